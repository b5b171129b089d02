"""A selection: -f of the event tools selects code in the interpreter,
before any trap (Python/pydtrace_select.c, usdt._select,
docs/selection.md).

The workload runs a busy module and a quiet package module whose code is
a small part of the calls: plain functions, a method, a generator, a
function that raises through a frame, a lambda and code made by exec()
after the probes were armed.  With a selection of the quiet module in
effect, calls -f must count exactly what sys.setprofile() counts for the
code objects the selection's rule selects, and nothing else (no output
filter runs when the selection took effect).  Garbage, torn writes and
lengths past the block must not harm the process; the selection ends
when the tracer detaches; another tracer's different selection is
refused; and arming stays invisible with a selection in effect
(test_invisible's cases, again with one).
"""

import collections
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import test_invisible
from support import (Bpftrace, PYTHON, USDT_PACKAGE, readline,
                     require_bpftrace, run, start)

sys.path.insert(0, os.path.dirname(USDT_PACKAGE))
from usdt import _select  # noqa: E402  (the toolkit under test)

BUSY = textwrap.dedent("""\
    def tick(i):
        return i + 1

    def spin(n):
        total = 0
        for i in range(n):
            total += tick(i)
        return total
    """)

QUIET = textwrap.dedent("""\
    class Quiet:
        def work(self, n):
            return [x for x in self.gen(n)]

        def gen(self, n):
            for i in range(n):
                yield i

    def fail(n):
        raise ValueError(n)

    def catch(n):
        try:
            fail(n)
        except ValueError:
            return -1

    def later():
        code = compile("def made(x):\\n    return x * 2\\n",
                       __file__.replace(".py", "_exec.py"), "exec")
        space = {}
        exec(code, space)
        twice = lambda v: space["made"](v)
        return [twice(i) for i in range(3)]
    """)

MAIN = textwrap.dedent("""\
    import json, os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    def main():
        # Imported under the tracer (and the profile function): module
        # and class bodies run once each.
        import busy
        from pkg import quiet
        for round in range(20):
            busy.spin(2000)
            quiet.Quiet().work(3)
            quiet.catch(round)
        quiet.later()

    if __name__ == "__main__":
        if sys.argv[1:] == ["profile"]:
            counts = {}
            def profile(frame, event, arg):
                if event == "call":
                    code = frame.f_code
                    key = "%s|%s|%s|%d" % (code.co_filename, code.co_name,
                                          code.co_qualname,
                                          code.co_firstlineno)
                    counts[key] = counts.get(key, 0) + 1
            sys.setprofile(profile)
            main()
            sys.setprofile(None)
            print(json.dumps(counts))
        elif sys.argv[1:] == ["wait"]:
            print("ready", flush=True)
            sys.stdin.readline()
            main()
        else:
            main()
    """)

CALLS_LINE = re.compile(r"^@calls\[(.*), (.*), (-?\d+)\]: (\d+)$")


def parse_calls(text):
    counts = {}
    for line in text.splitlines():
        match = CALLS_LINE.match(line)
        if match:
            counts[match.group(1), match.group(2),
                   int(match.group(3))] = int(match.group(4))
    return counts


