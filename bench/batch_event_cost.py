"""What writing one record of python:batch costs inside the interpreter,
with no tracer attached (docs/batch.md, "In the process").

A copy of the interpreter whose python_batch_semaphore is set to 1 in the
file (its offset read from the ELF: the symbol's address, in the section
that holds it, checked against the marker's stapsdt note) counts as armed
from its start: it installs the function events and writes a record for
each, and the marker fires into its nop when a buffer is full, as it
would with a tracer attached but without the traps.  Against the same
binary unarmed, each run from a tree of its own in a temporary directory
(bench/common.py's make_tree: an installation's layout, paths of equal
length), on a workload of fib(FIB) repeated N times, whose function
events (a start and a return per call) are counted exactly: by the
recurrence of fib's calls, checked under sys.setprofile at both N:

  instructions  valgrind --tool=cachegrind --cache-sim=no, ASLR off, at
                two N (default 20 and 60): instructions per event =
                (Ir(N2) - Ir(N1)) / (events(N2) - events(N1)), unarmed,
                armed, and armed - unarmed; and the functions whose
                instructions per event grew most when armed (the same
                difference, function by function, from cachegrind's
                output files);
  CPU time      --rounds alternated runs (default 3) of N = --cpu-n
                (default 200), unarmed and armed, the process's CPU time
                of the loop (time.process_time_ns(): the watcher thread's
                flushes included) per event, and armed - unarmed per
                round (median, min-max).

It fails unless the copy's semaphore reads back 1 and the armed binary
costs more than --min-armed instructions per event (default 50) over the
unarmed one.  Not root; needs valgrind (apt-get install valgrind).

usage: python3 bench/batch_event_cost.py PYTHON [--fib 18] [--n 20,60]
           [--cpu-n 200] [--rounds 3] [--top 12] [--min-armed 50]
           [--out-json F]
"""

import argparse
import json
import os
import platform
import re
import runpy
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402  (build_tree_of, make_tree: the runs' trees)

USDT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "overlay", "Lib", "usdt")
SHF_ALLOC = 0x2
SYMBOL = "python_batch_semaphore"
PROVIDER, MARKER = "python", "batch"
IREFS = re.compile(r"==\d+==\s+I\s+refs:\s+([\d,]+)")

WORKLOAD = '''\
import sys, time

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

N, FIB = int(sys.argv[1]), int(sys.argv[2])
COUNT = len(sys.argv) > 3 and sys.argv[3] == "count"
events = 0

def profile(frame, event, arg):
    global events
    if event in ("call", "return"):
        events += 1

if COUNT:
    sys.setprofile(profile)
start = time.process_time_ns()
for _ in range(N):
    fib(FIB)
cpu = time.process_time_ns() - start
if COUNT:
    sys.setprofile(None)
print("cpu_ns=%d events=%d" % (cpu, events))
'''


# --------------------------------------------------------------------------- ELF

def semaphore_offset(python):
    """{symbol, address, section, file_offset, note_checked} of
    python_batch_semaphore in the interpreter, read with usdt._elf (the
    toolkit's one ELF reader, loaded from overlay/Lib/usdt)."""
    runpy.run_path(os.path.join(USDT, "_frompath.py"))["load"](USDT)
    from usdt import _elf
    try:
        elf = _elf.ElfFile(python)
        symbol = elf.symbols().get(SYMBOL)
        notes = [probe.semaphore for probe in elf.stapsdt_probes()
                 if (probe.provider, probe.name) == (PROVIDER, MARKER)]
    except _elf.ElfError as error:
        sys.exit("bench/batch_event_cost.py: %s" % error)
    if symbol is None:
        sys.exit("bench/batch_event_cost.py: no symbol %s in the interpreter "
                 "(not a build with python:batch, or stripped)" % SYMBOL)
    address = symbol.value
    # The allocated section whose bytes in the file hold the symbol.
    section = next((s for s in elf.sections
                    if s.flags & SHF_ALLOC and s.type != _elf.SHT_NOBITS
                    and s.addr <= address < s.addr + s.size), None)
    if section is None:
        sys.exit("bench/batch_event_cost.py: %s at %#x is not in the file's "
                 "bytes of any section" % (SYMBOL, address))
    for note in notes:
        if note != address:
            sys.exit("bench/batch_event_cost.py: %s is at %#x, the %s:%s "
                     "note's semaphore at %#x"
                     % (SYMBOL, address, PROVIDER, MARKER, note))
    return {"symbol": SYMBOL, "address": address, "section": section.name,
            "file_offset": section.offset + address - section.addr,
            "note_checked": bool(notes)}


