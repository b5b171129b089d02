"""python:stacks__enable: call speed before, while and after a tracer arms it.

One process runs bench/stacks_workload.py, a call-heavy loop timed in fixed
rounds.  Its phases, each SECONDS long:

  before  nothing attached;
  armed   `bpftrace -p PID` arms python:stacks__enable, and the perf map
          (/tmp/perf-PID.map) shows that the trampoline is on: every
          Python call then goes through it and none is inlined;
  after   bpftrace has exited (SIGINT), a mark shows the trampoline off,
          and SETTLE seconds have passed since the exit (one watcher poll
          and the call sites' re-specialization).

before / armed / after is repeated CYCLES times in the same process, with
its RSS and the perf map's size after each phase, so that a leak across
arm/disarm cycles would show too, and the workload's quickened
instructions, so that call sites left unspecialized by a disarm would.
One unarmed control phase before the first cycle gives the noise of
comparing two unarmed phases.  Only rounds
that start and end inside a phase count.  The verdict on "disarming
returns the process to its unarmed speed" and its criterion are in
verdict() and in the report.

usage: python3 bench/stacks.py PYTHON [--seconds S] [--cycles K]
           [--out-md F] [--out-json F]
Run as root (bpftrace).
"""

import argparse
import json
import math
import os
import queue
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOAD = os.path.join(TOP, "bench", "stacks_workload.py")
# The workload's functions, by the qualified names the perf map lists.
FUNCTIONS = ("one_round", "outer", "middle", "inner", "leaf",
             "Vec.__init__", "Vec.add", "Vec.dot")
MARK_FILE = "<stacks-mark>"
PHASES = ("before", "armed", "after")
BOOTSTRAP = 2000
# Block bootstrap: rounds are resampled in blocks of this many seconds of
# consecutive rounds, because load on the machine comes in bursts that
# make neighbouring rounds alike.
BLOCK_S = 1.0


def shown(path):
    """path relative to the repository if it is inside it."""
    rel = os.path.relpath(os.path.abspath(path), TOP)
    return path if rel.startswith("..") else rel


class Lines:
    """The lines of a child's pipe, read by a thread into a queue."""

    def __init__(self, pipe, handle=None):
        self.queue = queue.Queue()
        self.text = []
        self.handle = handle
        self.thread = threading.Thread(target=self._read, args=(pipe,),
                                       daemon=True)
        self.thread.start()

    def _read(self, pipe):
        for line in pipe:
            line = line.rstrip("\n")
            if self.handle is None or not self.handle(line):
                self.text.append(line)
                self.queue.put(line)
        self.queue.put(None)

    def first(self, wanted, timeout):
        """The first line for which wanted(line) is true; None at EOF or
        timeout."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.queue.get(
                    timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None or wanted(line):
                return line

    def wait_for(self, wanted, timeout):
        """True once the line `wanted` came, False at EOF or timeout."""
        return self.first(lambda line: line == wanted, timeout) is not None


class Workload:
    def __init__(self, python, round_calls, limit):
        self.rounds = []          # (end_ns, duration_ns)
        self.proc = subprocess.Popen(
            [python, "-E", "-X", "dtrace_stacks", WORKLOAD, str(round_calls),
             str(limit)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.out = Lines(self.proc.stdout, self._round)
        self.pid = None
        try:
            line = self.out.queue.get(timeout=60)
        except queue.Empty:
            line = None
        match = re.fullmatch(r"ready (\d+)", line or "")
        if match is None:
            self.close()
            raise SystemExit("the workload did not start: %r" % line)
        self.pid = int(match.group(1))
        self.map = "/tmp/perf-%d.map" % self.pid
        # With pid_max often 32768, an earlier process with this PID may
        # have left a perf map: its size is subtracted, and the marks carry
        # a name of this run's own.
        self.stale = perf_map(self.map)[1:3]
        self.token = os.urandom(3).hex()

    def _round(self, line):
        if not line.startswith("round "):
            return False
        end, duration = map(int, line.split()[1:])
        self.rounds.append((end, duration))
        return True

    def between(self, t0, t1):
        """[(end_ns, duration_ns)] of the rounds inside [t0, t1]."""
        return [(end, d) for end, d in list(self.rounds)
                if end - d >= t0 and end <= t1]

    def mark(self, what):
        """Call the workload's function for `what` (stacks_workload.py)
        and return the function's name."""
        name = "stacks_%s_%s" % (self.token, what)
        self.proc.stdin.write("mark %s\n" % name)
        self.proc.stdin.flush()
        if not self.out.wait_for("marked %s" % name, 30):
            raise SystemExit("the workload did not answer mark %s" % name)
        return name

    def specialization(self):
        """{opname: count} of the workload's functions right now
        (stacks_workload.py's "spec")."""
        self.proc.stdin.write("spec\n")
        self.proc.stdin.flush()
        line = self.out.first(lambda line: line.startswith("spec "), 30)
        if line is None:
            raise SystemExit("the workload did not answer spec")
        return {op: int(n) for op, _, n in
                (item.partition("=") for item in line.split()[1:])}

    def listed(self, what):
        """Call the function for `what`: is it in the perf map?"""
        name = self.mark(what)
        return "py::%s:%s" % (name, MARK_FILE) in perf_map(self.map)[0]

    def map_size(self):
        """(bytes, lines, marks of this run) the perf map has gained."""
        names, size, lines, entries = perf_map(self.map)
        marks = sum(1 for e in entries if e.startswith(
            "py::stacks_%s_" % self.token) and e.endswith(":" + MARK_FILE))
        return size - self.stale[0], lines - self.stale[1], marks

    def rss_kb(self):
        with open("/proc/%d/status" % self.pid) as f:
            return int(re.search(r"^VmRSS:\s*(\d+) kB", f.read(),
                                 re.M).group(1))

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.thread.join(5)


