"""otel_memory:alloc and otel_memory:free against exact tracemalloc.

bpftrace runs data/alloc_workload.py with the probes armed from the start
(so the allocator wrapper is installed before the first frame, and
tracemalloc.start() installs itself under it).  The workload allocates
objects of known sizes between two sys.audit() markers and prints what
tracemalloc, exact in the same process, saw.  The program counts the
weights of the phase's sampled allocations (their sum estimates the bytes
allocated) and of those still live at its end marker, and over the whole
run checks the contract's pointer rule: a free only for a pointer that an
alloc reported and that was not freed since, and no alloc of a pointer that
is still live (which would mean that its free was missed).
"""

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from support import (Bpftrace, PYTHON, Semaphore, USDT_PACKAGE,
                     bpftrace_env, free_threaded, iter_lines, pystack_filename,
                     readline, start, tracer_unusable)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "data", "alloc_workload.py")
DRIVEN = os.path.join(HERE, "data", "alloc_driven.py")
SITES = os.path.join(HERE, "data", "alloc_sites.py")
# Its name as usdt.stacks prints it (cut in a clone under a deep directory).
SHOWN = pystack_filename(SITES)
PYSTACK = os.path.join(USDT_PACKAGE, "stacks")
# usdt.stacks runs under any Python 3: the system's, as test_stack_tool runs it.
TOOL_PYTHON = shutil.which("python3") or sys.executable

# @w[ptr]: weight of each live sampled pointer.  @on: inside the phase.
# @pw[ptr]: weight of the live pointers sampled in the phase.  A key is
# deleted only where it is set: bpftrace 0.23 warns of each delete of a
# missing key, on the stdout it shares with the workload, and one such
# warning once landed inside a TRUTH line.
PROGRAM = """
usdt:%(p)s:python:audit /pid == cpid && str(arg0) == "usdt.alloc.begin"/
{ @on = 1; }
usdt:%(p)s:python:audit /pid == cpid && str(arg0) == "usdt.alloc.end"/
{ @on = 0; }
usdt:%(p)s:otel_memory:alloc /pid == cpid/
{
  if (@w[arg0] != 0) { @alloc_of_live = count(); }
  if (arg2 == 0 || arg1 == 0) { @bad_args = count(); }
  @w[arg0] = arg2;
  @allocs = count();
  if (@on) { @pw[arg0] = arg2; @phase_weight = sum(arg2);
             @phase_samples = count(); }
}
usdt:%(p)s:otel_memory:free /pid == cpid/
{
  if (@w[arg0] == 0) { @free_of_unknown = count(); }
  else { delete(@w[arg0]); }
  @frees = count();
  if (@pw[arg0] != 0) {
    if (@on) { @phase_freed = sum(@pw[arg0]); }
    delete(@pw[arg0]);
  }
}
END { clear(@w); clear(@pw); clear(@on); }
"""


def run_workload(mode, interval=None):
    """({map: value}, {truth name: bytes}) of one run of the workload."""
    reason = Bpftrace.usable()
    if reason is not None:
        tracer_unusable(reason)
    env = bpftrace_env(keys=262144, ALLOC_MODE=mode)
    env.pop("PYTHONUSDTALLOCINTERVAL", None)
    if interval is not None:
        env["PYTHONUSDTALLOCINTERVAL"] = str(interval)
    proc = Bpftrace.run(PROGRAM % {"p": PYTHON}, WORKLOAD, env=env,
                        timeout=600)
    if proc.returncode != 0 or "DONE" not in proc.stdout:
        raise AssertionError("bpftrace exit %d: %s\n%s"
                             % (proc.returncode, Bpftrace.errors(proc),
                                proc.stdout[-2000:]))
    maps = {name: value for name, keys, value in Bpftrace.maps(proc.stdout)
            if not keys}
    truth = {}
    for line in proc.stdout.splitlines():
        fields = line.split()
        if fields[:1] == ["TRUTH"]:
            truth[fields[1]] = int(fields[2])
    return maps, truth


