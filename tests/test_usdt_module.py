"""The usdt module: probes that Python code defines at run time.

A process makes probes with usdt.Probe() and usdt.traced(); tracers must
see them as ordinary USDT markers with semaphores.  Most tests drive a
long-running process, data/usdt_agent.py, which runs the code they send
it, so that bpftrace can attach to it with -p while it runs; gdb runs its
script itself.

bpftrace runs BEGIN before it has attached the probes, and the kernel
increments a probe's semaphore before bpftrace has attached its program to
the uprobe, so no test counts from BEGIN or from the semaphores alone:
each waits until the process sees its probes armed (bool(probe)), then
fires a sync probe until bpftrace prints its output (which it reads only
once every probe is attached), then fires the probes under test, then a
"done" probe whose action is exit(): map updates happen in the firing
thread, so every earlier event is in the maps bpftrace prints.  The
tracer tests skip with bpftrace's error where it cannot attach (not root,
no BPF).
"""

import json
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import textwrap
import time
import unittest

from support import (Bpftrace, Hang, PYTHON, readline, require_bpftrace,
                     run, run_gdb, stapsdt_notes, start, stop)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
AGENT = os.path.join(DATA, "usdt_agent.py")
TIMEOUT = 60
# Room for the long test strings in bpftrace's maps (default 64).
BPFTRACE_ENV = dict(os.environ, BPFTRACE_STRLEN="128")
INT64_MAX = 2**63 - 1
INT64_MIN = -2**63


class AgentError(Exception):
    """An exception the agent's code raised: (type name, message)."""