def perf_map(path):
    """(set of entry names, size in bytes, lines, [entry names]) of a perf
    map."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return set(), 0, 0, []
    entries = [line.split(" ", 2)[2] for line in text.splitlines()
               if line.count(" ") >= 2]
    return set(entries), len(text.encode()), text.count("\n"), entries


class Tracer:
    """bpftrace -p PID holding python:stacks__enable armed."""

    def __init__(self, python, pid, timeout):
        program = ('usdt:%s:python:stacks__enable {} '
                   'BEGIN { printf("attached\\n"); }' % python)
        self.proc = subprocess.Popen(
            ["bpftrace", "-q", "-p", str(pid), "-e", program],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out = Lines(self.proc.stdout)
        self.err = Lines(self.proc.stderr)
        # A SIGINT that comes before BEGIN is lost: wait for it.
        if not self.out.wait_for("attached", timeout):
            self.stop()
            raise SystemExit("bpftrace did not start within %d s: %s"
                             % (timeout, self.errors()))
        self.began = time.monotonic()

    def errors(self):
        self.err.thread.join(1)
        return "\n".join(line for line in self.err.text
                         if "RLIMIT_MEMLOCK" not in line).strip() or "-"

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        """SIGINT, then bpftrace's exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out.thread.join(5)
        self.err.thread.join(5)
        return self.proc.returncode


def wait_on(work, tracer, cycle, timeout):
    """Seconds from bpftrace's BEGIN until the trampoline is on: the
    perf map lists the workload's functions and this cycle's mark (the
    functions stay listed after the first cycle, a fresh mark does not)."""
    wanted = {"py::%s:%s" % (f, WORKLOAD) for f in FUNCTIONS}
    while True:
        name = work.mark("on_c%d" % cycle)
        entry = "py::%s:%s" % (name, MARK_FILE)
        names = perf_map(work.map)[0]
        if entry in names and wanted <= names:
            return time.monotonic() - tracer.began
        if not tracer.alive():
            raise SystemExit("bpftrace exited (%s): %s"
                             % (tracer.proc.returncode, tracer.errors()))
        if time.monotonic() - tracer.began > timeout:
            raise SystemExit(
                "the trampoline did not come on within %d s of bpftrace's "
                "BEGIN: %s lists %s of the workload's functions and %s "
                "mark %s" % (timeout, work.map, len(wanted & names) or "none",
                             "its" if entry in names else "not the", name))
        time.sleep(0.2)


