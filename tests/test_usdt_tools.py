"""python -m usdt.tools: the front door of the ready tools, on a real-size
application.

The application is installed under a path of more than 150 bytes, in a
package whose two handler modules share their first 180 bytes; it runs
more than 10,000 different lines (a generated module of 250 functions),
a recursion, 8 threads and asyncio tasks.  What the lines tool reports
for the application's files must be what sys.settrace() sees, line for
line, whether the tool starts the application (-c) or attaches to it
after it has run for a minute (-p).  The tool must refuse a process of
another interpreter, say how many events a full map dropped, and print
its results at Ctrl-C and at the end of -d.
"""

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import textwrap
import time
import unittest

from support import (Bpftrace, PYTHON, SETTRACE_LINES, TOP,
                     readline, require_bpftrace, run, start,
                     usdt_module)
from test_flamegraph import svg_frames, expected_frames
from test_stacks import CHAIN, WORKLOAD as STACKS_WORKLOAD

# Lines per generated function, and functions: more than 10,000 lines.
BULK_LINES = 45
BULK_FUNCTIONS = 250

MAIN = textwrap.dedent("""\
    import asyncio, os, sys, threading, time
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from app import bulk
    from app import {alpha} as alpha
    from app import {beta} as beta

    def warm_up():
        return sum(range(10))

    def main():
        bulk.run_all()
        alpha.recurse(30)
        threads = [threading.Thread(target=beta.work, args=(i,))
                   for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        asyncio.run(beta.tasks(5))

    if __name__ == "__main__":
        if sys.argv[1:] == ["wait"]:
            # Run a while, then work when told to (a line on stdin).
            go = threading.Event()
            threading.Thread(target=lambda: (sys.stdin.readline(),
                                             go.set()),
                             daemon=True).start()
            print("ready", flush=True)
            while not go.is_set():
                warm_up()
                time.sleep(0.01)
            main()
            print("done", flush=True)
            sys.stdin.readline()
        elif sys.argv[1:] == ["bulk"]:
            # No thread: the same lines run every time.
            bulk.run_all()
        else:
            main()
    """)

ALPHA = textwrap.dedent("""\
    def recurse(n):
        if n == 0:
            return 0
        return 1 + recurse(n - 1)
    """)

BETA = textwrap.dedent("""\
    import asyncio

    def work(i):
        total = 0
        for j in range(100 + i):
            if j % 7 == i:
                total += j
        return total

    async def step(i):
        for _ in range(3 + i):
            await asyncio.sleep(0)
        return i

    async def tasks(n):
        return await asyncio.gather(*[step(i) for i in range(n)])
    """)

def bulk_module():
    """250 functions of 45 lines each, and run_all() that calls them."""
    parts = []
    for n in range(BULK_FUNCTIONS):
        body = ["    x = %d" % n]
        body += ["    x = x * 3 + %d" % i for i in range(BULK_LINES - 2)]
        body.append("    return x")
        parts.append("def f%d():\n%s\n" % (n, "\n".join(body)))
    parts.append("def run_all():\n    return [%s]\n" % ", ".join(
        "f%d()" % n for n in range(BULK_FUNCTIONS)))
    return "\n".join(parts)


class ToolsTestCase(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="usdt-tools")
        self.addCleanup(shutil.rmtree, self.tmp)

    def tools(self, *args, **kwargs):
        return run([PYTHON, "-m", "usdt.tools", *args], **kwargs)