class SelectTestCase(unittest.TestCase):

    def setUp(self):
        require_bpftrace(self)
        self.tmp = tempfile.mkdtemp(prefix="usdt-select")
        self.addCleanup(shutil.rmtree, self.tmp)
        os.mkdir(os.path.join(self.tmp, "pkg"))
        for name, text in (("busy.py", BUSY), ("pkg/quiet.py", QUIET),
                           ("pkg/__init__.py", ""), ("main.py", MAIN)):
            with open(os.path.join(self.tmp, name), "w") as f:
                f.write(text)
        self.main = os.path.join(self.tmp, "main.py")

    def expected(self, text):
        """What sys.setprofile() counts for the code that *text*
        selects."""
        proc = run([PYTHON, self.main, "profile"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        counts = {}
        for key, n in json.loads(proc.stdout).items():
            filename, name, qualname, line = key.split("|")
            if _select.selects(text, filename, name, qualname):
                counts[filename, name, int(line)] = n
        return counts

    def tools(self, *args, **kwargs):
        return run([PYTHON, "-m", "usdt.tools", *args], **kwargs)

    def start_waiting(self):
        proc = start(self, [PYTHON, self.main, "wait"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.assertEqual(readline(proc.stdout, 60, "no 'ready'"), "ready\n")
        return proc

    def tool_on(self, proc, *args):
        """Run the tool with -p on *proc* (waiting on stdin): let the
        workload run once the tool says it traces, and return the tool's
        process once both have ended."""
        tool = start(self, [PYTHON, "-m", "usdt.tools", *args, "-p",
                            str(proc.pid)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        err = []
        while True:
            line = readline(tool.stderr, 120, "the tool did not start "
                            "tracing")
            err.append(line)
            if "tracing process" in line or not line:
                break
        self.assertIn("tracing process", "".join(err), "".join(err))
        proc.stdin.write("go\n")
        proc.stdin.close()
        self.assertEqual(proc.wait(timeout=120), 0)
        out, rest = tool.communicate(timeout=120)
        tool.stderr_text = "".join(err) + rest
        tool.stdout_text = out
        return tool


class CallsSelectionTest(SelectTestCase):

    def check_calls(self, text, out, err, batches=False):
        self.assertNotIn("did not select", err)
        found, expected = parse_calls(out), self.expected(text)
        if batches:
            # The batches name a code object when they are read: a module
            # or class body freed after its import counts under
            # [code object gone] (docs/batch.md), and only it.
            gone = found.pop(("[code object gone]", "?", 0), 0)
            freed = {key: n for key, n in expected.items()
                     if key not in found}
            self.assertEqual(sum(freed.values()), gone, (freed, err))
            self.assertTrue(all(key[1] in ("<module>", "Quiet")
                                for key in freed), freed)
            expected = {key: n for key, n in expected.items()
                        if key not in freed}
        self.assertEqual(found, expected, err)

    def test_module_by_dotted_name_with_c(self):
        # pkg.quiet selects pkg/quiet.py and pkg/quiet_exec.py (code made
        # by exec() after arming), and nothing of busy.py or main.py; the
        # batches (python:batch's records) as the per-event path.
        for path in ([], ["--per-event"]):
            with self.subTest(path=path):
                proc = self.tools("calls", *path, "-f", "pkg.quiet", "-c",
                                  "%s %s" % (PYTHON, self.main))
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.check_calls("pkg.quiet", proc.stdout, proc.stderr,
                                 batches=not path)
                files = {key[0] for key in parse_calls(proc.stdout)}
                files.discard("[code object gone]")
                self.assertEqual({os.path.basename(f) for f in files},
                                 {"quiet.py", "quiet_exec.py"}, files)

    def test_qualified_name_with_p(self):
        # Quiet.gen: selected by its qualified name; the generator's
        # resumptions count as entries, as setprofile's 'call' does.
        proc = self.start_waiting()
        tool = self.tool_on(proc, "calls", "-f", "Quiet.gen")
        self.assertEqual(tool.returncode, 0, tool.stderr_text)
        self.check_calls("Quiet.gen", tool.stdout_text, tool.stderr_text)
        self.assertEqual([key[1] for key in parse_calls(tool.stdout_text)],
                         ["gen"])

    def test_selection_ends_with_the_tracer(self):
        proc = self.start_waiting()
        tool = self.tool_on(proc, "calls", "-f", "pkg.quiet")
        self.assertEqual(tool.returncode, 0, tool.stderr_text)
        # The process has exited: a new one, traced without -f.
        proc = start(self, [PYTHON, "-c", "import time\nwhile True: "
                            "time.sleep(0.05)"])
        time.sleep(0.5)
        with _select.Block(proc.pid) as block:
            self.assertIsNotNone(block.wait_seen(block.write("pkg.quiet"),
                                                 5))
        out = run([PYTHON, "-m", "usdt", "select", "-p", str(proc.pid)])
        self.assertIn("pending 'pkg.quiet'", out.stdout, out.stderr)
        # Armed and disarmed by a tracer: the selection is spent.
        tracer = run(["bpftrace", "-q", "-e", "usdt:%s:python:"
                      "function__entry { @n = count(); } interval:s:3 "
                      "{ exit(); }" % PYTHON, "-p", str(proc.pid)])
        self.assertEqual(tracer.returncode, 0, tracer.stderr)
        time.sleep(2.5)
        with _select.Block(proc.pid) as block:
            self.assertEqual(block.read()["state"], "ended")
        proc.kill()

    def test_another_tracers_selection_is_refused(self):
        proc = start(self, [PYTHON, "-c", "import time\nwhile True: "
                            "time.sleep(0.05)"])
        time.sleep(0.5)
        out = run([PYTHON, "-m", "usdt", "select", "-p", str(proc.pid),
                   "time"])
        self.assertEqual(out.returncode, 0, out.stderr)
        tracer = start(self, ["bpftrace", "-q", "-e", "usdt:%s:python:"
                              "function__entry { @n = count(); }" % PYTHON,
                              "-p", str(proc.pid)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        with _select.Block(proc.pid) as block:
            while block.read()["state"] != "applied":
                self.assertLess(time.monotonic(), deadline,
                                "the selection never took effect")
                time.sleep(0.1)
        out = run([PYTHON, "-m", "usdt", "select", "-p", str(proc.pid),
                   "json"])
        self.assertEqual(out.returncode, 2)
        self.assertIn("in effect, for another tracer", out.stderr)
        out = self.tools("calls", "-p", str(proc.pid), "-d", "1")
        self.assertEqual(out.returncode, 2)
        self.assertIn("without -f would see only that code", out.stderr)
        Bpftrace.interrupt(tracer)
        proc.kill()


class SubinterpreterSelectionTest(unittest.TestCase):

    def test_only_the_selected_function_fires(self):
        # test_invisible's subinterpreter case, with the selection
        # sub_func from start-up: the subinterpreter's sub_func, 7 times,
        # and nothing else of either interpreter.
        require_bpftrace(self)
        program = ("usdt:%s:python:function__entry { @[str(arg1)] = "
                   "count(); }" % PYTHON)
        env = dict(os.environ, INVISIBLE_CASE="subinterpreter",
                   PYTHONUSDTSELECT="sub_func")
        proc = Bpftrace.run(program, test_invisible.WORKLOAD, env=env)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        self.assertIn("subinterpreter done", proc.stdout)
        self.assertEqual(re.findall(r"(?m)^@\[(.*)\]: (\d+)$", proc.stdout),
                         [("sub_func", "7")], proc.stdout)


# What the process prints: a checksum of its own work, whatever the
# tracer writes into its selection block.
HOSTILE = textwrap.dedent("""\
    import sys, time
    def f(i):
        return i * 3 % 7
    print("ready", flush=True)
    total = 0
    end = time.monotonic() + float(sys.argv[1])
    rounds = 0
    while time.monotonic() < end:
        total += sum(f(i) for i in range(1000))
        rounds += 1
    print(total == rounds * sum(i * 3 % 7 for i in range(1000)),
          sys.exc_info(), flush=True)
    """)


class UntrustedBlockTest(SelectTestCase):

    def test_garbage_torn_and_oversized_writes(self):
        path = os.path.join(self.tmp, "hostile.py")
        with open(path, "w") as f:
            f.write(HOSTILE)
        proc = start(self, [PYTHON, path, "14"], stdout=subprocess.PIPE)
        self.assertEqual(readline(proc.stdout, 60, "no 'ready'"), "ready\n")
        tracer = start(self, ["bpftrace", "-q", "-e", "usdt:%s:python:"
                              "function__entry { @n = count(); } "
                              "usdt:%s:python:line { @l = count(); }"
                              % (PYTHON, PYTHON), "-p", str(proc.pid)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        rng = random.Random(54)
        states = collections.Counter()
        with _select.Block(proc.pid) as block:
            base = block.address
            for round in range(40):
                kind = round % 4
                if kind == 0:
                    # Random bytes over the whole block but its header.
                    os.pwrite(block.mem, rng.randbytes(_select.SIZE - 16),
                              base + 16)
                elif kind == 1:
                    # A length past the text, with an even seq.
                    os.pwrite(block.mem, struct.pack(
                        "<II", 2 * rng.randrange(1, 1 << 30),
                        rng.choice([256, 4096, 0xFFFFFFFF])), base + 16)
                elif kind == 2:
                    # A text with a NUL inside.
                    os.pwrite(block.mem, struct.pack(
                        "<II", 2 * rng.randrange(1, 1 << 30), 5)
                        + b"f\0x\0y", base + 16)
                else:
                    # Torn: left odd, the text half written.
                    os.pwrite(block.mem, struct.pack(
                        "<II", 2 * rng.randrange(1, 1 << 30) + 1, 200)
                        + rng.randbytes(100), base + 16)
                time.sleep(0.3)
                states[block.read()["state"]] += 1
            # A good selection afterwards still works.
            seq = block.write("hostile")
            self.assertIsNotNone(block.wait_seen(seq, 5))
        out, _ = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0)
        self.assertEqual(out.splitlines()[-1], "True (None, None, None)")
        Bpftrace.interrupt(tracer)
        self.assertIn("refused", states)


class SelectCommandTest(unittest.TestCase):

    def test_bad_start_up_selection(self):
        proc = run([PYTHON, "-X", "usdt_select=" + "x" * 300, "-c", "pass"])
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("-X usdt_select: expected a text of at most 255 "
                      "bytes", proc.stderr)
        proc = run([PYTHON, "-c", "pass"],
                   env=dict(os.environ, PYTHONUSDTSELECT="y" * 256))
        self.assertIn("PYTHONUSDTSELECT: expected a text of at most 255 "
                      "bytes", proc.stderr)

    def test_text_checks(self):
        self.assertRaises(_select.Error, _select.check_text, "a\0b")
        self.assertRaises(_select.Error, _select.check_text, "é" * 128)
        self.assertEqual(_select.check_text("é" * 127), "é".encode() * 127)

    def test_rule(self):
        self.assertTrue(_select.selects("email.mime", "/usr/lib/email/"
                                        "mime/text.py", "f", "f"))
        self.assertTrue(_select.selects("C.m", "/a.py", "m", "C.m"))
        self.assertFalse(_select.selects("C.m", "/a.py", "m", "D.m"))


# test_invisible's cases about what a program, profiler, tracer, debugger
# or coverage tool sees, again with a selection in effect from start-up
# (the workload's own file: its functions fire, the rest does not).
INVISIBLE_CASES = [
    "test_monitoring_all_events", "test_profiler_c_events",
    "test_monitoring_tool_events", "test_monitoring_all_events_with_tool",
    "test_exception_chaining_and_tracebacks",
    "test_profiler_toggled_during_calls",
    "test_opcode_events_reach_bdb_style_tracer", "test_thread_exit",
]


class SelectedArmedEqualsUnarmed(test_invisible.ArmedEqualsUnarmed):

    def armed(self, case, extra="", markers=False, env=None):
        return super().armed(case, extra, markers, env=dict(
            env or {}, PYTHONUSDTSELECT="invisible_workload"))


def load_tests(loader, tests, pattern):
    suite = unittest.TestSuite()
    for case in (CallsSelectionTest, SubinterpreterSelectionTest,
                 UntrustedBlockTest, SelectCommandTest):
        suite.addTests(loader.loadTestsFromTestCase(case))
    for name in INVISIBLE_CASES:
        suite.addTest(SelectedArmedEqualsUnarmed(name))
    return suite


if __name__ == "__main__":
    unittest.main()
