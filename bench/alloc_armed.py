"""Slowdown of the bench workloads while otel_memory:alloc/free are armed.

Two measures, each unarmed against armed, ROUNDS times in alternation:

  instructions (default)  valgrind --tool=cachegrind, at BENCH_SCALE 0.1:
                          the probes' semaphores are set before the
                          interpreter starts by bench/alloc/arm_preload.c
                          (LD_PRELOAD, in both runs; only the armed run gets
                          the semaphore list), so the interpreter wraps its
                          allocators and samples, and the probes fire into
                          their nops: the interpreter's own cost, without
                          the traps (uprobes do not work under valgrind);
  --wall                  bpftrace -c with a program that counts both
                          probes, against a plain run: the workload's timed
                          region (BENCH_TIMING), traps included, in wall
                          time and in the process's CPU time (user and
                          system: the kernel's time in the traps and the
                          BPF program is the traced thread's system time;
                          time the process waits for a CPU is in neither).
                          On a shared machine their noise can exceed the
                          effect: the range of the ratios is printed with
                          the median.
  --paired                the same two runs at the same time, each pinned
                          to its own CPU (taskset; the CPUs swapped every
                          round), their timed regions started together
                          (BENCH_GO, once bpftrace has attached): a slow
                          phase of the machine then slows both.  With
                          --null, both runs are unarmed: the method's own
                          spread, to read the armed ratios against.

usage: python3 bench/alloc_armed.py [--python PATH] [--rounds N]
       [--wall | --paired [--null]] [--scale S] [--interval BYTES]
       [WORKLOAD ...]
One line per workload: the median armed/unarmed ratio minus one, the
min-max range of the rounds, and (--wall) the same for CPU time and the
probes' hits per armed run.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
WORKLOADS = os.path.join(HERE, "workloads")
DEFAULT_PYTHON = os.path.join(TOP, "build", "3.13", "obj", "python")
# Allocation-heavy first: the target is about them.
DEFAULT_WORKLOADS = ["containers", "strings", "json_roundtrip", "deltablue",
                     "richards", "generators", "closures", "nbody"]

PROGRAM = ("usdt:%(p)s:otel_memory:alloc { @allocs = count(); } "
           "usdt:%(p)s:otel_memory:free { @frees = count(); } "
           "BEGIN { printf(\"attached\\n\"); }")


def semaphores(python):
    """The link-time addresses of the otel_memory semaphores, "0x..,0x..".
    """
    notes = subprocess.run(["readelf", "-n", python], capture_output=True,
                           text=True, check=True).stdout
    found = set()
    for note in notes.split("NT_STAPSDT")[1:]:
        if "Provider: otel_memory" in note:
            found.add(re.search(r"Semaphore: (0x[0-9a-f]+)", note).group(1))
    if len(found) != 2:
        raise SystemExit("otel_memory semaphores of %s: %r" % (python, found))
    return ",".join(sorted(found))


def build_preload(tmp):
    lib = os.path.join(tmp, "arm_preload.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", lib,
                    os.path.join(HERE, "alloc", "arm_preload.c")],
                   check=True)
    return lib


def one_count(python, workload, sems, preload, scale, interval, tmp):
    """Instructions of one cachegrind run; armed when *sems* is given."""
    env = dict(os.environ, BENCH_SCALE=str(scale), PYTHONHASHSEED="0",
               LD_PRELOAD=preload, USDT_ARM_SEMAPHORES=sems,
               USDT_ARM_EXE=os.path.realpath(python))
    env.pop("PYTHONUSDTALLOCINTERVAL", None)
    if interval:
        env["PYTHONUSDTALLOCINTERVAL"] = str(interval)
    cmd = ["setarch", "-R", "valgrind", "--tool=cachegrind",
           "--cache-sim=no", "--cachegrind-out-file=/dev/null", python,
           os.path.join(WORKLOADS, workload + ".py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          cwd=tmp, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit("%s failed (exit %d): %s %s" % (" ".join(cmd), proc.returncode, proc.stderr, proc.stdout))
    return int(re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
               .group(1).replace(",", ""))


def run_command(python, workload, armed, scale, interval, go=None,
                cpu=None):
    """(command, environment) of one timed run."""
    env = dict(os.environ, BENCH_TIMING="1", BENCH_SCALE=str(scale),
               PYTHONHASHSEED="0")
    env.pop("PYTHONUSDTALLOCINTERVAL", None)
    env.pop("BENCH_GO", None)
    if interval:
        env["PYTHONUSDTALLOCINTERVAL"] = str(interval)
    if go:
        env["BENCH_GO"] = go
    cmd = [python, os.path.join(WORKLOADS, workload + ".py")]
    if armed:
        for part in cmd:
            if " " in part:
                raise SystemExit("bpftrace -c splits on spaces: %r" % part)
        cmd = ["bpftrace", "-q", "-e", PROGRAM % {"p": python},
               "-c", " ".join(cmd)]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    return cmd, env


def parse_run(cmd, armed, returncode, stdout, stderr):
    """(elapsed ns, CPU ns, {probe: hits}) of a finished run."""
    if returncode != 0:
        raise SystemExit("%s failed (exit %d): %s %s"
                         % (" ".join(cmd), returncode, stderr, stdout))
    elapsed = int(re.search(r"elapsed_ns=(\d+)", stderr).group(1))
    cpu = int(re.search(r"cpu_ns=(\d+)", stderr).group(1))
    hits = {name: int(n) for name, n in
            re.findall(r"^@(\w+): (\d+)$", stdout, re.M)}
    if armed and "attached" not in stdout:
        raise SystemExit("bpftrace did not attach: %s" % stderr)
    return elapsed, cpu, hits


def one_run(python, workload, armed, scale, interval, tmp):
    cmd, env = run_command(python, workload, armed, scale, interval)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          cwd=tmp, timeout=1800)
    return parse_run(cmd, armed, proc.returncode, proc.stdout, proc.stderr)


def paired_round(python, workload, second_armed, swap, scale, interval,
                 tmp):
    """One unarmed run and one run armed (or, with second_armed false,
    unarmed too) at the same time, on CPUs 0 and 1 (1 and 0 if *swap*),
    their timed regions started together.  [(elapsed, cpu, hits)] of
    the first and the second."""
    go = os.path.join(tmp, "go")
    for name in os.listdir(tmp):
        if name.startswith("go"):
            os.unlink(os.path.join(tmp, name))
    procs = []
    for index, armed in enumerate((False, second_armed)):
        cmd, env = run_command(python, workload, armed, scale, interval,
                               go=go, cpu=index ^ swap)
        procs.append((cmd, armed, subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, cwd=tmp)))
    deadline = time.monotonic() + 120
    while sum(name.endswith(".ready") for name in os.listdir(tmp)) < 2:
        if time.monotonic() > deadline or any(
                p.poll() is not None for _, _, p in procs):
            for _, _, p in procs:
                p.kill()
            raise SystemExit("%s: the runs did not get ready: %s"
                             % (workload, [p.communicate()
                                           for _, _, p in procs]))
        time.sleep(0.01)
    open(go, "w").close()
    results = []
    for cmd, armed, p in procs:
        stdout, stderr = p.communicate(timeout=1800)
        results.append(parse_run(cmd, armed, p.returncode, stdout, stderr))
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=DEFAULT_PYTHON)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=None,
                        help="BENCH_SCALE (default 0.1, --wall and --paired 1.0)")
    parser.add_argument("--wall", action="store_true")
    parser.add_argument("--paired", action="store_true")
    parser.add_argument("--null", action="store_true",
                        help="--paired with both runs unarmed")
    parser.add_argument("--interval", type=int, default=0,
                        help="PYTHONUSDTALLOCINTERVAL (default: built-in)")
    parser.add_argument("workloads", nargs="*", default=DEFAULT_WORKLOADS)
    args = parser.parse_args()
    python = os.path.abspath(args.python)
    if args.null and not args.paired:
        parser.error("--null goes with --paired")
    if args.wall and args.paired:
        parser.error("--wall or --paired, not both")
    if args.scale is None:
        args.scale = 1.0 if args.wall or args.paired else 0.1
    print("# %s, %d rounds, scale %s, interval %s"
          % (python, args.rounds, args.scale,
             args.interval or "default (524288)"))
    with tempfile.TemporaryDirectory() as tmp:
        if not (args.wall or args.paired):
            print("# workload: instructions armed/unarmed - 1, median "
                  "[min, max] of the rounds; instructions unarmed")
            sems = semaphores(python)
            preload = build_preload(tmp)
            for workload in args.workloads:
                ratios = []
                for _ in range(args.rounds):
                    unarmed = one_count(python, workload, "", preload,
                                        args.scale, args.interval, tmp)
                    armed = one_count(python, workload, sems, preload,
                                      args.scale, args.interval, tmp)
                    ratios.append(armed / unarmed)
                print("%-15s %+6.2f %% [%+.2f, %+.2f]  %d"
                      % (workload, 100 * (statistics.median(ratios) - 1),
                         100 * (min(ratios) - 1), 100 * (max(ratios) - 1),
                         unarmed), flush=True)
            return 0
        if args.paired:
            print("# paired: both runs at once, pinned to CPUs 0 and 1 "
                  "(swapped every round)%s"
                  % ("; NULL: the second run unarmed too" if args.null
                     else ""))
        print("# workload: wall %s/unarmed - 1, median [min, max] of the "
              "rounds; the same for CPU time; hits per armed run"
              % ("unarmed" if args.null else "armed"))
        for workload in args.workloads:
            runs = {False: [], True: []}
            cpus = {False: [], True: []}
            hits = []
            for r in range(args.rounds):
                if args.paired:
                    pair = paired_round(python, workload, not args.null,
                                        r % 2, args.scale, args.interval,
                                        tmp)
                else:
                    pair = [one_run(python, workload, armed, args.scale,
                                    args.interval, tmp)
                            for armed in (False, True)]
                for armed, (wall, cpu, h) in zip((False, True), pair):
                    runs[armed].append(wall)
                    cpus[armed].append(cpu)
                    if armed:
                        hits.append(h)
            ratios = [a / u for u, a in zip(runs[False], runs[True])]
            cpu_ratios = [a / u for u, a in zip(cpus[False], cpus[True])]
            allocs = statistics.median(h.get("allocs", 0) for h in hits)
            frees = statistics.median(h.get("frees", 0) for h in hits)
            print("%-15s wall %+6.2f %% [%+.2f, %+.2f]  "
                  "cpu %+6.2f %% [%+.2f, %+.2f]  alloc %d free %d"
                  % (workload, 100 * (statistics.median(ratios) - 1),
                     100 * (min(ratios) - 1), 100 * (max(ratios) - 1),
                     100 * (statistics.median(cpu_ratios) - 1),
                     100 * (min(cpu_ratios) - 1),
                     100 * (max(cpu_ratios) - 1),
                     allocs, frees), flush=True)

if __name__ == "__main__":
    sys.exit(main())