def wait_off(work, since, cycle, timeout):
    """Seconds from `since` until a fresh mark is no longer listed."""
    for n in range(10 ** 6):
        what = "off_c%d_%d" % (cycle, n)
        if not work.listed(what):
            return time.monotonic() - since
        if time.monotonic() - since > timeout:
            raise SystemExit("the trampoline is still on %d s after "
                             "bpftrace exited (mark %s is listed in %s; "
                             "or another tracer holds the marker)"
                             % (timeout, what, work.map))
        time.sleep(0.2)


def check_off(work, what):
    """Fail unless the trampoline is off: a tracer of the whole binary
    (bpftrace without -p) arms the marker in this process too."""
    if work.listed(what):
        others = subprocess.run(["pgrep", "-a", "bpftrace"],
                                stdout=subprocess.PIPE, text=True).stdout
        raise SystemExit(
            "the trampoline is on while this benchmark has no tracer "
            "attached (mark %s is listed in %s).  A tracer of the whole "
            "binary arms python:stacks__enable in every process of it; "
            "bpftrace running now:\n%s" % (what, work.map,
                                           others.strip() or "none"))


def phase(work, seconds):
    t0 = time.monotonic_ns()
    time.sleep(seconds)
    t1 = time.monotonic_ns()
    rounds = work.between(t0, t1)
    if len(rounds) < 10:
        raise SystemExit("only %d rounds in a %g s phase" % (len(rounds),
                                                            seconds))
    size, lines, marks = work.map_size()
    return {"t0_ns": t0, "t1_ns": t1, "spec": work.specialization(),
            "end_ns": [e - t0 for e, _ in rounds],
            "round_ns": [d for _, d in rounds],
            "rss_kb": work.rss_kb(), "perf_map_bytes": size,
            "perf_map_lines": lines, "perf_map_marks": marks}


def measure(opts, python):
    limit = int(opts.warmup + 2 * opts.seconds + opts.settle
                + opts.cycles * (3 * opts.seconds + opts.settle
                                 + 2 * opts.arm_timeout + 60) + 120)
    work = Workload(python, opts.round_calls, limit)
    cycles = []
    tracer = None
    try:
        time.sleep(opts.warmup)
        # The A/A comparison: an unarmed phase as far from cycle 1's
        # before phase as an after phase is from its before phase.
        print("control", file=sys.stderr)
        check_off(work, "off_control_0")
        control = phase(work, opts.seconds)
        check_off(work, "off_control_1")
        time.sleep(opts.seconds + opts.settle + 1.5)
        for cycle in range(1, opts.cycles + 1):
            print("cycle %d/%d: before" % (cycle, opts.cycles),
                  file=sys.stderr)
            check_off(work, "off_c%d_b0" % cycle)
            before = phase(work, opts.seconds)
            check_off(work, "off_c%d_b1" % cycle)

            print("cycle %d/%d: arming" % (cycle, opts.cycles),
                  file=sys.stderr)
            tracer = Tracer(python, work.pid, opts.arm_timeout)
            arm_s = wait_on(work, tracer, cycle, opts.arm_timeout)
            time.sleep(0.5)
            armed = phase(work, opts.seconds)
            if not tracer.alive():
                raise SystemExit("bpftrace exited while armed: %s"
                                 % tracer.errors())

            print("cycle %d/%d: disarming" % (cycle, opts.cycles),
                  file=sys.stderr)
            status = tracer.stop()
            tracer = None
            exited = time.monotonic()
            off_s = wait_off(work, exited, cycle, opts.arm_timeout)
            time.sleep(max(0.0, exited + opts.settle - time.monotonic()))
            after = phase(work, opts.seconds)
            check_off(work, "off_c%d_a1" % cycle)
            cycles.append({"cycle": cycle, "arm_s": arm_s,
                           "bpftrace_status": status, "off_s": off_s,
                           "before": before, "armed": armed,
                           "after": after})
    finally:
        if tracer is not None:
            tracer.stop()
        work.close()
        # The sizes are in the results; the map itself is of no use to
        # anyone once the process is gone.
        if os.path.exists(work.map):
            os.unlink(work.map)
    return control, cycles


