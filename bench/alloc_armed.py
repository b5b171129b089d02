"""Slowdown of the bench workloads while a tracer arms otel_memory:alloc/free.

Each workload runs unarmed and under bpftrace with a program that counts
both probes (the cost an OpenTelemetry-style consumer would add: the
allocator wrapper, the sampling countdown, the sampled-pointer set, and a
uprobe trap per sampled allocation and per free of a sampled pointer), in
alternation, ROUNDS times each.  Two measures per run:

  instructions:u   perf stat of the interpreter alone (user space: the
                   wrapper's own cost; the traps are kernel time);
  wall             the workload's timed region (BENCH_TIMING), which
                   includes the traps, on a machine whose noise this shows.

usage: python3 bench/alloc_armed.py [--python PATH] [--rounds N]
       [--scale S] [--interval BYTES] [WORKLOAD ...]
Prints one line per workload: the median armed/unarmed ratio of each
measure, the min-max range of the ratios, and the hits.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

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


def one_run(python, workload, armed, scale, interval, tmp):
    out = os.path.join(tmp, "perf.csv")
    env = dict(os.environ, BENCH_TIMING="1", BENCH_SCALE=str(scale),
               PYTHONHASHSEED="0")
    env.pop("PYTHONUSDTALLOCINTERVAL", None)
    if interval:
        env["PYTHONUSDTALLOCINTERVAL"] = str(interval)
    cmd = ["perf", "stat", "-x,", "-o", out, "-e", "instructions:u",
           python, os.path.join(WORKLOADS, workload + ".py")]
    if armed:
        for part in cmd:
            if " " in part:
                raise SystemExit("bpftrace -c splits on spaces: %r" % part)
        cmd = ["bpftrace", "-q", "-e", PROGRAM % {"p": python},
               "-c", " ".join(cmd)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          cwd=tmp, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit("%s failed: %s" % (" ".join(cmd), proc.stderr))
    elapsed = int(re.search(r"elapsed_ns=(\d+)", proc.stderr).group(1))
    with open(out) as f:
        instructions = int(next(line.split(",")[0] for line in f
                                if "instructions" in line))
    hits = {name: int(n) for name, n in
            re.findall(r"^@(\w+): (\d+)$", proc.stdout, re.M)}
    if armed and "attached" not in proc.stdout:
        raise SystemExit("bpftrace did not attach: %s" % proc.stderr)
    return instructions, elapsed, hits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=DEFAULT_PYTHON)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--interval", type=int, default=0,
                        help="PYTHONUSDTALLOCINTERVAL (default: built-in)")
    parser.add_argument("workloads", nargs="*", default=DEFAULT_WORKLOADS)
    args = parser.parse_args()
    python = os.path.abspath(args.python)
    print("# %s, %d rounds, scale %s, interval %s"
          % (python, args.rounds, args.scale,
             args.interval or "default (524288)"))
    print("# workload: instructions:u armed/unarmed median [min-max]; "
          "wall median [min-max]; hits per armed run")
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads:
            runs = {False: [], True: []}
            hits = []
            for _ in range(args.rounds):
                for armed in (False, True):
                    ins, wall, h = one_run(python, workload, armed,
                                           args.scale, args.interval, tmp)
                    runs[armed].append((ins, wall))
                    if armed:
                        hits.append(h)
            ratios = {}
            for index, name in ((0, "ins"), (1, "wall")):
                ratios[name] = [a[index] / u[index] for u, a in
                                zip(runs[False], runs[True])]
            allocs = statistics.median(h.get("allocs", 0) for h in hits)
            frees = statistics.median(h.get("frees", 0) for h in hits)
            print("%-15s ins %+6.2f %% [%+.2f, %+.2f]  wall %+6.2f %% "
                  "[%+.2f, %+.2f]  alloc %d free %d"
                  % (workload,
                     100 * (statistics.median(ratios["ins"]) - 1),
                     100 * (min(ratios["ins"]) - 1),
                     100 * (max(ratios["ins"]) - 1),
                     100 * (statistics.median(ratios["wall"]) - 1),
                     100 * (min(ratios["wall"]) - 1),
                     100 * (max(ratios["wall"]) - 1), allocs, frees),
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