def armed_copy(python, path):
    """Copy python to path with the batch semaphore set to 1; returns the
    semaphore's facts."""
    where = semaphore_offset(python)
    with open(python, "rb") as f:
        data = bytearray(f.read())
    off = where["file_offset"]
    value, = struct.unpack_from("<H", data, off)
    if value != 0:
        sys.exit("bench/batch_event_cost.py: %s of %s is %d in the file, "
                 "not 0" % (SYMBOL, python, value))
    struct.pack_into("<H", data, off, 1)
    with open(path, "wb") as f:
        f.write(data)
    shutil.copymode(python, path)
    with open(path, "rb") as f:
        f.seek(off)
        back, = struct.unpack("<H", f.read(2))
    if back != 1:
        sys.exit("bench/batch_event_cost.py: the copy's %s reads back %d"
                 % (SYMBOL, back))
    return where


# --------------------------------------------------------------------------- runs

def fib_events(n):
    """Function events of one fib(n): a start and a return per call."""
    calls = [1, 1]
    for _ in range(2, n + 1):
        calls.append(1 + calls[-1] + calls[-2])
    return 2 * calls[n]


def run(cmd, env, cwd):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        sys.exit("bench/batch_event_cost.py: %s failed (exit %d):\n%s%s"
                 % (" ".join(cmd), proc.returncode, proc.stdout,
                    proc.stderr[-3000:]))
    return proc


def parse_out(stdout):
    m = re.search(r"cpu_ns=(\d+) events=(\d+)", stdout)
    if not m:
        sys.exit("bench/batch_event_cost.py: the workload printed %r" % stdout)
    return int(m.group(1)), int(m.group(2))


def cachegrind(python, workload, n, fib, out, env, cwd):
    cmd = ["setarch", platform.machine(), "-R", "valgrind",
           "--tool=cachegrind", "--cache-sim=no",
           "--cachegrind-out-file=" + out, python, workload, str(n), str(fib)]
    proc = run(cmd, env, cwd)
    found = IREFS.findall(proc.stderr)
    if not found:
        sys.exit("bench/batch_event_cost.py: no I refs in %s:\n%s"
                 % (" ".join(cmd), proc.stderr[-3000:]))
    return int(found[-1].replace(",", ""))


def per_function(path):
    """{(file, function): Ir} of a cachegrind output file."""
    counts, key = {}, None
    fl = fn = "???"
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("fl="):
                fl = line[3:].strip()
            elif line.startswith("fn="):
                fn = line[3:].strip()
                key = (fl, fn)
            elif key and line[:1].isdigit():
                parts = line.split()
                if len(parts) > 1 and parts[1] != ".":
                    counts[key] = counts.get(key, 0) + int(parts[1])
    return counts


