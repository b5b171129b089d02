"""The scripts of Lib/usdt/scripts/, run against the built interpreter.

Each bpftrace script runs as it is documented,

    bpftrace -q -c "PYTHON workload.py" Lib/usdt/scripts/SCRIPT.bt PYTHON [ARG]

on a small workload whose behaviour is known, and the test checks both the
shape of the output (the one Doc/howto/instrumentation.rst shows) and its
content.  Where the probes promise to match a Python-level hook (the
function and C function probes sys.setprofile(), the line probe
sys.settrace(), the exception probes sys.monitoring's exception events),
the expected output is computed by running the same workload under that
hook with the same interpreter; task steps are counted with
sys.monitoring too, and the thread and GIL scripts are checked against
what the workload prints about its threads.  pystat.bt is attached with
-p to a process that works on request, pyprofile.bt with -p to
test_stacks.py's workload.  examples/http_routes.bt, the howto's example
of probes defined with the usdt module, is attached with -p to the
example server, examples/http_routes.py.

The SystemTap scripts can only be checked here: `stap -p2` resolves their
probe points against the interpreter without running them.
"""

import collections
import concurrent.futures
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import tempfile
import textwrap
import threading
import time
import unittest
import urllib.error
import urllib.request

from support import (Bpftrace, Hang, PYTHON, SETTRACE_LINES, Semaphore, TOP,
                     USDT_PACKAGE, bpftrace_env, bpftrace_lines, bpftrace_module,
                     bpftrace_output, bpftrace_runner, free_threaded,
                     perf_map_entries, perf_map_path, readline,
                     require_bpftrace, run, stapsdt_notes, start)
from test_stacks import (CHAIN, WORKLOAD as STACKS_WORKLOAD, bpftrace_stacks,
                         py_frame, start_consenting_workload)

USDT = os.path.join(USDT_PACKAGE, "scripts")

# "<timestamp>\t<probe, right-aligned on 15>:<indent><file>:<func>:<line>"
CALL_STACK_LINE = re.compile(
    r"^(\d+)\t( function-entry|function-return):( *)([^ ].*):(\d+)$")
# A map entry printed by bpftrace: @name[key, key, ...]: value
MAP_ENTRY = re.compile(r"^@(\w+)\[(.*)\]: (-?\d+)$")

# A map entry of stats(): @name[key, ...]: count N, average A, total T
STATS_ENTRY = re.compile(
    r"^@(\w+)\[(.*)\]: count (\d+), average (-?\d+), total (-?\d+)$")
# The first line of a histogram ("@name[key, ...]: ") and one of its
# buckets ("[8M, 16M)   4 |@@@@|", "[1]   1 |@|")
HIST_START = re.compile(r"^@(\w+)\[(.*)\]: ?$")
HIST_BUCKET = re.compile(
    r"^\[(\d+)([KMGTPE]?)(?:, \d+[KMGTPE]?\)|\])\s+(\d+) \|")
# The suffixes of histogram bounds: powers of 1024
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
         "P": 2**50, "E": 2**60}


def end_reader(tracer, reader):
    """End the thread reader, which reads tracer's stdout to its end: kill
    the tracer if it still runs (a test that failed leaves it running), then
    join the thread, within 60 s."""
    if tracer.poll() is None:
        tracer.kill()
    reader.join(60)
    if reader.is_alive():
        raise Hang("timeout: %s's stdout did not end within 60 s of its exit"
                   % os.path.basename(tracer.args[0]))


def script_path(name):
    return os.path.join(USDT, name)


def run_script(name, workload, script_args=(), python_args=(), timeout=180,
               env=None):
    """bpftrace -q -c 'PYTHON [python_args] workload' SCRIPT PYTHON [args],
    its output without the warnings that bpftrace 0.27 prints among it,
    in 0.17's format (bpftrace_output())."""
    command = [PYTHON, *python_args, workload]
    if any(" " in word for word in command):
        raise ValueError("bpftrace -c splits on spaces: %r" % command)
    cmd = ["bpftrace", "-q", "-c", " ".join(command),
           script_path(name), PYTHON, *script_args]
    proc = run(cmd, timeout=timeout, env=env)
    proc.stdout = bpftrace_output(proc.stdout)
    return proc


def map_entries(output, name):
    """{key tuple: int value} for the entries of map @name in output.

    Keys are split on ", " (bpftrace's separator); the workloads keep ", "
    out of their paths and names.
    """
    entries = {}
    for line in output.splitlines():
        match = MAP_ENTRY.match(line)
        if match and match.group(1) == name:
            key = tuple(match.group(2).split(", "))
            entries[key] = int(match.group(3))
    return entries


def stats_entries(output, name):
    """{key tuple: (count, average, total)} for the stats() map @name."""
    entries = {}
    for line in output.splitlines():
        match = STATS_ENTRY.match(line)
        if match and match.group(1) == name:
            key = tuple(match.group(2).split(", "))
            entries[key] = tuple(int(match.group(i)) for i in (3, 4, 5))
    return entries


def histograms(output, name):
    """{key tuple: {bucket lower bound: count}} for the hist() map @name,
    empty buckets left out."""
    found = {}
    buckets = None
    for line in output.splitlines():
        start = HIST_START.match(line)
        if start:
            buckets = None
            if start.group(1) == name:
                buckets = found.setdefault(
                    tuple(start.group(2).split(", ")), {})
            continue
        bucket = HIST_BUCKET.match(line)
        if bucket and buckets is not None:
            if int(bucket.group(3)):
                low = int(bucket.group(1)) * UNITS[bucket.group(2)]
                buckets[low] = int(bucket.group(3))
        elif buckets is not None and line.strip():
            buckets = None
    return found


def call_stack_lines(output):
    """The call_stack.bt lines, ordered by timestamp, without it."""
    rows = []
    for line in output.splitlines():
        match = CALL_STACK_LINE.match(line)
        if match:
            rows.append((int(match.group(1)), line.split("\t", 1)[1]))
    # bpftrace reads its per-CPU buffers in turn: order by time, like
    # upstream's test_dtrace does for DTrace.
    rows.sort(key=lambda row: row[0])
    return [text for _, text in rows]


def dtracedata_dir():
    """Upstream's Lib/test/dtracedata of the interpreter under test."""
    proc = run([PYTHON, "-c",
                "import os, test; "
                "print(os.path.join(os.path.dirname(test.__file__), "
                "'dtracedata'))"])
    candidates = [proc.stdout.strip()] if proc.returncode == 0 else []
    candidates.append(os.path.join(TOP, "build", "src", "Lib", "test",
                                   "dtracedata"))
    for path in candidates:
        if path and os.path.exists(os.path.join(path, "call_stack.py")):
            return path
    return None


# Reference trace computed with sys.setprofile(): the same lines
# call_stack.bt prints (without timestamps) for what runs inside start().
SETPROFILE_REFERENCE = textwrap.dedent("""\
    import os, runpy, sys
    lines = []
    depth = 0
    def profile(frame, event, arg):
        global depth
        code = frame.f_code
        where = "%s:%s" % (os.path.basename(code.co_filename), code.co_name)
        if event == "call":
            lines.append("%15s:%s%s:%d" % ("function-entry", " " * depth,
                                           where, code.co_firstlineno))
            depth += 1
        elif event == "return":
            depth -= 1
            lines.append("%15s:%s%s:%d" % ("function-return", " " * depth,
                                           where, frame.f_lineno))
    namespace = runpy.run_path(sys.argv[1], run_name="reference")
    sys.setprofile(profile)
    namespace["start"]()
    sys.setprofile(None)
    sys.stdout.write("".join(line + "\\n" for line in lines))
""")

# Reference line counts computed with sys.settrace(): {lineno: count} for
# the 'line' events of the workload file.
SETTRACE_REFERENCE = textwrap.dedent("""\
    import collections, json, runpy, sys
    target = sys.argv[1]
    counts = collections.Counter()
    def trace(frame, event, arg):
        if frame.f_code.co_filename != target:
            return None
        if event == "line":
            counts[frame.f_lineno] += 1
        return trace
    sys.settrace(trace)
    runpy.run_path(target, run_name="__main__")
    sys.settrace(None)
    print(json.dumps(counts))
""")


class UsdtScriptTestCase(unittest.TestCase):

    def setUp(self):
        require_bpftrace(self)
        self.tmp = tempfile.mkdtemp(prefix="usdt")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
        return path

    def run_script(self, name, workload, *args, **kwargs):
        proc = run_script(name, workload, *args, **kwargs)
        self.assertEqual(proc.returncode, 0,
                         "%s failed: %s" % (name, Bpftrace.errors(proc)))
        return proc.stdout

    def reference(self, program, workload):
        helper = self.write("reference.py", program)
        proc = run([PYTHON, helper, workload])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout


# call_stack's workload: generators, exceptions and a coroutine inside start().
GEN_WORKLOAD = """\
    import asyncio

    def gen():
        received = yield 1
        try:
            yield received
        except KeyError:
            yield 3
        return 4

    def fail(n):
        if n:
            fail(n - 1)
        raise ValueError(n)

    async def sleeper():
        await asyncio.sleep(0)
        return 5

    def start():
        g = gen()
        next(g)
        g.send(2)
        g.throw(KeyError)
        for _ in g:
            pass
        try:
            fail(2)
        except ValueError:
            pass
        coro = sleeper()
        try:
            coro.send(None)
            coro.send(None)
        except StopIteration:
            pass
        squares = [x * x for x in range(3)]
        return sum(squares)

    if __name__ == "__main__":
        start()
"""


