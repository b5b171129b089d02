"""Arming the probes must change nothing that Python code can observe.

Each case of data/invisible_workload.py prints what a program, a debugger
or a coverage tool sees.  It runs once unarmed and once under bpftrace with
every probe of the registry (series/3.13/probes.tsv) armed (by path, from start-up; the marker
stacks__enable in the trampoline tests, which remove its perf map); the outputs
must be equal, and equal to what pristine 3.13.5 prints (the expected
values below, where they are short enough to read).  Cases that need an
attach to a running process use bpftrace -p.
"""

import collections
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from support import (Bpftrace, PYTHON, free_threaded, perf_map_entries,
                     perf_map_path, promised_probe_pairs, readline,
                     require_bpftrace, run, start)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "data", "invisible_workload.py")


def arm_all(extra="", markers=False):
    """A bpftrace program arming every probe (each one counts its hits);
    with *markers*, the markers that never fire too (stacks__enable, whose
    perf map only test_stack_trampoline cleans up)."""
    pairs = promised_probe_pairs(firing=not markers)
    return " ".join("usdt:%s:%s:%s { @hits[probe] = count(); }"
                    % (PYTHON, provider, name)
                    for provider, name in pairs) + " " + extra


def hit_counts(stdout):
    """{probe name: hits} from the @hits map that arm_all() prints: NAME for
    python's probes, PROVIDER:NAME for the others'."""
    hits = {}
    for m in re.finditer(r"^@hits\[usdt:.*:(\w+):(\w+)\]: (\d+)$",
                         stdout, re.M):
        name = m.group(2) if m.group(1) == "python" else "%s:%s" % m.group(
            1, 2)
        hits[name] = int(m.group(3))
    return hits


def program_output(stdout):
    """The traced program's lines, without bpftrace's map dump."""
    return [line for line in stdout.splitlines()
            if line and not line.startswith("@")]