class AllocProbes(unittest.TestCase):

    def check_pointer_rule(self, maps):
        self.assertGreater(maps.get("allocs", 0), 0)
        self.assertGreater(maps.get("frees", 0), 0)
        self.assertEqual(maps.get("free_of_unknown", 0), 0,
                         "free of a pointer not sampled, or freed twice")
        self.assertEqual(maps.get("alloc_of_live", 0), 0,
                         "alloc of a live sampled pointer: a missed free")
        self.assertEqual(maps.get("bad_args", 0), 0)

    def check_estimate(self, estimate, truth, tolerance):
        self.assertGreater(truth, 0)
        error = (estimate - truth) / truth
        self.assertLessEqual(abs(error), tolerance,
                             "estimate %d, tracemalloc %d (%+.1f %%)"
                             % (estimate, truth, 100 * error))

    def test_large_total(self):
        # 1 MiB allocations at the default interval (512 KiB).
        maps, truth = run_workload("large")
        self.check_pointer_rule(maps)
        self.check_estimate(maps["phase_weight"], truth["total"], 0.10)

    def test_small_total(self):
        # 10 KB allocations at the default interval.
        maps, truth = run_workload("small")
        self.check_pointer_rule(maps)
        self.check_estimate(maps["phase_weight"], truth["total"], 0.15)

    def check_live(self, mode, interval=16384):
        """The live estimate at the end of the phase of mode, at interval
        (-X usdt_alloc_interval's variable; 16 KiB), within 10 % of
        tracemalloc's; the run's maps."""
        maps, truth = run_workload(mode, interval=interval)
        self.check_pointer_rule(maps)
        live = maps["phase_weight"] - maps.get("phase_freed", 0)
        self.check_estimate(live, truth["live"], 0.10)
        return maps

    def test_live(self):
        # 8000 samples.
        self.check_live("live")

    def test_live_with_tracemalloc_restarted(self):
        self.check_live("restart")

    def test_threads(self):
        # Four threads allocating and freeing at once: one countdown each,
        # one shared set.
        self.check_live("threads")

    def test_realloc(self):
        # Buffers grown by realloc: each realloc is a free of the old
        # pointer (if sampled) and an allocation of the new size.
        self.check_live("realloc")

    def test_interval_scales_boundaries(self):
        # Eight times the interval: an eighth of the boundaries crossed
        # (weight / interval; about 1000 at the larger one), and both
        # estimates still right.
        crossed = []
        for interval in (16384, 8 * 16384):
            maps = self.check_live("live", interval)
            self.assertEqual(maps["phase_weight"] % interval, 0)
            crossed.append(maps["phase_weight"] // interval)
        ratio = crossed[0] / crossed[1]
        self.assertGreater(ratio, 7, crossed)
        self.assertLess(ratio, 9, crossed)


class PerSite(unittest.TestCase):
    """usdt.stacks --weight arg2 at otel_memory:alloc: the bytes allocated
    per Python stack (in-BPF walker), against tracemalloc per line."""

    def sites(self, *options):
        """({site: estimated bytes}, {site: tracemalloc's bytes}, total)
        of usdt.stacks with *options* on data/alloc_sites.py."""
        reason = Bpftrace.usable()
        if reason is not None:
            tracer_unusable(reason)
        command = "%s %s" % (PYTHON, SITES)
        if " " in PYTHON or " " in SITES:
            raise ValueError("bpftrace -c splits on spaces: %r" % command)
        # 64 KiB: about 2700 and 900 boundaries at the two kept sites.
        env = dict(os.environ, PYTHONUSDTALLOCINTERVAL="65536")
        proc = subprocess.run(
            [TOOL_PYTHON, PYSTACK, "--probe",
             "usdt:PYTHON:otel_memory:alloc", "--weight", "arg2",
             *options, "--python", PYTHON, "--json", "-c", command],
            capture_output=True, text=True, env=env, timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("lost", proc.stderr)
        start = proc.stdout.index("[")
        truth = {}
        for line in proc.stdout[:start].splitlines():
            fields = line.split()
            if fields[:1] == ["TRUTH"]:
                truth[fields[1]] = int(fields[2])
        estimate = collections.Counter()
        total = 0
        for row in json.loads(proc.stdout[start:]):
            total += row["count"]
            inner = row["frames"][0]
            if inner["filename"] == SHOWN:
                estimate[inner["name"]] += row["count"]
        return estimate, truth, total

    def check_sites(self, estimate, truth, total):
        self.assertEqual(set(truth), {"big", "small"})
        for site in ("big", "small"):
            # Each above 5 % of all the bytes sampled in the run.
            self.assertGreater(estimate[site], total / 20, (site, total))
            error = (estimate[site] - truth[site]) / truth[site]
            self.assertLessEqual(abs(error), 0.15,
                                 "%s: estimate %d, tracemalloc %d (%+.1f %%)"
                                 % (site, estimate[site], truth[site],
                                    100 * error))

    def test_sites_against_tracemalloc(self):
        # Bytes allocated per stack: churn() allocated too.
        estimate, truth, total = self.sites()
        self.check_sites(estimate, truth, total)
        self.assertGreater(estimate["churn"], total / 20)

    def test_live_sites_against_tracemalloc(self):
        # Bytes live at the end per stack (--live: the frees of the sampled
        # pointers taken out): churn() holds nothing.
        estimate, truth, total = self.sites(
            "--live", "arg0", "usdt:PYTHON:otel_memory:free", "arg0")
        self.check_sites(estimate, truth, total)
        self.assertEqual(estimate["churn"], 0)


class ToolTables(unittest.TestCase):
    """python -m usdt.tools alloc: its tables by line, function and file,
    against tracemalloc per line, and against each other."""

    ROW = re.compile(r"^ +([\d,]+) +([\d.]+)%  (.+)$")

    def tables(self, *options):
        """({table: {key: bytes}}, the header, tracemalloc's {site: bytes})
        of usdt.tools alloc on data/alloc_sites.py."""
        reason = Bpftrace.usable()
        if reason is not None:
            tracer_unusable(reason)
        if " " in PYTHON or " " in SITES:
            raise ValueError("bpftrace -c splits on spaces")
        env = dict(os.environ, PYTHONUSDTALLOCINTERVAL="65536")
        proc = subprocess.run(
            [PYTHON, "-m", "usdt.tools", "alloc", "--top", "1000", *options,
             "-c", "%s %s" % (PYTHON, SITES)],
            capture_output=True, text=True, env=env, timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        truth = {}
        tables = {}
        header = None
        table = None
        for line in proc.stdout.splitlines():
            fields = line.split()
            if fields[:1] == ["TRUTH"]:
                truth[fields[1]] = int(fields[2])
            elif line.startswith("Bytes "):
                header = line
            elif line.startswith("By "):
                table = tables.setdefault(line.split()[1], {})
            elif self.ROW.match(line):
                size, _, key = self.ROW.match(line).groups()
                self.assertNotIn(key, table, line)
                table[key] = int(size.replace(",", ""))
        self.assertEqual(set(tables), {"line", "function", "file"},
                         proc.stdout)
        return tables, header, truth

    def check(self, tables, header, truth):
        lines = {"big": 13, "small": 17}
        for site, number in lines.items():
            estimate = tables["line"]["%s:%d (%s)" % (SHOWN, number, site)]
            error = (estimate - truth[site]) / truth[site]
            self.assertLessEqual(abs(error), 0.15,
                                 "%s: estimate %d, tracemalloc %d"
                                 % (site, estimate, truth[site]))
            # One line per function here: the function's row is the line's.
            self.assertEqual(tables["function"]["%s (%s)" % (site, SHOWN)],
                             estimate)
        # Every table sums the same bytes, and the file's row sums its
        # lines.
        sums = {name: sum(table.values()) for name, table in tables.items()}
        self.assertEqual(len(set(sums.values())), 1, sums)
        total = int(re.search(r": ([\d,]+) \(", header).group(1)
                    .replace(",", ""))
        self.assertEqual(sums["line"], total, header)
        self.assertEqual(tables["file"][SHOWN],
                         sum(size for key, size in tables["line"].items()
                             if key.startswith(SHOWN + ":")))

    def test_allocated(self):
        tables, header, truth = self.tables()
        self.check(tables, header, truth)
        self.assertTrue(header.startswith("Bytes allocated: "), header)
        # churn() allocated 200 MB, and dropped them
        self.assertGreater(tables["function"]["churn (%s)" % SHOWN],
                           150 * 10**6)

    def test_live(self):
        tables, header, truth = self.tables("--live")
        self.check(tables, header, truth)
        self.assertTrue(header.startswith("Bytes still allocated"), header)
        self.assertNotIn("churn (%s)" % SHOWN, tables["function"])


def allocator_functions(pid):
    """The names of the malloc functions that the raw, mem and object
    domains call in process pid, read by gdb (which stops it meanwhile)."""
    commands = []
    for domain in ("raw", "mem", "obj"):
        commands += ["-ex", "p _PyRuntime.allocators.standard.%s.malloc"
                     % domain]
    proc = subprocess.run(["gdb", "-batch", "-nx", "-p", str(pid),
                           *commands], capture_output=True, timeout=300)
    names = re.findall(rb"^\$\d+ = .* <(\w+)>$", proc.stdout, re.M)
    if len(names) != 3:
        raise AssertionError("gdb: %s %s" % (proc.stdout, proc.stderr))
    return [name.decode() for name in names]


class WrapAndUnwrap(unittest.TestCase):
    """Arming at run time, by the semaphore alone (as the kernel sets it
    for a tracer), with tracemalloc started and stopped on both sides: the
    wrapper goes on within the watcher's poll, stays on top of tracemalloc,
    and comes off leaving exactly what is under it."""

    WRAPPER = ["raw_malloc", "mem_malloc", "obj_malloc"]

    def setUp(self):
        if os.geteuid() != 0:
            tracer_unusable("arming through /proc/PID/mem needs root")
        self.armed = 0
        self.addCleanup(self.disarm_all)
        self.restart()

    def restart(self, **env):
        """(Re)start the driven process, with *env* added."""
        if getattr(self, "proc", None) is not None:
            self.command("quit")
            self.proc.wait(timeout=60)
        self.proc = start(self, [PYTHON, DRIVEN], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE,
                          env=dict(os.environ, **env))
        self.assertEqual(readline(self.proc.stdout, 60, "the driven "
                                  "process did not say 'ready'"), "ready\n")
        self.semaphore = Semaphore(self.proc.pid, "alloc",
                                   provider="otel_memory")

    def disarm_all(self):
        if self.armed and self.proc.poll() is None:
            self.semaphore.add(-self.armed)

    def command(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return readline(self.proc.stdout, 120, "the driven process did not "
                        "answer %r" % text).strip()

    def wait_functions(self, expected):
        """Poll gdb until the domains call *expected* (the watcher polls
        once a second); the names seen last."""
        deadline = time.monotonic() + 10
        while True:
            names = allocator_functions(self.proc.pid)
            if names == expected or time.monotonic() > deadline:
                return names

    def arm(self, delta):
        self.semaphore.add(delta)
        self.armed += delta

    def dropped(self):
        """_PyDTrace_AllocDropped of the process, from /proc/PID/mem (its
        link-time address plus the load bias)."""
        symbols = subprocess.run(["nm", PYTHON], capture_output=True,
                                 text=True, check=True).stdout
        (address,) = [int(line.split()[0], 16)
                      for line in symbols.splitlines()
                      if line.endswith(" _PyDTrace_AllocDropped")]
        with open("/proc/%d/mem" % self.proc.pid, "rb") as f:
            f.seek(self.semaphore._load_bias() + address)
            return int.from_bytes(f.read(8), sys.byteorder)

    def test_full_set_is_counted(self):
        # Every byte a boundary (interval 1): more live sampled pointers
        # than the set holds (24576).  Those that do not fit are counted.
        self.restart(PYTHONUSDTALLOCINTERVAL="1")
        self.assertEqual(self.dropped(), 0)
        self.arm(1)
        self.assertEqual(self.wait_functions(self.WRAPPER), self.WRAPPER)
        self.assertEqual(self.command("keep"), "kept 40000")
        self.assertGreater(self.dropped(), 0)
        self.arm(-1)
        self.assertEqual(self.command("quit"), "bye")

    def test_wrap_unwrap_while_threads_allocate(self):
        # Four threads allocate without pause (in the free-threaded build
        # at the same time as the thread that wraps): the wrapper goes on
        # and off five times under them, then they stop and find every
        # round's data intact.
        plain = allocator_functions(self.proc.pid)
        self.assertEqual(self.command("churn_start"), "churning")
        for _ in range(5):
            self.arm(1)
            self.assertEqual(self.wait_functions(self.WRAPPER),
                             self.WRAPPER)
            self.arm(-1)
            self.assertEqual(self.wait_functions(plain), plain)
        self.assertEqual(self.command("churn_stop"),
                         "churned True intact True")
        self.assertEqual(self.command("quit"), "bye")
        self.assertEqual(self.proc.wait(timeout=60), 0)

    def test_swapped_under_the_allocators_lock(self):
        # gdb stops at each swap of a domain's functions and reads what
        # holds the other threads out of the allocators: the allocators'
        # mutex, and the world stopped (free-threaded build) or the GIL
        # held (default build).
        held = ("_PyRuntime.stoptheworld.world_stopped" if free_threaded()
                else "_PyRuntime.interpreters.main->ceval.gil->locked")
        script = os.path.join(self.enterContext(
            tempfile.TemporaryDirectory(prefix="cpython-usdt-test-")),
            "swaps.gdb")
        with open(script, "w") as f:
            f.write("set pagination off\n"
                    "break store_functions\n"
                    "commands\n"
                    "silent\n"
                    'printf "SWAP mutex %%d held %%d\\n", '
                    "_PyRuntime.allocators.mutex._bits & 1, %s\n"
                    "continue\n"
                    "end\n"
                    'echo READY\\n\n'
                    "continue\n" % held)
        gdb = start(self, ["gdb", "-batch", "-nx", "-p", str(self.proc.pid),
                           "-x", script], stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT)
        output = []
        for line in iter_lines(gdb.stdout, 120,
                               "gdb did not attach and say READY"):
            output.append(line)
            if line == "READY\n":
                break
        else:
            self.fail("gdb: %s" % "".join(output))
        self.arm(1)
        self.assertEqual(self.command("alloc"), "allocated")
        swaps = []

        def read_swaps(count):
            for line in iter_lines(gdb.stdout, 120, "gdb did not print "
                                   "%d SWAP lines" % count):
                output.append(line)
                if line.startswith("SWAP"):
                    swaps.append(line.split()[1:])
                    if len(swaps) == count:
                        return
            self.fail("gdb: %s" % "".join(output))

        read_swaps(3)
        self.arm(-1)
        read_swaps(6)
        self.assertEqual(self.command("quit"), "bye")
        self.assertEqual(self.proc.wait(timeout=60), 0)
        gdb.wait(timeout=60)
        self.assertEqual(swaps, [["mutex", "1", "held", "1"]] * 6,
                         "".join(output))

    def test_wrap_unwrap_with_tracemalloc(self):
        plain = allocator_functions(self.proc.pid)
        if free_threaded():
            self.assertEqual(plain, ["_PyMem_RawMalloc", "_PyMem_MiMalloc",
                                     "_PyObject_MiMalloc"])
        else:
            self.assertEqual(plain, ["_PyMem_RawMalloc", "_PyObject_Malloc",
                                     "_PyObject_Malloc"])
        self.assertEqual(self.command("tm_start"), "tracing True")
        traced = allocator_functions(self.proc.pid)
        self.assertNotEqual(traced, plain)
        # Armed over tracemalloc.
        self.arm(1)
        self.assertEqual(self.wait_functions(self.WRAPPER), self.WRAPPER)
        self.assertEqual(self.command("alloc"), "allocated")
        self.assertEqual(self.command("check"), "check exact True")
        # tracemalloc stopped and started again under the wrapper.
        self.assertEqual(self.command("tm_stop"), "tracing False")
        self.assertEqual(allocator_functions(self.proc.pid), self.WRAPPER)
        self.assertEqual(self.command("alloc"), "allocated")
        self.assertEqual(self.command("tm_start"), "tracing True")
        self.assertEqual(self.command("check"), "check exact True")
        # A second tracer, then both leave: unwrapped only at the last.
        self.arm(1)
        self.arm(-1)
        time.sleep(2.5)
        self.assertEqual(allocator_functions(self.proc.pid), self.WRAPPER)
        self.arm(-1)
        self.assertEqual(self.wait_functions(traced), traced)
        self.assertEqual(self.command("check"), "check exact True")
        self.assertEqual(self.command("tm_stop"), "tracing False")
        self.assertEqual(allocator_functions(self.proc.pid), plain)
        # Armed again, with nothing else installed.
        self.arm(1)
        self.assertEqual(self.wait_functions(self.WRAPPER), self.WRAPPER)
        self.assertEqual(self.command("alloc"), "allocated")
        self.arm(-1)
        self.assertEqual(self.wait_functions(plain), plain)
        self.assertEqual(self.command("quit"), "bye")
        self.assertEqual(self.proc.wait(timeout=60), 0)


if __name__ == "__main__":
    unittest.main()