class WatcherDelayTest(unittest.TestCase):
    """How long the front door waits for the watched markers: the poll
    interval that the interpreter exports, which is how often its watcher
    thread (py-usdt-watch) wakes up in an idle process."""

    def watcher_wakeups(self, seconds):
        proc = subprocess.Popen(
            [PYTHON, "-c", "import sys, time; print(flush=True); "
             "sys.stdin.read()"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.stdin.close)
        proc.stdout.readline()
        task = "/proc/%d/task" % proc.pid
        for tid in os.listdir(task):
            with open("%s/%s/comm" % (task, tid)) as f:
                if f.read().strip() == "py-usdt-watch":
                    break
        else:
            self.fail("no py-usdt-watch thread in %s" % task)

        def switches():
            with open("%s/%s/status" % (task, tid)) as f:
                return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)",
                                     f.read(), re.M).group(1))

        before = switches()
        time.sleep(seconds)
        return switches() - before

    def test_delay_is_the_exported_interval(self):
        tools = usdt_module("tools")
        interval = tools.watcher_delay(PYTHON) - tools.WATCHER_MARGIN
        self.assertGreater(interval, 0, "%s exports no %s"
                           % (PYTHON, tools.WATCH_INTERVAL_SYMBOL))
        # Over four intervals, four wakeups (three if the first poll
        # comes late on a busy machine; one more for a stray signal).
        wakeups = self.watcher_wakeups(4 * interval)
        self.assertIn(wakeups, (3, 4, 5), "%d wakeups in %.1f s"
                      % (wakeups, 4 * interval))

    def test_no_watcher_no_interval(self):
        tools = usdt_module("tools")
        self.assertEqual(tools.watcher_delay("/bin/true"),
                         tools.WATCHER_MARGIN)


class FrontDoorTest(ToolsTestCase):
    """What needs no tracer."""

    # The questions of issue 26, each answered by a tool, and issue 29's
    # "which Python code allocates the most".
    REQUIRED = ["calls", "latency", "lines", "exceptions", "ccalls", "gc",
                "imports", "gil", "threads", "tasks", "stacks", "profile",
                "flamegraph", "alloc"]

    def test_help_lists_every_tool_with_its_question(self):
        proc = self.tools("--help")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        listed = {}
        for line in proc.stdout.splitlines():
            match = re.match(r"^    (\w+)\s+(\S.*\?.*)$", line)
            if match:
                listed[match.group(1)] = match.group(2)
        self.assertEqual(sorted(set(self.REQUIRED) - set(listed)), [],
                         proc.stdout)
        # Each tool takes the common options.
        for name in sorted(listed):
            if name in ("flamegraph", "list"):
                continue
            with self.subTest(tool=name):
                proc = self.tools(name, "--help")
                self.assertEqual(proc.returncode, 0, proc.stderr)
                for option in ("-p PID", "-c CMD", "-d SECONDS", "-o FILE",
                               "-f TEXT"):
                    self.assertIn(option, proc.stdout)

    def test_help_shows_the_measured_costs(self):
        # Every row of docs/tools-cost.md (bench/tools.py's report) is in
        # --help, on its tool's line, and the howto's table is the same.
        with open(os.path.join(TOP, "docs", "tools-cost.md")) as f:
            rows = re.findall(r"^\| `([\w -]+)` \| (\w+) \| ×([\d.]+) \|",
                              f.read(), re.M)
        self.assertGreaterEqual(len(rows), 20, rows)
        proc = self.tools("--help")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        listed = dict(re.findall(r"^    (\w+)\s+(.*)$", proc.stdout, re.M))
        for tool, workload, slowdown in rows:
            name, _, option = tool.partition(" ")
            self.assertIn("%s×%s on %s" % (option + " " if option else "",
                                           slowdown, workload),
                          listed.get(name, ""), (tool, workload))
        with open(os.path.join(TOP, "overlay", "Doc", "howto",
                               "usdt-tools.rst")) as f:
            howto = re.findall(r"^``([\w -]+)``\s+(\w+)\s+×([\d.]+)\s*$",
                               f.read(), re.M)
        self.assertEqual(howto, rows)

    def test_refuses_another_interpreter(self):
        # sleep(1) is a process that does not run this interpreter.
        other = start(self, ["sleep", "60"])
        proc = self.tools("gc", "-p", str(other.pid))
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(proc.stderr, "usdt.tools gc: process %d runs %s, "
                         "not this interpreter (%s): run the tools with the "
                         "interpreter it runs\n"
                         % (other.pid, shutil.which("sleep")
                            and os.path.realpath(shutil.which("sleep")),
                            os.path.realpath(PYTHON)))