def grown(outs, events, top):
    """The functions whose instructions per event grew most when armed:
    [(function, armed - unarmed per event, unarmed, armed, its files)],
    a function's lines in every file (its inlined parts) added up, the
    files in the order of their share of the armed count."""
    per, files = {}, {}
    for side in ("unarmed", "armed"):
        low, high = (per_function(p) for p in outs[side])
        for key in set(low) | set(high):
            fl, fn = key
            grew = (high.get(key, 0) - low.get(key, 0)) / events
            d = per.setdefault(fn, {})
            d[side] = d.get(side, 0) + grew
            shares = files.setdefault(fn, {})
            shares[os.path.basename(fl)] = (
                shares.get(os.path.basename(fl), 0)
                + (high.get(key, 0) if side == "armed" else 0))
    rows = [(fn, d.get("armed", 0) - d.get("unarmed", 0),
             d.get("unarmed", 0), d.get("armed", 0),
             sorted(files[fn], key=lambda f: -files[fn][f]))
            for fn, d in per.items()]
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def spread(values):
    return {"median": statistics.median(values), "min": min(values),
            "max": max(values), "runs": values}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--fib", type=int, default=18,
                        help="fib's argument (default %(default)s)")
    parser.add_argument("--n", default="20,60",
                        help="the two repetition counts under cachegrind "
                        "(default %(default)s)")
    parser.add_argument("--cpu-n", type=int, default=200,
                        help="repetitions of the CPU time runs "
                        "(default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="CPU time runs of each (default %(default)s)")
    parser.add_argument("--top", type=int, default=12,
                        help="functions that grew most, shown "
                        "(default %(default)s; 0: none)")
    parser.add_argument("--min-armed", type=float, default=50,
                        help="fail unless armed costs more instructions per "
                        "event than this over unarmed (default %(default)s)")
    parser.add_argument("--out-json")
    args = parser.parse_args()
    n1, n2 = (int(x) for x in args.n.split(","))
    if not 0 < n1 < n2:
        sys.exit("bench/batch_event_cost.py: --n wants N1,N2 with 0 < N1 < N2")
    if not shutil.which("valgrind"):
        sys.exit("bench/batch_event_cost.py: valgrind is not installed: "
                 "apt-get install valgrind")
    python = os.path.abspath(args.python)
    trees = common.build_tree_of(python)
    with tempfile.TemporaryDirectory(prefix="batch-event-cost.") as tmp:
        result = measure(args, python, trees, tmp, n1, n2)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


def measure(args, python, trees, tmp, n1, n2):
    copy = os.path.join(tmp, "python-batch-armed")
    where = armed_copy(python, copy)
    print("%s at %#x in %s, file offset %#x: set to 1 in the copy%s"
          % (SYMBOL, where["address"], where["section"], where["file_offset"],
             " (the python:batch note's semaphore)" if where["note_checked"]
             else ""), flush=True)
    pythons = {"unarmed": common.make_tree(os.path.join(tmp, "0"), python,
                                           *trees),
               "armed": common.make_tree(os.path.join(tmp, "1"), copy,
                                         *trees)}
    workload = os.path.join(tmp, "w.py")
    with open(workload, "w") as f:
        f.write(WORKLOAD)
    cwd = os.path.join(tmp, "cwd")
    os.makedirs(cwd)
    env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8",
           "HOME": cwd}

    # The events, exactly: the recurrence, checked under sys.setprofile
    # (which also writes each tree's bytecode caches before any count).
    per_rep = fib_events(args.fib)
    for side in ("unarmed", "armed"):
        for n in (n1, n2):
            _, events = parse_out(run([pythons[side], workload, str(n),
                                       str(args.fib), "count"],
                                      env, cwd).stdout)
            if events != n * per_rep:
                sys.exit("bench/batch_event_cost.py: %s, N = %d: %d events "
                         "under sys.setprofile, %d expected"
                         % (side, n, events, n * per_rep))
    events = (n2 - n1) * per_rep
    print("fib(%d): %d function events a repetition (sys.setprofile agrees)"
          % (args.fib, per_rep), flush=True)

    irefs, outs, per_event = {}, {}, {}
    for side in ("unarmed", "armed"):
        irefs[side], outs[side] = {}, []
        for n in (n1, n2):
            out = os.path.join(tmp, "cachegrind.%s.%d" % (side, n))
            irefs[side][n] = cachegrind(pythons[side], workload, n, args.fib,
                                        out, env, cwd)
            outs[side].append(out)
        per_event[side] = (irefs[side][n2] - irefs[side][n1]) / events
        print("cachegrind %-7s Ir(N=%d) %d, Ir(N=%d) %d: %.1f instructions "
              "per event" % (side, n1, irefs[side][n1], n2, irefs[side][n2],
                             per_event[side]), flush=True)
    difference = per_event["armed"] - per_event["unarmed"]
    print("armed - unarmed: %.1f instructions per event (%d events between "
          "N = %d and %d)" % (difference, events, n1, n2), flush=True)
    if difference <= args.min_armed:
        sys.exit("bench/batch_event_cost.py: the armed copy costs only %.1f "
                 "instructions per event more (at most --min-armed %g): it "
                 "does not record" % (difference, args.min_armed))
    functions = grown(outs, events, args.top) if args.top else []
    if functions:
        print("grew most when armed, instructions per event "
              "(armed - unarmed; unarmed, armed):")
        for fn, d, u, a, fls in functions:
            print("  %7.1f  (%6.1f, %6.1f)  %s  [%s%s]" % (
                d, u, a, fn, fls[0],
                " + %d inlined" % (len(fls) - 1) if len(fls) > 1 else ""))

    cpu_events = args.cpu_n * per_rep
    ns = {"unarmed": [], "armed": []}
    for i in range(args.rounds):
        order = ("unarmed", "armed") if i % 2 == 0 else ("armed", "unarmed")
        for side in order:
            cpu, _ = parse_out(run([pythons[side], workload, str(args.cpu_n),
                                    str(args.fib)], env, cwd).stdout)
            ns[side].append(cpu / cpu_events)
        print("round %d: %.1f ns per event unarmed, %.1f armed"
              % (i + 1, ns["unarmed"][-1], ns["armed"][-1]), flush=True)
    diffs = [a - u for a, u in zip(ns["armed"], ns["unarmed"])]
    cpu = {side: spread(v) for side, v in ns.items()}
    cpu["difference"] = spread(diffs)
    print("CPU time, %d alternated runs of N = %d (%d events): unarmed "
          "%.1f-%.1f ns per event, armed %.1f-%.1f, armed - unarmed %.1f "
          "(%.1f-%.1f) ns per event" % (
              args.rounds, args.cpu_n, cpu_events, min(ns["unarmed"]),
              max(ns["unarmed"]), min(ns["armed"]), max(ns["armed"]),
              statistics.median(diffs), min(diffs), max(diffs)))
    print("instructions per event: unarmed %.1f, armed %.1f, armed - unarmed "
          "%.1f" % (per_event["unarmed"], per_event["armed"], difference))

    try:
        with open("/sys/devices/system/clocksource/clocksource0/"
                  "current_clocksource") as f:
            clocksource = f.read().strip()
    except OSError:
        clocksource = None
    return {
        "python": python,
        "semaphore": where,
        "workload": {"fib": args.fib, "events_per_repetition": per_rep,
                     "checked_by_setprofile": [n1, n2]},
        "instructions": {
            "n": [n1, n2], "events": events,
            "irefs": {side: {str(n): c for n, c in v.items()}
                      for side, v in irefs.items()},
            "per_event": per_event, "difference_per_event": difference,
            "grew": [{"function": fn, "files": fls,
                      "difference_per_event": d, "unarmed_per_event": u,
                      "armed_per_event": a}
                     for fn, d, u, a, fls in functions]},
        "cpu": {"n": args.cpu_n, "rounds": args.rounds, "events": cpu_events,
                "ns_per_event": cpu},
        "machine": {"cpus": os.cpu_count(), "clocksource": clocksource,
                    "valgrind": common.first_line(["valgrind", "--version"])},
    }


if __name__ == "__main__":
    main()
