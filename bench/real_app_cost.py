"""What the stack tool's profile costs on a real application, in BPF.

The application is tests/data/real_app.py (docutils renders 150 lines of
our howto, pygments highlights _bpftrace.py in asyncio's worker threads;
both from Debian's python3-docutils and python3-pygments, found through
a scratch directory on PYTHONPATH), run over and over by one process for
the whole bench.  Phases of SECONDS each, CYCLES times: nothing attached,
then

    usdt.stacks --probe profile:hz:HZ --json --max-depth 512 -p PID

(with --native too when asked).  For each traced phase:

- the BPF program's time (run_time_ns of the programs bpftrace holds,
  from /proc/BPFTRACE/fdinfo, with kernel.bpf_stats_enabled set for the
  run and restored after) over the samples of the process that the tool
  printed: the time of all the program's runs (on both CPUs, in any
  process) per sample, an upper bound of a sample's walk;
- the frames per sample, and how many frames have no line (there must
  be none: the bench fails otherwise);
- the stack tool's own CPU time (user and system, all its threads) per
  sample: while tracing, and in all, up to its exit (the lines are
  decoded at the end).

usage: python3 bench/real_app_cost.py PYTHON [--seconds S] [--cycles K]
           [--hz HZ] [--native] [--out-json F]
Run as root (bpftrace), on a quiet machine: the BPF time of a sample
grows with what else runs (about three times with both CPUs busy).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from whole_stacks import (STATS, attached, bpf_stats, cpu_ns,  # noqa: E402
                          stop)

TOOL = os.path.join(TOP, "overlay", "Lib", "usdt", "stacks")
APP = os.path.join(TOP, "tests", "data", "real_app.py")
RST = os.path.join(TOP, "overlay", "Doc", "howto", "instrumentation.rst")
SOURCE = os.path.join(TOP, "overlay", "Lib", "usdt", "_bpftrace.py")
DIST = "/usr/lib/python3/dist-packages"
PACKAGES = ("docutils", "pygments", "roman.py")

# The application, again and again until its standard input closes; its
# own line of output goes nowhere.
LOOP = r"""
import os, runpy, sys, threading
app, rst, source = sys.argv[1:4]
sys.argv = [app, rst, "150", source]
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()),
                 daemon=True).start()
out = sys.stdout
sys.stdout = open(os.devnull, "w")
first = True
while not done.is_set():
    runpy.run_path(app, run_name="__main__")
    if first:
        print("ready", file=out, flush=True)
        first = False
"""


def frames_of(rows):
    """(samples, Python frames, Python frames without a line, samples
    whose native frames were cut at [native frames lost], those of them
    sampled in libc) of the stack tool's JSON."""
    samples = frames = unknown = lost = lost_in_libc = 0
    for row in rows:
        samples += row["count"]
        if any("[native frames lost]" in (frame.get("symbol"),
                                          frame.get("name"))
               for frame in row["frames"]):
            lost += row["count"]
            if os.path.basename(row["frames"][0].get("library", "")
                                ).startswith("libc.so"):
                lost_in_libc += row["count"]
        for frame in row["frames"]:
            if "symbol" in frame:
                continue  # a native frame (--native), or its mark
            if frame["name"].startswith("["):
                continue  # a mark ([more frames], ...), not a frame
            frames += row["count"]
            if frame["line"] is None:
                unknown += row["count"]
    return samples, frames, unknown, lost, lost_in_libc