class CallStackTest(UsdtScriptTestCase):

    def test_upstream_call_stack(self):
        # Upstream's call_stack.py: the lines of call_stack.d.expected.
        data = dtracedata_dir()
        if data is None:
            self.skipTest("Lib/test/dtracedata not found for %s" % PYTHON)
        workload = os.path.join(self.tmp, "call_stack.py")
        shutil.copy(os.path.join(data, "call_stack.py"), workload)
        with open(os.path.join(data, "call_stack.d.expected")) as f:
            expected = [line for line in f.read().splitlines() if line]
        output = self.run_script("call_stack.bt", workload, ("start",))
        self.assertEqual(call_stack_lines(output), expected, output)

    def test_generators_exceptions_match_setprofile(self):
        # Resumptions (next, send, throw) are entries; yields and
        # exceptions leaving a frame are returns.
        workload = self.write("gen_workload.py", GEN_WORKLOAD)
        expected = self.reference(SETPROFILE_REFERENCE, workload)
        expected = expected.splitlines()
        # The reference must itself show what this test is about.
        self.assertIn(" function-entry: gen_workload.py:gen:3", expected)
        self.assertIn("function-return:   gen_workload.py:fail:14", expected)
        output = self.run_script("call_stack.bt", workload, ("start",))
        self.assertEqual(call_stack_lines(output), expected, output)

    def test_everything_without_function(self):
        # Without FUNCTION the module itself and its callees are shown;
        # entries and returns balance.
        workload = self.write("plain_workload.py", """\
            def leaf():
                return 1

            def branch():
                return leaf() + leaf()

            branch()
            """)
        # The start-up's thousands of lines need the larger buffer that
        # the script's header asks for with bpftrace 0.23 and later (the
        # runner's environ() sets it).
        output = self.run_script("call_stack.bt", workload,
                                 env=bpftrace_env())
        self.assertNotRegex(output, r"(?m)^Lost \d+ events", output)
        lines = [line for line in call_stack_lines(output)
                 if "plain_workload.py:" in line]
        # The main module runs from C: its depth is that of whatever ran
        # before it (0 unless start-up left frames unbalanced).
        self.assertTrue(lines, output)
        match = re.match(r" function-entry:( *)plain_workload.py:<module>:1$",
                         lines[0])
        self.assertIsNotNone(match, lines)
        base = match.group(1)
        self.assertEqual(lines, [
            " function-entry:%splain_workload.py:<module>:1" % base,
            " function-entry:%s plain_workload.py:branch:4" % base,
            " function-entry:%s  plain_workload.py:leaf:1" % base,
            "function-return:%s  plain_workload.py:leaf:2" % base,
            " function-entry:%s  plain_workload.py:leaf:1" % base,
            "function-return:%s  plain_workload.py:leaf:2" % base,
            "function-return:%s plain_workload.py:branch:5" % base,
            "function-return:%splain_workload.py:<module>:7" % base,
        ])


# top-functions' workload: one function called 1000 times, another 7.
TOP_WORKLOAD = """\
    def target():
        pass

    def other():
        pass

    for _ in range(1000):
        target()
    for _ in range(7):
        other()
"""


class TopFunctionsTest(UsdtScriptTestCase):

    def test_counts(self):
        workload = self.write("top_workload.py", TOP_WORKLOAD)
        output = self.run_script("top-functions.bt", workload)
        calls = {(os.path.basename(key[0]), key[1], key[2]): value
                 for key, value in map_entries(output, "calls").items()}
        self.assertEqual(calls.get(("top_workload.py", "target", "1")), 1000,
                         output)
        # print(@calls, 20): only the 20 most frequent
        self.assertLessEqual(len(calls), 20, output)
        values = [map_entries(output, "calls")[key]
                  for key in map_entries(output, "calls")]
        self.assertEqual(values, sorted(values), "not sorted: " + output)

    def test_n(self):
        # N after the interpreter: that many, the most frequent; 0, every
        # function.
        workload = self.write("top_workload.py", TOP_WORKLOAD)
        calls = map_entries(self.run_script("top-functions.bt", workload,
                                            ("2",)), "calls")
        self.assertEqual(len(calls), 2, calls)
        self.assertEqual([os.path.basename(key[0]) for key in calls if
                          calls[key] == 1000], ["top_workload.py"], calls)
        output = self.run_script("top-functions.bt", workload, ("0",))
        calls = {(os.path.basename(key[0]), key[1]): value
                 for key, value in map_entries(output, "calls").items()}
        self.assertGreater(len(calls), 20, output)
        self.assertEqual(calls[("top_workload.py", "other")], 7, output)


# Runs per function of the workload's file, with sys.setprofile() in every
# thread: {"name:def line": number of 'call' events}, which a generator or
# coroutine gets at each resumption too.
SETPROFILE_CALLS_REFERENCE = textwrap.dedent("""\
    import collections, json, runpy, sys, threading
    target = sys.argv[1]
    calls = collections.Counter()
    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename == target:
            calls["%s:%d" % (code.co_name, code.co_firstlineno)] += 1
    threading.setprofile_all_threads(profile)
    runpy.run_path(target, run_name="__main__")
    threading.setprofile_all_threads(None)
    print(json.dumps(calls))
""")


