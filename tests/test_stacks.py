"""python:stacks__enable: Python names in native stacks, on demand.

A tracer arms the marker (it never fires; only its semaphore counts), and
in a process started with -X dtrace_stacks (the owner's consent; without
it the marker does nothing, test_no_consent), within a poll of the probe
watcher the main interpreter runs every Python
function entered from then on through a perf-map trampoline listed in
/tmp/perf-PID.map as py::QUALNAME:FILENAME: bpftrace's ustack and perf -g
show py:: frames between the interpreter's C frames.  When the last tracer
leaves, the trampoline is turned off again, unless the program turned it
on itself, and the program never sees a trampoline only the marker keeps.

data/stacks_workload.py runs outer() -> middle() -> leaf() in four threads
and answers commands on its standard input: it calls a function nothing
called before (whose perf map entry then shows whether the trampoline is
on), reports how middle()'s CALLs are specialized, and calls sys's
trampoline functions.

Every tracer here attaches to the workload alone (bpftrace -p): a
path-wide uprobe would arm the marker in every process of the interpreter,
and turn the trampoline on in other tests, benchmarks, and this test
runner itself.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from support import (Bpftrace, PYTHON, Semaphore, free_threaded,
                     perf_map_entries, perf_map_path, readline,
                     require_bpftrace, run, start, stop, tracer_unusable)

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                        "stacks_workload.py")
# Seconds before the workload kills itself, and the marker's tracers exit,
# should this test die without stopping them.
LIFETIME_S = 90
# The watcher polls once a second; allow one more poll on a loaded machine.
NOTICE_S = 2
# How middle()'s two calls of leaf() are specialized without a frame
# evaluator (PEP 523): with the trampoline's, the specializer refuses them.
SPECIALIZED = ["CALL_PY_EXACT_ARGS", "CALL_PY_EXACT_ARGS"]
CHAIN = ["leaf", "middle", "outer"]
# Printed once the probes before it are attached (bpftrace runs BEGIN
# before it attaches any).
ATTACHED = """
interval:ms:50 /@attached == 0/ { @attached = 1; printf("attached\\n"); }
END { clear(@attached); }
"""
MARKER_PROGRAM = """
usdt:%(p)s:python:stacks__enable { }
interval:s:%(lifetime)d { exit(); }
""" + ATTACHED
# Samples the workload's stacks for SAMPLE_S seconds, from WARM_S seconds
# after the probes are attached (when the trampoline is on), and prints
# them while the workload still runs: bpftrace names frames only then, from
# /proc/PID/maps and /tmp/perf-PID.map.
WARM_S = 2
SAMPLE_S = 4
PROFILE_PROGRAM = """
usdt:%(p)s:python:stacks__enable { }
profile:hz:99 /pid == %(pid)d/ { @stacks[ustack] = count(); }
interval:s:1 {
    @seconds = @seconds + 1;
    if (@seconds == %(warm)d) {
        clear(@stacks);
        printf("sampling %%llu\\n", nsecs);
    }
    if (@seconds == %(end)d) { exit(); }
}
""" + ATTACHED


def py_frame(symbol):
    """(qualname, filename) of a py::QUALNAME:FILENAME symbol (without
    the tool's +offset), else None."""
    if not symbol.startswith("py::"):
        return None
    qualname, _, filename = symbol[4:].partition(":")
    return qualname, filename


def bpftrace_stacks(stdout, name):
    """[([symbol, ...] innermost first, count)] of bpftrace's map @name
    keyed by ustack alone, symbols without their +offset."""
    samples, frames = [], None
    for line in stdout.splitlines():
        if frames is None:
            if line == "@%s[" % name:
                frames = []
        elif line.startswith("]: "):
            samples.append((frames, int(line[3:])))
            frames = None
        elif line.strip():
            symbol, plus, offset = line.strip().rpartition("+")
            frames.append(symbol if plus and offset.isdigit()
                          else line.strip())
    return samples


def perf_script_stacks(text):
    """[([symbol, ...] innermost first, 1)] of perf script's samples,
    symbols without their +0xoffset."""
    samples = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            # A sample's header: "python 1234 5.678: 10101010 cpu-clock: "
            samples.append(([], 1))
        elif line.strip() and samples:
            # "\t    7f1234 py::leaf:/path/stacks_workload.py+0x1c (dso)"
            symbol = line.split(None, 1)[1].rsplit(" (", 1)[0]
            head, plus, _ = symbol.rpartition("+0x")
            samples[-1][0].append(head if plus else symbol)
    return samples


def start_consenting_workload(testcase, lifetime):
    """data/stacks_workload.py under -X dtrace_stacks (the owner allows the
    marker's trampoline), ready; it is stopped and its perf map removed at
    the test's end.  Skips when python:stacks__enable is armed already."""
    proc = start(testcase, [PYTHON, "-X", "dtrace_stacks", WORKLOAD,
                            str(lifetime)],
                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE)
    pid = proc.pid

    def remove_map():
        stop(proc)
        if os.path.exists(perf_map_path(pid)):
            os.unlink(perf_map_path(pid))
    testcase.addCleanup(remove_map)
    testcase.assertEqual(readline(proc.stdout, 60, "the stacks workload did "
                                  "not say 'ready'"), "ready %d\n" % pid)
    armed = Semaphore(pid, "stacks__enable").value()
    if armed:
        testcase.skipTest("python:stacks__enable is already armed "
                          "(semaphore %d): another tracer has a uprobe on "
                          "every %s process" % (armed, PYTHON))
    return proc


class Workload:
    """data/stacks_workload.py, running until finish() or the test's end;
    its perf map is removed after it."""

    def __init__(self, testcase, *options, consent=True,
                 lifetime=LIFETIME_S):
        self.testcase = testcase
        # -X dtrace_stacks: the owner allows a tracer to turn the trampoline
        # on; without it the marker does nothing.
        if consent:
            options = ("-X", "dtrace_stacks", *options)
        self.proc = start(testcase, [PYTHON, *options, WORKLOAD,
                                     str(lifetime)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
        # Cleanups run last first: the map goes after the process.
        testcase.addCleanup(self.remove_map)
        self.pid = self.proc.pid
        self.map_path = perf_map_path(self.pid)
        ready = readline(self.proc.stdout, 60, "the stacks workload did not "
                         "say 'ready'")
        testcase.assertEqual(ready, "ready %d\n" % self.pid,
                             self.proc.poll() is not None
                             and self.proc.stderr.read())

    def remove_map(self):
        stop(self.proc)
        if os.path.exists(self.map_path):
            os.unlink(self.map_path)

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = readline(self.proc.stdout, 60, "the stacks workload did not "
                        "answer %r" % command)
        if not line:
            self.proc.wait(timeout=60)
            raise AssertionError("workload died at %r: %s"
                                 % (command, self.proc.stderr.read()))
        return json.loads(line)

    def call(self, name):
        """Call fresh function *name*: True if the perf map lists it
        after its first call."""
        self.testcase.assertIs(self.ask("call " + name), True)
        return self.mapped(name)

    def mapped(self, qualname):
        """The perf map lists workload function *qualname*."""
        return "py::%s:%s" % (qualname, WORKLOAD) in perf_map_entries(
            self.pid)

    def wait_mapped(self, qualname, timeout):
        """Poll until the perf map lists *qualname*: the time.monotonic()
        it was seen listed, or None after *timeout* s."""
        deadline = time.monotonic() + timeout
        while True:
            if self.mapped(qualname):
                return time.monotonic()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)

    def wait_new_mapped(self, mapped, timeout):
        """Compile and call new functions until the perf map lists them
        (*mapped* true) or not: the number of functions that took.
        AssertionError after *timeout* s."""
        deadline = time.monotonic() + timeout
        tries = 0
        while True:
            tries += 1
            if self.mapped(self.ask("new")) == mapped:
                return tries
            if time.monotonic() > deadline:
                raise AssertionError(
                    "new functions still %s the perf map after %d s"
                    % ("missing from" if mapped else "listed in", timeout))
            time.sleep(0.05)

    def wait_calls(self, expected, timeout):
        """Poll middle()'s CALLs until they are *expected*: the seconds
        that took, or AssertionError after *timeout* s."""
        began = time.monotonic()
        while True:
            calls = self.ask("calls")
            if calls == expected:
                return time.monotonic() - began
            if time.monotonic() - began > timeout:
                raise AssertionError("middle()'s CALLs still %s, not %s, "
                                     "after %d s" % (calls, expected,
                                                     timeout))
            time.sleep(0.02)

    def finish(self):
        out, err = self.proc.communicate(timeout=60)
        self.testcase.assertEqual(self.proc.returncode, 0, err)
        self.testcase.assertEqual(out, "done\n")


class Marker:
    """A bpftrace -p holding python:stacks__enable armed in the workload."""

    def __init__(self, testcase, workload):
        self.testcase = testcase
        self.pid = workload.pid
        self.semaphore = Semaphore(workload.pid, "stacks__enable")
        self.before = self.semaphore.value()

    def require_unarmed(self):
        if self.before:
            self.testcase.skipTest(
                "python:stacks__enable is already armed (semaphore %d) in a "
                "workload that just started: another tracer has a uprobe on "
                "every %s process, so disarming cannot be tested"
                % (self.before, PYTHON))

    def arm(self, program=None, env=None):
        """Start bpftrace and wait until it has armed the marker: the
        time.monotonic() it was seen armed.  Skips with bpftrace's error
        when it cannot attach."""
        program = program or MARKER_PROGRAM % {"p": PYTHON,
                                                "lifetime": LIFETIME_S}
        snapshot = self.semaphore.snapshot()
        self.tracer = start(self.testcase, ["bpftrace", "-q", "-p",
                                            str(self.pid), "-e", program],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
        line = readline(self.tracer.stdout, 120, "bpftrace did not say "
                        "'attached'")
        armed = None
        if line == "attached\n":
            armed = self.semaphore.wait_armed(
                snapshot, still_waiting=lambda: self.tracer.poll() is None,
                timeout=30)
        if armed is None:
            out, err = self.tracer.communicate(timeout=60)
            tracer_unusable(
                "bpftrace cannot attach python:stacks__enable: %s"
                % (Bpftrace.errors(err) or "exit %s, output %r"
                   % (self.tracer.returncode, line + out)))
        return time.monotonic()

    def disarm(self):
        """Stop bpftrace; the time.monotonic() the semaphore was seen back
        at its value before arm()."""
        out, err = Bpftrace.interrupt(self.tracer)
        self.testcase.assertEqual(self.tracer.returncode, 0,
                                  Bpftrace.errors(err))
        deadline = time.monotonic() + 10
        while self.semaphore.value() > self.before:
            self.testcase.assertLess(
                time.monotonic(), deadline,
                "python:stacks__enable still armed (semaphore %d) 10 s after "
                "bpftrace exited: has another tracer armed it meanwhile?"
                % self.semaphore.value())
            time.sleep(0.01)
        return time.monotonic()


def setUpModule():
    if free_threaded():
        raise unittest.SkipTest("the free-threaded build has no stack "
                                "trampoline for the marker")


class StacksTest(unittest.TestCase):

    maxDiff = None

    def setUp(self):
        require_bpftrace(self)

    def arm(self, workload, program=None):
        """Arm the marker (only this test's tracer may) and wait until the
        perf map shows the trampoline on: the Marker."""
        marker = Marker(self, workload)
        marker.require_unarmed()
        armed = marker.arm(program)
        self.wait_on(workload, armed)
        return marker

    def wait_on(self, workload, armed):
        """Wait until the perf map lists leaf(), entered every millisecond,
        after the marker was armed at *armed*: the time.monotonic() it was
        listed."""
        on = workload.wait_mapped("leaf", 10)
        self.assertIsNotNone(on, "no py::leaf in %s 10 s after the marker "
                             "was armed" % workload.map_path)
        self.assertLess(on - armed, NOTICE_S,
                        "py::leaf listed %.2f s after the marker was armed"
                        % (on - armed))
        return on

    def check_stacks(self, samples, tool):
        """The samples name the workload's Python frames."""
        total = sum(count for _, count in samples)
        common = "\n".join("%d: %s" % (count, " < ".join(frames))
                           for frames, count in sorted(
                               samples, key=lambda s: -s[1])[:3])
        self.assertGreater(total, 50, "%s: too few samples" % tool)
        named = full = py_frames = evaluated = 0
        for frames, count in samples:
            py = [py_frame(f) for f in frames if f.startswith("py::")]
            if not py:
                continue
            named += count
            for qualname, filename in py:
                # Only functions entered after the trampoline came on have
                # names: never the threads' loop, spin(), entered before.
                self.assertIn(qualname, CHAIN, (tool, frames))
                self.assertEqual(filename, WORKLOAD, (tool, frames))
            # Innermost first: outer() called middle(), which called leaf().
            names = [qualname for qualname, _ in py]
            self.assertIn(names, [CHAIN[i:] for i in range(3)],
                          (tool, frames))
            if names == CHAIN:
                full += count
            # Each trampoline calls the interpreter's frame evaluator, which
            # runs the function's code: the next frame inside, but where
            # the sample hit a function before it set its frame pointer.
            # A PGO build splits the evaluator: its code that the training
            # run did not find hot is in "_PyEval_EvalFrameDefault.cold"
            # (GCC's suffixes for parts and clones start with a dot).
            for inner, frame in zip(frames, frames[1:]):
                if frame.startswith("py::"):
                    py_frames += count
                    if inner.split(".")[0] == "_PyEval_EvalFrameDefault":
                        evaluated += count
        self.assertGreaterEqual(2 * named, total,
                                "%s: %d of %d samples have a py:: frame; "
                                "the most common:\n%s"
                                % (tool, named, total, common))
        # leaf() takes most of the time.
        self.assertGreaterEqual(2 * full, named,
                                "%s: %d of %d samples have leaf, middle and "
                                "outer; the most common:\n%s"
                                % (tool, full, named, common))
        self.assertGreaterEqual(10 * evaluated, 9 * py_frames,
                                "%s: %d of %d py:: frames called "
                                "_PyEval_EvalFrameDefault"
                                % (tool, evaluated, py_frames))
        return total, named, full

    def test_bpftrace_profile_ustack(self):
        # One bpftrace arms the marker and samples the workload's stacks.
        workload = Workload(self)
        marker = Marker(self, workload)
        marker.require_unarmed()
        # bpftrace 0.17 names user frames with a symbol cache of its own
        # for each stack when ASLR is on: 0.1 s each, for a 30 MB
        # interpreter with debug information, unless told to keep one per
        # process.
        armed = marker.arm(PROFILE_PROGRAM % {
            "p": PYTHON, "pid": workload.pid, "warm": WARM_S,
            "end": WARM_S + SAMPLE_S},
            env=dict(os.environ, BPFTRACE_CACHE_USER_SYMBOLS="1"))
        on = self.wait_on(workload, armed)
        line = readline(marker.tracer.stdout, 60, "bpftrace did not say "
                        "'sampling'")
        self.assertTrue(line.startswith("sampling "), line)
        # The trampoline was on before sampling began (bpftrace's nsecs is
        # time.monotonic_ns()).
        self.assertLess(on, int(line.split()[1]) / 1e9,
                        "the trampoline came on after sampling began")
        out, err = marker.tracer.communicate(timeout=60)
        self.assertEqual(marker.tracer.returncode, 0, Bpftrace.errors(err))
        self.assertIsNone(workload.proc.poll(), "workload died while traced")
        self.check_stacks(bpftrace_stacks(out, "stacks"), "bpftrace")
        workload.finish()

    def test_perf_record(self):
        # perf record -g, while a bpftrace holds the marker armed.
        if shutil.which("perf") is None:
            self.skipTest("perf not found (apt-get install linux-perf)")
        workload = Workload(self)
        marker = self.arm(workload)
        tmp = tempfile.mkdtemp(prefix="test_stacks.")
        self.addCleanup(shutil.rmtree, tmp)
        data = os.path.join(tmp, "perf.data")
        proc = run(["perf", "record", "-g", "-F", "99", "-p",
                    str(workload.pid), "-o", data, "--", "sleep", "3"],
                   timeout=60)
        if proc.returncode != 0:
            self.skipTest("perf record failed: %s" % proc.stderr.strip())
        # perf script reads the perf map now, while the workload runs.
        proc = run(["perf", "script", "-i", data],
                   timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        marker.disarm()
        self.check_stacks(perf_script_stacks(proc.stdout), "perf")
        workload.finish()

    def test_disarm(self):
        # Off again after the tracer leaves, and on again for the next one,
        # over several cycles: each arming makes the call sites fail to
        # specialize again, and each disarm must still give the fast path
        # back (the specializer's backoff grows with every failure).
        workload = Workload(self)
        unarmed = workload.ask("calls")
        self.assertEqual(unarmed, SPECIALIZED)
        marker = self.arm(workload)
        for cycle in range(1, 4):
            if cycle > 1:
                rearmed = marker.arm()
                time.sleep(max(0, rearmed + NOTICE_S - time.monotonic()))
            self.assertTrue(workload.call("fresh_%d" % (2 * cycle - 1)),
                            "no name %d s after arming (cycle %d)"
                            % (NOTICE_S, cycle))
            # With the trampoline's frame evaluator installed,
            # CALL_PY_EXACT_ARGS deoptimizes, and the specializer leaves
            # plain CALLs.
            workload.wait_calls(["CALL", "CALL"], 10)
            disarmed = marker.disarm()
            time.sleep(max(0, disarmed + NOTICE_S - time.monotonic()))
            self.assertFalse(workload.call("fresh_%d" % (2 * cycle)),
                             "the trampoline is still on %d s after the "
                             "tracer left (cycle %d)" % (NOTICE_S, cycle))
            # Without the evaluator the calls specialize again as before:
            # the interpreter's fast path is back.
            workload.wait_calls(unarmed, 15)
        workload.finish()

    def test_program_trampoline_kept(self):
        # -X perf: the program's trampoline, which no tracer turns off.
        workload = Workload(self, "-X", "perf")
        self.assertIs(workload.ask("active"), True)
        marker = Marker(self, workload)
        marker.require_unarmed()
        armed = marker.arm()
        time.sleep(max(0, armed + NOTICE_S - time.monotonic()))
        self.assertIs(workload.ask("active"), True)
        self.assertTrue(workload.call("fresh_1"))
        disarmed = marker.disarm()
        time.sleep(max(0, disarmed + NOTICE_S - time.monotonic()))
        self.assertTrue(workload.call("fresh_2"))
        self.assertIs(workload.ask("active"), True)
        workload.finish()

    def test_is_active_hidden_then_activate(self):
        # The program asks for the trampoline the marker keeps on: it is
        # the program's from then on, and stays after the tracer leaves.
        workload = Workload(self)
        marker = self.arm(workload)
        self.assertIs(workload.ask("active"), False)
        self.assertIsNone(workload.ask("activate"))
        self.assertIs(workload.ask("active"), True)
        disarmed = marker.disarm()
        time.sleep(max(0, disarmed + NOTICE_S - time.monotonic()))
        self.assertTrue(workload.call("fresh_1"))
        self.assertIs(workload.ask("active"), True)
        workload.finish()

    def test_is_active_hidden_deactivate(self):
        # The program turns off a trampoline it never had: still on for
        # the tracer, off as the program can tell; off when the tracer
        # leaves.
        workload = Workload(self)
        marker = self.arm(workload)
        self.assertIs(workload.ask("active"), False)
        self.assertIsNone(workload.ask("deactivate"))
        self.assertIs(workload.ask("active"), False)
        self.assertTrue(workload.call("fresh_1"))
        disarmed = marker.disarm()
        time.sleep(max(0, disarmed + NOTICE_S - time.monotonic()))
        self.assertFalse(workload.call("fresh_2"))
        self.assertIs(workload.ask("active"), False)
        workload.finish()

    def test_no_consent(self):
        # Without -X dtrace_stacks the marker changes nothing: no perf map,
        # no trampoline, the calls stay specialized.
        workload = Workload(self, consent=False)
        unarmed = workload.ask("calls")
        self.assertEqual(unarmed, SPECIALIZED)
        marker = Marker(self, workload)
        marker.require_unarmed()
        armed = marker.arm()
        time.sleep(max(0, armed + 2 * NOTICE_S - time.monotonic()))
        self.assertFalse(workload.call("fresh_1"))
        self.assertFalse(os.path.exists(workload.map_path),
                         "%s exists" % workload.map_path)
        self.assertEqual(workload.ask("calls"), unarmed)
        self.assertIs(workload.ask("active"), False)
        marker.disarm()
        workload.finish()

    def test_deactivate_after_activate(self):
        # The program takes over the marker's trampoline, then turns it
        # off: nothing is written to the perf map after that, although the
        # marker is still armed.
        workload = Workload(self)
        marker = self.arm(workload)
        self.assertIsNone(workload.ask("activate"))
        self.assertIs(workload.ask("active"), True)
        self.assertIsNone(workload.ask("deactivate"))
        self.assertIs(workload.ask("active"), False)
        self.assertFalse(workload.call("fresh_1"))
        marker.disarm()
        workload.finish()


class TrampolineCyclesTest(unittest.TestCase):
    """The trampoline turned on and off many times in one process, by the
    marker and by the program, and the process still exits cleanly.  Since
    gh-143228 each activation registers a code watcher (there are 8) and
    refcounts the trampolines; activating it again used to free them under
    live code at exit (gh-146522, patch 0211)."""

    maxDiff = None

    def test_arm_disarm_50_times(self):
        # The semaphore is moved as the kernel moves it for a uprobe, so
        # that 50 cycles take 50 polls each way rather than 50 bpftrace
        # start-ups; test_disarm does it with bpftrace.  Every tenth cycle
        # the program also activates and deactivates the trampoline
        # itself, which makes the marker's next arming start it again.
        workload = Workload(self, lifetime=600)
        semaphore = Semaphore(workload.pid, "stacks__enable")
        if semaphore.value():
            self.skipTest("python:stacks__enable is already armed "
                          "(semaphore %d): another tracer has a uprobe on "
                          "every %s process" % (semaphore.value(), PYTHON))
        for cycle in range(50):
            try:
                semaphore.add(1)
            except PermissionError as e:
                tracer_unusable("cannot arm python:stacks__enable by "
                                "writing its semaphore: %s" % e)
            workload.wait_new_mapped(True, 10)
            semaphore.add(-1)
            workload.wait_new_mapped(False, 10)
            if cycle % 10 == 5:
                self.assertIsNone(workload.ask("activate"))
                self.assertIs(workload.ask("active"), True)
                workload.wait_new_mapped(True, 10)
                self.assertIsNone(workload.ask("deactivate"))
                self.assertIs(workload.ask("active"), False)
        workload.finish()

    def test_program_activates_repeatedly(self):
        # gh-146522's reproducer, with and without consent: the third
        # activation after loading a library crashed at exit, the ninth
        # ran out of code watchers.  Then a fork, whose child starts the
        # trampoline afresh: with consent, the first start had the slot
        # reserved for it, which the child's must not share.
        code = ("import ctypes, os, sys\n"
                "print(os.getpid(), flush=True)\n"
                "ctypes.CDLL(None)\n"
                "for _ in range(12):\n"
                "    sys.activate_stack_trampoline('perf')\n"
                "def f(): return 1\n"
                "f()\n"
                "sys.deactivate_stack_trampoline()\n"
                "sys.activate_stack_trampoline('perf')\n"
                # A fork child starts the trampoline afresh, with code
                # objects of the parent's start still alive.
                "fs = [eval('lambda: %d' % i) for i in range(200)]\n"
                "for g in fs: g()\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    for g in fs: g()\n"
                "    del fs\n"
                "    for i in range(200): eval('lambda: %d' % i)()\n"
                "    sys.exit(0)\n"
                "_, status = os.waitpid(pid, 0)\n"
                "child_map = '/tmp/perf-%d.map' % pid\n"
                "if os.path.exists(child_map): os.unlink(child_map)\n"
                "print(sys.is_stack_trampoline_active(), status)\n")
        for options in ([], ["-X", "dtrace_stacks"]):
            with self.subTest(options=options):
                proc = subprocess.run([PYTHON, *options, "-c", code],
                                      capture_output=True, text=True,
                                      timeout=60)
                pid = proc.stdout.split()[0] if proc.stdout else None
                if pid is not None and os.path.exists(perf_map_path(int(pid))):
                    os.unlink(perf_map_path(int(pid)))
                self.assertEqual((proc.returncode, proc.stderr),
                                 (0, ""))
                self.assertEqual(proc.stdout.split()[1:], ["True", "0"])


if __name__ == "__main__":
    unittest.main()
