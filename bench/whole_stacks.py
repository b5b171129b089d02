"""usdt.stacks --native: what sampling whole stacks costs, in BPF and to the
traced process.

One process runs bench/stacks_workload.py, a call-heavy loop timed in fixed
rounds (about ten Python calls deep per outer() call).  Its phases, each
SECONDS long, repeated CYCLES times:

  idle    nothing attached;
  99      `usdt.stacks --native --probe profile:hz:99 -p PID`;
  idle    nothing attached;
  999     the same at 999 Hz.

For each traced phase:

- the BPF program's own time per run, from the kernel's BPF statistics
  (sysctl kernel.bpf_stats_enabled, set for the run and restored after;
  run_time_ns and run_cnt in /proc/BPFTRACE/fdinfo of the program), and
  the samples the tool counted in the process;
- the process's slowdown: the median round time of the phase over that of
  the two idle phases around it.  On a machine whose CPUs are shared, the
  tracer's own user-space work (bpftrace printing, usdt.stacks reading the
  mappings) competes with the process too: that is part of what is
  measured.

- the stack tool's own CPU time (user and system, all its threads) per sample
  of the process: in the phase (the records read, the code objects read
  from the process), and in all, up to its exit (with the last records
  and the lines decoded, which it does at the end).

With --depth N the workload's rounds run N frames deeper (a sample's
stack is about N + 5 Python frames deep).

usage: python3 bench/whole_stacks.py PYTHON [--seconds S] [--cycles K]
           [--out-json F] [--python-only] [--depth N] [--rates HZ,...]
Run as root (bpftrace).
"""

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
TOOL = os.path.join(TOP, "overlay", "Lib", "usdt", "stacks")
WORKLOAD = os.path.join(HERE, "stacks_workload.py")
STATS = "/proc/sys/kernel/bpf_stats_enabled"


class Rounds:
    """The workload's round lines, read as they come."""

    def __init__(self, proc):
        self.rounds = []
        self.thread = threading.Thread(target=self._read, args=(proc,),
                                       daemon=True)
        self.thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            words = line.split()
            if words and words[0] == "round":
                self.rounds.append((int(words[1]), int(words[2])))

    def between(self, start, end):
        """Round durations (ns) of the rounds inside [start, end]."""
        return [duration for stop, duration in list(self.rounds)
                if stop - duration >= start and stop <= end]


def children(pid):
    found = []
    for task in os.listdir("/proc/%d/task" % pid):
        with open("/proc/%d/task/%s/children" % (pid, task)) as f:
            found.extend(int(word) for word in f.read().split())
    return found


def bpf_stats(pid):
    """(run_time_ns, run_cnt) summed over the BPF programs process pid
    holds."""
    time_ns = count = 0
    for fd in os.listdir("/proc/%d/fdinfo" % pid):
        try:
            with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines()
                      if ":" in line)
        if "run_time_ns" in fields and "prog_type" in fields:
            time_ns += int(fields["run_time_ns"])
            count += int(fields["run_cnt"])
    return time_ns, count


def cpu_ns(pid):
    """The CPU time (user and system) of process pid so far, in ns."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * 10**9 // os.sysconf(
        "SC_CLK_TCK")


def stop(tool, timeout=300):
    """Stop usdt.stacks (process tool) as Ctrl-C does, read what it prints,
    and let it exit: (stdout, stderr, its CPU ns in all, read from the
    ended process before it is reaped, with what it did after the
    signal: the last records and, at the end, the lines decoded)."""
    tool.send_signal(signal.SIGINT)
    out = {}

    def read(name):
        stream = getattr(tool, name)
        out[name] = stream.read() if stream is not None else None

    readers = [threading.Thread(target=read, args=(name,))
               for name in ("stdout", "stderr")]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    # Ended, not reaped: /proc/PID/stat still holds its CPU time.
    while not os.waitid(os.P_PID, tool.pid,
                        os.WEXITED | os.WNOWAIT | os.WNOHANG):
        if time.monotonic() > deadline:
            tool.kill()
            sys.exit("usdt.stacks did not stop %d s after SIGINT" % timeout)
        time.sleep(0.01)
    total = cpu_ns(tool.pid)
    tool.wait()
    for reader in readers:
        reader.join()
    return out["stdout"], out["stderr"], total


def attached(tool, records):
    """The pid of the bpftrace that usdt.stacks (process tool, --save
    records) runs, once it has attached: its first record is there."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and tool.poll() is None:
        if os.path.exists(records) and os.path.getsize(records):
            break
        time.sleep(0.05)
    if tool.poll() is not None:
        sys.exit("usdt.stacks failed: %s" % tool.stderr.read())
    return children(tool.pid)[0]