class LatencyTest(UsdtScriptTestCase):
    """latency.bt: runs per function as sys.setprofile() counts them, and
    times that add up: the inclusive time of a function is its exclusive
    time plus the inclusive time of the Python functions it calls, per
    thread, with recursion counted once and a suspended generator or
    coroutine not at all."""

    # The limits its header asks for.
    STRLEN, KEYS = 128, 65536
    # Seconds each function sleeps, in its own code.
    SLEEP = {"inner": 0.01, "outer": 0.02, "rec": 0.005, "deep": 0.005}
    # Seconds the workload sleeps while the generator and the coroutine
    # are suspended, three times each.
    SUSPENDED = 0.05

    def test_times_add_up(self):
        workload = self.write("latency_workload.py", """\
            import asyncio, threading, time

            def inner():
                time.sleep(%(inner)r)

            def outer():
                inner()
                time.sleep(%(outer)r)

            def rec(n):
                time.sleep(%(rec)r)
                if n:
                    rec(n - 1)

            def gen():
                for i in range(3):
                    yield i

            async def coroutine():
                for i in range(3):
                    await asyncio.sleep(%(suspended)r)

            def deep(n):
                time.sleep(%(deep)r)
                if n:
                    deep(n - 1)

            def worker():
                deep(2)

            threads = [threading.Thread(target=worker) for _ in range(2)]
            for thread in threads:
                thread.start()
            outer()
            rec(4)
            for x in gen():
                time.sleep(%(suspended)r)
            asyncio.run(coroutine())
            for thread in threads:
                thread.join()
            """ % dict(self.SLEEP, suspended=self.SUSPENDED))
        expected = json.loads(self.reference(SETPROFILE_CALLS_REFERENCE,
                                             workload))
        self.assertEqual(expected["rec:10"], 5, expected)
        self.assertEqual(expected["deep:23"], 2 * 3, expected)
        self.assertEqual(expected["gen:15"], 4, expected)
        env = bpftrace_env(strlen=self.STRLEN, keys=self.KEYS)
        output = self.run_script("latency.bt", workload, env=env)
        self.assertNotIn("map_update_elem", output)
        self.assertNotIn("latency.bt:", output)

        def ours(entries):
            return {"%s:%s" % key[1:]: value
                    for key, value in entries.items() if key[0] == workload}
        runs = ours(stats_entries(output, "ns"))
        inclusive = ours(map_entries(output, "inclusive_ns"))
        exclusive = ours(map_entries(output, "exclusive_ns"))
        hists = ours(histograms(output, "latency_ns"))
        self.assertEqual({name: run[0] for name, run in runs.items()},
                         expected, output)
        self.assertEqual({name: sum(buckets.values())
                          for name, buckets in hists.items()},
                         expected, output)
        for name, (count, average, total) in runs.items():
            self.assertEqual(average, total // count, name)
        # The Python callees of each function (C functions such as
        # time.sleep count in their caller's own time).
        callees = {"outer:6": ["inner:3"], "rec:10": [], "inner:3": [],
                   "gen:15": [], "deep:23": [], "worker:28": ["deep:23"]}
        for name, called in callees.items():
            self.assertEqual(inclusive[name],
                             exclusive[name] + sum(inclusive[callee]
                                                   for callee in called),
                             name)
        # Recursion counted once: the outermost levels hold all the
        # levels, so their time is the function's own time, and less than
        # the sum over all levels.
        for name in ("rec:10", "deep:23"):
            self.assertLess(inclusive[name], runs[name][2], name)
        # Each function slept in its own code.
        for name, calls in (("inner:3", 1), ("outer:6", 1), ("rec:10", 5),
                            ("deep:23", 6)):
            self.assertGreaterEqual(
                exclusive[name],
                calls * self.SLEEP[name.split(":")[0]] * 1e9, name)
        # A suspended generator or coroutine is not timed: the workload
        # slept SUSPENDED three times while each was suspended.
        for name in ("gen:15", "coroutine:19"):
            self.assertLess(inclusive[name], 3 * self.SUSPENDED * 1e9,
                            name)


class GcTest(UsdtScriptTestCase):

    def test_generations(self):
        workload = self.write("gc_workload.py", """\
            import gc
            gc.disable()
            gc.collect(0)
            for _ in range(7):
                gc.collect(1)
            for _ in range(200):
                cycle = []
                cycle.append(cycle)
            del cycle
            gc.collect(2)
            gc.collect(2)
            gc.collect(2)
            """)
        output = self.run_script("gc.bt", workload)
        collections_ = {int(key[0]): value for key, value
                        in map_entries(output, "collections").items()}
        collected = {int(key[0]): value for key, value
                     in map_entries(output, "collected").items()}
        total = {int(key[0]): value for key, value
                 in map_entries(output, "total_us").items()}
        # Start-up and shutdown may add collections, never remove any.
        self.assertGreaterEqual(collections_.get(0, 0), 1, output)
        self.assertGreaterEqual(collections_.get(1, 0), 7, output)
        self.assertGreaterEqual(collections_.get(2, 0), 3, output)
        self.assertGreaterEqual(collected.get(2, 0), 200, output)
        self.assertIn(2, total, output)
        # one histogram of durations per generation seen
        for generation in collections_:
            self.assertIn("@duration_us[%d]:" % generation, output)


class ImportsTest(UsdtScriptTestCase):

    def test_slow_and_missing(self):
        self.write("slowmod.py", """\
            import time
            time.sleep(0.3)
            """)
        workload = self.write("import_workload.py", """\
            import slowmod
            try:
                import no_such_module_usdt
            except ImportError:
                pass
            """)
        output = self.run_script("imports.bt", workload)
        durations = {key[0]: value for key, value
                     in map_entries(output, "import_us").items()}
        missing = {key[0]: value for key, value
                   in map_entries(output, "not_found").items()}
        self.assertIn("slowmod", durations, output)
        self.assertGreaterEqual(durations["slowmod"], 300000, output)
        self.assertLess(durations["slowmod"], 60 * 10**6, output)
        self.assertEqual(missing.get("no_such_module_usdt"), 1, output)
        self.assertNotIn("slowmod", missing, output)


class LinesTest(UsdtScriptTestCase):

    def test_matches_settrace(self):
        workload = self.write("lines_workload.py", """\
            def work(n):
                total = 0
                for i in range(n):
                    if i % 3:
                        total += i
                squares = [i * i for i in range(n)]
                while n: n -= 1
                return total + sum(squares)

            work(10)
            work(4)
            """)
        expected = json.loads(self.reference(SETTRACE_REFERENCE, workload))
        expected = {int(line): count for line, count in expected.items()}
        self.assertEqual(expected[5], 6 + 2, expected)   # total += i
        output = self.run_script("lines.bt", workload)
        got = {int(key[1]): value for key, value
               in map_entries(output, "lines").items()
               if key[0] == workload}
        self.assertEqual(got, expected, output)


# Modules of LinesLongPathsTest: the same code, different counts.
LONG_PATH_MODULE = """\
def work(n):
    total = 0
    for i in range(n):
        if i % 3:
            total += i
    return total
"""


class LinesLongPathsTest(UsdtScriptTestCase):
    """lines.bt with the limits its header asks for, on an application
    installed under a path of more than 150 bytes, with two modules whose
    paths share their first 180 bytes: no file merges with another, and
    no line is dropped, compared with sys.settrace(); with a map too small,
    bpftrace -k says how many line events it dropped (one warning each, or
    "Lost N events" for the warnings it could not print)."""

    # The limits its header asks for.
    STRLEN, KEYS = 200, 131072

    def application(self):
        top = self.tmp
        while len(top) < 150:
            top = os.path.join(top, "site-packages-%d" % len(top))
        os.makedirs(top)
        prefix = os.path.join(top, "common_prefix_of_two_modules_")
        names = {}
        for name in ("alpha", "betaa"):
            with open(prefix + name + ".py", "w") as f:
                f.write(LONG_PATH_MODULE)
            names[name] = prefix + name + ".py"
        self.assertEqual(os.path.commonprefix(list(names.values())),
                         prefix)
        self.assertGreaterEqual(len(prefix), 180)
        self.assertLess(max(len(path) for path in names.values()), 200)
        main = os.path.join(top, "main.py")
        with open(main, "w") as f:
            f.write(textwrap.dedent("""\
                import os, sys
                sys.path.insert(0, os.path.dirname(__file__))
                import common_prefix_of_two_modules_alpha as alpha
                import common_prefix_of_two_modules_betaa as betaa
                alpha.work(10)
                betaa.work(7)
                betaa.work(5)
                """))
        return main

    def test_files_kept_apart_match_settrace(self):
        main = self.application()
        reference = run([PYTHON, "-c", SETTRACE_LINES, "all", main])
        self.assertEqual(reference.returncode, 0, reference.stderr)
        expected = json.loads(reference.stdout)
        self.assertEqual(len(expected), 3, expected)
        env = bpftrace_env(strlen=self.STRLEN, keys=self.KEYS,
                           PYTHONHASHSEED="0")
        proc = run(["bpftrace", *bpftrace_runner().drop_flags(), "-q",
                    "-c", "%s %s" % (PYTHON, main),
                    script_path("lines.bt"), PYTHON], env=env, timeout=180)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        self.assertEqual(bpftrace_module().DROPPED.findall(
            proc.stdout + proc.stderr), [])
        proc.stdout = bpftrace_output(proc.stdout)
        self.assertNotIn("map_update_elem", proc.stdout)
        self.assertNotIn("Lost", proc.stdout)
        self.assertNotIn("lines.bt:", proc.stdout)
        got = collections.defaultdict(dict)
        for key, value in map_entries(proc.stdout, "lines").items():
            if key[0].startswith(os.path.dirname(main)):
                got[key[0]][key[1]] = value
        self.assertEqual(got, expected, proc.stdout)

    def test_dropped_events_counted(self):
        # The same run with room for 256 lines: bpftrace -k warns once per
        # line event it drops, and the lines kept plus those dropped are
        # all the line events of the run with room for all.
        main = self.application()
        counts = {}
        for keys in ("131072", "256"):
            env = bpftrace_env(strlen=self.STRLEN, keys=int(keys),
                               PYTHONHASHSEED="0")
            proc = run(["bpftrace", *bpftrace_runner().drop_flags(), "-q",
                        "-c", "%s %s" % (PYTHON, main),
                        script_path("lines.bt"), PYTHON], env=env,
                       timeout=180)
            self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
            entries = map_entries(bpftrace_output(proc.stdout), "lines")
            # bpftrace 0.17 prints -k's warnings on its output, through the
            # same buffers as printf(): those it cannot keep up with, it
            # counts as lost events.  Each version words them its own way
            # (usdt._bpftrace.DROPPED), and later ones print them on
            # stderr.
            dropped = len(bpftrace_module().DROPPED.findall(
                proc.stdout + proc.stderr))
            dropped += sum(int(n) for n in re.findall(
                r"(?m)^Lost (\d+) events$", proc.stdout + proc.stderr))
            counts[keys] = (len(entries), sum(entries.values()), dropped)
        self.assertEqual(counts["131072"][2], 0, counts)
        self.assertGreater(counts["131072"][0], 256, counts)
        self.assertEqual(counts["256"][0], 256, counts)
        self.assertGreater(counts["256"][2], 0, counts)
        self.assertEqual(counts["256"][1] + counts["256"][2],
                         counts["131072"][1], counts)


class InstancesTest(UsdtScriptTestCase):

    def test_live_counts(self):
        workload = self.write("instances_workload.py", """\
            import gc, os, sys

            class Freed:
                pass

            class Cyclic:
                def __init__(self):
                    self.me = self

            class Kept:
                pass

            freed = [Freed() for _ in range(300)]
            del freed
            cyclic = [Cyclic() for _ in range(50)]
            del cyclic
            gc.collect()
            kept = [Kept() for _ in range(200)]
            sys.stdout.flush()
            os._exit(0)    # no finalization: the Kept instances stay
            """)
        output = self.run_script("instances.bt", workload)
        live = {key: value for key, value
                in map_entries(output, "live").items()
                if key[0] == "__main__"}
        self.assertEqual(live.get(("__main__", "Freed")), 0, output)
        self.assertEqual(live.get(("__main__", "Cyclic")), 0, output)
        self.assertEqual(live.get(("__main__", "Kept")), 200, output)


# Reference C calls computed with threading.setprofile_all_threads():
# {"module|qualname": count} of the 'c_call' events, and of the 'c_return'
# and 'c_exception' events, of main(), named as cfunction__entry names
# the callable.
CCALLS_REFERENCE = textwrap.dedent("""\
    import collections, json, runpy, sys, threading
    calls = collections.Counter()
    returns = collections.Counter()
    def name(func):
        module = getattr(func, "__module__", None)
        if not isinstance(module, str):
            owner = getattr(func, "__self__", None)
            if owner is None or isinstance(owner, type(sys)):
                module = ""
            else:
                owner = owner if isinstance(owner, type) else type(owner)
                module = owner.__module__
        return "%s|%s" % (module, func.__qualname__)
    def profile(frame, event, arg):
        if event == "c_call":
            calls[name(arg)] += 1
        elif event in ("c_return", "c_exception"):
            returns[name(arg)] += 1
    namespace = runpy.run_path(sys.argv[1], run_name="reference")
    threading.setprofile_all_threads(profile)
    namespace["main"]()
    threading.setprofile_all_threads(None)
    # the switch itself: reported on the way in and out of profiling
    for counter in (calls, returns):
        counter.pop("sys|_setprofileallthreads", None)
    print(json.dumps({"calls": calls, "returns": returns}))
""")

# Reference exception events computed with a sys.monitoring tool:
# {"event|type|filename|funcname|lineno": count}, the type named as a
# traceback names it, the line read as the howto says a tool reads it.
EXCEPTIONS_REFERENCE = textwrap.dedent("""\
    import collections, json, runpy, sys
    M = sys.monitoring
    TOOL = 4
    events = collections.Counter()
    def type_name(exc):
        cls = type(exc)
        if cls.__module__ in ("builtins", "__main__"):
            return cls.__qualname__
        return "%s.%s" % (cls.__module__, cls.__qualname__)
    def recorder(event):
        def callback(code, offset, exc):
            events["%s|%s|%s|%s|%d" % (
                event, type_name(exc), code.co_filename, code.co_name,
                sys._getframe(1).f_lineno)] += 1
        return callback
    M.use_tool_id(TOOL, "reference")
    for event, name in ((M.events.RAISE, "raised"),
                        (M.events.RERAISE, "reraised"),
                        (M.events.EXCEPTION_HANDLED, "handled")):
        M.register_callback(TOOL, event, recorder(name))
    M.set_events(TOOL, M.events.RAISE | M.events.RERAISE
                 | M.events.EXCEPTION_HANDLED)
    runpy.run_path(sys.argv[1], run_name="__main__")
    M.set_events(TOOL, 0)
    print(json.dumps(events))
""")

# Reference task steps computed with a sys.monitoring tool: {coroutine
# qualname: count} of the starts, resumptions and throws of the coroutine
# code objects of the workload file.  Each task step sends into (or
# throws into) its coroutine once; the workload awaits no coroutine of its
# own file except as a task.
TASKS_REFERENCE = textwrap.dedent("""\
    import collections, inspect, json, runpy, sys
    M = sys.monitoring
    TOOL = 4
    target = sys.argv[1]
    steps = collections.Counter()
    def step(code, *args):
        if (code.co_filename == target
                and code.co_flags & inspect.CO_COROUTINE):
            steps[code.co_qualname] += 1
    M.use_tool_id(TOOL, "reference")
    for event in (M.events.PY_START, M.events.PY_RESUME, M.events.PY_THROW):
        M.register_callback(TOOL, event, step)
    M.set_events(TOOL, M.events.PY_START | M.events.PY_RESUME
                 | M.events.PY_THROW)
    runpy.run_path(target, run_name="__main__")
    M.set_events(TOOL, 0)
    print(json.dumps(steps))
""")


class CCallsTest(UsdtScriptTestCase):

    WORKLOAD = """\
        import collections, functools, math, threading, time, zlib

        def inner(a, b):
            time.sleep(0.01)
            return a + b

        def outer(a, b):
            time.sleep(0.01)
            return functools.reduce(inner, [a, b])

        def fails():
            try:
                math.factorial(-1)
            except ValueError:
                pass

        def worker():
            d = collections.deque()
            for i in range(50):
                d.appendleft(i)
            zlib.crc32(b"abc")

        def spawn(target):
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()

        def main():
            # reduce() inside reduce(), through Python code
            functools.reduce(outer, [1, 2])
            for _ in range(3):
                fails()
            spawn(worker)
            dict.fromkeys("abc")
            # map() calls gcd from C: not a call from Python code
            list(map(math.gcd, [4, 6], [2, 3]))
            math.comb(5, 2)

        if __name__ == "__main__":
            main()
        """

    def test_counts_match_setprofile(self):
        workload = self.write("cc_main.py", self.WORKLOAD)
        # The same program without main(), but a thread that does nothing:
        # what start-up, shutdown and a thread's own start and end call,
        # outside the reach of setprofile.
        baseline = self.write("cc_base.py", self.WORKLOAD.replace(
            "            main()\n", "            spawn(object)\n"))
        reference = json.loads(self.reference(CCALLS_REFERENCE, workload))
        output = self.run_script("ccalls.bt", workload, ("time", "sleep"))
        base_output = self.run_script("ccalls.bt", baseline)
        got = {"|".join(key): value for key, value
               in stats_entries(output, "ns").items()}
        base = {"|".join(key) for key in stats_entries(base_output, "ns")}
        self.assertTrue(base, base_output)
        # Callables that only main() calls: the counts are exact.
        compared = set(reference["calls"]) - base
        self.assertLessEqual(
            {"math|comb", "math|factorial", "zlib|crc32", "time|sleep",
             "collections|deque.appendleft", "_functools|reduce",
             "builtins|dict.fromkeys"}, compared, reference)
        self.assertNotIn("math|gcd", reference["calls"])
        self.assertNotIn("math|gcd", got)
        self.assertEqual(reference["calls"]["collections|deque.appendleft"],
                         50)
        for name in sorted(compared):
            with self.subTest(callable=name):
                self.assertEqual(reference["returns"].get(name),
                                 reference["calls"][name])
                self.assertIn(name, got, output)
                count, average, total = got[name]
                self.assertEqual(count, reference["calls"][name], output)
                self.assertEqual(average, total // count)
        # Nested calls are timed on their own: the outer reduce() spans two
        # sleeps, the inner one a third.
        self.assertGreaterEqual(got["_functools|reduce"][2], 30 * 10**6)
        self.assertGreaterEqual(got["time|sleep"][2], 20 * 10**6)
        # The histogram of the callable given: every sleep(0.01) >= 8 ms
        latency = histograms(output, "latency_ns")
        self.assertEqual(list(latency), [("time", "sleep")], output)
        buckets = latency[("time", "sleep")]
        self.assertEqual(sum(buckets.values()), got["time|sleep"][0])
        self.assertGreaterEqual(min(buckets), 8 * 2**20, output)
        # Without a callable: the histogram of the one called most often.
        counts = {key: value[0] for key, value
                  in stats_entries(base_output, "ns").items()}
        latency = histograms(base_output, "latency_ns")
        self.assertEqual(len(latency), 1, base_output)
        (top, buckets), = latency.items()
        self.assertEqual(sum(buckets.values()), max(counts.values()))
        self.assertEqual(counts[top], max(counts.values()))
        # @total_ns: the 20 largest totals, the largest last, equal to the
        # totals of @ns.
        totals = [(key, value) for key, value in
                  map_entries(output, "total_ns").items()]
        self.assertEqual(len(totals), 20, output)
        self.assertEqual([v for _, v in totals],
                         sorted(v for _, v in totals))
        for key, value in totals:
            self.assertEqual(value, got["|".join(key)][2])
        self.assertEqual(min(v for _, v in totals),
                         sorted(v[2] for v in got.values())[-20])


# exceptions' workload: raised, re-raised and handled, in two threads.
EXCEPTIONS_WORKLOAD = """\
    import json, threading

    class AppError(Exception):
        pass

    def parse(text):
        return json.loads(text)

    def fail():
        raise AppError("deep")

    def middle():
        fail()

    def work():
        for _ in range(3):
            try:
                parse("{")
            except ValueError:
                pass
        try:
            try:
                middle()
            finally:
                pass
        except AppError:
            pass
        try:
            try:
                {}["missing"]
            except KeyError:
                raise
        except LookupError:
            pass
        try:
            raise ExceptionGroup("group", [TypeError(1), OSError(2)])
        except* TypeError:
            pass
        except* OSError:
            pass

    work()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
"""


class ExceptionsTest(UsdtScriptTestCase):

    def test_counts_match_sys_monitoring(self):
        workload = self.write("exc_workload.py", EXCEPTIONS_WORKLOAD)
        reference = json.loads(self.reference(EXCEPTIONS_REFERENCE,
                                              workload))
        expected = {}
        functions = {}
        for key, count in reference.items():
            event, exctype, filename, funcname, line = key.split("|")
            if filename == workload:
                expected[event, exctype, int(line)] = count
                site = (funcname, int(line))
                functions[site] = functions.get(site, 0) + count
        # The reference shows what this test is about.
        events = {event for event, _, _ in expected}
        self.assertEqual(events, {"raised", "reraised", "handled"})
        types = {exctype for _, exctype, _ in expected}
        self.assertLessEqual({"AppError", "json.decoder.JSONDecodeError",
                              "KeyError", "ExceptionGroup"}, types)
        output = self.run_script("exceptions.bt", workload)
        got = {}
        for event in ("raised", "reraised", "handled"):
            for (exctype, filename, line), count in map_entries(
                    output, event).items():
                if filename == workload:
                    got[event, exctype, int(line)] = count
        self.assertEqual(got, expected, output)
        sites = {(funcname, int(line)): count
                 for (filename, funcname, line), count
                 in map_entries(output, "sites").items()
                 if filename == workload}
        self.assertEqual(sites, functions, output)
        # @types: the totals per type and event, over every file
        per_event = {event: map_entries(output, event)
                     for event in ("raised", "reraised", "handled")}
        types = map_entries(output, "types")
        self.assertIn(("AppError", "reraised"), types, output)
        for (exctype, event), count in types.items():
            self.assertEqual(count, sum(value for key, value
                                        in per_event[event].items()
                                        if key[0] == exctype),
                             (exctype, event))


# gil's workload: two CPU-bound threads that overlap, each waiting for the
# other to be asked to drop the GIL, after the switch interval; it prints
# the native ids of its threads and the switch interval.
GIL_WORKLOAD = """\
    import sys, threading

    def spin():
        n = 3_000_000
        while n:
            n -= 1

    threads = [threading.Thread(target=spin) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("workers", *(thread.native_id for thread in threads))
    print("main", threading.get_native_id())
    print("switch_ns", int(sys.getswitchinterval() * 1e9))
"""


class GilTest(UsdtScriptTestCase):

    def test_two_spinning_threads(self):
        # Two CPU-bound threads that overlap: each waits for the other to
        # be asked to drop the GIL, after the switch interval.
        workload = self.write("gil_workload.py", GIL_WORKLOAD)
        output = self.run_script("gil.bt", workload)
        facts = {line.split()[0]: line.split()[1:]
                 for line in output.splitlines()
                 if line.startswith(("workers ", "main ", "switch_ns "))}
        workers = facts["workers"]
        switch_ns = int(facts["switch_ns"][0])
        waits = {key[0]: value for key, value
                 in map_entries(output, "wait_total_ns").items()}
        holds = {key[0]: value for key, value
                 in map_entries(output, "hold_total_ns").items()}
        percent = {key[0]: value for key, value
                   in map_entries(output, "contention_pct").items()}
        wait_hist = {key[0]: value for key, value
                     in histograms(output, "wait_ns").items()}
        hold_hist = {key[0]: value for key, value
                     in histograms(output, "hold_ns").items()}
        if free_threaded():
            # The GIL probes never fire in the free-threaded build.
            self.assertEqual((waits, holds, wait_hist, hold_hist),
                             ({}, {}, {}, {}), output)
            return
        self.assertIn(facts["main"][0], holds, output)
        for tid in workers:
            with self.subTest(thread=tid):
                self.assertIn(tid, wait_hist, output)
                self.assertIn(tid, hold_hist, output)
                self.assertGreater(waits[tid], 0)
                self.assertGreater(holds[tid], 0)
                # waited for the other spinning thread at least once
                # (bucket [L, 2L) holds a wait of a switch interval)
                self.assertGreater(2 * max(wait_hist[tid]), switch_ns,
                                   output)
        for tid, value in percent.items():
            with self.subTest(thread=tid):
                self.assertTrue(0 <= value <= 100, value)
                total = waits.get(tid, 0) + holds.get(tid, 0)
                self.assertEqual(value, 100 * waits.get(tid, 0) // total)
        # The line over all threads: the sums of the threads' totals.
        match = re.search(r"^all threads: wait (\d+) ns, hold (\d+) ns, "
                          r"contention (\d+)\.(\d)%$", output, re.M)
        self.assertIsNotNone(match, output)
        wait, hold, whole, tenth = map(int, match.groups())
        self.assertEqual(wait, sum(waits.values()))
        self.assertEqual(hold, sum(holds.values()))
        self.assertEqual(whole * 10 + tenth, 1000 * wait // (wait + hold))


# threads' workload: three workers that sleep 0.05 s, 0.1 s and 0.15 s, a
# daemon that outlives the program; it prints their ids.
THREADS_WORKLOAD = """\
    import sys, threading, time

    def say(*words):
        # one write per line: threads print at the same time
        sys.stdout.write(" ".join(map(str, words)) + "\\n")
        sys.stdout.flush()

    def work(seconds):
        say("worker", threading.get_ident(),
            threading.get_native_id(), seconds)
        time.sleep(seconds)

    threads = [threading.Thread(target=work, args=(0.05 * (i + 1),))
               for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    started = threading.Event()
    def forever():
        say("daemon", threading.get_ident(), threading.get_native_id())
        started.set()
        time.sleep(600)
    threading.Thread(target=forever, daemon=True).start()
    started.wait()
    say("main", threading.get_ident(), threading.get_native_id())
"""


class ThreadsTest(UsdtScriptTestCase):

    # "<time> start <thread_id> <native_id>", "... stop ... <duration>"
    LINE = re.compile(r"^(\d+) +(start|stop) +(\d+) +(\d+)(?: +(\d+|-))?$")

    def test_lifetimes(self):
        workload = self.write("threads_workload.py", THREADS_WORKLOAD)
        output = self.run_script("threads.bt", workload)
        lines = output.splitlines()
        self.assertRegex(lines[0], r"^TIME_NS +EVENT +THREAD_ID +NATIVE_ID "
                                   r"+DURATION_US$")
        workers = {}
        daemon = main = None
        for line in lines:
            words = line.split()
            if words and words[0] == "worker":
                workers[words[1], words[2]] = float(words[3])
            elif words and words[0] == "daemon":
                daemon = (words[1], words[2])
            elif words and words[0] == "main":
                main = (words[1], words[2])
        self.assertEqual(len(workers), 3, output)
        starts, stops = [], {}
        for line in lines:
            match = self.LINE.match(line)
            if match and match.group(2) == "start":
                starts.append(match.group(3, 4))
            elif match:
                self.assertNotIn(match.group(3, 4), stops, output)
                stops[match.group(3, 4)] = match.group(5)
        # One start per thread, none for the main thread.
        self.assertEqual(sorted(starts), sorted([*workers, daemon]), output)
        self.assertNotIn(main, starts)
        # Each worker stopped, after its sleep; the daemon never did.
        self.assertEqual(set(stops), set(workers), output)
        for ids, seconds in workers.items():
            self.assertGreaterEqual(int(stops[ids]), seconds * 1e6, output)
        self.assertRegex(output, r"(?m)^\d+ +end$")
        running = map_entries(output, "running")
        self.assertEqual(list(running), [daemon], output)
        start_time = [int(m.group(1)) for m in map(self.LINE.match, lines)
                      if m and m.group(3, 4) == daemon]
        self.assertEqual(list(running.values()), start_time)


# tasks' workload: asyncio tasks that step, stall, fail, are cancelled and
# run eagerly.
TASKS_WORKLOAD = """\
    import asyncio, time

    async def ticker(n):
        for _ in range(n):
            await asyncio.sleep(0)
        return n

    async def stall():
        time.sleep(0.02)
        await asyncio.sleep(0)

    async def eager_child():
        time.sleep(0.01)
        await asyncio.sleep(0)

    async def fails():
        await asyncio.sleep(0)
        raise ValueError

    async def sleeper():
        await asyncio.sleep(60)

    async def main():
        await asyncio.gather(ticker(3), ticker(5), stall(),
                             return_exceptions=True)
        await asyncio.gather(fails(), return_exceptions=True)
        task = asyncio.create_task(sleeper(), name="cancelled")
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        loop = asyncio.get_running_loop()
        # The first step of an eager task runs inside this one.
        loop.set_task_factory(asyncio.eager_task_factory)
        await asyncio.create_task(eager_child())

    asyncio.run(main())
"""


class TasksTest(UsdtScriptTestCase):

    def test_steps_match_sys_monitoring(self):
        workload = self.write("tasks_workload.py", TASKS_WORKLOAD)
        expected = json.loads(self.reference(TASKS_REFERENCE, workload))
        self.assertEqual(expected["ticker"], 3 + 1 + 5 + 1, expected)
        output = self.run_script("tasks.bt", workload)
        steps = {key[0]: value for key, value
                 in stats_entries(output, "steps").items()}
        self.assertEqual({name: steps.get(name, (0,))[0]
                          for name in expected}, expected, output)
        maxima = {key[0]: value for key, value
                  in map_entries(output, "max_ns").items()}
        hists = {key[0]: value for key, value
                 in histograms(output, "step_ns").items()}
        for name, (count, average, total) in steps.items():
            with self.subTest(coroutine=name):
                self.assertEqual(sum(hists[name].values()), count)
                self.assertEqual(average, total // count)
                self.assertLessEqual(maxima[name], total)
                self.assertLessEqual(average, maxima[name])
        # A step that sleeps 20 ms; the step of main() that runs the eager
        # task's first step includes its 10 ms sleep.
        self.assertGreaterEqual(maxima["stall"], 20 * 10**6)
        self.assertGreaterEqual(max(hists["stall"]), 16 * 2**20)
        self.assertGreaterEqual(maxima["eager_child"], 10 * 10**6)
        self.assertGreaterEqual(maxima["main"], maxima["eager_child"])


# pystat's workload: works on request ("ping", "burst", "burst without
# threads") from stdin.
PYSTAT_WORKLOAD = """\
    import gc, sys, threading

    def f():
        pass

    def raise_one():
        try:
            raise ValueError
        except ValueError:
            pass

    print("ready", flush=True)
    for command in sys.stdin:
        if command == "ping\\n":
            f()
            raise_one()
        elif command in ("burst\\n", "burst without threads\\n"):
            if command == "burst\\n":
                for _ in range(5):
                    thread = threading.Thread(target=f)
                    thread.start()
                    thread.join()
            for _ in range(200):
                f()
            for _ in range(7):
                raise_one()
            for _ in range(3):
                gc.collect()
        print("done", flush=True)
"""


class PystatTest(UsdtScriptTestCase):
    """pystat.bt attached with -p to a process that works on request."""

    ROW = re.compile(r"^\d\d:\d\d:\d\d" + r" +(\d+)" * 7 + "$")
    COLUMNS = ("PY_CALLS", "C_CALLS", "EXC_RAISED", "GC", "GIL_WAIT_US",
               "THR_START", "THR_STOP")

    def test_columns_add_up(self):
        workload = self.write("pystat_workload.py", PYSTAT_WORKLOAD)
        target = start(self, [PYTHON, workload], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE)
        self.assertEqual(readline(target.stdout, 60, "the pystat workload "
                                  "did not say 'ready'"), "ready\n")
        tracer = start(self, ["bpftrace", "-q", "-p", str(target.pid),
                              script_path("pystat.bt"), PYTHON],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # bpftrace's lines, read by a thread so that a wait can time out
        lines = queue.Queue()
        reader = threading.Thread(target=lambda: [
            *map(lines.put, bpftrace_lines(tracer.stdout)), lines.put("")],
            daemon=True)
        reader.start()
        self.addCleanup(end_reader, tracer, reader)

        def line():
            try:
                text = lines.get(timeout=60)
            except queue.Empty:
                text = ""
            if not text:
                tracer.kill()
                self.fail("pystat.bt stopped printing: "
                          + Bpftrace.errors(tracer.stderr.read()))
            return text

        def row():
            text = line()
            match = self.ROW.match(text)
            self.assertIsNotNone(match, text)
            return dict(zip(self.COLUMNS, map(int, match.groups())))

        def command(word):
            target.stdin.write(word + "\n")
            target.stdin.flush()
            self.assertEqual(readline(target.stdout, 60, "the pystat "
                                      "workload did not answer %r" % word),
                             "done\n")

        self.assertEqual(line().split(), ["TIME", *self.COLUMNS])
        # Ping until the watcher has armed the function, C function and
        # exception probes: a second shows f(), print() and a raise.
        for _ in range(30):
            command("ping")
            seen = row()
            if seen["PY_CALLS"] and seen["C_CALLS"] and seen["EXC_RAISED"]:
                break
        else:
            self.fail("the probes did not start firing: %s" % seen)
        # Then until a second without any event: the pings are all
        # counted in the lines read so far.
        for _ in range(30):
            seen = row()
            if not any(seen[column] for column in self.COLUMNS
                       if column != "GIL_WAIT_US"):
                break
        else:
            self.fail("the process does not stay idle: %s" % seen)
        command("burst")
        rows = [row()]
        while sum(r["THR_STOP"] for r in rows) < 5 and len(rows) < 60:
            rows.append(row())
        # two more seconds: nothing else comes
        rows += [row(), row()]
        _, errors = Bpftrace.interrupt(tracer)
        self.assertEqual(tracer.returncode, 0, Bpftrace.errors(errors))
        total = {column: sum(r[column] for r in rows)
                 for column in self.COLUMNS}
        self.assertEqual(total["THR_START"], 5, rows)
        self.assertEqual(total["THR_STOP"], 5, rows)
        self.assertEqual(total["EXC_RAISED"], 7, rows)
        self.assertGreaterEqual(total["GC"], 3, rows)
        # f() 200 times; thread.start() and join() 5 times each
        self.assertGreaterEqual(total["PY_CALLS"], 200 + 5 + 5, rows)
        # gc.collect() 3 times, print() once
        self.assertGreaterEqual(total["C_CALLS"], 3 + 1, rows)

# Where the documentation advises BPFTRACE_STRLEN values.
ADVICE = [os.path.join(TOP, "README.md"),
          os.path.join(TOP, "overlay", "Doc", "howto", "instrumentation.rst"),
          os.path.join(TOP, "overlay", "Doc", "howto", "usdt-tools.rst")]
# The scripts that print the workload's file name, and how they print it.
PRINTS_FILENAME = {"call_stack.bt": os.path.basename,
                   "top-functions.bt": lambda path: path,
                   "lines.bt": lambda path: path,
                   "exceptions.bt": lambda path: path,
                   "latency.bt": lambda path: path,
                   "callpaths.bt": lambda path: path}


# What the scripts that check their string size say they cut.
NOTICE_WHAT = {"lines.bt": "paths",
               "top-functions.bt": "paths and names",
               "exceptions.bt": "paths and names",
               "ccalls.bt": "names",
               "latency.bt": "paths and names",
               "callpaths.bt": "paths and names"}


def script_strlen(name):
    """The BPFTRACE_STRLEN that script *name* needs, which its BEGIN
    compares with sizeof(str(nsecs * 0)) to say so when it starts with
    less; None
    for a script without that check."""
    with open(script_path(name)) as f:
        found = re.search(r"sizeof\(str\(nsecs \* 0\)\) < (\d+)", f.read())
    return int(found.group(1)) if found else None


def documented_strlens():
    """{BPFTRACE_STRLEN value: {file: scripts}} for each BPFTRACE_STRLEN=N
    shown: in a script, for that script; in a command of the README or the
    howto, for the .bt scripts that the command names (up to its first
    empty line), or for every script (None) when it names none."""
    files = ADVICE + sorted(script_path(name) for name in os.listdir(USDT))
    values = {}
    for path in files:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            text = f.read()
        for match in re.finditer(r"\bBPFTRACE_STRLEN=(\d+)", text):
            if text[:match.start()].endswith("``"):
                continue        # in the howto's prose, not a command
            if path.endswith(".bt"):
                scripts = {os.path.basename(path)}
            else:
                command = text[match.end():].split("\n\n", 1)[0]
                scripts = set(os.path.basename(name) for name in
                              re.findall(r"[\w/.-]+\.bt\b", command)) or None
            where = values.setdefault(int(match.group(1)), {})
            relative = os.path.relpath(path, TOP)
            if relative in where and where[relative] is not None:
                where[relative] = (None if scripts is None
                                   else where[relative] | scripts)
            else:
                where.setdefault(relative, scripts)
    return values


class StrlenAdviceTest(UsdtScriptTestCase):
    """Every BPFTRACE_STRLEN the docs show works with the scripts it is
    shown for, and the scripts say when they start with less than they
    need.

    bpftrace keeps strings on the 512-byte BPF stack, so a value that suits
    one script can make another fail to load.  Each value runs with each
    script of Lib/usdt/scripts that it is shown for, and bpftrace's default with
    every script, on a workload whose file name is longer than any value,
    so that the output also shows where the name is cut.
    """

    def test_documented_values_load(self):
        documented = documented_strlens()
        # The advice exists: the howto and the scripts give values.
        self.assertTrue(documented, "no BPFTRACE_STRLEN=N in %s" % ADVICE)
        # pyprofile.bt keeps no strings, and takes a running process's PID
        # (-p), not a -c command: PyprofileTest runs it.  calls-batch.bt
        # and latency-batch.bt need the interpreter's offsets and its range loops written for
        # the bpftrace at hand, which usdt.tools calls gives it: test_batch
        # runs it.
        scripts = sorted(name for name in os.listdir(USDT)
                         if name.endswith(".bt")
                         and name not in ("pyprofile.bt", "calls-batch.bt",
                                          "latency-batch.bt"))
        self.assertTrue(set(PRINTS_FILENAME) <= set(scripts), scripts)
        # A script that checks its string size shows the value it checks
        # for in its own header.
        for script in scripts:
            need = script_strlen(script)
            if need is not None:
                self.assertIn(os.path.relpath(os.path.join(USDT, script),
                                              TOP),
                              documented.get(need, {}), script)
        # bpftrace accepts at most 200: a longer base name
        # Something for every script: calls, C calls, an exception, an
        # asyncio task, a thread, a collection.
        workload = self.write("w" * 220 + ".py", """\
            import asyncio, gc, threading

            class Thing:
                pass

            def target():
                return Thing()

            def fail():
                try:
                    raise ValueError
                except ValueError:
                    pass

            async def task():
                fail()

            things = [target() for _ in range(1000)]
            asyncio.run(task())
            thread = threading.Thread(target=fail)
            thread.start()
            thread.join()
            gc.collect()
            """)
        runner = bpftrace_runner()
        default_env = dict(os.environ)
        for name in ("BPFTRACE_STRLEN", "BPFTRACE_MAX_STRLEN"):
            default_env.pop(name, None)
        # None: bpftrace's default (64 up to 0.17, 1024 from 0.23), for
        # every script
        runs = {None: {"bpftrace's default": None}, **documented}
        for value, where in sorted(runs.items(),
                                   key=lambda item: item[0] or 0):
            env = runner.environ(strlen=value, base=default_env)
            strlen = runner.default_strlen if value is None else value
            # strlen - 1 bytes up to 0.23, strlen from 0.27
            kept = runner.kept(strlen)
            shown_for = set()
            for names in where.values():
                shown_for |= set(scripts) if names is None else names
            for script in sorted(shown_for):
                with self.subTest(BPFTRACE_STRLEN=value, script=script,
                                  documented_in=sorted(where)):
                    self.assertIn(script, scripts)
                    output = self.run_script(script, workload, env=env)
                    self.assertTrue(output.strip(), "no output")
                    shown = PRINTS_FILENAME.get(script)
                    if shown is not None:
                        name = shown(workload)
                        if len(name) > kept:
                            self.assertIn(name[:kept], output)
                            self.assertNotIn(name[:kept + 1], output)
                        else:
                            # 0.23's default keeps the whole name.
                            self.assertIsNone(value)
                            self.assertIn(name, output)
                    need = script_strlen(script)
                    notice = "%s: " % script
                    if need is not None and strlen < need:
                        # sizeof(str()) - 1, which is what 0.17 keeps.
                        self.assertEqual(
                            output.splitlines()[0],
                            "%s: %s cut to %d bytes (BPFTRACE_STRLEN=%d "
                            "keeps %d)" % (script, NOTICE_WHAT[script],
                                           strlen - 1, need, need - 1),
                            output)
                    else:
                        self.assertNotIn(notice, output)


class PyprofileTest(UsdtScriptTestCase):
    """pyprofile.bt run as its header says, with -p, on test_stacks.py's
    workload (threads calling outer() -> middle() -> leaf())."""

    # Seconds before the workload kills itself, should the test die.
    LIFETIME_S = 90
    # Seconds of sampling after the trampoline is on.
    SAMPLE_S = 4

    def folding_program(self):
        """The awk program that the script's header gives for folding,
        which the howto shows too."""
        with open(script_path("pyprofile.bt")) as f:
            header = f.read().split("*/", 1)[0]
        header = re.sub(r"(?m)^ \* ?", "", header)
        found = re.search(r"awk '(.*?)' stacks\.txt", header, re.S)
        self.assertIsNotNone(found, "no awk command in pyprofile.bt")
        with open(os.path.join(TOP, "overlay", "Doc", "howto",
                               "usdt-tools.rst")) as f:
            howto = " ".join(f.read().split())
        self.assertIn("awk '%s' stacks.txt" % " ".join(found.group(1).split()),
                      howto, "the howto folds otherwise")
        return found.group(1)

    def test_python_names_in_sampled_stacks(self):
        if free_threaded():
            self.skipTest("the free-threaded build has no stack trampoline "
                          "for the marker")
        # -X dtrace_stacks: the owner allows the marker's trampoline.
        workload = start_consenting_workload(self, self.LIFETIME_S)
        pid = workload.pid
        stacks = os.path.join(self.tmp, "stacks.txt")
        tracer = start(self, ["bpftrace", "-q", "-p", str(pid),
                              script_path("pyprofile.bt"), PYTHON, str(pid),
                              "-o", stacks],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=dict(os.environ, BPFTRACE_CACHE_USER_SYMBOLS="1"))
        # The trampoline is on once the perf map lists leaf(), entered
        # every millisecond.
        leaf = "py::leaf:" + STACKS_WORKLOAD
        deadline = time.monotonic() + 30
        while leaf not in perf_map_entries(pid):
            if tracer.poll() is not None:
                self.fail("pyprofile.bt exited: %s"
                          % Bpftrace.errors(tracer.stderr.read()))
            if time.monotonic() > deadline:
                self.fail("pyprofile.bt did not turn the trampoline on: "
                          "no %s in %s after 30 s" % (leaf,
                                                      perf_map_path(pid)))
            time.sleep(0.05)
        time.sleep(self.SAMPLE_S)
        _, errors = Bpftrace.interrupt(tracer)
        self.assertEqual(tracer.returncode, 0, Bpftrace.errors(errors))
        self.assertIsNone(workload.poll(), "the workload died while traced")
        with open(stacks) as f:
            output = f.read()
        samples = bpftrace_stacks(output, "")
        # Samples whose stack bpftrace lost: "@[]: N"
        lost = sum(int(n) for n in re.findall(r"(?m)^@\[\]: (\d+)$",
                                               output))
        total = sum(count for _, count in samples) + lost
        common = "\n".join("%d: %s" % (count, " < ".join(frames))
                           for frames, count in sorted(
                               samples, key=lambda s: -s[1])[:3])
        self.assertGreater(total, 50, "too few samples:\n" + output)
        named = full = 0
        for frames, count in samples:
            py = [py_frame(frame) for frame in frames
                  if frame.startswith("py::")]
            if not py:
                continue
            named += count
            for qualname, filename in py:
                self.assertIn(qualname, CHAIN, frames)
                self.assertEqual(filename, STACKS_WORKLOAD, frames)
            # Innermost first: leaf() before middle() before outer(); a
            # caller entered before the trampoline came on has no name.
            names = [qualname for qualname, _ in py]
            self.assertEqual(names, sorted(names, key=CHAIN.index), frames)
            self.assertEqual(len(names), len(set(names)), frames)
            if names == CHAIN:
                full += count
        self.assertGreaterEqual(2 * named, total,
                                "%d of %d samples have a py:: frame; the "
                                "most common:\n%s" % (named, total, common))
        # leaf() takes most of the time.
        self.assertGreaterEqual(2 * full, named,
                                "%d of %d samples have leaf, middle and "
                                "outer; the most common:\n%s"
                                % (full, named, common))
        # The header's folding: the same samples, one line per stack,
        # root first.
        proc = run(["awk", self.folding_program(), stacks])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        folded = {}
        for line in proc.stdout.splitlines():
            stack, _, count = line.rpartition(" ")
            self.assertNotIn(stack, folded, "folded twice")
            folded[stack] = int(count)
        self.assertEqual(sum(folded.values()), total - lost, proc.stdout)
        root_first = sum(count for stack, count in folded.items()
                         if [py_frame(frame)[0]
                             for frame in stack.split(";")
                             if frame.startswith("py::")] == CHAIN[::-1])
        self.assertEqual(root_first, full, proc.stdout)
        workload.stdin.close()
        self.assertEqual(readline(workload.stdout, 30, "the stacks workload "
                                  "did not say 'done'"), "done\n")
        self.assertEqual(readline(workload.stdout, 30, "the stacks workload "
                                  "did not close its stdout"), "")
        self.assertEqual(workload.wait(timeout=30), 0)


class AttachTest(UsdtScriptTestCase):
    """Attaching with -p to a running interpreter (the watcher thread)."""

    def test_attach_running_process(self):
        workload = self.write("attach_workload.py", """\
            import time

            def ping():
                pass

            print("ready", flush=True)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                ping()
                time.sleep(0.001)
            """)
        target = start(self, [PYTHON, workload], stdout=subprocess.PIPE)
        self.assertEqual(readline(target.stdout, 60, "the attach workload "
                                  "did not say 'ready'"), "ready\n")
        semaphore = Semaphore(target.pid, "function__entry")
        snapshot = semaphore.snapshot()
        tracer = start(self, ["bpftrace", "-q", "-p", str(target.pid),
                              script_path("top-functions.bt"), PYTHON],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The script's only probe is attached once it arms the semaphore.
        if semaphore.wait_armed(
                snapshot, still_waiting=lambda: tracer.poll() is None) is None:
            # bpftrace has exited.
            _, errors = tracer.communicate()
            self.fail("bpftrace left without arming the probe: "
                      + Bpftrace.errors(errors))
        # A witness attached after it sees 200 calls of ping() (once the
        # watcher has switched the instrumentation on): the script, attached
        # before, has counted them too.
        witness = run(
            ["bpftrace", "-q", "-p", str(target.pid), "-e",
             'usdt:%s:python:function__entry /pid == %d && '
             'str(uptr(arg1)) == "ping"/ { @pings = @pings + 1; '
             'if (@pings >= 200) { exit(); } } interval:s:60 { exit(); }'
             % (PYTHON, target.pid)], timeout=120)
        self.assertEqual(witness.returncode, 0, Bpftrace.errors(witness))
        seen = re.search(r"^@pings: (\d+)$", witness.stdout, re.M)
        self.assertTrue(seen and int(seen.group(1)) >= 200,
                        "the watcher did not arm within 60 s: "
                        + witness.stdout)
        # bpftrace 0.17 misses a SIGINT now and then (this test failed so).
        output, errors = Bpftrace.interrupt(tracer)
        output = bpftrace_output(output)
        self.assertEqual(tracer.returncode, 0, Bpftrace.errors(errors))
        self.assertIsNone(target.poll(), "the workload died")
        calls = {key[1]: value for key, value
                 in map_entries(output, "calls").items()
                 if key[0] == workload}
        self.assertGreaterEqual(calls.get("ping", 0), 200, output + errors)


class HttpRoutesTest(UsdtScriptTestCase):
    """examples/http_routes.bt, run as the howto says,

        bpftrace -p PID examples/http_routes.bt

    against examples/http_routes.py, whose probes the usdt module defines:
    the requests it counts per route and status are those made, and their
    durations are plausible."""

    SERVER = os.path.join(TOP, "examples", "http_routes.py")
    # Relative to the top of the clone, as documented.
    SCRIPT = os.path.join("examples", "http_routes.bt")
    BEGIN = "Tracing requests... Hit Ctrl-C to end.\n"
    PROBES = ["myapp:load_user__entry", "myapp:load_user__return",
              "myapp:request__done", "myapp:request__start"]
    # (path, its route, its status, how many requests)
    REQUESTS = [("/", "/", 200, 40),
                ("/users/1", "/users/<id>", 200, 10),
                ("/users/2", "/users/<id>", 200, 10),
                ("/users/3", "/users/<id>", 200, 10),
                ("/users/9", "/users/<id>", 404, 10),
                ("/slow", "/slow", 200, 8),
                ("/nope", "-", 404, 5)]
    LOAD_USER = re.compile(
        r"^@load_user_us: count (\d+), average (\d+), total (\d+)$", re.M)

    def get(self, port, path):
        """GET path from the server: its status."""
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d%s"
                                        % (port, path), timeout=60) as r:
                r.read()
                return r.status
        except urllib.error.HTTPError as error:
            error.close()
            return error.code

    def probe_listing(self, pid):
        """{probe: semaphore} of the server, from python -m usdt list."""
        proc = run([PYTHON, "-m", "usdt", "list", str(pid)])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # The first line names the fields.
        self.assertEqual(proc.stdout.split()[:2], ["PID", "PROVIDER:NAME"])
        return {line.split()[1]: line.split()[2]
                for line in proc.stdout.splitlines()[1:]}, proc.stdout

    def test_counts_and_latencies_per_route(self):
        # SIGINT as from a terminal, also when the tests run as a
        # background job of a shell without job control, which ignores it
        # there (and Python keeps an ignored SIGINT ignored): Ctrl-C ends
        # the server below.
        server = start(self, [PYTHON, self.SERVER, "0"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                        signal.SIG_DFL))

        def interrupt():
            # Before stop() kills it: a killed server leaves its files.
            if server.poll() is None:
                server.send_signal(signal.SIGINT)
                try:
                    server.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
        self.addCleanup(interrupt)
        # support.readline(): select() on the text pipe would miss a line
        # already in its buffer.
        try:
            first = readline(server.stdout, 60, "the server did not say "
                             "where it serves")
        except Hang:
            first = ""
        started = re.match(r"pid (\d+) serving on http://127\.0\.0\.1:(\d+)/$",
                           first)
        if not started:
            # Killed here, its pipes still open (stop() closes them).
            server.kill()
            server.wait()
            self.fail("the server did not start: %r %s"
                      % (first, server.stderr.read()))
        self.assertEqual(int(started.group(1)), server.pid)
        port = int(started.group(2))
        probes, listing = self.probe_listing(server.pid)
        self.assertEqual(sorted(probes), self.PROBES, listing)
        tracer = start(self, ["bpftrace", "-p", str(server.pid),
                              self.SCRIPT],
                       cwd=TOP, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
        lines = queue.Queue()
        reader = threading.Thread(target=lambda: [
            *map(lines.put, bpftrace_lines(tracer.stdout)), lines.put("")],
            daemon=True)
        reader.start()
        self.addCleanup(end_reader, tracer, reader)
        # bpftrace reads the output of BEGIN (which runs before it attaches
        # the probes) only once every probe is attached.
        shown = []
        while self.BEGIN not in shown:
            try:
                shown.append(lines.get(timeout=60))
            except queue.Empty:
                shown.append("")
            if not shown[-1]:
                tracer.kill()
                self.fail("no BEGIN line from http_routes.bt: %s %s"
                          % (shown, Bpftrace.errors(tracer.stderr.read())))
        probes, listing = self.probe_listing(server.pid)
        self.assertTrue(all(probes[p] == "1" for p in self.PROBES), listing)
        paths = [path for path, _, _, n in self.REQUESTS for _ in range(n)]
        random.Random(11).shuffle(paths)
        # Four at a time: the server's threads overlap.
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            statuses = collections.Counter(
                zip(paths, pool.map(lambda path: self.get(port, path),
                                    paths)))
        self.assertEqual(statuses, {(path, status): n for path, _, status, n
                                    in self.REQUESTS})
        Bpftrace.interrupt(tracer, collect=False)
        end_reader(tracer, reader)
        output = "".join(iter(lines.get_nowait, ""))
        self.assertEqual(tracer.returncode, 0,
                         Bpftrace.errors(tracer.stderr.read()))
        expected = collections.Counter()
        for _, route, status, n in self.REQUESTS:
            expected[route, str(status)] += n
        stats = stats_entries(output, "stats_us")
        self.assertEqual({key: count for key, (count, _, _) in stats.items()},
                         expected, output)
        hists = histograms(output, "us")
        self.assertEqual({key: sum(buckets.values())
                          for key, buckets in hists.items()},
                         expected, output)
        average = {key: avg for key, (_, avg, _) in stats.items()}
        # /slow sleeps 50 ms, load_user() 2 ms; / does nothing.
        self.assertGreaterEqual(average["/slow", "200"], 50000, output)
        self.assertGreaterEqual(min(hists["/slow", "200"]), 32 * 2**10,
                                output)
        self.assertGreaterEqual(average["/users/<id>", "200"], 2000, output)
        self.assertLess(average["/", "200"], average["/users/<id>", "200"],
                        output)
        self.assertLess(average["/users/<id>", "200"],
                        average["/slow", "200"], output)
        load_user = self.LOAD_USER.search(output)
        self.assertIsNotNone(load_user, output)
        self.assertEqual(int(load_user.group(1)),
                         expected["/users/<id>", "200"]
                         + expected["/users/<id>", "404"])
        self.assertGreaterEqual(int(load_user.group(2)), 2000, output)
        # Detached: unarmed again (the kernel may take a moment).  Ctrl-C
        # ends the server cleanly, and it removes its probes' files.
        deadline = time.monotonic() + 60
        while True:
            probes, listing = self.probe_listing(server.pid)
            if all(probes[p] == "0" for p in self.PROBES):
                break
            self.assertLess(time.monotonic(), deadline, listing)
            time.sleep(0.1)
        files = {line.split()[3] for line in listing.splitlines()}
        server.send_signal(signal.SIGINT)
        self.assertEqual(server.wait(timeout=60), 0, server.stderr.read())
        for path in files:
            self.assertFalse(os.path.exists(path), path)


class SystemTapScriptsTest(unittest.TestCase):
    """stap -p2: parse and resolve the markers, without running anything."""

    _fake_kernel = None

    def stap(self, *args):
        if shutil.which("stap") is None:
            self.skipTest("stap not found (apt-get install systemtap)")
        proc = run(["stap", "-p2", *args], timeout=300)
        if proc.returncode != 0 and "build/.config" in proc.stderr:
            # No kernel build tree: -p2 only reads the kernel's release and
            # configuration, so give it those from /proc/config.gz.
            tree = self.fake_kernel_tree()
            if tree is None:
                self.skipTest("stap needs a kernel build tree: "
                              + proc.stderr.strip())
            proc = run(["stap", "-r", tree, "-p2", *args], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def fake_kernel_tree(self):
        try:
            import gzip
        except ImportError:     # built without zlib
            return None
        if not os.path.exists("/proc/config.gz"):
            return None
        tree = tempfile.mkdtemp(prefix="stap-kernel")
        self.addCleanup(shutil.rmtree, tree)
        with gzip.open("/proc/config.gz", "rb") as src, \
                open(os.path.join(tree, ".config"), "wb") as dst:
            dst.write(src.read())
        os.makedirs(os.path.join(tree, "include", "config"))
        with open(os.path.join(tree, "include", "config",
                               "kernel.release"), "w") as f:
            f.write(os.uname().release + "\n")
        for name in ("Makefile", "Module.symvers"):
            open(os.path.join(tree, name), "w").close()
        return tree

    def sites(self, *markers):
        """How many probe points stap resolves for these markers of PYTHON:
        one per site, and an inlining compiler (LTO, PGO) may copy a site."""
        notes = stapsdt_notes(PYTHON)
        counts = [sum(1 for provider, name, _ in notes
                      if (provider, name) == ("python", marker))
                  for marker in markers]
        self.assertNotIn(0, counts, (markers, counts))
        return sum(counts)

    def resolved(self, output):
        """Probe points resolved in PYTHON, from stap -p2's listing."""
        prefixes = tuple('process("%s").' % path
                         for path in (PYTHON, os.path.realpath(PYTHON)))
        return [line for line in output.splitlines()
                if line.startswith(prefixes)]

    def test_show_call_hierarchy(self):
        with tempfile.TemporaryDirectory() as tmp:
            workload = os.path.join(tmp, "noop.py")
            with open(workload, "w") as f:
                f.write("pass\n")
            output = self.stap(script_path("show-call-hierarchy.stp"),
                               "-c", "%s %s" % (PYTHON, workload))
        self.assertEqual(len(self.resolved(output)),
                         self.sites("function__entry", "function__return"),
                         output)

    def test_top_functions(self):
        output = self.stap(script_path("top-functions.stp"), PYTHON)
        self.assertEqual(len(self.resolved(output)),
                         self.sites("function__entry"), output)
        self.assertIn("timer.ms(1000)", output)

    # The scripts for one process (-c or -x): the markers each one uses.
    PROCESS_SCRIPTS = {
        "ccalls.stp": ("cfunction__entry", "cfunction__return"),
        "exceptions.stp": ("exception__raise", "exception__reraise",
                           "exception__handled"),
        "gil.stp": ("gil__take__start", "gil__take__done", "gil__drop"),
        "threads.stp": ("thread__start", "thread__stop"),
        "tasks.stp": ("task__step__start", "task__step__done"),
        "pystat.stp": ("function__entry", "cfunction__entry",
                       "exception__raise", "gc__start", "gil__take__start",
                       "gil__take__done", "thread__start", "thread__stop"),
    }

    def test_process_scripts(self):
        with tempfile.TemporaryDirectory() as tmp:
            workload = os.path.join(tmp, "noop.py")
            with open(workload, "w") as f:
                f.write("pass\n")
            command = "%s %s" % (PYTHON, workload)
            for name, markers in self.PROCESS_SCRIPTS.items():
                with self.subTest(script=name):
                    output = self.stap(script_path(name), "-c", command)
                    self.assertEqual(len(self.resolved(output)),
                                     self.sites(*markers), output)
            # ccalls.stp's optional callable
            output = self.stap(script_path("ccalls.stp"), "time.sleep",
                               "-c", command)
            self.assertEqual(len(self.resolved(output)),
                             self.sites(*self.PROCESS_SCRIPTS["ccalls.stp"]),
                             output)
        self.assertEqual(sorted(self.PROCESS_SCRIPTS),
                         sorted(name for name in os.listdir(USDT)
                                if name.endswith(".stp")
                                and name not in ("show-call-hierarchy.stp",
                                                 "top-functions.stp")))


if __name__ == "__main__":
    unittest.main()