def blocks(phase_data):
    """A phase's rounds cut into blocks of BLOCK_S seconds."""
    out = {}
    for end, d in zip(phase_data["end_ns"], phase_data["round_ns"]):
        out.setdefault(int(end // (BLOCK_S * 1e9)), []).append(d)
    return list(out.values())


def resample(rng, phase_blocks):
    """One block-bootstrap replicate's median."""
    n = sum(len(b) for b in phase_blocks)
    out = []
    while len(out) < n:
        out.extend(rng.choice(phase_blocks))
    return statistics.median(out[:n])


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def drift(rounds):
    """|median(second half) / median(first half) - 1| of a phase: how far
    the unarmed speed moves by itself within one phase."""
    half = len(rounds) // 2
    return abs(statistics.median(rounds[half:])
               / statistics.median(rounds[:half]) - 1)


def unarmed_noise(control, cycles):
    """{what: value}: how far unarmed speed moves with nothing changed.

    The control phase against cycle 1's before phase (two unarmed phases
    as far apart as a before and an after phase), and the drift within
    the control and each before phase.  After phases are left out: a slow
    return to unarmed speed would show there and pass for noise.
    """
    parts = {"before 1 / control": abs(
        statistics.median(cycles[0]["before"]["round_ns"])
        / statistics.median(control["round_ns"]) - 1),
        "control drift": drift(control["round_ns"])}
    for c in cycles:
        parts["before %d drift" % c["cycle"]] = drift(
            c["before"]["round_ns"])
    return parts


def verdict(after, after_ci, armed, noise):
    """The after/before verdict of one cycle, or of all together.

    inconclusive  the noise (unarmed_noise(), or the half-width of the
                  after/before interval) is at least half the armed
                  slowdown: a disarm that undid only half the slowdown
                  would not be told from noise;
    within noise  the 95 % interval of after/before includes 1.0, or
                  |after/before - 1| is at most the unarmed noise;
    slower/faster otherwise.
    """
    half_width = (after_ci[1] - after_ci[0]) / 2
    if max(noise, half_width) >= (armed - 1) / 2:
        return "inconclusive"
    if after_ci[0] <= 1.0 <= after_ci[1] or abs(after - 1) <= noise:
        return "within noise"
    return "slower" if after > 1 else "faster"


def summary(samples):
    return {"median_ns": statistics.median(samples),
            "quartiles_ns": statistics.quantiles(samples, n=4)}


def analyse(control, cycles):
    rng = random.Random(12345)
    control.update(summary(control["round_ns"]))
    parts = unarmed_noise(control, cycles)
    noise = max(parts.values())
    replicates = {"armed": [], "after": []}
    for c in cycles:
        for p in PHASES:
            c[p].update(summary(c[p]["round_ns"]))
        bl = {p: blocks(c[p]) for p in PHASES}
        reps = {p: [] for p in ("armed", "after")}
        for _ in range(BOOTSTRAP):
            base = resample(rng, bl["before"])
            for p in reps:
                reps[p].append(resample(rng, bl[p]) / base)
        c["ratio"] = {p: c[p]["median_ns"] / c["before"]["median_ns"]
                      for p in reps}
        c["ci95"] = {p: (percentile(reps[p], 0.025),
                         percentile(reps[p], 0.975)) for p in reps}
        c["verdict"] = verdict(c["ratio"]["after"], c["ci95"]["after"],
                               c["ratio"]["armed"], noise)
        for p in reps:
            replicates[p].append(reps[p])

    def geomean(values):
        return math.exp(sum(math.log(v) for v in values) / len(values))

    overall = {"ratio": {}, "ci95": {}, "noise": noise,
               "noise_parts": parts}
    for p in ("armed", "after"):
        overall["ratio"][p] = geomean([c["ratio"][p] for c in cycles])
        joint = [geomean(r) for r in zip(*replicates[p])]
        overall["ci95"][p] = (percentile(joint, 0.025),
                              percentile(joint, 0.975))
    pooled = verdict(overall["ratio"]["after"], overall["ci95"]["after"],
                     overall["ratio"]["armed"], noise)
    each = [c["verdict"] for c in cycles]
    conclusive = [v for v in each if v != "inconclusive"]
    if pooled == "within noise" and "slower" not in each:
        overall["verdict"] = "restored"
    elif (pooled == "slower" and conclusive
          and all(v == "slower" for v in conclusive)):
        overall["verdict"] = "NOT restored"
    else:
        overall["verdict"] = "inconclusive"
    overall["pooled"] = pooled
    return overall


def spec_change(base, now):
    """The opnames whose counts differ between base and now, as text."""
    changed = ["%s %+d" % (op, now.get(op, 0) - base.get(op, 0))
               for op in sorted(set(base) | set(now))
               if now.get(op, 0) != base.get(op, 0)]
    return ", ".join(changed) or "none"


def render(result):
    cfg = result["config"]
    control = result["control"]
    cycles = result["cycles"]
    overall = result["overall"]

    def ms(ns):
        return "%.2f ms" % (ns / 1e6)

    def ratio(c, p):
        lo, hi = c["ci95"][p]
        return "%.3f [%.3f, %.3f]" % (c["ratio"][p], lo, hi)

    def row(cycle, name, d, vs_before=""):
        q = d["quartiles_ns"]
        return "| %s | %s | %d | %s | %s – %s | %s |" % (
            cycle, name, len(d["round_ns"]), ms(d["median_ns"]), ms(q[0]),
            ms(q[2]), vs_before)

    lines = [
        "# python:stacks__enable: call speed armed and after disarm", "",
        "Generated by `%s`%s." % (result["command"],
                                  " (`make bench-stacks`)"
                                  if result["is_default"] else ""),
        "",
        ("Interpreter `%s`; %d CPUs; load average %s at the start, %s at "
         "the end.  %s" % (
             cfg["python"], result["host"]["cpus"],
             result["host"]["loadavg_start"], result["host"]["loadavg_end"],
             result["host"]["note"])).rstrip(),
        "",
        "One process runs `bench/stacks_workload.py`: rounds of %d calls of "
        "`outer()`, each about ten Python-to-Python calls (functions three "
        "levels deep, a constructor and two methods).  After %g s of "
        "unmeasured rounds comes a *control* phase, unarmed, then a pause "
        "as long as an armed phase and the steps around it, then %d cycles "
        "of *before* (nothing attached), *armed* (`bpftrace -p` holds "
        "`python:stacks__enable`; starts once the perf map lists the "
        "workload's functions and a fresh function called after the "
        "attach, then 0.5 s) and *after* (bpftrace exited on SIGINT, a "
        "freshly called function is no longer listed, and %g s have passed "
        "since the exit), phases of %g s each.  Only rounds that begin and "
        "end inside a phase count.  Before and after each unarmed phase a "
        "freshly called function is checked not to be listed (a tracer of "
        "the whole binary, bpftrace without `-p`, would arm the marker "
        "here too)." % (cfg["round_calls"], cfg["warmup"], cfg["cycles"],
                        cfg["settle"], cfg["seconds"]),
        "",
        "## Round time", "",
        "Median with quartiles; ratios to the same cycle's *before* median "
        "with a 95 %% block-bootstrap interval (%d resamples of %g-s blocks "
        "of consecutive rounds, so that bursts of load are resampled "
        "together)." % (BOOTSTRAP, BLOCK_S),
        "",
        "| cycle | phase | rounds | median | quartiles | / before |",
        "|---|---|---|---|---|---|",
        row("–", "control", control)]
    for c in cycles:
        for p in PHASES:
            lines.append(row(c["cycle"], p, c[p],
                             "" if p == "before" else ratio(c, p)))
    lines += [
        "", "| cycle | armed / before | after / before | "
        "trampoline on after | off after | verdict |",
        "|---|---|---|---|---|---|"]
    for c in cycles:
        lines.append("| %d | %s | %s | %.2f s | %.2f s | %s |" % (
            c["cycle"], ratio(c, "armed"), ratio(c, "after"),
            c["arm_s"], c["off_s"], c["verdict"]))
    lines.append("| all (geomean) | %s | %s | | | %s |" % (
        ratio(overall, "armed"), ratio(overall, "after"),
        overall["pooled"]))
    lines += [
        "",
        "*trampoline on after*: from bpftrace's `BEGIN` until the perf map "
        "lists a function called after it; *off after*: from bpftrace's "
        "exit until a freshly called function is not listed (polled every "
        "0.2 s, so both include up to 0.2 s of polling).",
        "",
        "**Unarmed noise: %.3f**, the largest of %s." % (
            overall["noise"], "; ".join(
                "%s: %.3f" % (k, v)
                for k, v in overall["noise_parts"].items())),
        "*before 1 / control* compares two unarmed phases as far apart as "
        "a *before* and its *after*; a *drift* is |median of a phase's "
        "second half / median of its first half − 1|.  *after* phases are "
        "not used: a slow return to unarmed speed would show there and "
        "pass for noise.",
        "",
        "## Verdict: %s" % overall["verdict"], "",
        "Requirement: \"Disarming returns the process to its unarmed "
        "speed.\"  For each cycle, and for the geometric mean over cycles "
        "(its interval from the same bootstrap replicates):",
        "",
        "- **inconclusive** if the unarmed noise, or the half-width of the "
        "after/before interval, is at least half of the armed slowdown "
        "(armed/before − 1): a disarm that undid only half of the slowdown "
        "could not be told from noise;",
        "- **within noise** if the after/before interval includes 1.0, or "
        "|after/before − 1| is at most the unarmed noise;",
        "- **slower** / **faster** otherwise.",
        "",
        "Overall **restored** if the geometric mean is within noise and no "
        "cycle is slower; **NOT restored** if the geometric mean is slower "
        "and so is every conclusive cycle; otherwise **inconclusive**.  "
        "Rounds are not independent (load moves whole stretches of them): "
        "the blocks widen the intervals for that, and the unarmed noise "
        "bounds what the machine does on its own between phases.",
        "",
        "## Memory and perf map across cycles", "",
        "RSS (`VmRSS`) and what `/tmp/perf-PID.map` has gained since the "
        "start (a map left by an earlier process with the same PID is not "
        "counted), at the end of each phase.  "
        "The trampolines, their code arena and the map entries are made "
        "once, at the first arming, and reused after; each cycle also adds "
        "the small functions the driver calls to see the trampoline on or "
        "off (*marks*: one listed per cycle, plus one for each poll that "
        "still found the trampoline on after bpftrace's exit).",
        "",
        "| cycle | phase | RSS | perf map | map lines (marks) |",
        "|---|---|---|---|---|"]
    for cycle, p, d in ([("–", "control", control)]
                        + [(c["cycle"], p, c[p])
                           for c in cycles for p in PHASES]):
        lines.append("| %s | %s | %d kB | %d B | %d (%d) |" % (
            cycle, p, d["rss_kb"], d["perf_map_bytes"],
            d["perf_map_lines"], d["perf_map_marks"]))
    lines += ["", "| cycle | RSS growth | map growth | map lines growth | "
              "of which marks |", "|---|---|---|---|---|"]
    prev = cycles[0]["before"]
    for c in cycles:
        d = c["after"]
        lines.append("| %d | %+d kB | %+d B | %+d | %+d |" % (
            c["cycle"], d["rss_kb"] - prev["rss_kb"],
            d["perf_map_bytes"] - prev["perf_map_bytes"],
            d["perf_map_lines"] - prev["perf_map_lines"],
            d["perf_map_marks"] - prev["perf_map_marks"]))
        prev = d
    lines += ["", "Growth of cycle 1 is from the end of its *before* phase, "
              "of later cycles from the end of the previous *after*.",
              ""]
    base = cycles[0]["before"]["spec"]
    lines += [
        "## Specialization across cycles", "",
        "The workload's own instructions (%s), quickened as the "
        "interpreter left them at the end of each phase "
        "(`dis.get_instructions(adaptive=True)`), against cycle 1's "
        "*before* phase: %s.  While the trampoline is on, Python-to-Python "
        "calls do not specialize; an *after* phase that differs from "
        "*before* would show call sites left slow by the disarm."
        % (", ".join("`%s`" % f for f in FUNCTIONS),
           ", ".join("%s %d" % kv for kv in sorted(base.items())
                     if kv[0].startswith("CALL"))),
        "", "| cycle | phase | instructions unlike cycle 1 before |",
        "|---|---|---|"]
    for cycle, p, d in ([("–", "control", control)]
                        + [(c["cycle"], p, c[p])
                           for c in cycles for p in PHASES]):
        lines.append("| %s | %s | %s |" % (cycle, p,
                                           spec_change(base, d["spec"])))
    lines.append("")
    lines += ["All round times are in `%s`." % result["json"], ""]
    return "\n".join(lines)


def check_tools(python):
    if shutil.which("bpftrace") is None:
        raise SystemExit("bpftrace not found (apt-get install bpftrace)")
    if os.geteuid() != 0:
        raise SystemExit("bpftrace needs root")
    if shutil.which("readelf"):
        notes = subprocess.run(["readelf", "-n", python],
                               stdout=subprocess.PIPE, text=True).stdout
        if "stacks__enable" not in notes:
            raise SystemExit("%s has no python:stacks__enable marker"
                             % python)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("python")
    p.add_argument("--seconds", type=float, default=20,
                   help="length of each phase (default 20)")
    p.add_argument("--cycles", type=int, default=3,
                   help="arm/disarm cycles (default 3)")
    p.add_argument("--settle", type=float, default=2.0,
                   help="seconds from bpftrace's exit to the after phase "
                   "(default 2)")
    p.add_argument("--warmup", type=float, default=3.0,
                   help="unmeasured seconds before the first cycle")
    p.add_argument("--round-calls", type=int, default=20000,
                   help="outer() calls per round (default 20000)")
    p.add_argument("--arm-timeout", type=float, default=15,
                   help="seconds to wait for the trampoline to go on/off")
    p.add_argument("--note", default="",
                   help="a sentence about the machine, for the report")
    p.add_argument("--out-md", default=os.path.join(TOP, "docs",
                                                    "stacks.md"))
    p.add_argument("--out-json", default=os.path.join(TOP, "bench",
                                                      "recorded",
                                                      "stacks.json"))
    opts = p.parse_args()
    python = os.path.abspath(opts.python)
    check_tools(python)

    defaults = {"seconds": 20, "cycles": 3, "settle": 2.0, "warmup": 3.0,
                "round_calls": 20000, "arm_timeout": 15}
    args = ["python3", "bench/stacks.py", shown(python)]
    for key, value in defaults.items():
        if getattr(opts, key) != value:
            args += ["--" + key.replace("_", "-"), "%g" % getattr(opts, key)]
    args += ["--out-md", shown(opts.out_md),
             "--out-json", shown(opts.out_json)]
    is_default = (all(getattr(opts, k) == v for k, v in defaults.items())
                  and os.path.abspath(opts.out_md)
                  == os.path.join(TOP, "docs", "stacks.md"))

    start = loadavg()
    control, cycles = measure(opts, python)
    overall = analyse(control, cycles)
    result = {
        "command": " ".join(args), "is_default": is_default,
        "json": shown(opts.out_json),
        "config": {"python": shown(python), "seconds": opts.seconds,
                   "cycles": opts.cycles, "settle": opts.settle,
                   "warmup": opts.warmup, "round_calls": opts.round_calls,
                   "bootstrap": BOOTSTRAP, "block_s": BLOCK_S},
        "host": {"cpus": os.cpu_count(), "loadavg_start": start,
                 "loadavg_end": loadavg(), "note": opts.note},
        "control": control, "cycles": cycles, "overall": overall}
    text = render(result)
    for path, data in ((opts.out_json, json.dumps(result, indent=1) + "\n"),
                       (opts.out_md, text)):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(data)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