class ArmedEqualsUnarmed(unittest.TestCase):

    def unarmed(self, case, env=None):
        proc = run([PYTHON, WORKLOAD, case], env=dict(os.environ, **env or {}))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # Without blank lines, as armed() returns them.
        return program_output(proc.stdout), proc.stderr

    def armed(self, case, extra="", markers=False, env=None):
        require_bpftrace(self)
        env = dict(os.environ, INVISIBLE_CASE=case, **env or {})
        proc = Bpftrace.run(arm_all(extra, markers), WORKLOAD, env=env)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        return program_output(proc.stdout), hit_counts(proc.stdout)

    def armed_pathwide(self, case, env=None, markers=True):
        """Run *case* as an ordinary child while one bpftrace arms every
        probe by path (no -c, which hides the child's exit status): its
        output (without blank lines), exit status and the hit counts."""
        require_bpftrace(self)
        program = arm_all(
            'interval:ms:50 /@attached == 0/ { @attached = 1; '
            'printf("attached\\n"); } END { clear(@attached); }', markers)
        tracer = start(self, ["bpftrace", "-q", "-e", program],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = readline(tracer.stdout, 120, "bpftrace did not say "
                        "'attached'")
        if line != "attached\n":
            out, err = tracer.communicate(timeout=60)
            self.fail("bpftrace did not attach: %s"
                      % (Bpftrace.errors(err) or line + out))
        proc = run([PYTHON, WORKLOAD, case],
                   env=dict(os.environ, **env or {}), timeout=300)
        out, err = Bpftrace.interrupt(tracer)
        self.assertEqual(tracer.returncode, 0, Bpftrace.errors(err))
        return (program_output(proc.stdout), proc.returncode,
                hit_counts(out))

    def check(self, case, expected=None):
        """Armed output == unarmed output (== expected, if given); returns
        the probes' hit counts."""
        out, err = self.unarmed(case)
        if expected is not None:
            self.assertEqual(out, expected)
        armed_out, hits = self.armed(case)
        self.assertEqual(armed_out, out)
        # The probes were really armed: start-up alone fires these.
        for name in ("function__entry", "line", "import__find__load__start"):
            self.assertGreater(hits.get(name, 0), 0, (name, hits))
        return hits

    def test_allocators(self):
        # tracemalloc started and stopped twice (each round traces the 100
        # bytes objects and their list), a C extension's allocator hooks
        # and the allocator's name, under the otel_memory wrapper.
        name = "name mimalloc" if free_threaded() else "name pymalloc"
        hits = self.check("allocators", [
            name,
            "round 0 traced True count 101 sized True",
            "round 1 traced True count 101 sized True",
            "traced after stop False",
            "nomemory raised True",
            name,
        ])
        self.assertFired(hits, "otel_memory:alloc", "otel_memory:free")

    def test_instance_probes_call_no_eq(self):
        # A str-subclass "__module__" key whose __eq__ raises and creates
        # instances: no call, no SystemError, no recursion.
        hits = self.check("instance_eq", ["instances 0", "unrelated 3"])
        self.assertGreater(hits.get("instance__new__start", 0), 0, hits)
        self.assertGreater(hits.get("instance__delete__done", 0), 0, hits)

    def test_import_unencodable_name(self):
        self.check("import_surrogate",
                   ["ModuleNotFoundError", "ModuleNotFoundError"])

    def test_sys_audit_without_hooks(self):
        hits = self.check("audit", [
            "None None None",
            "TypeError audit() missing 1 required positional argument: "
            "'event'"])
        self.assertGreater(hits.get("audit", 0), 0, hits)

    def test_monitoring_all_events(self):
        self.check("all_events", [
            "{}",
            "['CALL', 'PY_RESUME', 'PY_RETURN', 'PY_START', 'PY_THROW', "
            "'PY_UNWIND', 'PY_YIELD'] {}"])

    def assertFired(self, hits, *names):
        for name in names:
            self.assertGreater(hits.get(name, 0), 0, (name, hits))

    def test_profiler_c_events(self):
        # With cfunction__* armed, the profile slot has CALL events in every
        # thread: the profiler still gets its own thread's events only.
        hits = self.check("profile_events", [
            "MainThread call c_workload",
            "MainThread c_call list.append",
            "MainThread c_return list.append",
            "MainThread c_call len",
            "MainThread c_return len",
            "MainThread c_call list.append",
            "MainThread c_return list.append",
            "MainThread c_call sqrt",
            "MainThread c_exception sqrt",
            "MainThread c_call len",
            "MainThread c_return len",
            "MainThread return c_workload",
            "MainThread c_call setprofile"])
        self.assertFired(hits, "cfunction__entry", "cfunction__return",
                         "exception__raise", "exception__reraise",
                         "exception__handled")

    def test_monitoring_tool_events(self):
        # A tool's CALL, C_RETURN, C_RAISE, RAISE, RERAISE and
        # EXCEPTION_HANDLED events, and a DISABLE it returns, are untouched
        # by the probes that use the same events on the profile slot.
        out, _ = self.unarmed("monitoring_events")
        self.assertEqual(out.count("CALL work len"), 1, out)
        for event in ("C_RAISE", "RAISE", "RERAISE", "EXCEPTION_HANDLED"):
            self.assertTrue(any(line.startswith(event + " ")
                                for line in out), (event, out))
        hits = self.check("monitoring_events")
        self.assertFired(hits, "cfunction__entry", "exception__raise",
                         "exception__reraise", "exception__handled")

    def test_monitoring_all_events_with_tool(self):
        # The profile slot shows no RAISE, RERAISE or EXCEPTION_HANDLED
        # (the probes' events there are hidden per event) and its CALL only
        # with a profiler; the trace slot its RAISE with a tracer.
        self.check("all_events_tools", [
            "[('CALL', 4), ('EXCEPTION_HANDLED', 4), ('RAISE', 4)]",
            "[('CALL', 68), ('EXCEPTION_HANDLED', 4), ('PY_RESUME', 64), "
            "('PY_RETURN', 64), ('PY_START', 64), ('PY_THROW', 64), "
            "('PY_UNWIND', 64), ('PY_YIELD', 64), ('RAISE', 4)]",
            "[('CALL', 68), ('EXCEPTION_HANDLED', 4), ('JUMP', 128), "
            "('LINE', 128), ('PY_RESUME', 192), ('PY_RETURN', 192), "
            "('PY_START', 192), ('PY_THROW', 192), ('PY_UNWIND', 192), "
            "('PY_YIELD', 192), ('RAISE', 132), ('STOP_ITERATION', 128)]",
            "{}"])

    def test_exception_chaining_and_tracebacks(self):
        out, _ = self.unarmed("exception_chaining")
        self.assertIn("The above exception was the direct cause of the "
                      "following exception:", out)
        self.assertIn("after handler None", out)
        hits = self.check("exception_chaining")
        self.assertFired(hits, "exception__raise", "exception__reraise",
                         "exception__handled")

    def test_asyncio_task_names(self):
        # Default names ("Task-N", an int until get_name()), a name set
        # during the task's life, an eager task factory's tasks (named
        # after their first step: "None" when create_task() had no name).
        hits = self.check("asyncio_names", [
            "['Task-2', 'Task-3', 'named', '7', 'Task-5', 'None']",
            "['Task-2', 'Task-3', 'named', '7', 'eager', 'None']"])
        self.assertFired(hits, "task__step__start", "task__step__done")

    def test_thread_exit(self):
        hits = self.check("thread_exit", [
            "del quiet",
            "joined quiet alive False",
            "excepthook failing ValueError failing",
            "del failing",
            "joined failing alive False",
            "threads 1"])
        # (The GIL probes, armed too, never fire in a free-threaded build.)
        self.assertFired(hits, "thread__start", "thread__stop")

    def test_profiler_toggled_during_calls(self):
        # A profiler switched on and off inside sum(map(f, ...)), once and
        # three times, then on for a new call at the same frame and
        # instruction: it gets that call's c_call and c_return, and none of
        # the calls that were in progress when it came on, however many
        # (more than 4,096 in the nested case; sys.setprofile's own events
        # are left out).
        out, _ = self.unarmed("profile_toggles")
        self.assertEqual(out, [
            "rounds 1 [('c_call', 'sum'), ('c_return', 'sum')]",
            "rounds 3 [('c_call', 'sum'), ('c_return', 'sum')]",
            "nested []"])
        armed_out, hits = self.armed("profile_toggles")
        self.assertEqual(armed_out, out)
        self.assertFired(hits, "cfunction__entry", "cfunction__return")

    def test_trampoline_needs_consent(self):
        # Without -X dtrace_stacks, arming stacks__enable turns no
        # trampoline on: no co_extra free(NULL) calls, no crash in a small
        # stack, no early RecursionError, no extra file descriptor or perf
        # map (each of these happened when it did).
        pidfile = os.path.join(self.tmpdir(), "pid")
        env = {"INVISIBLE_PIDFILE": pidfile}
        expected = [
            "code extra index 0",
            "free(NULL) calls 0",
            "small stack [2000]",
            "deep 20000"]
        out, _ = self.unarmed("trampoline_effects", env)
        self.assertEqual(out[:4], expected)
        self.assertEqual(out[-2:], ["perf map False", "active False"])
        self.assertEqual(self.perf_map(pidfile), [])
        # Armed by path, so that the exit status shows (the free function
        # crashed the process at exit when the trampoline was on).
        armed_out, status, hits = self.armed_pathwide("trampoline_effects",
                                                      env)
        self.assertEqual((armed_out, status), (out, 0))
        self.assertEqual(self.perf_map(pidfile), [])
        self.assertFired(hits, "function__entry", "line")

    def test_trampoline_with_consent(self):
        # With the owner's consent the marker turns the trampoline on (its
        # perf map names work()), and what can be avoided is: its co_extra
        # slot comes first (index 0), so the program's free function is not
        # called with NULL, and the program's own deactivation stops the
        # perf map's writes.  The free-threaded build has no trampoline for
        # the marker, so it reserves no slot: the program's comes first.
        pidfile = os.path.join(self.tmpdir(), "pid")
        env = {"INVISIBLE_PIDFILE": pidfile, "PYTHONDTRACESTACKS": "1",
               "INVISIBLE_EFFECTS": "safe"}
        work = ("py::case_trampoline_effects.<locals>.work:" + WORKLOAD)
        expected = ["code extra index %d" % (0 if free_threaded() else 1),
                    "free(NULL) calls 0", "deactivated kept"]
        out, _ = self.unarmed("trampoline_effects", env)
        self.assertEqual(out, expected)
        self.assertNotIn(work, self.perf_map(pidfile))
        armed_out, _ = self.armed("trampoline_effects", markers=True,
                                  env=env)
        self.assertEqual(armed_out, expected)
        if free_threaded():
            return
        self.assertIn(work, self.perf_map(pidfile))

    def test_stack_trampoline(self):
        # With stacks__enable armed the perf-map trampoline is on, yet the
        # program sees it off until it asks for it, and deep recursion,
        # frames, tracebacks and the events of sys.monitoring and
        # sys.settrace are unchanged (pristine 3.13.5 with -X perf gives
        # three C_RETURN events for work() and a second 'exception').
        # The owner allows it (-X dtrace_stacks).
        pidfile = os.path.join(self.tmpdir(), "pid")
        env = {"INVISIBLE_PIDFILE": pidfile, "PYTHONDTRACESTACKS": "1"}
        work = "py::case_stack_trampoline.<locals>.work:" + WORKLOAD
        expected = [
            "active False",
            "recursion 950",
            "frames ['names', 'case_stack_trampoline', '<module>']",
            "generator [['names', 'gen', 'case_stack_trampoline'], 900]",
            'raise KeyError("deep")',
            "c_return ['len']",
            "settrace [('awaiting', 'call'), ('awaiting', 'line'), "
            "('inner', 'call'), ('inner', 'line'), ('inner', 'return'), "
            "('awaiting', 'exception'), ('awaiting', 'return'), "
            "('value', 1)]",
            "activated True",
            "deactivated False",
            "deactivated again False"]
        out, _ = self.unarmed("stack_trampoline", env)
        self.assertEqual(out, expected)
        # Unarmed, work() ran before the program activated the trampoline.
        self.assertFalse(work in self.perf_map(pidfile),
                         "unarmed, the trampoline was on before the program "
                         "asked (another tracer arming stacks__enable?)")
        armed_out, _ = self.armed("stack_trampoline", markers=True,
                                  env=env)
        self.assertEqual(armed_out, expected)
        if free_threaded():
            # The marker does nothing there (documented limit).
            self.assertFalse(work in self.perf_map(pidfile))
            return
        # Armed, the trampoline was on before: work() has its entry.
        self.assertTrue(work in self.perf_map(pidfile),
                        "armed, %s has no perf map entry" % work)

    def tmpdir(self):
        d = tempfile.mkdtemp(prefix="test_invisible.")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def perf_map(self, pidfile):
        """The lines of the perf map of the process in *pidfile* (the map
        is removed)."""
        with open(pidfile) as f:
            pid = int(f.read())
        try:
            return perf_map_entries(pid)
        finally:
            if os.path.exists(perf_map_path(pid)):
                os.unlink(perf_map_path(pid))

    def test_opcode_events_reach_bdb_style_tracer(self):
        out, _ = self.unarmed("pdb_opcodes")
        self.assertIn("'opcode'", out[0])
        armed_out, _ = self.armed("pdb_opcodes")
        self.assertEqual(armed_out, out)


class StartUp(unittest.TestCase):

    def test_every_frame_from_the_first(self):
        # A tracer present at start-up sees importlib's bootstrap first, and
        # the <module> frame of every module that ran Python code (encodings
        # and site included).
        require_bpftrace(self)
        program = (
            'usdt:%(p)s:python:function__entry /@seen == 0/ '
            '{ @seen = 1; printf("first %%s|%%s\\n", str(arg0), str(arg1)); }'
            ' usdt:%(p)s:python:function__entry /str(arg1) == "<module>"/ '
            '{ printf("entry %%s\\n", str(arg0)); }' % {"p": PYTHON})
        env = dict(os.environ, INVISIBLE_CASE="modules")
        proc = Bpftrace.run(program, WORKLOAD, env=env)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        lines = program_output(proc.stdout)
        self.assertEqual(
            [line for line in lines if line.startswith("first ")],
            ["first <frozen importlib._bootstrap>|<module>"])
        # bpftrace cuts strings at BPFTRACE_STRLEN - 1 bytes (63 here): in
        # a deep checkout many file names share their first 63 bytes, so
        # count: each cut name must have at least as many <module> entries
        # as there are modules behind it.
        entered = collections.Counter(line[len("entry "):] for line in lines
                                      if line.startswith("entry "))
        modules = [line.split(" ", 2) for line in lines
                   if line.startswith("module ")]
        names = {name for _, name, _ in modules}
        self.assertTrue({"encodings", "site", "codecs"} <= names, names)
        expected = collections.Counter(filename[:63]
                                       for _, _, filename in modules)
        self.assertEqual(expected - entered, collections.Counter())


class Subinterpreters(unittest.TestCase):

    def test_function_probes_fire_in_subinterpreters(self):
        require_bpftrace(self)
        program = ('usdt:%s:python:function__entry /str(arg1) == "sub_func"/'
                   ' { @sub = count(); }' % PYTHON)
        env = dict(os.environ, INVISIBLE_CASE="subinterpreter")
        proc = Bpftrace.run(program, WORKLOAD, env=env)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        self.assertIn("subinterpreter done", proc.stdout)
        self.assertRegex(proc.stdout, r"(?m)^@sub: 7$")


class Watcher(unittest.TestCase):

    def threads(self, *args, env=None):
        proc = run([PYTHON, *args, WORKLOAD, "threads"], env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout.split()[1::2]

    def test_named(self):
        self.assertEqual(self.threads(), ["python", "py-usdt-watch"])

    def test_fork(self):
        # The watcher is held still across fork(), never stopped and
        # re-created: the kernel can go on counting a joined thread for a
        # moment, and os.fork() warns when it counts more than one.
        proc = run([PYTHON, "-W", "error::DeprecationWarning", WORKLOAD,
                    "fork"])
        self.assertEqual((proc.returncode, proc.stderr), (0, ""))
        self.assertEqual(proc.stdout, "watchers 1 same True\n")

    def test_off_switches(self):
        env = dict(os.environ, PYTHONDTRACEWATCH="0")
        self.assertEqual(self.threads(env=env), ["python"])
        for args in (["-X", "dtrace_watch=0"], ["-E", "-X", "dtrace_watch=0"],
                     ["-I", "-X", "dtrace_watch=0"]):
            self.assertEqual(self.threads(*args), ["python"], args)
        # -X wins over the environment; -E ignores the environment.
        self.assertEqual(self.threads("-X", "dtrace_watch=1", env=env),
                         ["python", "py-usdt-watch"])
        self.assertEqual(self.threads("-E", env=env),
                         ["python", "py-usdt-watch"])

    def test_bad_values(self):
        for args, env, message in (
                (["-X", "dtrace_watch=2"], None,
                 "-X dtrace_watch: expected 0 or 1"),
                ([], dict(os.environ, PYTHONDTRACEWATCH="off"),
                 "PYTHONDTRACEWATCH: expected 0 or 1"),
                (["-X", "dtrace_stacks=yes"], None,
                 "-X dtrace_stacks: expected 0 or 1"),
                ([], dict(os.environ, PYTHONDTRACESTACKS="2"),
                 "PYTHONDTRACESTACKS: expected 0 or 1")):
            proc = run([PYTHON, *args, "-c", "pass"], env=env)
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn(message, proc.stderr)

    def test_help(self):
        proc = run([PYTHON, "--help-xoptions"])
        self.assertIn("-X dtrace_watch=[0|1]", proc.stdout)
        self.assertIn("-X dtrace_stacks=[0|1]", proc.stdout)
        proc = run([PYTHON, "--help-env"])
        self.assertIn("PYTHONDTRACEWATCH", proc.stdout)
        self.assertIn("PYTHONDTRACESTACKS", proc.stdout)


class DisableSurvivesAttach(unittest.TestCase):
    """A sys.monitoring tool's DISABLE stays in force across attaches."""

    CODE = r"""
import sys, time
E = sys.monitoring.events
seen = []
def on_line(code, line):
    if code is work.__code__:
        seen.append(line)
        return sys.monitoring.DISABLE
def work(n):
    a = n
    b = a + 1
    return b
sys.monitoring.use_tool_id(1, "coverage")
sys.monitoring.register_callback(1, E.LINE, on_line)
sys.monitoring.set_events(1, E.LINE)
work(0)
print("ready", len(seen), flush=True)
while sys.stdin.readline() == "more\n":
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        work(1)
    print("lines", len(seen), flush=True)
"""

    def test_line_probe_attach(self):
        require_bpftrace(self)
        proc = start(self, [PYTHON, "-c", self.CODE], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertEqual(readline(proc.stdout, 60, "the line workload did "
                                  "not say 'ready'"), "ready 3\n")
        program = ('usdt:%s:python:line /pid == %d/ { @lines = count(); } '
                   'interval:s:5 { exit(); }' % (PYTHON, proc.pid))
        for attempt in range(2):
            traced = start(
                self, ["bpftrace", "-q", "-p", str(proc.pid), "-e", program],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # Keep the program running while the tracer is attached.
            while traced.poll() is None:
                proc.stdin.write("more\n")
                proc.stdin.flush()
                self.assertEqual(
                    readline(proc.stdout, 60, "the line workload did not "
                             "answer 'more' (attach %d)" % attempt),
                    "lines 3\n", "attach %d" % attempt)
            # bpftrace has exited.
            out, err = traced.communicate()
            self.assertEqual(traced.returncode, 0, Bpftrace.errors(err))
            self.assertRegex(out, r"(?m)^@lines: [1-9]")
        proc.stdin.write("stop\n")
        proc.stdin.close()
        self.assertEqual(proc.wait(timeout=60), 0)


if __name__ == "__main__":
    unittest.main()