class Agent:
    """data/usdt_agent.py: runs the Python code it is sent (see there)."""

    def __init__(self, testcase, env=None):
        self.proc = start(testcase, [PYTHON, AGENT], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=env)
        # Before stop() kills it: a killed agent leaves its files behind.
        testcase.addCleanup(self._exit)
        self.pid = self._answer()

    def _exit(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                pass

    def _answer(self, timeout=TIMEOUT * 2):
        # support.readline(): select() on the text pipe missed an answer
        # already in its buffer.
        try:
            line = readline(self.proc.stdout, timeout,
                            "the agent did not answer")
        except Hang as hang:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("%s; its stderr: %r"
                                 % (hang, self.proc.stderr.read())) from None
        if not line:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            raise AssertionError("the agent did not answer: "
                                 + self.proc.stderr.read())
        answer = json.loads(line)
        if "error" in answer:
            raise AgentError(answer["error"], answer["message"])
        return answer["ok"]

    def __call__(self, code):
        """Run code; return what it left in `_`."""
        self.proc.stdin.write(json.dumps(textwrap.dedent(code)) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def eval(self, expression):
        return self("_ = " + expression)

    def error(self, code):
        """(type name, message) of the exception code raises."""
        try:
            result = self(code)
        except AgentError as e:
            return e.args
        raise AssertionError("no exception from %r (got %r)" % (code, result))

    def wait_until(self, expression, tracer=None, timeout=TIMEOUT):
        """Poll until expression is true in the agent; fail at timeout or
        if the tracer process exits first."""
        deadline = time.monotonic() + timeout
        while not self.eval("bool(%s)" % expression):
            if tracer is not None and tracer.poll() is not None:
                raise AssertionError(
                    "the tracer exited (%d) before %s: %s"
                    % (tracer.returncode, expression,
                       Bpftrace.errors(tracer.stderr.read())))
            if time.monotonic() > deadline:
                raise AssertionError("%s not true within %d s"
                                     % (expression, timeout))
            time.sleep(0.01)

    def finish(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=TIMEOUT)
        return self.proc.returncode, self.proc.stderr.read()


def parse_maps(stdout):
    """{map name: {key: value}} of the maps bpftrace prints at exit; keys
    and values are strings, a map without keys has the key None."""
    maps = {}
    for line in stdout.splitlines():
        if not line.startswith("@"):
            continue
        if "[" in line.split(":", 1)[0]:
            head, _, value = line.partition("]: ")
            name, _, key = head[1:].partition("[")
        else:
            name, _, value = line[1:].partition(": ")
            key = None
        maps.setdefault(name, {})[key] = value
    return maps


def probe_c_string(s, strlen=128):
    """What a tracer reads for the str s: UTF-8 with each lone surrogate as
    '?', up to the first NUL, cut by bpftrace's str() to strlen - 1 bytes."""
    data = "".join("?" if 0xd800 <= ord(c) <= 0xdfff else c
                   for c in s).encode("utf-8")
    data = data.split(b"\0")[0][:strlen - 1]
    return data.decode("utf-8", "surrogateescape")


def buf_text(b):
    """bpftrace's rendering of buf(): printable ASCII as is, other bytes as
    \\xNN."""
    return "".join(chr(c) if 32 <= c < 127 else "\\x%02x" % c for c in b)


# Each tracer's program also has this probe: its output shows that bpftrace
# has attached every probe and started reading events (see Tracer).
SYNC_PROBE = 'usdt:*:testsync:sync { printf("synced\\n"); }'
SYNC_CREATE = '_sync = usdt.Probe("testsync", "sync", ())'


class Tracer:
    """bpftrace -p PID -e PROGRAM, with the sync probe added."""

    def __init__(self, testcase, pid, program, sync_probe=SYNC_PROBE):
        self.testcase = testcase
        pid_args = ["-p", str(pid)] if pid is not None else []
        # Bytes: str() may cut a UTF-8 sequence.
        self.proc = subprocess.Popen(
            ["bpftrace", "-q", *pid_args, "-e",
             program + "\n" + sync_probe],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=BPFTRACE_ENV)
        testcase.addCleanup(stop, self.proc)
        self.out = b""

    def fail(self, what):
        raise AssertionError("%s: bpftrace exited (%d): %s"
                             % (what, self.proc.returncode,
                                Bpftrace.errors(self.proc.stderr.read()
                                                .decode(errors="replace"))))

    def sync(self, fire, timeout=TIMEOUT):
        """Call fire() (which fires testsync:sync) until bpftrace prints its
        output.  Armed semaphores alone do not say that bpftrace is
        listening: it arms each uprobe before it attaches the program."""
        deadline = time.monotonic() + timeout
        while b"synced\n" not in self.out:
            fire()
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.02)
            if ready:
                data = os.read(self.proc.stdout.fileno(), 65536)
                if not data:
                    self.proc.wait(timeout=TIMEOUT)
                    self.fail("no sync")
                self.out += data
            if time.monotonic() > deadline:
                raise AssertionError("no sync from bpftrace within %d s"
                                     % timeout)

    def attached(self, agent, probes):
        """Wait until bpftrace has armed the probes (an expression in the
        agent) and listens."""
        agent(SYNC_CREATE)
        agent.wait_until(probes, self.proc)
        self.sync(lambda: agent("_sync()"))

    def finish(self):
        """The maps bpftrace prints at exit (see parse_maps())."""
        out, err = self.proc.communicate(timeout=TIMEOUT)
        err = err.decode(errors="replace")
        self.testcase.assertEqual(self.proc.returncode, 0,
                                  Bpftrace.errors(err))
        # A cut UTF-8 sequence: its bytes as surrogates.
        return parse_maps((self.out + out).decode("utf-8",
                                                  "surrogateescape"))


class TracerTest(unittest.TestCase):

    def setUp(self):
        require_bpftrace(self)

    def bpftrace(self, pid, program, **kwargs):
        return Tracer(self, pid, program, **kwargs)


INTS = [0, 1, -1, INT64_MAX, INT64_MIN, 123456789012, -987654321, True]
STRS = ["", "plain", "héllo wörld", "日本語", "snake 🐍",
        "lone \udcff surrogate", "\ud83d\udc0d: a pair of surrogates",
        "cut\0here", "x" * 100, "é" * 100]
BLOBS = [b"", b"abc", b"\x00\x01\xff\xfe", bytes(range(40)), b"z" * 60]
ROUNDS = 3


class ArgumentsTest(TracerTest):

    maxDiff = None

    def test_every_argument_exactly(self):
        agent = Agent(self)
        paths = agent("""
            ints = usdt.Probe("argtest", "ints", (int, int))
            strs = usdt.Probe("argtest", "strs", (int, str))
            blobs = usdt.Probe("argtest", "blobs", (int, bytes, int))
            mixed = usdt.Probe("argtest", "mixed",
                               (int, str, bytes, int, str, int))
            done = usdt.Probe("argtest", "done", ())
            probes = [ints, strs, blobs, mixed, done]
            _ = [p.path for p in probes]
            """)
        self.assertFalse(agent.eval("any(probes)"))
        # bpftrace 0.17 prints argN unsigned: (int64) shows negative ints.
        program = """
        usdt:%s:argtest:ints
        { @int[arg0] = (int64)arg1; @n_ints = count(); }
        usdt:%s:argtest:strs { @str[arg0] = str(arg1); @n_strs = count(); }
        usdt:%s:argtest:blobs
        { @blob[arg0] = buf(arg1, arg2); @n_blobs = count(); }
        usdt:%s:argtest:mixed
        { @m1[arg0] = str(arg1); @m2[arg0] = buf(arg2, 3);
          @m3[arg0] = (int64)arg3; @m4[arg0] = str(arg4);
          @m5[arg0] = (int64)arg5; @n_mixed = count(); }
        usdt:%s:argtest:done { exit(); }
        """ % tuple(paths)
        tracer = self.bpftrace(agent.pid, program)
        tracer.attached(agent, "all(probes)")
        agent("""
            for r in range(%d):
                for i, v in enumerate(%r):
                    ints(r * 100 + i, v)
                for i, v in enumerate(%r):
                    strs(r * 100 + i, v)
                for i, v in enumerate(%r):
                    blobs(r * 100 + i, v, len(v))
                mixed(r, "mé", b"b\\x00c", -5 - r, "\\udcff", %d)
            done()
            """ % (ROUNDS, INTS, STRS, BLOBS, INT64_MIN))
        maps = tracer.finish()
        self.assertEqual(maps["n_ints"], {None: str(ROUNDS * len(INTS))})
        self.assertEqual(maps["n_strs"], {None: str(ROUNDS * len(STRS))})
        self.assertEqual(maps["n_blobs"], {None: str(ROUNDS * len(BLOBS))})
        self.assertEqual(maps["n_mixed"], {None: str(ROUNDS)})
        rounds = range(ROUNDS)
        self.assertEqual(
            maps["int"], {str(r * 100 + i): str(int(v))
                          for r in rounds for i, v in enumerate(INTS)})
        self.assertEqual(
            maps["str"], {str(r * 100 + i): probe_c_string(v)
                          for r in rounds for i, v in enumerate(STRS)})
        self.assertEqual(
            maps["blob"], {str(r * 100 + i): buf_text(v)
                           for r in rounds for i, v in enumerate(BLOBS)})
        self.assertEqual(maps["m1"], {str(r): "mé" for r in rounds})
        self.assertEqual(maps["m2"], {str(r): "b\\x00c" for r in rounds})
        self.assertEqual(maps["m3"], {str(r): str(-5 - r) for r in rounds})
        self.assertEqual(maps["m4"], {str(r): "?" for r in rounds})
        self.assertEqual(maps["m5"], {str(r): str(INT64_MIN) for r in rounds})
        # After bpftrace detaches, the semaphores go back to 0.
        agent.wait_until("not any(probes)")
        self.assertEqual(agent.finish()[0], 0)

    def test_armed_only_while_attached(self):
        agent = Agent(self)
        path = agent("""
            p = usdt.Probe("armtest", "hit", (int,))
            other = usdt.Probe("armtest", "other", ())
            _ = p.path
            """)
        self.assertEqual(agent.eval("[bool(p), p.armed, bool(other)]"),
                         [False, False, False])
        tracer = self.bpftrace(
            agent.pid, "usdt:%s:armtest:hit { @hits = count(); "
                       "if (arg0 == 2) { exit(); } }" % path)
        tracer.attached(agent, "p")
        # Only the probe the tracer attached to is armed.
        self.assertEqual(agent.eval("[bool(p), p.armed, bool(other)]"),
                         [True, True, False])
        agent("p(1); p(2)")
        self.assertEqual(tracer.finish()["hits"],
                         {None: "2"})
        agent.wait_until("not p")
        self.assertEqual(agent.eval("p.armed"), False)
        self.assertEqual(agent.finish()[0], 0)

    def test_documented_command_without_path(self):
        # With -p, bpftrace finds the file itself: usdt:*:PROVIDER:NAME.
        agent = Agent(self)
        agent("""p = usdt.Probe("myapp", "request__start", (str, int))""")
        tracer = self.bpftrace(
            agent.pid, 'usdt:*:myapp:request__start '
                       '{ @[str(arg0)] = sum(arg1); '
                       'if (arg1 == 0) { exit(); } }')
        tracer.attached(agent, "p")
        agent("p('/a', 200); p('/b', 404); p('/a', 200); p('/end', 0)")
        maps = tracer.finish()
        self.assertEqual(maps[""], {"/a": "400", "/b": "404", "/end": "0"})


class TracedTest(TracerTest):

    def test_entry_and_return(self):
        agent = Agent(self)
        agent("""
            @usdt.traced("tracedtest")
            def add(a, b):
                return a + b

            class Box:
                @usdt.traced("tracedtest", "box_get")
                def get(self, key):
                    if key == "bad":
                        raise KeyError(key)
                    return key * 2

            done = usdt.Probe("tracedtest", "done", ())
            probes = [add.entry_probe, add.return_probe,
                      Box.get.entry_probe, Box.get.return_probe, done]
            """)
        program = """
        usdt:*:tracedtest:add__entry { @add_entry = count(); }
        usdt:*:tracedtest:add__return { @add_return[arg0] = count(); }
        usdt:*:tracedtest:box_get__entry { @get_entry = count(); }
        usdt:*:tracedtest:box_get__return { @get_return[arg0] = count(); }
        usdt:*:tracedtest:done { exit(); }
        """
        tracer = self.bpftrace(agent.pid, program)
        tracer.attached(agent, "all(probes)")
        results = agent("""
            _ = [add(i, 1) for i in range(5)]
            box = Box()
            _ += [box.get("x") for i in range(3)]
            for i in range(2):
                try:
                    box.get("bad")
                except KeyError:
                    _.append("raised")
            done()
            """)
        self.assertEqual(results, [1, 2, 3, 4, 5, "xx", "xx", "xx",
                                   "raised", "raised"])
        maps = tracer.finish()
        self.assertEqual(maps["add_entry"], {None: "5"})
        self.assertEqual(maps["add_return"], {"0": "5"})
        self.assertEqual(maps["get_entry"], {None: "5"})
        self.assertEqual(maps["get_return"], {"0": "3", "1": "2"})
        self.assertEqual(agent.finish()[0], 0)


# The start of FORK_SCRIPT and ORPHAN_SCRIPT, whose child process a test
# traces; a step that outlasts the timeout exits the child (3, 5 or 4).
TRACED_CHILD_PROLOGUE = """
import os, select, sys, time, usdt

def wait_synced(probes, sync):
    # Wait until probes and sync are armed, then fire sync until the test
    # has seen bpftrace's output for it (it writes a line on stdin).
    # Returns the deadline for the child's other steps.
    deadline = time.monotonic() + %(timeout)d
    while not (all(probes) and sync):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.01)
    while not select.select([sys.stdin], [], [], 0.01)[0]:
        sync()
        if time.monotonic() > deadline:
            sys.exit(5)
    sys.stdin.readline()
    return deadline

def wait_disarmed(probe, deadline):
    while probe:
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.01)
"""

FORK_SCRIPT = TRACED_CHILD_PROLOGUE + """
p = usdt.Probe("forktest", "hit", (int, str))
done = usdt.Probe("forktest", "done", ())
sync = usdt.Probe("testsync", "sync", ())
print(p.path, done.path, flush=True)
child = os.fork()
if child == 0:
    deadline = wait_synced([p, done], sync)
    for i in range(5):
        p(i, "child %%d" %% os.getpid())
    done()
    wait_disarmed(p, deadline)
    # A normal exit, which must leave the parent's files alone.
    sys.exit(0)
print(child, flush=True)
armed_in_parent = False
while os.waitpid(child, os.WNOHANG) == (0, 0):
    armed_in_parent |= bool(p)
    time.sleep(0.01)
print("parent armed", armed_in_parent, flush=True)
print("files kept", os.path.exists(p.path), flush=True)
p(99, "parent")
sys.stdin.readline()
"""


class ForkTest(TracerTest):

    def test_child_fires(self):
        # bpftrace attached to the child's pid arms only the child's
        # semaphores, and sees the child's events.
        proc = start(self, [PYTHON, "-c", FORK_SCRIPT % {"timeout": TIMEOUT}],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
        path, done_path = readline(proc.stdout, TIMEOUT, "the fork script "
                                   "did not print its paths").split()
        child = int(readline(proc.stdout, TIMEOUT, "the fork script did not "
                             "print its child's pid"))
        tracer = self.bpftrace(
            child, 'usdt:%s:forktest:hit { @[pid, arg0] = count(); '
                   '@s[arg0] = str(arg1); } '
                   'usdt:%s:forktest:done { exit(); }' % (path, done_path))
        tracer.sync(lambda: None)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        maps = tracer.finish()
        self.assertEqual(maps[""], {"%d, %d" % (child, i): "1"
                                    for i in range(5)})
        self.assertEqual(maps["s"], {str(i): "child %d" % child
                                     for i in range(5)})
        self.assertEqual(readline(proc.stdout, TIMEOUT, "the fork script "
                                  "did not say 'parent armed'"),
                         "parent armed False\n")
        self.assertEqual(readline(proc.stdout, TIMEOUT, "the fork script "
                                  "did not say 'files kept'"),
                         "files kept True\n")
        out, err = proc.communicate("\n", timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, err)
        # The parent's exit removes its files.
        self.assertFalse(os.path.exists(path))
        self.assertFalse(os.path.exists(os.path.dirname(path)))


ORPHAN_SCRIPT = TRACED_CHILD_PROLOGUE + """
tick = usdt.Probe("orphantest", "tick", (int,))
sync = usdt.Probe("orphantest", "sync", ())
if os.fork():
    sys.exit(0)         # the parent's exit removes its files
print(os.getpid(), flush=True)
deadline = wait_synced([tick], sync)
for i in range(5):
    tick(i)
wait_disarmed(tick, deadline)
print("disarmed", flush=True)
"""


def kill_quietly(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class OrphanTest(TracerTest):

    def test_child_outlives_parent(self):
        # Once the parent that made the probes has exited, their files are
        # gone; python -m usdt list gives /proc/CHILD/map_files/ paths,
        # which bpftrace resolves without -p.
        proc = start(self, [PYTHON, "-c",
                            ORPHAN_SCRIPT % {"timeout": TIMEOUT}],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
        child = int(readline(proc.stdout, TIMEOUT, "the orphan script did "
                             "not print its child's pid"))
        self.addCleanup(kill_quietly, child)
        self.assertEqual(proc.wait(timeout=TIMEOUT), 0)
        listed = run([PYTHON, "-m", "usdt", "list", str(child)])
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(listed.stdout.splitlines()[0], LIST_HEADER)
        paths = {line.split()[1]: line.split()[3]
                 for line in listed.stdout.splitlines()[1:]}
        self.assertEqual(sorted(paths), ["orphantest:sync", "orphantest:tick"])
        for path in paths.values():
            self.assertTrue(path.startswith("/proc/%d/map_files/" % child),
                            path)
        tracer = self.bpftrace(
            None, "usdt:%s:orphantest:tick /pid == %d/ "
                  "{ @[arg0] = count(); if (arg0 == 4) { exit(); } }"
                  % (paths["orphantest:tick"], child),
            sync_probe='usdt:%s:orphantest:sync /pid == %d/ '
                       '{ printf("synced\\n"); }'
                       % (paths["orphantest:sync"], child))
        tracer.sync(lambda: None)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        self.assertEqual(tracer.finish()[""],
                         {str(i): "1" for i in range(5)})
        self.assertEqual(readline(proc.stdout, TIMEOUT, "the orphan did "
                                  "not say 'disarmed'"), "disarmed\n")


class ManyProbesTest(TracerTest):

    def test_many_providers_threads(self):
        # 200 probes of 20 providers, created over time by 8 threads (each
        # also creating probes that others create), then fired by threads.
        agent = Agent(self)
        agent("""
            made = {}
            lock = threading.Lock()
            def maker(k):
                for j in range(50):
                    n = (k * 37 + j * 11) % 200
                    p = usdt.Probe("prov%d" % (n % 20), "probe%d" % (n // 20),
                                   (int,))
                    with lock:
                        made.setdefault((p.provider, p.name), set()).add(
                            p.path)
                    time.sleep(0.001)
            threads = [threading.Thread(target=maker, args=(k,))
                       for k in range(8)]
            for t in threads: t.start()
            for t in threads: t.join()
            # Whatever was not made yet, and the probes to fire.
            probes = [usdt.Probe("prov%d" % (n % 20), "probe%d" % (n // 20),
                                 (int,)) for n in range(200)]
            for p in probes:
                made.setdefault((p.provider, p.name), set()).add(p.path)
            done = usdt.Probe("prov7", "done", ())
            _ = sorted(len(paths) for paths in made.values())
            """)
        self.assertEqual(agent.eval("len(made)"), 200)
        # Each probe has one file, whoever made it first.
        self.assertEqual(agent.eval("sorted(len(s) for s in made.values())"),
                         [1] * 200)
        self.assertEqual(
            agent.eval("len({p.path for p in probes})"), 200)

        listed = run([PYTHON, "-m", "usdt", "list", str(agent.pid)])
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(listed.stdout.splitlines()[0], LIST_HEADER)
        names = [line.split()[1] for line in listed.stdout.splitlines()[1:]]
        self.assertEqual(len(names), 201, listed.stdout)
        self.assertEqual(set(names), {"prov%d:probe%d" % (n % 20, n // 20)
                                      for n in range(200)} | {"prov7:done"})

        tracer = self.bpftrace(
            agent.pid, "usdt:*:prov7:probe* { @[probe, arg0] = count(); } "
                       "usdt:*:prov7:done { exit(); }")
        tracer.attached(agent, "all(p for p in probes if p.provider == "
                               "'prov7') and done")
        self.assertFalse(agent.eval(
            "any(p for p in probes if p.provider != 'prov7')"))
        agent("""
            def fire(k):
                for p in probes:
                    p(k)
            threads = [threading.Thread(target=fire, args=(k,))
                       for k in range(4)]
            for t in threads: t.start()
            for t in threads: t.join()
            done()
            """)
        # Keys: "usdt:PATH:prov7:probeN, k" (bpftrace names the file as it
        # found it, through /proc/PID/root).
        counts = {re.sub(r"^usdt:.*:(prov7:probe\d+), ", r"\1, ", key): value
                  for key, value in tracer.finish()[""].items()}
        self.assertEqual(counts, {"prov7:probe%d, %d" % (n // 20, k): "1"
                                  for n in range(7, 200, 20)
                                  for k in range(4)})
        self.assertEqual(agent.finish()[0], 0)


class GdbTest(unittest.TestCase):

    def setUp(self):
        if shutil.which("gdb") is None:
            self.skipTest("gdb not found (apt-get install gdb)")

    def test_info_probes_and_arguments(self):
        script = textwrap.dedent("""
            import os, signal, usdt
            p = usdt.Probe("gdbtest", "hit", (int, str, bytes))
            @usdt.traced("gdbtest")
            def handler():
                pass
            print("PATHS", p.path, handler.entry_probe.path, flush=True)
            os.kill(os.getpid(), signal.SIGTRAP)
            p(-42, "é" * 1000, b"raw")
            handler()
            """)
        commands = textwrap.dedent("""
            set pagination off
            set print thread-events off
            set host-charset UTF-8
            set target-charset UTF-8
            run
            info probes stap gdbtest
            break -probe-stap gdbtest:hit
            commands 1
            silent
            printf "HIT\\t%d\\t%s\\t%s\\n", $_probe_arg0, $_probe_arg1, \\
                $_probe_arg2
            continue
            end
            break -probe-stap gdbtest:handler__return
            commands 2
            silent
            printf "RETURN\\t%d\\n", $_probe_arg0
            continue
            end
            continue
            """)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "script.py")
            with open(path, "w") as f:
                f.write(script)
            proc = run_gdb(commands, PYTHON, path)
        out = proc.stdout.decode("utf-8", "replace")
        paths = re.search(r"^PATHS (\S+) (\S+)$", out, re.M)
        self.assertIsNotNone(paths, out + proc.stderr.decode())
        listed = re.findall(r"^stap\s+gdbtest\s+(\S+)\s+0x[0-9a-f]+\s+"
                            r"0x[0-9a-f]+\s+(\S+)", out, re.M)
        self.assertEqual(sorted(listed),
                         [("handler__entry", paths.group(2)),
                          ("handler__return", paths.group(2)),
                          ("hit", paths.group(1))])
        hits = [line.split("\t")[1:] for line in out.splitlines()
                if line.startswith("HIT\t")]
        # gdb reads the whole string: str arguments are never truncated.
        self.assertEqual(hits, [["-42", "é" * 1000, "raw"]])
        self.assertIn("RETURN\t0", out.splitlines())


def python(code, **kwargs):
    """Run code in PYTHON; the CompletedProcess."""
    return run([PYTHON, "-c", textwrap.dedent(code)], **kwargs)


class ModuleTest(unittest.TestCase):
    """The API, without a tracer."""

    def setUp(self):
        self.agent = Agent(self)

    def test_attributes(self):
        a = self.agent
        a("p = usdt.Probe('attrs', 'request__start', [str, int])")
        self.assertEqual(a.eval("[p.provider, p.name]"),
                         ["attrs", "request__start"])
        self.assertTrue(a.eval("p.types == (str, int)"))
        self.assertIs(a.eval("bool(p)"), False)
        path = a.eval("p.path")
        directory = os.path.dirname(path)
        self.assertRegex(os.path.basename(directory),
                         r"^python-usdt-%d-" % a.pid)
        self.assertEqual(stat.S_IMODE(os.stat(directory).st_mode), 0o700)
        self.assertTrue(path.endswith(".so"))
        self.assertEqual(a.eval("repr(p)"),
                         "<usdt.Probe attrs:request__start(8@%%rdi -8@%%rsi) "
                         "%r>" % path)
        # readelf reads the note, with its semaphore.
        notes = stapsdt_notes(path)
        self.assertEqual(len(notes), 1)
        self.assertEqual(notes[0][:2], ("attrs", "request__start"))
        self.assertTrue(notes[0][2])
        proc = run(["readelf", "-n", path])
        self.assertIn("Arguments: 8@%rdi -8@%rsi", proc.stdout)
        self.assertEqual(a.eval("p('a', 1)"), None)
        for name in ("provider", "name", "types", "path", "armed"):
            self.assertEqual(a.error("p.%s = 1" % name)[0], "AttributeError")

    def test_creation_errors(self):
        a = self.agent
        for args, error in [
                ("'my-app', 'x'", "ValueError"),
                ("'1app', 'x'", "ValueError"),
                ("'', 'x'", "ValueError"),
                ("'app', ''", "ValueError"),
                ("'app', 'café'", "ValueError"),
                ("'app', 'a b'", "ValueError"),
                ("'app', 'x' * 129", "ValueError"),
                ("'a' * 65, 'x'", "ValueError"),
                ("b'app', 'x'", "TypeError"),
                ("'app', None", "TypeError"),
                ("'app', 'x', (float,)", "TypeError"),
                ("'app', 'x', (bool,)", "TypeError"),
                ("'app', 'x', (bytearray,)", "TypeError"),
                ("'app', 'x', 'si'", "TypeError"),
                ("'app', 'x', 5", "TypeError"),
                ("'app', 'x', (int,) * 7", "TypeError"),
                ("'app'", "TypeError")]:
            with self.subTest(args=args):
                self.assertEqual(a.error("usdt.Probe(%s)" % args)[0], error)
        # The longest names, and six arguments, are fine.
        a("usdt.Probe('a' * 64, 'x' * 128, (int, str, bytes) * 2)")
        self.assertIn("not a C identifier",
                      a.error("usdt.Probe('my-app', 'x')")[1])

    def test_call_errors(self):
        a = self.agent
        a("p = usdt.Probe('calls', 'p', (int, str, bytes))")
        for call, error in [
                ("p()", "TypeError"),
                ("p(1, 's')", "TypeError"),
                ("p(1, 's', b'', 2)", "TypeError"),
                ("p(1, 's', b=b'')", "TypeError"),
                ("p(1.0, 's', b'')", "TypeError"),
                ("p('1', 's', b'')", "TypeError"),
                ("p(None, 's', b'')", "TypeError"),
                ("p(1, b's', b'')", "TypeError"),
                ("p(1, 's', 'b')", "TypeError"),
                ("p(1, 's', bytearray(b'b'))", "TypeError"),
                ("p(1, 's', memoryview(b'b'))", "TypeError"),
                ("p(%d, 's', b'')" % (INT64_MAX + 1), "OverflowError"),
                ("p(%d, 's', b'')" % (INT64_MIN - 1), "OverflowError"),
                ("p(10**100, 's', b'')", "OverflowError")]:
            with self.subTest(call=call):
                self.assertEqual(a.error(call)[0], error)
                # Nothing is left behind: the next call succeeds.
                self.assertIsNone(a("p(1, 's', b'')"))
        self.assertIn("argument 2 must be str, not bytes",
                      a.error("p(1, b's', b'')")[1])
        self.assertIn("takes 3 arguments (2 given)",
                      a.error("p(1, 's')")[1])
        # Subclasses of int, str and bytes are accepted; bool is an int.
        a("""
            class S(str): pass
            class B(bytes): pass
            p(True, S('sub'), B(b'sub'))
            p(%d, '\\udcff' * 10000, b'\\0' * 10000)
            p(%d, 'é' * 100000, b'')
            """ % (INT64_MAX, INT64_MIN))

    def test_same_probe_twice(self):
        a = self.agent
        a("p = usdt.Probe('dup', 'x', (int, str))")
        self.assertTrue(a.eval("usdt.Probe('dup', 'x', [int, str]).path "
                               "== p.path"))
        self.assertEqual(a.error("usdt.Probe('dup', 'x', (int,))")[0],
                         "ValueError")
        self.assertEqual(a.error("usdt.Probe('dup', 'x')")[0], "ValueError")
        # A traced function's probes are probes like any other.
        a("""
            @usdt.traced('dup')
            def f(): pass
            """)
        self.assertTrue(a.eval("usdt.Probe('dup', 'f__return', (int,)).path"
                               " == f.return_probe.path"))
        self.assertEqual(a.error("usdt.Probe('dup', 'f__entry', (int,))")[0],
                         "ValueError")
        a("""
            @usdt.traced('dup', name='f')
            def g(): pass
            """)
        self.assertTrue(a.eval("g.entry_probe.path == f.entry_probe.path"))

    def test_traced_wrapper(self):
        a = self.agent
        a("""
            import functools, inspect
            class Oops(Exception): pass
            oops = Oops()
            @usdt.traced("wrap")
            def f(a, b=2, *args, key=None, **kw):
                "The doc."
                if key == "raise":
                    raise oops
                return (a, b, args, key, kw)
            def h(): pass
            h.marker = "copied"
            th = usdt.traced("wrap")(h)
            class K:
                @usdt.traced("wrap", "method")
                def m(self, x):
                    return (self, x)
                @classmethod
                @usdt.traced("wrap", "cm")
                def c(cls, x):
                    return (cls, x)
            k = K()
            """)
        self.assertEqual(a.eval("f(1)"), [1, 2, [], None, {}])
        self.assertEqual(a.eval("f(1, 3, 4, 5, key=6, other=7)"),
                         [1, 3, [4, 5], 6, {"other": 7}])
        self.assertTrue(a.eval("f(*[1], **{'b': 9}) == (1, 9, (), None, {})"))
        # The exception passes through unchanged, with its traceback.
        a("""
            try:
                f(0, key="raise")
            except Oops as e:
                caught = e
            tb = caught.__traceback__
            frames = []
            while tb:
                frames.append(tb.tb_frame.f_code.co_name)
                tb = tb.tb_next
            """)
        self.assertTrue(a.eval("caught is oops"))
        self.assertEqual(a.eval("frames[-1]"), "f")
        self.assertTrue(a.eval("k.m(5) == (k, 5)"))
        self.assertTrue(a.eval("K.m(k, 6) == (k, 6)"))
        self.assertTrue(a.eval("k.m.__self__ is k"))
        self.assertTrue(a.eval("K.c(1) == (K, 1)"))
        self.assertTrue(a.eval("k.c(2) == (K, 2)"))
        # What functools.wraps would set.
        self.assertEqual(a.eval("[f.__name__, f.__qualname__, f.__doc__, "
                                "f.__module__]"),
                         ["f", "f", "The doc.", "agent_code"])
        self.assertEqual(a.eval("K.m.__qualname__"), "K.m")
        self.assertTrue(a.eval("f.__wrapped__.__code__.co_name == 'f'"))
        self.assertEqual(a.eval("str(inspect.signature(f))"),
                         "(a, b=2, *args, key=None, **kw)")
        self.assertEqual(a.eval("[f.entry_probe.name, f.return_probe.name, "
                                "f.return_probe.types == (int,), "
                                "f.entry_probe.types]"),
                         ["f__entry", "f__return", True, []])
        self.assertEqual(a.eval("type(f).__name__"), "TracedFunction")
        self.assertEqual(a.eval("th.marker"), "copied")
        a("f.extra = 1")
        self.assertEqual(a.eval("f.__dict__['extra']"), 1)
        # Pickled by reference, like the function it replaces.
        self.assertTrue(a.eval("__import__('pickle').loads("
                               "__import__('pickle').dumps(f)) is f"))
        self.assertTrue(a.eval("__import__('weakref').ref(f)() is f"))

    def test_traced_errors(self):
        a = self.agent
        for code, error in [
                ("usdt.traced(lambda: 0)", "TypeError"),
                ("usdt.traced('bad-provider')", "ValueError"),
                ("usdt.traced('p', name='bad name')", "ValueError"),
                ("usdt.traced('p', name='x' * 121)", "ValueError"),
                ("usdt.traced('p')(lambda: 0)", "ValueError"),
                ("usdt.traced('p')(5)", "TypeError"),
                ("usdt.traced('p')(print, 1)", "TypeError")]:
            with self.subTest(code=code):
                self.assertEqual(a.error(code)[0], error)
        self.assertIn("name=", a.error("usdt.traced('p')(lambda: 0)")[1])
        # 120 characters, plus "__return", is the longest name.
        a("usdt.traced('p', name='x' * 120)(print)")

    def test_list_command(self):
        a = self.agent
        paths = a("""
            p = usdt.Probe('listtest', 'request__start', (str, int))
            @usdt.traced('listtest')
            def handle(): pass
            _ = [p.path, handle.entry_probe.path]
            """)

        def listing(*args):
            proc = run([PYTHON, "-m", "usdt", "list", *args])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            lines = proc.stdout.splitlines()
            self.assertEqual(lines[0], LIST_HEADER)
            if os.geteuid() != 0:
                # Reading another process's memory (the semaphores) may
                # need root: then they show as "?".
                return [re.sub(r"^(\d+ \S+) \? ", r"\1 0 ", line)
                        for line in lines[1:]]
            return lines[1:]

        self.assertEqual(listing(str(a.pid)), [
            "%d listtest:handle__entry 0 %s" % (a.pid, paths[1]),
            "%d listtest:handle__return 0 %s -8@%%rdi" % (a.pid, paths[1]),
            "%d listtest:request__start 0 %s 8@%%rdi -8@%%rsi"
            % (a.pid, paths[0])])
        # Without a PID: every process with such probes, this one included.
        self.assertIn("%d listtest:request__start 0 %s 8@%%rdi -8@%%rsi"
                      % (a.pid, paths[0]), listing())
        # --all: the interpreter's own probes too.
        self.assertTrue(any(line.startswith("%d python:function__entry "
                                            % a.pid)
                            for line in listing("--all", str(a.pid))))
        # A process without usdt module probes: said so, and no header.
        plain = start(self, [PYTHON, "-c", "import sys; sys.stdin.read()"],
                      stdin=subprocess.PIPE)
        proc = run([PYTHON, "-m", "usdt", "list", str(plain.pid)])
        self.assertEqual((proc.returncode, proc.stdout), (0, ""))
        self.assertEqual(proc.stderr, "usdt list: process %d has no probes "
                         "defined with the usdt module (--all lists the "
                         "others)\n" % plain.pid)
        # No such process; not a PID.
        proc = run([PYTHON, "-m", "usdt", "list", "999999999"])
        self.assertEqual((proc.returncode, proc.stdout), (1, ""))
        self.assertIn("no process 999999999", proc.stderr)
        proc = run([PYTHON, "-m", "usdt", "list", "nope"])
        self.assertEqual(proc.returncode, 2)
        self.assertIn("invalid int value: 'nope'", proc.stderr)


# The first line of python -m usdt list's output.
LIST_HEADER = "PID PROVIDER:NAME SEMAPHORE PATH ARGUMENTS"


def start_time(pid):
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks
    since boot."""
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rpartition(")")[2].split()[19])


def pid_namespace():
    return os.stat("/proc/self/ns/pid").st_ino


def dead_pid():
    """The pid of a process that has just ended."""
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=TIMEOUT)
    return proc.pid


class FilesTest(unittest.TestCase):

    def setUp(self):
        # Each test's own TMPDIR, for the module's directories: the
        # children of the fork test end with os._exit() and leave theirs.
        self.tmp = tempfile.mkdtemp(prefix="usdt-files-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.env = dict(os.environ, TMPDIR=self.tmp)

    def probe_dir(self, name, files=("1-x-y.so",)):
        """A directory in self.tmp named name, holding files."""
        path = os.path.join(self.tmp, name)
        os.mkdir(path, 0o700)
        for file in files:
            with open(os.path.join(path, file), "w"):
                pass
        return path

    def make_probe(self):
        """Run a process that makes a probe and exits: the directory it
        made, which it removed at exit."""
        proc = python("""
            import os, usdt
            print(os.path.dirname(usdt.Probe("staletest", "x").path))
            """, env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        own = proc.stdout.strip()
        self.assertFalse(os.path.exists(own))
        return own

    def test_directory_names_its_owner(self):
        proc = python("""
            import os, usdt
            print(os.getpid(), usdt.Probe("nametest", "x").path)
            """, env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        pid, path = proc.stdout.split()
        name = os.path.basename(os.path.dirname(path))
        found = re.fullmatch(r"python-usdt-(\d+)-(\d+)-(\d+)-\w{6}", name)
        self.assertTrue(found, name)
        self.assertEqual(found.group(1), pid)
        self.assertEqual(int(found.group(3)), pid_namespace())

    def test_killed_process_directory_removed_by_next(self):
        # SIGTERM, as service managers stop services, ends the process
        # without its exit functions: its directory stays, until the next
        # process's first probe removes it.
        victim = start(self, [PYTHON, "-c", textwrap.dedent("""
            import sys, usdt
            print(usdt.Probe("killtest", "x").path, flush=True)
            sys.stdin.read()
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       env=self.env)
        path = readline(victim.stdout, TIMEOUT, "the victim did not print "
                        "its probe's path").strip()
        self.assertTrue(path.startswith(self.tmp + "/python-usdt-"), path)
        victim.send_signal(signal.SIGTERM)
        victim.wait(timeout=TIMEOUT)
        self.assertEqual(victim.returncode, -signal.SIGTERM)
        self.assertTrue(os.path.exists(path))
        self.make_probe()
        self.assertFalse(os.path.exists(os.path.dirname(path)))
        self.assertEqual(os.listdir(self.tmp), [])

    def test_only_dead_owners_directories_removed(self):
        me, ns = os.getpid(), pid_namespace()
        mine = start_time(me)
        gone = dead_pid()
        removed = [
            # the owner is gone
            self.probe_dir("python-usdt-%d-%d-%d-aB3dE6" % (gone, mine, ns)),
            # the pid runs, but is another process than the owner: it
            # started at another time
            self.probe_dir("python-usdt-%d-%d-%d-aB3dE7"
                           % (me, mine + 1, ns)),
            # empty
            self.probe_dir("python-usdt-%d-%d-%d-aB3dE8" % (gone, mine, ns),
                           files=()),
        ]
        kept = [
            # a live process: this one
            self.probe_dir("python-usdt-%d-%d-%d-aB3dE9" % (me, mine, ns)),
            # another pid namespace's process, whose pid means nothing here
            self.probe_dir("python-usdt-%d-%d-%d-aB3dEa"
                           % (gone, mine, ns + 1)),
            # an older module's name, without the owner's start time
            self.probe_dir("python-usdt-%d-aB3dEb" % gone),
            # names the module does not make
            self.probe_dir("python-usdt-%d-%d-%d-aB3dEc-x"
                           % (gone, mine, ns)),
            self.probe_dir("python-usdt-x%d-%d-%d-aB3dEd" % (gone, mine, ns)),
        ]
        # A symbolic link with a stale name: neither it nor the directory
        # it points to is touched.
        target = self.probe_dir("target")
        link = os.path.join(self.tmp,
                            "python-usdt-%d-%d-%d-aB3dEe" % (gone, mine, ns))
        os.symlink(target, link)
        kept += [target, link]
        if os.geteuid() == 0:
            # another user's
            other = self.probe_dir("python-usdt-%d-%d-%d-aB3dEf"
                                   % (gone, mine, ns))
            os.chown(other, 65534, 65534)
            kept.append(other)
        # A live process's real directory, next to them.
        agent = Agent(self, env=self.env)
        live = os.path.dirname(agent.eval(
            "__import__('usdt').Probe('livetest', 'x').path"))
        self.make_probe()
        for path in removed:
            self.assertFalse(os.path.lexists(path), path)
        for path in kept:
            self.assertTrue(os.path.lexists(path), path)
        self.assertEqual(os.listdir(target), ["1-x-y.so"])
        self.assertEqual(os.listdir(live), ["1-livetest-x.so"])
        self.assertEqual(sorted(os.listdir(self.tmp)),
                         sorted(os.path.basename(p) for p in kept + [live]))

    def test_removed_at_exit(self):
        for ending in ("pass", "raise SystemExit(3)", "1 / 0",
                       "threading.Thread(target=make).start()"):
            with self.subTest(ending=ending):
                proc = python("""
                    import threading, usdt
                    def make():
                        usdt.Probe("exittest", "late", (int,))
                    p = usdt.Probe("exittest", "early", (int,))
                    t = threading.Thread(target=make)
                    t.start(); t.join()
                    print(p.path, flush=True)
                    %s
                    """ % ending)
                path = proc.stdout.strip()
                self.assertTrue(path, proc.stderr)
                self.assertFalse(os.path.exists(path))
                self.assertFalse(os.path.exists(os.path.dirname(path)))

    def test_fork_while_threads_make_probes(self):
        # Threads keep making probes while the main thread forks: a child
        # must never start with the registry's lock held (in the
        # free-threaded build a PyMutex waiter could be handed it during
        # the stop-the-world of os.fork(), and every such child hung).
        proc = python("""
            import os, signal, threading, usdt
            stop = False
            def make(k):
                i = 0
                while not stop:
                    usdt.Probe("forkstress%d" % k, "p%d" % (i % 50), (int,))
                    i += 1
            threads = [threading.Thread(target=make, args=(k,))
                       for k in range(3)]
            for t in threads:
                t.start()
            failed = 0
            for _ in range(300):
                pid = os.fork()
                if pid == 0:
                    signal.alarm(30)    # a hung child must not stay behind
                    usdt.Probe("forkstress", "child", (int,))(1)
                    os._exit(0)
                failed += os.waitpid(pid, 0)[1] != 0
            stop = True
            for t in threads:
                t.join()
            print("failed", failed)
            """, timeout=120, env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, "failed 0\n")

    def test_tmpdir(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc = python("""
                import os, usdt
                p = usdt.Probe("tmpdirtest", "x")
                print(p.path, os.listdir(os.path.dirname(p.path)))
                """, env=dict(os.environ, TMPDIR=tmp))
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertTrue(proc.stdout.startswith(tmp + "/python-usdt-"),
                            proc.stdout)
            self.assertEqual(os.listdir(tmp), [])


if __name__ == "__main__":
    unittest.main()
