"""The scripts of Tools/usdt/, run against the built interpreter.

Each bpftrace script runs as it is documented,

    bpftrace -q -c "PYTHON workload.py" Tools/usdt/SCRIPT.bt PYTHON [ARG]

on a small workload whose behaviour is known, and the test checks both the
shape of the output (the one Doc/howto/instrumentation.rst shows) and its
content.  Where the probes promise to match a Python-level hook (the
function probes sys.setprofile(), the line probe sys.settrace()), the
expected output is computed by running the same workload under that hook
with the same interpreter.

The SystemTap scripts can only be checked here: `stap -p2` resolves their
probe points against the interpreter without running them.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import textwrap
import unittest

from support import (Bpftrace, PYTHON, Semaphore, TOP, require_bpftrace,
                     run, start)

USDT = os.path.join(TOP, "overlay", "Tools", "usdt")

# "<timestamp>\t<probe, right-aligned on 15>:<indent><file>:<func>:<line>"
CALL_STACK_LINE = re.compile(
    r"^(\d+)\t( function-entry|function-return):( *)([^ ].*):(\d+)$")
# A map entry printed by bpftrace: @name[key, key, ...]: value
MAP_ENTRY = re.compile(r"^@(\w+)\[(.*)\]: (-?\d+)$")


def script_path(name):
    return os.path.join(USDT, name)


def run_script(name, workload, script_args=(), python_args=(), timeout=180,
               env=None):
    """bpftrace -q -c 'PYTHON [python_args] workload' SCRIPT PYTHON [args]."""
    command = [PYTHON, *python_args, workload]
    if any(" " in word for word in command):
        raise ValueError("bpftrace -c splits on spaces: %r" % command)
    cmd = ["bpftrace", "-q", "-c", " ".join(command),
           script_path(name), PYTHON, *script_args]
    return run(cmd, timeout=timeout, env=env)


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
        workload = self.write("gen_workload.py", """\
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
            """)
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
        output = self.run_script("call_stack.bt", workload)
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


class TopFunctionsTest(UsdtScriptTestCase):

    def test_counts(self):
        workload = self.write("top_workload.py", """\
            def target():
                pass

            def other():
                pass

            for _ in range(1000):
                target()
            for _ in range(7):
                other()
            """)
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


# Where the documentation advises BPFTRACE_STRLEN values.
ADVICE = [os.path.join(TOP, "README.md"),
          os.path.join(TOP, "overlay", "Doc", "howto", "instrumentation.rst")]
# The scripts that print the workload's file name, and how they print it.
PRINTS_FILENAME = {"call_stack.bt": os.path.basename,
                   "top-functions.bt": lambda path: path,
                   "lines.bt": lambda path: path}


def documented_strlens():
    """{BPFTRACE_STRLEN value: [files]} for each BPFTRACE_STRLEN=N shown."""
    files = ADVICE + sorted(script_path(name) for name in os.listdir(USDT))
    values = {}
    for path in files:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for match in re.finditer(r"\bBPFTRACE_STRLEN=(\d+)", f.read()):
                values.setdefault(int(match.group(1)), []).append(
                    os.path.relpath(path, TOP))
    return values


class StrlenAdviceTest(UsdtScriptTestCase):
    """Every BPFTRACE_STRLEN the docs show works with every bpftrace script.

    bpftrace keeps strings on the 512-byte BPF stack, so a value that suits
    one script can make another fail to load.  Each value runs with each
    script of Tools/usdt on a workload whose file name is longer than any
    value, so that the output also shows where the name is cut.
    """

    def test_documented_values_load_in_every_script(self):
        documented = documented_strlens()
        # The advice exists: the howto and top-functions.bt give a value.
        self.assertTrue(documented, "no BPFTRACE_STRLEN=N in %s" % ADVICE)
        scripts = sorted(name for name in os.listdir(USDT)
                         if name.endswith(".bt"))
        self.assertTrue(set(PRINTS_FILENAME) <= set(scripts), scripts)
        # bpftrace accepts at most 200: a longer base name
        workload = self.write("w" * 220 + ".py", """\
            import gc

            class Thing:
                pass

            def target():
                return Thing()

            things = [target() for _ in range(1000)]
            gc.collect()
            """)
        default_env = dict(os.environ)
        default_env.pop("BPFTRACE_STRLEN", None)
        # None: bpftrace's default (64)
        for value in [None, *sorted(documented)]:
            env = dict(default_env)
            if value is not None:
                env["BPFTRACE_STRLEN"] = str(value)
            kept = (64 if value is None else value) - 1
            for script in scripts:
                with self.subTest(BPFTRACE_STRLEN=value, script=script,
                                  documented_in=documented.get(value)):
                    output = self.run_script(script, workload, env=env)
                    self.assertTrue(output.strip(), "no output")
                    shown = PRINTS_FILENAME.get(script)
                    if shown is not None:
                        name = shown(workload)
                        self.assertGreater(len(name), kept)
                        self.assertIn(name[:kept], output)
                        self.assertNotIn(name[:kept + 1], output)


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
        self.assertEqual(target.stdout.readline(), "ready\n")
        semaphore = Semaphore(target.pid, "function__entry")
        snapshot = semaphore.snapshot()
        tracer = start(self, ["bpftrace", "-q", "-p", str(target.pid),
                              script_path("top-functions.bt"), PYTHON],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # The script's only probe is attached once it arms the semaphore.
        if semaphore.wait_armed(
                snapshot, still_waiting=lambda: tracer.poll() is None) is None:
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
        tracer.send_signal(signal.SIGINT)
        output, errors = tracer.communicate(timeout=60)
        self.assertEqual(tracer.returncode, 0, Bpftrace.errors(errors))
        self.assertIsNone(target.poll(), "the workload died")
        calls = {key[1]: value for key, value
                 in map_entries(output, "calls").items()
                 if key[0] == workload}
        self.assertGreaterEqual(calls.get("ping", 0), 200, output + errors)


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
        # function__entry and function__return
        self.assertEqual(len(self.resolved(output)), 2, output)

    def test_top_functions(self):
        output = self.stap(script_path("top-functions.stp"), PYTHON)
        self.assertEqual(len(self.resolved(output)), 1, output)
        self.assertIn("timer.ms(1000)", output)


if __name__ == "__main__":
    unittest.main()
