"""Where profile's BPF time per sample goes, part by part.

the stack tool's program for profile:hz:HZ -p PID (python -m usdt.stacks
--print-program) is run by bpftrace as it is and cut down, one variant at
a time, each for SECONDS, against the real application of
bench/real_app_cost.py and against a one-frame loop:

  empty       the probe and its pid predicate, and a count() only
  read-count  empty and one read of the process's memory (a word of the
              thread's TLS)
  read-print  the probe, its predicate, that read and one printf of it:
              the least that a program which reads the process and
              prints per sample costs
  runtime     + the task's mm and the interpreter's cookie (two reads)
  records     + the thread state left out: the D and Z records only
  no-walk     + the thread state (TLS, then the thread list if need be)
  no-list     no-walk without the thread list (TLS only)
  no-F        the whole program, its F records not printed (their frames
              still read)
  whole       the program as usdt.stacks runs it
  no-version  the whole program without its read of each frame's
              co_version (its records say 0 instead): what telling a
              reused code object's address apart by reading the object
              costs per sample
  maps        the whole program with its records kept in maps
              (@F[tid, event, batch], @D[tid, event], @Z[tid, event])
              instead of printed, and the maps printed and cleared every
              100 ms: what a sample costs without bpftrace's output
              buffer (its first record per sample wakes the reader)

For each: the BPF programs' run time over their runs (kernel.
bpf_stats_enabled, set for the run and restored) from its start, per
run (on both CPUs: those in another process stop at the predicate) and
per sample of the process (the runs that passed the predicate: the D
records printed, or @n counted, in the same time).  The difference
between two rows is what the part costs.

usage: python3 bench/profile_parts.py PYTHON [--seconds S] [--hz HZ]
           [--only NAME,...] [--cycles K] [--apps LABEL,...]
           [--out-json F]
Run as root (bpftrace), on a quiet machine.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from real_app_cost import (APP, DIST, LOOP, PACKAGES, RST,  # noqa: E402
                           SOURCE, TOOL)
from whole_stacks import STATS, bpf_stats  # noqa: E402

SPIN = "def spin():\n    while True:\n        sum(range(100))\nspin()\n"


def cut(text, start, end, replacement=""):
    """text with the part from the line that starts with *start* up to
    (not including) the line that starts with *end* replaced."""
    i = text.index(start)
    j = text.index(end, i)
    return text[:i] + replacement + text[j:]


RECORD = re.compile(r'printf\("PYSTACK ([DFZ]) [^"]*",\s*tid,\s*\$event,'
                    r'\s*([^;]*)\);')


def uint64(arg):
    """The expression *arg* as a uint64 (a tuple's members must have the
    same types at every assignment; bpftrace 0.17 takes "(uint64)(NAME)"
    for a cast to a type NAME)."""
    if arg.startswith("(uint64)"):
        return arg
    if re.fullmatch(r"\$?\w+", arg):
        return "(uint64)" + arg
    return "(uint64)(%s)" % arg


def in_maps(whole):
    """*whole* with each D, F and Z record kept in a map of its letter,
    keyed by the thread, the event (and the batch), instead of printed,
    and the maps printed and cleared every 100 ms (@n counts the
    samples)."""
    def keep(match):
        letter, args = match.group(1), [
            arg.strip() for arg in match.group(2).split(",")]
        key = "tid, $event"
        if letter == "F":
            # pid, $batch, then the 16 words
            key += ", " + args[1]
            args = args[2:]
        if letter == "D" and len(args) == 1:
            # the D record of an empty stack: "max 0 0"
            args += ["0", "0"]
        values = ", ".join(uint64(arg) for arg in args)
        count = "@n = count(); " if letter == "D" else ""
        return "%s@%s[%s] = (%s);" % (count, letter, key, values)
    program, replaced = RECORD.subn(keep, whole)
    if replaced != 7:
        sys.exit("profile_parts: expected 7 records to keep in maps, "
                 "found %d" % replaced)
    return program + ("\ninterval:ms:100\n{\n\tprint(@F); clear(@F);"
                      " print(@D); clear(@D); print(@Z); clear(@Z);\n}\n")


def variants(whole):
    """{name: program} of the variants described above."""
    walk = "\t$batch = 0;\n" if "\t$batch = 0;\n" in whole else "\tfor ($batch"
    out = {"whole": whole, "maps": in_maps(whole)}
    i = whole.index('printf("PYSTACK F')
    j = whole.index(";", i) + 1
    out["no-F"] = whole[:i] + (
        "$sink = $f0 + $w0 + $f1 + $w1 + $f2 + $w2 + $f3 + $w3 + $f4 + "
        "$w4 + $f5 + $w5 + $f6 + $w6 + $f7 + $w7;") + whole[j:]
    version = "(uint64)*uptr((uint32 *)($code + CO_VERSION))"
    if version not in whole:
        sys.exit("profile_parts: no read of co_version in the program")
    out["no-version"] = whole.replace(version, "(uint64)0")
    no_walk = cut(whole, walk, "\t$more = ", "\t$frame = 0;\n")
    out["no-walk"] = no_walk
    out["no-list"] = cut(no_walk, "\t$interp = *uptr(",
                         '\tif ($tstate == 0) {\n\t\tprintf("PYSTACK Z')
    records = cut(whole, "\t/* The thread state: the thread-local",
                  "\t$more = ", "\t$frame = 0; $top = 0;\n")
    out["records"] = records
    body = records.index("\t$frame = 0; $top = 0;\n")
    out["runtime"] = records[:body] + "\t@n = count();\n" + records[
        records.index("\n}\n", body):]
    head = whole.index("\t$task = (struct task_struct *)curtask;")
    tail = whole[whole.index("\n}\n", head):]
    out["empty"] = whole[:head] + "\t@n = count();\n" + tail
    read = ("\t$task = (struct task_struct *)curtask;\n"
            "\t$word = *uptr((uint64 *)($task->thread.fsbase - 8));\n")
    out["read-count"] = whole[:head] + read + (
        "\tif ($word == 1) {\n\t\t@n = count();\n\t} else {\n"
        "\t\t@n = count();\n\t}\n") + tail
    out["read-print"] = whole[:head] + read + (
        '\tprintf("PYSTACK D %d %lu %lx\\n", tid, nsecs, $word);\n') + tail
    return out


def measure(program, seconds):
    """(ns, runs, samples) of program, run by bpftrace for seconds: the
    BPF run time and runs from its start, and the samples of the traced
    process that it counted in the same time (its D records, or its
    @n)."""
    with tempfile.TemporaryDirectory(prefix="profile-parts") as tmp:
        path = os.path.join(tmp, "p.bt")
        with open(path, "w") as f:
            f.write(program)
        out_path = os.path.join(tmp, "out")
        with open(out_path, "w") as out:
            proc = subprocess.Popen(["bpftrace", "-q", "-B", "line", path],
                                    stdout=out, stderr=subprocess.STDOUT)
            time.sleep(seconds)
            if proc.poll() is not None:
                with open(out_path) as f:
                    sys.exit("bpftrace failed: %s" % f.read())
            ns, runs = bpf_stats(proc.pid)
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with open(out_path, errors="replace") as f:
            text = f.read()
    counted = re.search(r"^@n: (\d+)$", text, re.M)
    samples = (int(counted.group(1)) if counted
               else text.count("PYSTACK D "))
    return ns, runs, samples


def run_against(pid, args):
    whole = subprocess.run(
        [sys.executable, TOOL, "--probe", "profile:hz:%d" % args.hz,
         "-p", str(pid), "--print-program"], check=True,
        capture_output=True, text=True).stdout
    rows = []
    programs = variants(whole)
    names = args.only.split(",") if args.only else list(programs)
    unknown = [name for name in names if name not in programs]
    if unknown:
        sys.exit("profile_parts: no variant %s (there are %s)"
                 % (", ".join(unknown), ", ".join(programs)))
    for name in names * args.cycles:
        program = programs[name]
        ns, runs, samples = measure(program, args.seconds)
        rows.append({"variant": name, "ns": ns, "runs": runs,
                     "samples": samples,
                     "ns_per_run": ns / runs if runs else None,
                     "ns_per_sample": ns / samples if samples else None})
        print("  %-10s %6d runs %6d samples %6.1f us per run %6.1f us per "
              "sample" % (name, runs, samples, ns / runs / 1e3 if runs
                          else 0, ns / samples / 1e3 if samples else 0),
              flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--hz", type=int, default=99)
    parser.add_argument("--only", metavar="NAME,...",
                        help="these variants only, in this order")
    parser.add_argument("--cycles", type=int, default=1,
                        help="run the variants this many times, one "
                        "after the other (rows alternate: on a machine "
                        "whose load changes, compare neighbours)")
    parser.add_argument("--apps", default="real application,one-frame loop",
                        help="the workloads, by name, comma-separated")
    parser.add_argument("--out-json")
    args = parser.parse_args()
    with open(STATS) as f:
        stats_before = f.read().strip()
    results = {}
    with tempfile.TemporaryDirectory(prefix="profile-parts-path") as path:
        for name in PACKAGES:
            os.symlink(os.path.join(DIST, name), os.path.join(path, name))
        known = {
            "real application": [args.python, "-c", LOOP, APP, RST, SOURCE],
            "one-frame loop": [args.python, "-c", "print('ready', "
                               "flush=True)\n" + SPIN]}
        labels = args.apps.split(",")
        unknown = [label for label in labels if label not in known]
        if unknown:
            sys.exit("profile_parts: no workload %s (there are %s)"
                     % (", ".join(unknown), ", ".join(known)))
        apps = {label: known[label] for label in labels}
        try:
            with open(STATS, "w") as f:
                f.write("1")
            for label, cmd in apps.items():
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True,
                                        env=dict(os.environ,
                                                 PYTHONPATH=path))
                try:
                    if proc.stdout.readline() != "ready\n":
                        sys.exit("profile_parts: %s did not start" % label)
                    print(label, flush=True)
                    results[label] = run_against(proc.pid, args)
                finally:
                    proc.stdin.close()
                    proc.kill()
                    proc.wait()
        finally:
            with open(STATS, "w") as f:
                f.write(stats_before)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