def traced_phase(pid, args):
    with tempfile.TemporaryDirectory(prefix="real-app-cost") as tmp:
        records = os.path.join(tmp, "records")
        out = os.path.join(tmp, "out.json")
        with open(out, "w") as stdout:
            tool = subprocess.Popen(
                [sys.executable, TOOL, *(["--native"] if args.native
                                         else []),
                 "--json", "--python", args.python, "--max-depth", "512",
                 "--probe", "profile:hz:%d" % args.hz, "--save", records,
                 "-p", str(pid)],
                stdout=stdout, stderr=subprocess.PIPE, text=True)
            bpftrace = attached(tool, records)
            before = bpf_stats(bpftrace)
            tool_before = cpu_ns(tool.pid)
            time.sleep(args.seconds)
            after = bpf_stats(bpftrace)
            tool_ns = cpu_ns(tool.pid) - tool_before
            _, stderr, total = stop(tool)
            total -= tool_before
        if tool.returncode != 0:
            sys.exit("usdt.stacks failed (%d): %s" % (tool.returncode, stderr))
        with open(out) as f:
            rows = json.load(f)
    samples, frames, unknown, lost, lost_in_libc = frames_of(rows)
    ns, runs = after[0] - before[0], after[1] - before[1]
    return {"hz": args.hz, "native": args.native, "bpf_ns": ns,
            "bpf_runs": runs, "samples_in_process": samples,
            "bpf_ns_per_sample": ns / samples if samples else None,
            "frames_per_sample": frames / samples if samples else None,
            "frames_without_line": unknown,
            "native_lost": lost, "native_lost_in_libc": lost_in_libc,
            "notes": [line for line in stderr.splitlines()
                      if line.startswith("usdt.stacks: ")],
            "pystack_cpu_ns_per_sample": tool_ns / samples if samples
            else None,
            "pystack_cpu_ns_per_sample_in_all": total / samples if samples
            else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--hz", type=int, default=99)
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--out-json")
    args = parser.parse_args()
    missing = [name for name in PACKAGES
               if not os.path.exists(os.path.join(DIST, name))]
    if missing:
        sys.exit("real_app_cost: %s not in %s (apt-get install "
                 "python3-docutils python3-pygments)"
                 % (", ".join(missing), DIST))
    with open(STATS) as f:
        stats_before = f.read().strip()
    results = []
    with tempfile.TemporaryDirectory(prefix="real-app-path") as path:
        for name in PACKAGES:
            os.symlink(os.path.join(DIST, name), os.path.join(path, name))
        proc = subprocess.Popen(
            [args.python, "-c", LOOP, APP, RST, SOURCE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=path))
        try:
            with open(STATS, "w") as f:
                f.write("1")
            line = proc.stdout.readline()
            if line != "ready\n":
                sys.exit("real_app_cost: the application did not start")
            for _ in range(args.cycles):
                time.sleep(args.seconds)  # nothing attached
                results.append(traced_phase(proc.pid, args))
        finally:
            proc.stdin.close()
            proc.wait()
            with open(STATS, "w") as f:
                f.write(stats_before)
    print("%d Hz%s, real application: BPF time per sample %s us, %s "
          "frames per sample, usdt.stacks CPU per sample %s us while "
          "tracing, %s us in all (%s samples), frames without a line: "
          "%d%s"
          % (args.hz, " --native" if args.native else "",
             ", ".join("%.1f" % (r["bpf_ns_per_sample"] / 1e3)
                       for r in results),
             ", ".join("%.1f" % r["frames_per_sample"] for r in results),
             ", ".join("%.1f" % (r["pystack_cpu_ns_per_sample"] / 1e3)
                       for r in results),
             ", ".join("%.1f" % (r["pystack_cpu_ns_per_sample_in_all"]
                                 / 1e3) for r in results),
             ", ".join(str(r["samples_in_process"]) for r in results),
             sum(r["frames_without_line"] for r in results),
             "; samples cut at [native frames lost]: %s (in libc: %s)" % (
                 ", ".join(str(r["native_lost"]) for r in results),
                 ", ".join(str(r["native_lost_in_libc"]) for r in results))
             if args.native else ""))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(results, f, indent=1)
    if any(r["frames_without_line"] for r in results):
        sys.exit("real_app_cost: frames without a line (above)")


if __name__ == "__main__":
    main()