def traced_phase(pid, hz, seconds, python, native=True, depth=0):
    """Trace pid at hz for seconds: (start, end, BPF ns, runs, samples,
    the stack tool's CPU ns)."""
    with tempfile.TemporaryDirectory(prefix="whole-stacks") as tmp:
        records = os.path.join(tmp, "records")
        tool = subprocess.Popen(
            [sys.executable, TOOL, *(["--native"] if native else []),
             "--json", "--python", python,
             "--probe", "profile:hz:%d" % hz, "--save", records,
             "--max-depth", str(max(64, depth + 16)),
             "-p", str(pid)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        bpftrace = attached(tool, records)
        before = bpf_stats(bpftrace)
        tool_before = cpu_ns(tool.pid)
        start = time.monotonic_ns()
        time.sleep(seconds)
        end = time.monotonic_ns()
        after = bpf_stats(bpftrace)
        tool_ns = cpu_ns(tool.pid) - tool_before
        stdout, stderr, total = stop(tool)
        samples = sum(row["count"] for row in json.loads(stdout))
    # samples: over the whole run of the tool, a little longer than the
    # phase; the BPF statistics are those of the phase.
    return (start, end, after[0] - before[0], after[1] - before[1], samples,
            tool_ns, total - tool_before)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--out-json")
    parser.add_argument("--depth", type=int, default=0,
                        help="frames of nest() under the workload's rounds")
    parser.add_argument("--rates", default="99,999",
                        help="the sampling rates, Hz (default 99,999)")
    parser.add_argument("--python-only", action="store_true",
                        help="without --native: the Python stacks' walk "
                        "alone, for comparison")
    args = parser.parse_args()
    with open(STATS) as f:
        stats_before = f.read().strip()
    with open(STATS, "w") as f:
        f.write("1")
    rates = [int(hz) for hz in args.rates.split(",")]
    proc = subprocess.Popen([args.python, WORKLOAD, "20000", "3600",
                             str(args.depth)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        ready = proc.stdout.readline().split()
        assert ready[0] == "ready", ready
        rounds = Rounds(proc)
        time.sleep(2)  # warm up
        phases = []

        def idle():
            start = time.monotonic_ns()
            time.sleep(args.seconds)
            phases.append(("idle", start, time.monotonic_ns(), 0, 0, 0, 0,
                           0))

        for _ in range(args.cycles):
            for hz in rates:
                idle()
                phases.append((hz,) + traced_phase(proc.pid, hz,
                                                   args.seconds,
                                                   args.python,
                                                   not args.python_only,
                                                   args.depth))
        idle()
    finally:
        proc.stdin.close()
        proc.wait()
        with open(STATS, "w") as f:
            f.write(stats_before)
    results = []
    for i, (kind, start, end, ns, runs, samples, tool_ns,
            tool_total) in enumerate(phases):
        if kind == "idle":
            continue
        traced = statistics.median(rounds.between(start, end))
        idle_rounds = (rounds.between(*phases[i - 1][1:3])
                       + rounds.between(*phases[i + 1][1:3]))
        base = statistics.median(idle_rounds)
        results.append({
            "hz": kind, "bpf_runs": runs, "bpf_ns": ns,
            "bpf_ns_per_run": ns / runs if runs else None,
            "samples_in_process": samples,
            # The probe fires on every CPU, in any process; the walk runs
            # for this process's samples only: the BPF time of all runs
            # per sample of the process is an upper bound of a walk's.
            "bpf_ns_per_sample": ns / samples if samples else None,
            "depth": args.depth,
            "pystack_cpu_ns": tool_ns,
            "pystack_cpu_ns_per_sample": tool_ns / samples if samples
            else None,
            "pystack_cpu_ns_in_all": tool_total,
            "pystack_cpu_ns_per_sample_in_all": tool_total / samples
            if samples else None,
            "median_round_ms": traced / 1e6,
            "idle_median_round_ms": base / 1e6,
            "slowdown_percent": 100 * (traced / base - 1)})
    for hz in rates:
        rows = [r for r in results if r["hz"] == hz]
        print("%d Hz, depth %d: BPF time per sample of the process %s us, "
              "usdt.stacks CPU per sample %s us while tracing, %s us in all "
              "(%s samples), slowdown %s %% (median %.2f %%)"
              % (hz, args.depth,
                 ", ".join("%.1f" % (r["bpf_ns_per_sample"] / 1e3)
                           for r in rows),
                 ", ".join("%.1f" % (r["pystack_cpu_ns_per_sample"] / 1e3)
                           for r in rows),
                 ", ".join("%.1f" % (
                     r["pystack_cpu_ns_per_sample_in_all"] / 1e3)
                           for r in rows),
                 ", ".join(str(r["samples_in_process"]) for r in rows),
                 ", ".join("%+.2f" % r["slowdown_percent"] for r in rows),
                 statistics.median(r["slowdown_percent"] for r in rows)))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