class NativeProfileTest(ToolsTestCase):
    """profile --native: whole stacks, as stacks --native takes them, on
    test_stacks.py's workload (threads calling outer() -> middle() ->
    leaf()), started without -X dtrace_stacks: the Python frames are named
    all the same."""

    def test_python_names_in_native_stacks(self):
        require_bpftrace(self)
        workload = start(self, [PYTHON, STACKS_WORKLOAD, "90"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
        pid = workload.pid
        self.assertEqual(readline(workload.stdout, 60, "the stacks workload "
                                  "did not say 'ready'"), "ready %d\n" % pid)
        folded = os.path.join(self.tmp, "native.folded")
        svg = os.path.join(self.tmp, "native.svg")
        proc = self.tools("profile", "--native", "-p", str(pid), "-d", "6",
                          "-o", folded, "--svg", svg, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # What the stack tool counted of what it could not unwind or
        # read ("usdt.stacks: N ..."), and the one line that counts the
        # known harmless warnings left out: nothing else.
        self.assertEqual(re.sub(r"(?m)^(usdt\.stacks: \d+ .*|usdt.tools "
                                r"profile: \d+ known harmless bpftrace "
                                r"warnings? not shown \(-v shows "
                                r"(them|it)\))\n", "", proc.stderr),
                         "")
        self.assertIsNone(workload.poll())
        stacks = collections.Counter()
        with open(folded) as f:
            for line in f:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                stacks[stack] += int(count)
        total = sum(stacks.values())
        self.assertGreater(total, 50, stacks)
        # Root first: outer() below middle() below leaf(), in the samples
        # taken once the trampoline was on.
        full = sum(count for stack, count in stacks.items()
                   if [re.match(r"py::(\S+) \(", frame)[1]
                       for frame in stack.split(";")
                       if frame.startswith("py::")][-3:] == CHAIN[::-1])
        self.assertGreater(full, total // 4, stacks)
        with open(svg) as f:
            _, frames = svg_frames(f.read())
        self.assertEqual({frame["path"]: frame["count"] for frame in frames
                          if frame["path"]}, dict(expected_frames(stacks)))


# The workload of CallPathsTest: sleeps of known length on known paths,
# recursion, a generator resumed from two callers, and a thread.  It says
# how long main() took, by its own clock.
CALLPATHS_WORKLOAD = textwrap.dedent("""\
    import threading, time
    def leaf(seconds):
        time.sleep(seconds)
    def a():
        leaf(0.2)
    def b():
        leaf(0.1)
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)
    def numbers():
        for i in range(3):
            yield fib(i + 5)
    def first(gen):
        return next(gen)
    def rest(gen):
        return sum(gen)
    def worker():
        leaf(0.05)
        fib(8)
    def main():
        a()
        b()
        gen = numbers()
        first(gen)
        rest(gen)
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
    start = time.perf_counter_ns()
    main()
    print("main_ns", time.perf_counter_ns() - start)
    """)

# The ground truth of CallPathsTest: the call paths of the workload's
# functions, with threading.setprofile_all_threads() (which, like the
# probes, sees a generator's resumption as a call and its yield as a
# return): each path from the first of its frames in the workload's file,
# as "name (file:line)" of the def.
SETPROFILE_PATHS = textwrap.dedent("""\
    import json, sys, threading
    target = sys.argv[1]
    paths = set()
    stacks = {}
    def profile(frame, event, arg):
        if event not in ("call", "return"):
            return
        stack = stacks.setdefault(threading.get_ident(), [])
        if event == "return":
            if stack:
                stack.pop()
            return
        code = frame.f_code
        stack.append((code.co_filename == target, "%s (%s:%d)" % (
            code.co_name, code.co_filename, code.co_firstlineno)))
        for i, (own, _) in enumerate(stack):
            if own:
                paths.add(";".join(name for _, name in stack[i:]))
                break
    with open(target) as f:
        code = compile(f.read(), target, "exec")
    threading.setprofile_all_threads(profile)
    exec(code, {"__name__": "__main__"})
    threading.setprofile_all_threads(None)
    print(json.dumps(sorted(paths)))
    """)


class CallPathsTest(ToolsTestCase):
    """latency --folded/--svg (callpaths.bt): the own wall time of each
    function per call path, against sys.setprofile's call paths and the
    workload's own clock."""

    def test_call_paths_and_their_time(self):
        require_bpftrace(self)
        workload = os.path.join(self.tmp, "callpaths_workload.py")
        with open(workload, "w") as f:
            f.write(CALLPATHS_WORKLOAD)
        reference = run([PYTHON, "-c", SETPROFILE_PATHS, workload])
        self.assertEqual(reference.returncode, 0, reference.stderr)
        expected = set(json.loads(reference.stdout.splitlines()[-1]))
        folded = os.path.join(self.tmp, "callpaths.folded")
        svg = os.path.join(self.tmp, "callpaths.svg")
        proc = self.tools("latency", "--svg", svg, "-o", folded, "-c",
                          "%s %s" % (PYTHON, workload), timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        main_ns = int(re.search(r"^main_ns (\d+)$", proc.stdout,
                                re.M).group(1))
        own = collections.Counter()
        paths = set()
        with open(folded) as f:
            for line in f:
                stack, _, ns = line.rstrip("\n").rpartition(" ")
                frames = stack.split(";")
                own[stack] += int(ns)
                # From the first frame in the workload's file, as the
                # reference has them.
                for i, frame in enumerate(frames):
                    if "(%s:" % workload in frame:
                        paths.add(";".join(frames[i:]))
                        break

        def frame(name):
            return "%s (%s:%d)" % (name, workload, CALLPATHS_WORKLOAD[
                :CALLPATHS_WORKLOAD.index("def %s(" % name)].count("\n")
                + 1)
        module = "<module> (%s:1)" % workload
        main = [module, frame("main")]

        # Not the paths of the module's imports (the reference imported
        # those modules before): those that start at main(), or at the
        # thread's worker().
        def kept(paths):
            return sorted(path for path in paths
                          if not path.startswith(module + ";")
                          or path.startswith(";".join(main)))
        self.assertEqual(kept(paths), kept(expected))
        for path in (main + [frame("first"), frame("numbers")]
                     + [frame("fib")] * 5,
                     [frame("worker"), frame("leaf")]):
            self.assertTrue(";".join(path) in paths, path)
        # The sleeps, each on its own path, at least as long as asked.
        for caller, seconds in (("a", 0.2), ("b", 0.1)):
            stack = ";".join(main + [frame(caller), frame("leaf")])
            self.assertGreaterEqual(own[stack], seconds * 1e9, own)
            self.assertLess(own[stack], seconds * 1e9 + 0.1e9, own)
        # main()'s time is the time of the paths under it, which the
        # probes bracket within the workload's own clock.
        under_main = sum(ns for stack, ns in own.items()
                         if stack.split(";")[:2] == main)
        self.assertLessEqual(under_main, main_ns)
        self.assertGreater(under_main, main_ns - 5_000_000,
                           (under_main, main_ns))
        # The generator's resumptions, under the two callers that resumed
        # it.
        for caller in ("first", "rest"):
            stack = ";".join(main + [frame(caller), frame("numbers")])
            self.assertIn(stack, own)
        # The graph draws those times.
        with open(svg) as f:
            _, frames = svg_frames(f.read())
        self.assertEqual({tuple(frame["path"]): frame["count"]
                          for frame in frames if frame["path"]},
                         dict(expected_frames(own)))


# --top's workload: busy.py's 40 functions, f<i> called 50 + i times, more
# than any cut keeps; rare.py's two, called 3 and 5 times, fewer than the
# 20 busiest functions of the process.
TOP_BUSY = "".join("def f%d():\n    pass\n" % i for i in range(40))
TOP_RARE = "def once():\n    pass\n\ndef few():\n    pass\n"
TOP_MAIN = textwrap.dedent("""\
    import os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import busy, rare
    for i in range(40):
        for _ in range(50 + i):
            getattr(busy, "f%d" % i)()
    for _ in range(3):
        rare.once()
    for _ in range(5):
        rare.few()
    # C functions that main.py calls, for ccalls -f main.py.
    print(len(sys.path) > 0, abs(-1), max(1, 2), file=sys.stderr)
    """)

# The 'call' events per function (file, name, def line) of the files under
# a directory, as sys.setprofile() counts them: JSON [[key, count], ...].
SETPROFILE_CALLS = textwrap.dedent("""\
    import collections, json, os, runpy, sys
    target = sys.argv[1]
    top = os.path.dirname(target) + os.sep
    calls = collections.Counter()
    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(top):
            calls[code.co_filename, code.co_name, code.co_firstlineno] += 1
    sys.setprofile(profile)
    runpy.run_path(target, run_name="__main__")
    sys.setprofile(None)
    print(json.dumps(sorted(calls.items())))
    """)


class TopTest(ToolsTestCase):
    """--top: every entry with 0, a cut that says how many entries it
    left out, and -f before the cut."""

    LEFT_OUT = re.compile(r"^\((\d[\d,]*) more functions? left out: --top "
                          r"0 shows every one\)$", re.M)

    def setUp(self):
        super().setUp()
        for name, text in (("main.py", TOP_MAIN), ("busy.py", TOP_BUSY),
                           ("rare.py", TOP_RARE)):
            with open(os.path.join(self.tmp, name), "w") as f:
                f.write(text)
        self.main = os.path.join(self.tmp, "main.py")
        proc = run([PYTHON, "-c", SETPROFILE_CALLS, self.main])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.expected = {tuple(key): count
                         for key, count in json.loads(proc.stdout)}
        require_bpftrace(self)

    def calls(self, *args):
        """(the tool's {(file, name, def line): count}, its output)."""
        proc = self.tools("calls", *args, "-c",
                          "%s %s" % (PYTHON, self.main), timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        found = {}
        for line in proc.stdout.splitlines():
            match = re.match(r"^@calls\[(.*), (.*), (\d+)\]: (\d+)$", line)
            if match:
                found[match.group(1), match.group(2),
                      int(match.group(3))] = int(match.group(4))
        return found, proc.stdout

    def of(self, found, name):
        return {key: count for key, count in found.items()
                if key[0] == os.path.join(self.tmp, name)}

    def test_top_0_shows_every_function(self):
        found, output = self.calls("--top", "0")
        # The process's functions, the standard library's among them.
        self.assertGreater(len(found), 100, output)
        self.assertEqual({key: count for key, count in found.items()
                          if key[0].startswith(self.tmp + os.sep)},
                         self.expected)
        self.assertEqual(self.LEFT_OUT.findall(output), [], output)

    def test_cut_says_how_many_it_left_out(self):
        found, output = self.calls("--top", "5", "-f", "busy.py")
        busy = self.of(self.expected, "busy.py")
        self.assertGreater(len(busy), 40)
        largest = sorted(busy.items(), key=lambda item: item[1])[-5:]
        self.assertEqual(found, dict(largest), output)
        self.assertEqual(self.LEFT_OUT.findall(output),
                         [str(len(busy) - 5)], output)
        # The largest last, as bpftrace prints them, then the count.
        self.assertRegex(output, r"f39, \d+\]: 89\n\(%d more"
                         % (len(busy) - 5))

    def test_filter_before_the_cut(self):
        found, output = self.calls("-f", "rare.py")
        self.assertEqual(found, self.of(self.expected, "rare.py"), output)
        self.assertEqual(sorted(found.values()), [1, 3, 5], output)
        self.assertEqual(self.LEFT_OUT.findall(output), [], output)

    def test_each_map_cut_says_so(self):
        # latency and ccalls print several maps: each that --top cuts says
        # how many entries it left out of those --top 0 shows; @ns is
        # never cut.
        for tool, needle, cut in (
                ("latency", "busy.py",
                 ["@latency_ns", "@exclusive_ns", "@inclusive_ns"]),
                # -f selects the C calls that main.py makes.
                ("ccalls", "main.py", ["@total_ns", "@latency_ns"])):
            with self.subTest(tool=tool):
                maps = {}
                for top in ("0", "2"):
                    proc = self.tools(tool, "--top", top, "-f", needle, "-c",
                                      "%s %s" % (PYTHON, self.main),
                                      timeout=300)
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    maps[top] = (collections.Counter(re.findall(
                        r"(?m)^(@\w+)\[", proc.stdout)), proc.stdout)
                every, output = maps["0"]
                self.assertNotIn("left out", output)
                shown, output = maps["2"]
                self.assertEqual(shown["@ns"], every["@ns"], output)
                # ccalls shows one histogram.
                kept = {name: 1 if (tool, name) == ("ccalls", "@latency_ns")
                        else 2 for name in cut}
                self.assertEqual({name: shown[name] for name in cut}, kept,
                                 output)
                self.assertEqual(
                    re.findall(r"(?m)^\((\d+) more \w+ left out: --top 0 "
                               r"shows every one\)$", output),
                    [str(every[name] - kept[name]) for name in cut
                     if every[name] > kept[name]], output)


class CutMapsTest(unittest.TestCase):
    """usdt.tools.cut_maps on bpftrace's output: a histogram stays whole,
    the largest entries stay, an uncut map says nothing."""

    OUTPUT = textwrap.dedent("""\
        ccalls.bt: names cut to 63 bytes
        @total_ns[a, x]: 1
        @total_ns[a, y]: 2
        @total_ns[a, z]: 3
        @ns[a, x]: count 1, average 1, total 1
        @ns[a, y]: count 1, average 2, total 2
        @latency_ns[a, x]:
        [1] 1 |@@@@|

        @latency_ns[a, y]:
        [2, 4) 2 |@@@@|

        """)

    def test_cut(self):
        tools = usdt_module("tools")
        cuts = tools.BY_NAME["ccalls"].cuts
        cut = tools.cut_maps(self.OUTPUT, 2, cuts)
        self.assertEqual(cut, textwrap.dedent("""\
            ccalls.bt: names cut to 63 bytes
            @total_ns[a, y]: 2
            @total_ns[a, z]: 3
            (1 more callable left out: --top 0 shows every one)
            @ns[a, x]: count 1, average 1, total 1
            @ns[a, y]: count 1, average 2, total 2
            @latency_ns[a, y]:
            [2, 4) 2 |@@@@|
            (1 more histogram left out: --top 0 shows every one)

            """))
        self.assertEqual(tools.cut_maps(self.OUTPUT, 0, cuts), self.OUTPUT)
        self.assertEqual(tools.cut_maps(self.OUTPUT, 3, {}), self.OUTPUT)


class ImportsToolTest(ToolsTestCase):

    def test_failed_imports_named(self):
        # The tool runs imports.bt with -k up to bpftrace 0.23, and 0.17's
        # -k printed each failed import's name as "" (a string variable
        # given to a second map in an if block): found by comparing the
        # tools' counts across versions (tools/compare-bpftrace-versions).
        require_bpftrace(self)
        workload = os.path.join(self.tmp, "imports_workload.py")
        with open(workload, "w") as f:
            f.write("try:\n    import no_such_module_usdt\n"
                    "except ImportError:\n    pass\n")
        proc = self.tools("imports", "-c", "%s %s" % (PYTHON, workload),
                          timeout=300)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        self.assertIn("@not_found[no_such_module_usdt]: 1\n", proc.stdout)
        self.assertNotIn("@not_found[]", proc.stdout)


class ApplicationTest(ToolsTestCase):
    """The tools on the real-size application."""

    # Seconds the application runs before the tool attaches with -p.
    RUN_BEFORE = 60

    def setUp(self):
        super().setUp()
        require_bpftrace(self)
        # Exactly 150 bytes: a deep site-packages.
        top = os.path.join(self.tmp, "venv", "lib", "python3.13",
                           "site-packages")
        self.assertLess(len(top), 140)
        top = os.path.join(top, "vendor" + "-" * (150 - len(top) - 7))
        package = os.path.join(top, "app")
        os.makedirs(package)
        prefix = os.path.join(package, "handlers_" + "h" * 24)
        names = ["%s_alpha" % os.path.basename(prefix),
                 "%s_betaa" % os.path.basename(prefix)]
        files = {"__init__.py": "VERSION = 1\n", "bulk.py": bulk_module(),
                 names[0] + ".py": ALPHA, names[1] + ".py": BETA}
        for name, text in files.items():
            with open(os.path.join(package, name), "w") as f:
                f.write(text)
        handlers = [os.path.join(package, name + ".py") for name in names]
        self.assertGreaterEqual(len(os.path.commonprefix(handlers)), 180)
        self.assertLess(max(len(path) for path in handlers), 200)
        self.assertEqual(len(top), 150)
        self.main = os.path.join(top, "main.py")
        with open(self.main, "w") as f:
            f.write(MAIN.format(alpha=names[0], beta=names[1]))
        self.top = top
        self.expected = {}
        for what in ("all", "main"):
            proc = run([PYTHON, "-c", SETTRACE_LINES, what, self.main])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.expected[what] = json.loads(proc.stdout)
        distinct = sum(len(lines) for lines in self.expected["main"].values())
        self.assertGreater(distinct, 10000)
        self.assertIn(handlers[0], self.expected["main"])
        self.assertIn(handlers[1], self.expected["main"])

    def app_lines(self, output):
        """{file: {line: count}} of the application's files in the lines
        tool's output."""
        found = collections.defaultdict(dict)
        for line in output.splitlines():
            match = re.match(r"^@lines\[(.*), (\d+)\]: (\d+)$", line)
            if match and match.group(1).startswith(self.top + os.sep):
                found[match.group(1)][match.group(2)] = int(match.group(3))
        return found

    def expected_lines(self, what):
        # main.py's own lines run outside main() too: compare the package.
        return {path: {str(k): v for k, v in lines.items()}
                for path, lines in self.expected[what].items()
                if path != self.main}

    def package_only(self, found):
        return {path: lines for path, lines in found.items()
                if path != self.main}

    def assert_same_lines(self, found, expected):
        """found == expected, with a short message: the files, and the
        first lines that differ."""
        self.assertEqual(sorted(found), sorted(expected))
        for path in expected:
            differ = sorted(
                (int(line), found[path].get(line), expected[path].get(line))
                for line in set(found[path]) | set(expected[path])
                if found[path].get(line) != expected[path].get(line))
            self.assertEqual(differ, [], "%s: (line, found, expected)"
                             % path)

    def test_lines_with_c(self):
        proc = self.tools("lines", "-c", "%s %s" % (PYTHON, self.main),
                          "-f", self.top, "--top", "0", timeout=600)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        self.assertEqual(Bpftrace.errors(proc), "")
        self.assert_same_lines(self.package_only(self.app_lines(
            proc.stdout)), self.expected_lines("all"))
        # -f: only the application's entries.
        for line in proc.stdout.splitlines():
            if line.startswith("@"):
                self.assertIn(self.top, line)

    def test_lines_with_p_after_a_minute(self):
        app = start(self, [PYTHON, self.main, "wait"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.assertEqual(readline(app.stdout, 60, "the app did not say "
                                  "'ready'"), "ready\n")
        time.sleep(self.RUN_BEFORE)
        output = os.path.join(self.tmp, "lines.txt")
        tool = start(self, [PYTHON, "-m", "usdt.tools", "lines", "-p",
                            str(app.pid), "-o", output, "--top", "0"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The tool says when bpftrace has attached the script's probes.
        said = readline(tool.stderr, 120, "usdt.tools lines -p did not say "
                        "it traces")
        self.assertEqual(said, "usdt.tools lines: tracing process %d; "
                         "Ctrl-C prints the results\n" % app.pid,
                         said + tool.stderr.read() if not said else said)
        app.stdin.write("go\n")
        app.stdin.flush()
        self.assertEqual(readline(app.stdout, 60, "the app did not say "
                                  "'done'"), "done\n")
        # Ctrl-C: the results are printed.
        tool.send_signal(signal.SIGINT)
        stdout, stderr = tool.communicate(timeout=120)
        self.assertEqual(tool.returncode, 0, stderr)
        self.assertEqual(Bpftrace.errors(stderr), "")
        with open(output) as f:
            found = self.app_lines(f.read())
        self.assert_same_lines(self.package_only(found),
                               self.expected_lines("main"))
        self.assertIsNone(app.poll())

    def test_dropped_events_said(self):
        # Room for 512 lines: the tool says on stderr how many line events
        # the full map dropped; with the kept ones, they are all of them.
        # Two runs are compared, so the application runs without its
        # threads: how many lines threading's waits run depends on timing
        # (it differed by 75 of 191,071 in a free-threaded build under
        # load).
        counts = {}
        for keys in ("131072", "512"):
            proc = self.tools("lines", "--map-keys", keys, "--top", "0",
                              "-c", "%s %s bulk" % (PYTHON, self.main),
                              timeout=600,
                              env=dict(os.environ, PYTHONHASHSEED="0"))
            self.assertEqual(proc.returncode, 0, proc.stderr)
            kept = sum(int(n) for n in re.findall(r"(?m)^@lines\[.*\]: (\d+)$",
                                                  proc.stdout))
            said = re.findall(r"usdt.tools lines: (\d+) events dropped: a "
                              r"map was full \(%s keys per map\)"
                              % keys, proc.stderr)
            counts[keys] = (kept, int(said[0]) if said else 0)
            self.assertNotIn("map_update_elem", proc.stdout)
        self.assertEqual(counts["131072"][1], 0, counts)
        self.assertGreater(counts["512"][1], 0, counts)
        self.assertEqual(sum(counts["512"]), counts["131072"][0], counts)

    def test_profile_flame_graph_with_d(self):
        # -p and -d: the CPU profile of the application while it works,
        # folded and drawn; the graph's frames are the folded stacks'.
        app = start(self, [PYTHON, "-c", textwrap.dedent("""\
            import sys
            sys.path.insert(0, %r)
            import main
            print("ready", flush=True)
            while True:
                main.main()
            """ % self.top)], stdout=subprocess.PIPE)
        self.assertEqual(readline(app.stdout, 60, "the app did not say "
                                  "'ready'"), "ready\n")
        svg = os.path.join(self.tmp, "profile.svg")
        folded = os.path.join(self.tmp, "profile.folded")
        proc = self.tools("profile", "-p", str(app.pid), "-d", "8",
                          "--svg", svg, "-o", folded, "-f", "/app/",
                          timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        stacks = collections.Counter()
        with open(folded) as f:
            for line in f:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                stacks[stack] += int(count)
        # 49 samples a second of a process that shares 2 CPUs with the
        # tracer and whatever else runs.
        self.assertGreater(sum(stacks.values()), 5)
        # -f: only the stacks through the application's package.
        self.assertEqual([stack for stack in stacks if "/app/" not in stack],
                         [])
        # usdt.stacks keeps the last 127 bytes of a path, after "...".
        bulk = os.path.join(self.top, "app", "bulk.py")
        self.assertTrue(any(re.search(r"(^|;)run_all \(\.\.\.[^;]*:\d+\)",
                                      stack) and bulk[-100:] in stack
                            for stack in stacks), stacks)
        with open(svg) as f:
            _, frames = svg_frames(f.read())
        expected = expected_frames(stacks)
        self.assertEqual({frame["path"]: frame["count"] for frame in frames
                          if frame["path"]}, dict(expected))


if __name__ == "__main__":
    unittest.main()
