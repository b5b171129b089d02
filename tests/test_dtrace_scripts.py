"""The D scripts, under DTrace for Linux, against the built interpreter.

Every D script of Lib/usdt/scripts/, upstream's seed call_stack.d
(Lib/test/dtracedata) and every DTrace example of
Doc/howto/instrumentation.rst (read from the howto itself) runs under
DTrace for Linux, through tools/dtrace, twice: with -c, where the probes
are named python$target, and attached with -p to a process that waits for
the tracer, where the howto's one-liners and the seed name them
python<PID> (the Lib/usdt/scripts scripts keep python$target, which names the
-p process too).  Each run is compared with the same ground truth as the
bpftrace twin of the script in test_usdt_scripts.py, from the same
workloads: sys.setprofile() for the function and C function probes,
sys.settrace() for the line probe, sys.monitoring for exceptions and task
steps, what the workload prints about its threads, gc.callbacks, audit
hooks, and readelf -n for the probe listing.

DTrace takes 10 to 50 seconds to start, most of it CPU, so the runs are
started when the module is set up, the -c runs a few at a time, then the
-p runs one by one (see RUNS); the tests then check their results.  Where
DTrace cannot run (not root, no mmdebstrap or network to build its root,
tools/dtrace's one line says which), every test skips with that reason;
under CI or REQUIRE_TRACER=1 they fail instead.
"""

import collections
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

import test_usdt_scripts as bt
from support import (PYTHON, TOP, Hang, PtraceWatch, Semaphore,
                     free_threaded, ptrace_stopped, readline, run,
                     stapsdt_notes, tracer_unusable, wait)

DTRACE = os.path.join(TOP, "tools", "dtrace")
USDT = bt.USDT
HOWTO = os.path.join(TOP, "overlay", "Doc", "howto", "instrumentation.rst")
TOOLKIT = os.path.join(TOP, "overlay", "Doc", "howto", "usdt-tools.rst")
# Runs of DTrace at once: its start-up is mostly CPU.
PARALLEL = int(os.environ.get("DTRACE_PARALLEL", "3"))
TIMEOUT = 600
# What one -c run may take (the longest take 30 s on a loaded machine).
SESSION_TIMEOUT = 240
# What DTrace may take to end once told to (SIGINT).
END_TIMEOUT = 120
# What a step of a -p run may take: DTrace arming the target's probes, the
# workload running once they are, DTrace ending after it (each takes
# seconds; a stall is DTrace's bug of retried(), found sooner).
STEP_TIMEOUT = 180
# How long DTrace may stay alive after its -p target has exited before it
# is told to end (SIGINT, on which it runs its END clauses and prints its
# aggregations, as it does when it sees the target go).  DTrace 2.0.7
# sometimes does not see it go (seen: a CI run waited 10 minutes, twice).
GONE_GRACE = 30
# How long pystat.d -p may take to end after SIGINT before its target is
# ended (PystatTest.drive_rows()).
SIGINT_GRACE = 30
# How long a thread of a -c program may stay in ptrace_stop: DTrace keeps
# the program stopped until its probes are armed (seconds; up to a minute
# on a loaded machine), then only for moments.
C_PTRACE_PATIENCE = 90


def state_of(pid):
    """Process pid's state and the kernel function it waits in, for a
    message (needs root for wchan)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rpartition(")")[2].split()[0]
        with open("/proc/%d/wchan" % pid) as f:
            return "state %s, waiting in %s" % (state, f.read() or "-")
    except OSError as e:
        return "unknown (%s)" % e


# What a -p target runs: it says it is ready, waits for a line on stdin (the
# tracer has armed its probes), then runs the workload as __main__, as
# "python workload" would, calling as little as it can (runpy would call C
# functions and raise exceptions that the workloads' scripts count).  The
# watcher arms the probes with a pending call, which runs at the main
# thread's next eval-breaker check: a call of a Python function after the
# wait, before the workload's first C call (exec) can be half seen.
GATE = textwrap.dedent("""\
    import importlib, os, sys
    for name in filter(None, os.environ.pop("GATE_PRELOAD", "").split(",")):
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(sys.argv[0])
    with open(sys.argv[0]) as f:
        code = compile(f.read(), sys.argv[0], "exec")
    go = os.environ.pop("GATE_GO", "").encode()
    print("ready", flush=True)
    sys.stdin.readline()
    if go:
        os.write(2, go + b"\\n")
    (lambda: None)()
    exec(code, {"__name__": "__main__", "__file__": sys.argv[0],
                "__builtins__": __builtins__})
""")

# usage: PYTHON -c EXTENSIONS_OF WORKLOAD: runs it (stdin at its end), then
# prints, on its last line, the extension modules (shared objects) it had
# imported, comma-separated.
EXTENSIONS_OF = textwrap.dedent("""\
    import importlib.machinery, os, runpy, sys
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(sys.argv[0])
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
        print("\\n" + ",".join(sorted(
            name for name, module in list(sys.modules.items())
            if (getattr(module, "__file__", None) or "").endswith(suffixes))))
""")
_extensions = {}


def extensions_of(workload):
    """The extension modules that workload imports (cached)."""
    if workload not in _extensions:
        proc = run([PYTHON, "-c", EXTENSIONS_OF, workload],
                   stdin=subprocess.DEVNULL, timeout=TIMEOUT)
        lines = proc.stdout.splitlines()
        if not lines:
            raise AssertionError("%s: no list of its extension modules: %s"
                                 % (workload, proc.stderr))
        _extensions[workload] = tuple(filter(None, lines[-1].split(",")))
    return _extensions[workload]


# What trace_p's own BEGIN clause prints once DTrace traces.
TRACING = "@@dtrace-tracing@@"
# Probe names in D (function-entry) of a python provider.
PROBE_NAME = re.compile(r"python(?:\$target|\d+):::([a-z-]+)")
# "   value  ------------- Distribution ------------- count", then rows
# "         8388608 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@ 2"
DIST_HEADER = re.compile(r"^\s+value\s+-+ Distribution -+\s+count\s*$")
DIST_ROW = re.compile(r"^\s*(-?\d+) \|[@ ]*?\s(\d+)\s*$")


def dtrace_errors(stderr):
    """DTrace's stderr without tools/dtrace's note on library files."""
    return "\n".join(line for line in stderr.splitlines()
                     if not line.startswith("dtrace: set aside")).strip()


_reason = "not checked"


def dtrace_unusable():
    """None if tools/dtrace can run a D program here, else its reason."""
    global _reason
    if _reason == "not checked":
        proc = run([DTRACE, "-q", "-n",
                    'BEGIN { printf("started\\n"); exit(0); }'],
                   timeout=TIMEOUT)
        if proc.returncode == 0 and proc.stdout.strip() == "started":
            _reason = None
        else:
            _reason = ("tools/dtrace cannot run DTrace: %s"
                       % (dtrace_errors(proc.stderr).splitlines() or
                          ["exit %d" % proc.returncode])[-1])
    return _reason


def distributions(output):
    """[(key words, {bucket: count})] of the quantize() aggregations printed
    in output, in order, empty buckets left out."""
    found = []
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if not DIST_HEADER.match(line):
            continue
        key = tuple(lines[i - 1].split()) if i else ()
        buckets = {}
        for row in lines[i + 1:]:
            match = DIST_ROW.match(row)
            if not match:
                break
            if int(match.group(2)):
                buckets[int(match.group(1))] = int(match.group(2))
        found.append((key, buckets))
    return found


def probes_of(program):
    """The markers (function__entry) a D program's python clauses name."""
    return sorted({name.replace("-", "__")
                   for name in PROBE_NAME.findall(program)})


class Session:
    """One DTrace run: its exit status, output and errors; for -p, the
    workload's output comes first in stdout (with -c DTrace's own stdout
    has it; its errors are in stderr, and with -p in target_stderr)."""

    def __init__(self, returncode, stdout, stderr, target_stderr=""):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.target_stderr = target_stderr


def pids_of(argv):
    """The processes whose command line is argv."""
    wanted = "\0".join(argv) + "\0"
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/cmdline" % pid) as f:
                if f.read() == wanted:
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def kill_program(argv):
    """Kill the processes whose command line is argv."""
    for pid in pids_of(argv):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class ProgramWatch:
    """A watch for wait() on a -c run of DTrace: a PtraceWatch (patience
    C_PTRACE_PATIENCE) of each process whose command line is argv, DTrace's
    program, so that DTrace's bug of retried() (a thread of the program
    left in ptrace_stop) is a Hang within a minute and a half, not at
    SESSION_TIMEOUT."""

    def __init__(self, argv):
        self.argv = argv
        self.watches = {}

    def __call__(self):
        for pid in pids_of(self.argv):
            watch = self.watches.get(pid)
            if watch is None:
                watch = self.watches[pid] = PtraceWatch(
                    pid, "DTrace's -c program", C_PTRACE_PATIENCE)
            watch()


def retried(name, function, *args, **kwargs):
    """function(*args, **kwargs), a run of DTrace (trace_c, trace_p), tried
    once more if it hangs (support.Hang, after which the run has killed
    DTrace and its target), with one line on stderr; a second hang fails,
    its one line naming the run and the cause.

    Seen here with threaded programs, in about 1 run in 10 with -c, and
    with -p too (pystat.d's target waited 11 minutes for an answer):
    DTrace 2.0.7 left one of their threads in ptrace_stop, and the program
    waited for it, even after DTrace was killed.  That is DTrace's bug, not
    the script's."""
    for attempt in (1, 2):
        try:
            return function(*args, **kwargs)
        except Hang as hang:
            if attempt == 2:
                raise Hang("%s hung twice, the second time: %s"
                           % (name, hang), hang.cause) from None
            sys.stderr.write("test_dtrace_scripts: %s: %s (run 1 of 2); "
                             "DTrace and its target killed, trying once "
                             "more\n" % (name, hang))


def trace_c(program_args, workload, script_args=(), env=None):
    """tools/dtrace -q PROGRAM -c 'PYTHON workload' [ARGS], in env if
    given.  DTrace writes its output to a file of its own (-o), so that the
    workload's, which comes first in the Session's stdout, cannot break its
    lines."""
    if " " in PYTHON or " " in workload:
        raise ValueError("dtrace -c splits on spaces: %r" % workload)
    with tempfile.TemporaryDirectory(dir=_tmp) as tmp:
        path = os.path.join(tmp, "dtrace.out")
        tracer = subprocess.Popen(
            [DTRACE, "-q", "-o", path, *program_args, "-c",
             "%s %s" % (PYTHON, workload), *script_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env)
        try:
            out, err = wait(tracer, SESSION_TIMEOUT,
                            "DTrace and its -c program %s did not end"
                            % workload,
                            ProgramWatch([PYTHON, workload]),
                            communicate=True)
        except Hang:
            # DTrace is killed below; its program may hang on (see
            # retried).
            kill_program([PYTHON, workload])
            raise
        finally:
            if tracer.poll() is None:
                tracer.kill()
                tracer.communicate()
        proc = subprocess.CompletedProcess(tracer.args, tracer.returncode,
                                           out, err)
        output = ""
        if os.path.exists(path):
            with open(path) as f:
                output = f.read()
    return Session(proc.returncode, proc.stdout + output, proc.stderr)


def trace_p(program_args, workload, program, script_args=(), tmp=None,
            pid_naming=False, driver=None, attach=True, env=None):
    """tools/dtrace -q PROGRAM -p PID [ARGS], PID a process of GATE that
    runs workload once the probes the program names are armed and the
    interpreter's watcher has seen them (it looks once a second).

    With pid_naming, python$target in the program (a -s file or a -n
    text) is written python<PID>.  driver(target, tracer), if given, takes
    over once DTrace is attached, instead of letting the workload run.
    Without attach, DTrace is not given -p (for a probe listing).  The
    target runs in env, if given; it writes env's GATE_GO, if any, to its
    stderr when it lets the workload run.

    The target imports the extension modules that workload imports
    before DTrace attaches, as a service that has run for a while has.
    After DTrace for Linux 2.0.7 attached with -p, a dlopen() in the
    process (the import of an extension module) made the probes fire
    twice from then on: cfunction-entry in 5 of 10 runs of ccalls.d here,
    function-entry in a run of call_stack.d (not seen with -c): the howto
    says so."""
    preload = extensions_of(workload) if attach else ()
    target = subprocess.Popen([PYTHON, "-c", GATE, workload],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(env or os.environ,
                                       GATE_PRELOAD=",".join(preload)))
    tracer = None
    try:
        ready = readline(target.stdout, 120,
                         "the target did not say 'ready'")
        if ready != "ready\n":
            target.kill()
            target.wait()
            raise AssertionError("the target did not start: %r %s"
                                 % (ready, target.stderr.read()))
        args = list(program_args)
        if pid_naming:
            named = "python%d" % target.pid
            if args[0] == "-s":
                with open(args[1]) as f:
                    text = f.read().replace("python$target", named)
                path = os.path.join(tmp, "pid-" + os.path.basename(args[1]))
                with open(path, "w") as f:
                    f.write(text)
                args[1] = path
            else:
                args = [arg.replace("python$target", named) for arg in args]
        # DTrace sets the probes' semaphores before all of its probes
        # fire (ccalls.d missed a call's entry after they were set): a
        # BEGIN clause of its own says when it traces, in the file DTrace
        # writes its output to.
        output = os.path.join(tmp or _tmp, "dtrace-%d.out" % target.pid)
        if driver is None:
            # It names the script's arguments too, as DTrace requires of
            # every program it is given.
            uses = " && ".join("$$%d == $$%d" % (i, i)
                               for i in range(1, len(script_args) + 1))
            begin = 'dtrace:::BEGIN %s{ printf("%s\\n"); }' % (
                "/%s/ " % uses if uses else "", TRACING)
            args += ["-o", output, "-n", begin]
        tracer = subprocess.Popen(
            [DTRACE, "-q", *args,
             *(["-p", str(target.pid)] if attach else []), *script_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        semaphores = [Semaphore(target.pid, name)
                      for name in probes_of(program)]
        deadline = time.monotonic() + STEP_TIMEOUT

        def tracing():
            if driver is not None:
                return True
            try:
                with open(output) as f:
                    return TRACING + "\n" in f.read()
            except FileNotFoundError:
                return False

        while not (all(s.value() for s in semaphores) and tracing()):
            if tracer.poll() is not None:
                out, err = tracer.communicate()
                return Session(tracer.returncode, out, err)
            if time.monotonic() > deadline:
                raise Hang("timeout: DTrace did not arm %s within %d s"
                           % (probes_of(program), STEP_TIMEOUT))
            time.sleep(0.05)
        # The watcher sees armed probes within a second.
        time.sleep(2.5)
        if driver is not None:
            return driver(target, tracer)
        target.stdin.write("go\n")
        target.stdin.close()
        target_out, target_err = wait(
            target, STEP_TIMEOUT, "the traced workload did not end",
            PtraceWatch(target.pid, "the traced workload"), communicate=True)
        if target.returncode != 0:
            raise AssertionError("the workload failed: %s" % target_err)
        # DTrace ends when the process it grabbed has exited; if it has
        # not seen it go, SIGINT makes it end as it would have.
        try:
            out, err = wait(tracer, GONE_GRACE, "DTrace did not end after "
                            "its target", communicate=True)
        except Hang:
            sys.stderr.write("test_dtrace_scripts: DTrace still ran %d s "
                             "after its -p target ended: sent SIGINT\n"
                             % GONE_GRACE)
            tracer.send_signal(signal.SIGINT)
            out, err = wait(tracer, END_TIMEOUT, "DTrace did not end after "
                            "its target and SIGINT", communicate=True)
        with open(output) as f:
            out += f.read().replace(TRACING + "\n", "", 1)
        return Session(tracer.returncode, target_out + out, err, target_err)
    finally:
        # DTrace first: while it still traces the target, the target's
        # exit is reported to DTrace, not to us, and waiting for it
        # blocks for as long as DTrace lives (seen: DTrace alive in
        # epoll, the target a zombie it traced, the test waiting in this
        # finally for over 5 minutes, until DTrace was killed).
        for proc in (tracer, target):
            if proc is not None:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()


def list_first(target, tracer):
    """A trace_p driver for a probe listing: the target waits until DTrace
    has listed its probes."""
    out, err = wait(tracer, TIMEOUT, "DTrace did not list the probes",
                    communicate=True)
    target.stdin.write("go\n")
    target.stdin.close()
    wait(target, TIMEOUT, "the target did not end after the listing",
         PtraceWatch(target.pid, "the listed target"), communicate=True)
    return Session(tracer.returncode, out, err)


# The runs, started by setUpModule(): name -> Future of a Session.
#
# A DTrace for Linux 2.0.7 session attached with -p can see the events of
# other processes of the same interpreter binary that another session
# traces at the same time (of three call_stack.d sessions attached at
# once, two printed 71 lines instead of 28; a -p run of the failed-imports
# one-liner printed the -c run's "yaml" too; the howto says so).  So the
# -c runs go first, a few at a time, and then the -p runs one by one.
RUNS = {}
_pool = None
_attached = []
_tmp = None


def submit(name, function, *args, **kwargs):
    if function is trace_p:
        _attached.append((name, function, args, kwargs))
    else:
        RUNS[name] = _pool.submit(retried, name, function, *args, **kwargs)


def submit_attached():
    """Start the -p runs, one by one once the -c runs have ended."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    unittest.addModuleCleanup(pool.shutdown)
    started = list(RUNS.values())
    pool.submit(concurrent.futures.wait, started)
    for name, function, args, kwargs in _attached:
        RUNS[name] = pool.submit(retried, name, function, *args, **kwargs)


def write(name, text):
    path = os.path.join(_tmp, name)
    with open(path, "w") as f:
        f.write(textwrap.dedent(text))
    return path


def reference(program, workload, *args):
    """The ground truth: program (a reference of test_usdt_scripts, or one
    below) run with the interpreter under test on workload, its stdout."""
    helper = write("reference-%d.py" % len(os.listdir(_tmp)), program)
    proc = run([PYTHON, helper, workload, *args], timeout=TIMEOUT)
    if proc.returncode != 0:
        raise AssertionError("reference failed: %s" % proc.stderr)
    return proc.stdout


def both(name, program_args, workload, program_text, script_args=(),
         pid_naming=False, env=None):
    """Submit the -c and the -p run of one D program."""
    submit(name + " -c", trace_c, program_args, workload, script_args, env)
    submit(name + " -p", trace_p, program_args, workload, program_text,
           script_args, _tmp, pid_naming, env=env)


def script(name):
    path = os.path.join(USDT, name)
    with open(path) as f:
        return path, f.read()


# The DTrace commands of the howto: "$ sudo dtrace ..." and the lines that
# continue it, as a shell would read them, with $PY the interpreter.
def howto_commands():
    lines = []
    for page in (HOWTO, TOOLKIT):
        with open(page) as f:
            lines += f.read().splitlines()
    commands = []
    i = 0
    while i < len(lines):
        match = re.match(r"^(\s*)\$ sudo dtrace (.*)$", lines[i])
        if not match:
            i += 1
            continue
        indent = len(match.group(1))
        text = [match.group(2)]
        i += 1
        while (i < len(lines) and lines[i].strip()
               and len(lines[i]) - len(lines[i].lstrip()) > indent
               and not lines[i].lstrip().startswith("$ ")):
            text.append(lines[i].strip())
            i += 1
        command = "\n".join(text).replace("\\\n", " ")
        commands.append(shlex.split(command))
    return commands


# The howto's one-liners, told apart by a piece of their D text: the name
# of their test, then what picks them out.
ONE_LINERS = {
    "calls_per_name": "{ @[copyinstr(arg1)] = count(); }",
    "time_per_name": "self->ts[copyinstr(arg1)] = timestamp",
    "lines_of_function": "python$target:::line",
    "live_instances": "instance-new-done",
    "gc_durations": "gc-start",
    "failed_imports": "import-find-load-done",
    "audit_stacks": "audit",
}


def one_liner(name):
    """(D program, workload path) of the howto's one-liner name."""
    found = []
    for words in howto_commands():
        if "-n" not in words:
            continue
        program = words[words.index("-n") + 1]
        squeezed = re.sub(r"[ ]+", " ", program)
        if ONE_LINERS[name] in squeezed:
            workload = words[words.index("-c") + 1].split()[1]
            found.append((program, os.path.join(TOP, workload)))
    if len(found) != 1:
        raise AssertionError("the howto has %d DTrace one-liners for %s"
                             % (len(found), name))
    return found[0]


def setUpModule():
    global _pool, _tmp
    reason = dtrace_unusable()
    if reason is not None:
        tracer_unusable(reason, "DTrace")
    _tmp = tempfile.mkdtemp(prefix="usdt-dtrace")
    unittest.addModuleCleanup(shutil.rmtree, _tmp)
    _pool = concurrent.futures.ThreadPoolExecutor(PARALLEL)
    unittest.addModuleCleanup(_pool.shutdown)
    data = bt.dtracedata_dir()
    if data is not None:
        with open(os.path.join(data, "call_stack.py")) as f:
            workload = write("call_stack.py", f.read())
        seed = os.path.join(data, "call_stack.d")
        with open(seed) as f:
            both("seed call_stack.d", ["-s", seed], workload, f.read(),
                 pid_naming=True)
    path, text = script("call_stack.d")
    both("call_stack.d", ["-s", path], write("gen_workload.py",
                                             bt.GEN_WORKLOAD), text)
    path, text = script("top-functions.d")
    both("top-functions.d", ["-s", path],
         write("top_workload.py", bt.TOP_WORKLOAD), text)
    path, text = script("ccalls.d")
    both("ccalls.d", ["-s", path],
         write("cc_main.py", bt.CCallsTest.WORKLOAD), text, ("time", "sleep"))
    path, text = script("exceptions.d")
    both("exceptions.d", ["-s", path],
         write("exc_workload.py", bt.EXCEPTIONS_WORKLOAD), text)
    path, text = script("gil.d")
    both("gil.d", ["-s", path], write("gil_workload.py", bt.GIL_WORKLOAD),
         text)
    path, text = script("threads.d")
    both("threads.d", ["-s", path],
         write("threads_workload.py", bt.THREADS_WORKLOAD), text)
    path, text = script("tasks.d")
    both("tasks.d", ["-s", path],
         write("tasks_workload.py", bt.TASKS_WORKLOAD), text)
    path, text = script("pystat.d")
    submit("pystat.d -c", trace_c, ["-s", path],
           write("pystat_once.py", PYSTAT_ONCE))
    submit("pystat.d -p", trace_p, ["-s", path],
           write("pystat_workload.py", bt.PYSTAT_WORKLOAD), text,
           driver=PystatTest.drive)
    for name in ONE_LINERS:
        program, workload = one_liner(name)
        both(name, ["-n", program], workload, program, pid_naming=True,
             env=truth_env(name))
    idle = write("idle.py", "pass\n")
    submit("listing -p", trace_p, ["-l", "-P", "python$target"], idle, "",
           pid_naming=True, driver=list_first)
    submit("listing", trace_p, ["-l", "-P", "python$target"], idle, "",
           pid_naming=True, driver=list_first, attach=False)
    submit_attached()


class DTraceTestCase(unittest.TestCase):

    def session(self, name):
        """The output of the run name, which must have succeeded."""
        return self.session_of(name).stdout

    def session_of(self, name):
        """The Session of the run name, which must have succeeded."""
        if name not in RUNS:
            self.skipTest("%s was not run" % name)
        result = RUNS[name].result()
        self.assertEqual(result.returncode, 0, "%s failed: %s"
                         % (name, dtrace_errors(result.stderr)))
        return result

    # The runs of each D program.
    MODES = ("-c", "-p")


class CallStackTest(DTraceTestCase):

    def test_seed_call_stack(self):
        # Upstream's own call_stack.d on its call_stack.py: the lines of
        # its call_stack.d.expected.
        data = bt.dtracedata_dir()
        if data is None:
            self.skipTest("Lib/test/dtracedata not found for %s" % PYTHON)
        with open(os.path.join(data, "call_stack.d.expected")) as f:
            expected = [line for line in f.read().splitlines() if line]
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("seed call_stack.d " + mode)
                self.assertEqual(bt.call_stack_lines(output), expected, output)

    def test_matches_setprofile(self):
        workload = os.path.join(_tmp, "gen_workload.py")
        expected = reference(bt.SETPROFILE_REFERENCE, workload).splitlines()
        self.assertIn(" function-entry: gen_workload.py:gen:3", expected)
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("call_stack.d " + mode)
                self.assertEqual(bt.call_stack_lines(output), expected, output)

    def test_howto_shows_the_script(self):
        # The howto's code block is Lib/usdt/scripts/call_stack.d's
        # program, included (test_howto checks that what it names is
        # there).
        with open(HOWTO) as f:
            howto = f.read()
        self.assertIn(".. literalinclude:: ../../Lib/usdt/scripts/"
                      "call_stack.d\n   :language: none\n"
                      "   :start-at: self int indent;\n", howto)


class TopFunctionsTest(DTraceTestCase):

    # FILENAME (which may hold spaces: "<frozen ...>"), LINE, FUNCTION,
    # CALLS
    ROW = re.compile(r"^(.*?) +(\d+) (\S+) +(\d+)$")

    def test_counts_match_setprofile(self):
        workload = os.path.join(_tmp, "top_workload.py")
        expected = json.loads(reference(bt.SETPROFILE_CALLS_REFERENCE,
                                        workload))
        self.assertEqual(expected["target:1"], 1000, expected)
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("top-functions.d " + mode)
                lines = output.splitlines()
                header = [i for i, line in enumerate(lines)
                          if line.split() == ["FILENAME", "LINE", "FUNCTION",
                                              "CALLS"]]
                self.assertEqual(len(header), 1, output)
                rows = [self.ROW.match(line)
                        for line in lines[header[0] + 1:] if line]
                self.assertTrue(rows and all(rows), output)
                counts = [int(row.group(4)) for row in rows]
                self.assertLessEqual(len(rows), 20)
                self.assertEqual(counts, sorted(counts), output)
                got = {"%s:%s" % (row.group(3), row.group(2)):
                       int(row.group(4))
                       for row in rows if row.group(1) == workload}
                # Start-up's functions may push the workload's rarer ones out
                # of the 20 shown; those shown are counted exactly.
                self.assertIn("target:1", got, output)
                self.assertEqual(got, {key: expected[key] for key in got},
                                 output)


class CCallsTest(DTraceTestCase):

    ROW = re.compile(r"^(\S*) +(\S+) +(\d+) +(\d+) +(\d+)$")
    # Callables that only main() calls, neither start-up, shutdown, a
    # thread's start and end, nor the -p target's runpy.
    ONLY_MAIN = {"math|comb", "math|factorial", "zlib|crc32", "time|sleep",
                 "collections|deque.appendleft", "_functools|reduce",
                 "builtins|dict.fromkeys"}

    def test_counts_match_setprofile(self):
        workload = os.path.join(_tmp, "cc_main.py")
        expected = json.loads(reference(bt.CCALLS_REFERENCE, workload))
        self.assertLessEqual(self.ONLY_MAIN, set(expected["calls"]))
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("ccalls.d " + mode)
                got = {}
                for line in output.splitlines():
                    match = self.ROW.match(line)
                    if match:
                        got["%s|%s" % match.group(1, 2)] = tuple(
                            map(int, match.group(3, 4, 5)))
                self.assertNotIn("math|gcd", got)
                for name in sorted(self.ONLY_MAIN):
                    with self.subTest(callable=name):
                        self.assertIn(name, got, output)
                        total, calls, average = got[name]
                        self.assertEqual(calls, expected["calls"][name],
                                         output)
                        self.assertEqual(calls, expected["returns"][name])
                        self.assertEqual(average, total // calls)
                # Nested calls are timed on their own: the outer reduce()
                # spans two sleeps, the inner one a third.
                self.assertGreaterEqual(got["_functools|reduce"][0],
                                        30 * 10**6, output)
                self.assertGreaterEqual(got["time|sleep"][0], 20 * 10**6)
                # The histogram of the callable given: every sleep(0.01)
                latency = distributions(output)
                self.assertEqual([key for key, _ in latency],
                                 [("time", "sleep")],
                                 output)
                buckets = latency[0][1]
                self.assertEqual(sum(buckets.values()), got["time|sleep"][1])
                self.assertGreaterEqual(min(buckets), 8 * 2**20, output)


class ExceptionsTest(DTraceTestCase):

    ROW = re.compile(r"^exception-(raise|reraise|handled) +(\S+) +(\d+)  "
                     r"(.*):([^:]*):(\d+)$")
    EVENTS = {"raise": "raised", "reraise": "reraised",
              "handled": "handled"}

    def test_counts_match_sys_monitoring(self):
        workload = os.path.join(_tmp, "exc_workload.py")
        expected = {}
        for key, count in json.loads(reference(bt.EXCEPTIONS_REFERENCE,
                                               workload)).items():
            event, exctype, filename, funcname, line = key.split("|")
            if filename == workload:
                expected[event, exctype, funcname, int(line)] = count
        self.assertEqual({key[0] for key in expected},
                         {"raised", "reraised", "handled"})
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("exceptions.d " + mode)
                got = {}
                for line in output.splitlines():
                    match = self.ROW.match(line)
                    if match and match.group(4) == workload:
                        got[self.EVENTS[match.group(1)], match.group(2),
                            match.group(5), int(match.group(6))] = int(
                                match.group(3))
                self.assertEqual(got, expected, output)


class GilTest(DTraceTestCase):

    ROW = re.compile(r"^ +(\d+) +(\d+) +(\d+) +(\d+)%$")
    ALL = re.compile(r"^ +all +(\d+) +(\d+) +(\d+)\.(\d)%$", re.M)

    def test_two_spinning_threads(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("gil.d " + mode)
                facts = {line.split()[0]: line.split()[1:]
                         for line in output.splitlines()
                         if line.startswith(("workers ", "main ",
                                             "switch_ns "))}
                workers = facts["workers"]
                switch_ns = int(facts["switch_ns"][0])
                waits, holds, percent = {}, {}, {}
                for line in output.splitlines():
                    match = self.ROW.match(line)
                    if match:
                        tid, wait, hold, pct = match.groups()
                        waits[tid], holds[tid], percent[tid] = (
                            int(wait), int(hold), int(pct))
                head, _, tail = output.partition(
                    "GIL holds per thread (ns):\n")
                wait_hist = {key[0]: buckets
                             for key, buckets in distributions(head)}
                hold_hist = {key[0]: buckets
                             for key, buckets in distributions(tail)}
                if free_threaded():
                    self.assertEqual((waits, holds, wait_hist, hold_hist),
                                     ({}, {}, {}, {}), output)
                    continue
                self.assertIn("GIL waits per thread (ns):\n", head, output)
                self.assertIn(facts["main"][0], holds, output)
                for tid in workers:
                    self.assertIn(tid, wait_hist, output)
                    self.assertIn(tid, hold_hist, output)
                    self.assertGreater(waits[tid], 0)
                    self.assertGreater(holds[tid], 0)
                    # waited for the other spinning thread at least once
                    self.assertGreater(2 * max(wait_hist[tid]), switch_ns,
                                       output)
                for tid, value in percent.items():
                    total = waits[tid] + holds[tid]
                    self.assertEqual(value, 100 * waits[tid] // total)
                match = self.ALL.search(output)
                self.assertIsNotNone(match, output)
                wait, hold, whole, tenth = map(int, match.groups())
                self.assertEqual(wait, sum(waits.values()))
                self.assertEqual(hold, sum(holds.values()))
                self.assertEqual(whole * 10 + tenth,
                                 1000 * wait // (wait + hold))


class ThreadsTest(DTraceTestCase):

    LINE = bt.ThreadsTest.LINE
    RUNNING = re.compile(r"^@running\[(\d+), (\d+)\]: (-?\d+)$")

    def test_lifetimes(self):
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("threads.d " + mode)
                lines = output.splitlines()
                self.assertIn(["TIME_NS", "EVENT", "THREAD_ID", "NATIVE_ID",
                               "DURATION_US"],
                              [line.split() for line in lines],
                              output)
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
                self.assertEqual(sorted(starts), sorted([*workers, daemon]),
                                 output)
                self.assertNotIn(main, starts)
                self.assertEqual(set(stops), set(workers), output)
                for ids, seconds in workers.items():
                    self.assertGreaterEqual(int(stops[ids]), seconds * 1e6,
                                            output)
                self.assertRegex(output, r"(?m)^\d+ +end$")
                running = {match.group(1, 2): int(match.group(3))
                           for match in map(self.RUNNING.match, lines)
                           if match}
                self.assertEqual(running, {**{ids: 0 for ids in workers},
                                           daemon: 1}, output)


class TasksTest(DTraceTestCase):

    ROW = re.compile(r"^(\S+) +(\d+) +(\d+) +(\d+) +(\d+)$")

    def test_steps_match_sys_monitoring(self):
        workload = os.path.join(_tmp, "tasks_workload.py")
        expected = json.loads(reference(bt.TASKS_REFERENCE, workload))
        self.assertEqual(expected["ticker"], 3 + 1 + 5 + 1, expected)
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("tasks.d " + mode)
                rows = {}
                for line in output.splitlines():
                    match = self.ROW.match(line)
                    if match:
                        rows[match.group(1)] = tuple(
                            map(int, match.group(2, 3, 4, 5)))
                self.assertEqual({name: rows.get(name, (0, 0))[1]
                                  for name in expected}, expected, output)
                hists = {key[0]: buckets
                         for key, buckets in distributions(output)}
                for name, (total, steps, average, longest) in rows.items():
                    self.assertEqual(sum(hists[name].values()), steps)
                    self.assertEqual(average, total // steps)
                    self.assertLessEqual(longest, total)
                    self.assertLessEqual(average, longest)
                self.assertGreaterEqual(rows["stall"][3], 20 * 10**6)
                self.assertGreaterEqual(rows["eager_child"][3], 10 * 10**6)
                self.assertGreaterEqual(rows["main"][3],
                                        rows["eager_child"][3])


# pystat.d with -c: the burst of PYSTAT_WORKLOAD once, and the program
# exits at once: its last events are in the line pystat.d prints at END.
PYSTAT_ONCE = """\
    import gc, threading

    def f():
        pass

    def raise_one():
        try:
            raise ValueError
        except ValueError:
            pass

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
    """


class PystatTest(DTraceTestCase):

    # "2026 Nov 26 01:50:12" and the seven columns
    ROW = re.compile(r"^\d{4} \w{3} +\d+ \d\d:\d\d:\d\d" + r" +(\d+)" * 7
                     + "$")
    COLUMNS = bt.PystatTest.COLUMNS

    @classmethod
    def drive(cls, target, tracer):
        """pystat.d attached with -p: what test_usdt_scripts' PystatTest
        does with pystat.bt, except that the burst starts no threads (the
        -c run counts those).  Pings until the probes fire, waits for an
        idle second, asks for the burst, reads until its exceptions are
        counted and two rows more, then stops DTrace with SIGINT.  The
        Session's stdout holds the rows from the burst on.

        The burst starts no threads because DTrace for Linux 2.0.7,
        attached with -p, leaves a thread the process starts stopped under
        ptrace now and then (state t, ptrace_stop) until DTrace ends: in
        2 of 10 runs of 5 threads here with CPUs busy, and in the first
        run of every CI rehearsal of three, whose retry hung again once
        (stop 45).  Ending DTrace let the thread run.  The likely cause,
        read in DTrace's source (libproc/Pcontrol.c, ignored_child_wait()):
        it detaches each new thread after a waitpid() that gives up on
        EINTR, as it compares errno with -EINTR, and DTrace's threads
        signal its control thread.  The howto says so.

        DTrace for Linux 2.0.7 skips a tick-1s that finds its CPU idle
        (pystat.d says so; here rows came a minute apart, and a run
        failed): while this waits for rows, a shell loop at the lowest
        priority keeps each CPU busy, and gives way to everything else."""
        spinners = [subprocess.Popen(["nice", "-n", "19", "sh", "-c",
                                      "while :; do :; done"])
                    for _ in range(os.cpu_count())]
        try:
            return cls.drive_rows(target, tracer)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()

    @classmethod
    def drive_rows(cls, target, tracer):
        # Every wait below has a deadline, and looks for a thread of the
        # target that DTrace left in ptrace_stop (a run hung 11 minutes on
        # an answer): both are hangs that retried() tries once more.
        watch = PtraceWatch(target.pid, "the pystat workload")
        lines = []
        def read():
            # Until DTrace ends; what waits for these lines has deadlines.
            for line in tracer.stdout:
                lines.append(line)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()

        def command(word):
            target.stdin.write(word + "\n")
            target.stdin.flush()
            if readline(target.stdout, 60, "the pystat workload did not "
                        "answer %r" % word, watch) != "done\n":
                raise AssertionError("pystat workload: no answer")

        def rows(since):
            return [dict(zip(cls.COLUMNS, map(int, match.groups())))
                    for match in map(cls.ROW.match, lines[since:]) if match]

        def wait_row(since, deadline):
            while not rows(since):
                if tracer.poll() is not None:
                    raise AssertionError("pystat.d stopped printing: %r"
                                         % lines)
                if time.monotonic() > deadline:
                    raise Hang("timeout: pystat.d printed no row by its "
                               "deadline: %r" % lines)
                watch()
                time.sleep(0.05)

        target.stdin.write("go\n")
        target.stdin.flush()
        if readline(target.stdout, 60, "the pystat workload did not say "
                    "'ready'", watch) != "ready\n":
            raise AssertionError("pystat workload did not start")
        deadline = time.monotonic() + 120
        for _ in range(30):
            command("ping")
            since = len(lines)
            wait_row(since, deadline)
            seen = rows(since)[0]
            if seen["PY_CALLS"] and seen["C_CALLS"] and seen["EXC_RAISED"]:
                break
        else:
            raise AssertionError("the probes did not start firing: %r"
                                 % lines)
        for _ in range(30):
            since = len(lines)
            wait_row(since, deadline)
            seen = rows(since)[0]
            if not any(seen[c] for c in cls.COLUMNS if c != "GIL_WAIT_US"):
                break
        else:
            raise AssertionError("the process does not stay idle: %r"
                                 % lines[-10:])
        burst = len(lines)
        command("burst without threads")
        deadline = time.monotonic() + 120
        while sum(r["EXC_RAISED"] for r in rows(burst)) < 7:
            wait_row(len(lines), deadline)
            time.sleep(0.5)
        count = len(rows(burst))
        while len(rows(burst)) < count + 2:
            wait_row(len(lines), deadline)
            time.sleep(0.2)
        tracer.send_signal(signal.SIGINT)
        # DTrace ends within seconds of SIGINT.  Sometimes it does not
        # while its -p target lives (in a CI rehearsal a session ran past
        # 6 minutes; in that of 2026-11-29 both tries stalled 120 s).  The
        # target's end ends such a session, as it ends every -p session
        # of trace_p(): the rows counted above were printed before.
        try:
            wait(tracer, SIGINT_GRACE, "pystat.d did not end after SIGINT")
        except Hang as hang:
            sys.stderr.write(
                "test_dtrace_scripts: pystat.d -p: %s (DTrace %s; the "
                "target's threads in ptrace_stop: %s): ending the target\n"
                % (hang, state_of(tracer.pid), ptrace_stopped(target.pid)))
            target.kill()
            wait(tracer, END_TIMEOUT, "pystat.d did not end after SIGINT "
                 "and its target's end")
        reader.join(END_TIMEOUT)
        if reader.is_alive():
            raise Hang("timeout: pystat.d's output did not end within %d s "
                       "of its exit" % END_TIMEOUT)
        return Session(tracer.returncode, "".join(lines[burst:]),
                       tracer.stderr.read())

    def totals(self, output):
        rows = [dict(zip(self.COLUMNS, map(int, match.groups())))
                for match in map(self.ROW.match, output.splitlines())
                if match]
        self.assertTrue(rows, output)
        return {column: sum(row[column] for row in rows)
                for column in self.COLUMNS}

    def test_columns_add_up(self):
        # -p: only the burst, as pystat.bt's test counts it, without its
        # threads (see drive()).
        total = self.totals(self.session("pystat.d -p"))
        self.assertEqual(total["THR_START"], 0, total)
        self.assertEqual(total["THR_STOP"], 0, total)
        self.assertEqual(total["EXC_RAISED"], 7, total)
        self.assertGreaterEqual(total["GC"], 3, total)
        self.assertGreaterEqual(total["PY_CALLS"], 200 + 7, total)
        self.assertGreaterEqual(total["C_CALLS"], 3 + 1, total)
        # -c: the whole program, start-up included, whose threads are the
        # burst's only.
        output = self.session("pystat.d -c")
        self.assertEqual(output.split("\n", 1)[0].split(),
                         ["TIME", *self.COLUMNS])
        total = self.totals(output)
        self.assertEqual(total["THR_START"], 5, total)
        self.assertEqual(total["THR_STOP"], 5, total)
        self.assertGreaterEqual(total["EXC_RAISED"], 7, total)
        self.assertGreaterEqual(total["GC"], 3, total)
        self.assertGreaterEqual(total["PY_CALLS"], 200 + 5 + 5, total)


# Ground truths of the howto's one-liners, each from the workload run
# under a Python hook with the interpreter under test.
LINES_REFERENCE = textwrap.dedent("""\
    import os, runpy, sys
    def trace(frame, event, arg):
        if frame.f_code.co_name != sys.argv[2]:
            return trace
        if event == "line":
            print("%s:%d" % (os.path.basename(frame.f_code.co_filename),
                             frame.f_lineno))
        return trace
    sys.settrace(trace)
    runpy.run_path(sys.argv[1], run_name="__main__")
    sys.settrace(None)
""")

# The collections the workload asks for, per generation: every run makes
# them, whatever else the allocations of that run (its start-up, the -p
# target's) make collect.
GC_REFERENCE = textwrap.dedent("""\
    import collections, gc, json, runpy, sys
    asked = collections.Counter()
    collect = gc.collect
    def counting(generation=2):
        asked[generation] += 1
        return collect(generation)
    gc.collect = counting
    runpy.run_path(sys.argv[1], run_name="__main__")
    gc.collect = collect
    print(json.dumps(asked))
""")


# Ground truths seen in the traced process itself, by a sitecustomize
# module its environment puts on its path (site imports it at start-up,
# before the workload runs): what the process's own gc and audit hooks
# report, on its stderr.  The -p target writes GO there when it lets the
# workload run.
GO = "truth: go"
SITECUSTOMIZE = {
    # Every collection: gc's DEBUG_STATS prints "gc: collecting generation
    # N..." for each, right before gc-start fires, those of the shutdown
    # included (gc.callbacks does not see these); gc.get_stats() has
    # those made before this module ran.
    "gc_durations": textwrap.dedent("""\
        import gc, sys
        sys.stderr.write("truth: before %s\\n" % " ".join(
            str(generation["collections"]) for generation in gc.get_stats()))
        gc.set_debug(gc.DEBUG_STATS)
    """),
    # Every "open" audit event from this module on (those of the imports
    # that site made before it are not seen).
    "audit_stacks": textwrap.dedent("""\
        import os, sys
        def hook(event, args, write=os.write):
            if event == "open":
                write(2, b"truth: open\\n")
        sys.addaudithook(hook)
    """),
}


def truth_env(name):
    """The environment of the runs of one-liner name: with its
    SITECUSTOMIZE, if it has one."""
    if name not in SITECUSTOMIZE:
        return None
    os.mkdir(os.path.join(_tmp, "truth-" + name))
    directory = os.path.dirname(write(os.path.join(
        "truth-" + name, "sitecustomize.py"), SITECUSTOMIZE[name]))
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, GATE_GO=GO, PYTHONPATH=directory + (
        os.pathsep + path if path else ""))


def truth_lines(session, mode):
    """The ground truth lines of session's traced process: with -p, those
    written once the workload could run."""
    if mode == "-c":
        return session.stderr.splitlines()
    lines = session.target_stderr.splitlines()
    return lines[lines.index(GO) + 1:]


# [the modules site tries at start-up, the modules the workload file
# imports], of those that cannot be found
FAILED_IMPORTS_REFERENCE = textwrap.dedent("""\
    import ast, importlib.util, json, site, sys
    at_start = ["sitecustomize"] + (["usercustomize"]
                                    if site.ENABLE_USER_SITE else [])
    with open(sys.argv[1]) as f:
        workload = [alias.name for node in ast.walk(ast.parse(f.read()))
                    if isinstance(node, ast.Import) for alias in node.names]
    print(json.dumps([[name for name in names
                       if importlib.util.find_spec(name) is None]
                      for names in (at_start, workload)]))
""")


class HowtoOneLinersTest(DTraceTestCase):
    """The howto's DTrace one-liners, as the howto prints them."""

    # "  name    count": a name may hold spaces ("<generic parameters of
    # f>")
    AGG_ROW = re.compile(r"^ +(.*?) +(-?\d+)$")

    def workload(self, name):
        return one_liner(name)[1]

    def test_every_example_is_tested(self):
        # Each DTrace command of the howto is a one-liner above, a script
        # of Lib/usdt/scripts (run by the tests above), or the probe listing.
        scripts = {name for name in os.listdir(USDT) if name.endswith(".d")}
        for words in howto_commands():
            with self.subTest(command=" ".join(words)):
                if "-s" in words:
                    self.assertIn(os.path.basename(
                        words[words.index("-s") + 1]), scripts)
                elif "-l" in words:
                    self.assertEqual(words[words.index("-P") + 1][:6],
                                     "python")
                else:
                    program = re.sub(r"[ ]+", " ",
                                     words[words.index("-n") + 1])
                    matched = [name for name, text in ONE_LINERS.items()
                               if text in program]
                    self.assertEqual(len(matched), 1, matched)
        # and each one-liner is one command of the howto
        for name in ONE_LINERS:
            one_liner(name)

    def test_calls_per_name(self):
        workload = self.workload("calls_per_name")
        expected = collections.Counter()
        # its last line: fib.py prints its result first
        for key, count in json.loads(reference(
                bt.SETPROFILE_CALLS_REFERENCE,
                workload).splitlines()[-1]).items():
            expected[key.split(":")[0]] += count
        del expected["<module>"]
        self.assertTrue(expected)
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("calls_per_name " + mode)
                got = {match.group(1): int(match.group(2))
                       for match in map(self.AGG_ROW.match,
                                        output.splitlines())
                       if match}
                self.assertEqual({name: got.get(name) for name in expected},
                                 dict(expected), output)

    def test_time_per_name(self):
        # No clock to compare with: each function of the workload has a
        # positive total, and no other line is printed.
        workload = self.workload("time_per_name")
        names = {key.split(":")[0] for key in json.loads(reference(
            bt.SETPROFILE_CALLS_REFERENCE, workload).splitlines()[-1])}
        names.discard("<module>")
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("time_per_name " + mode)
                # the aggregation's rows start with a space, the workload's
                # own line does not
                rows = [self.AGG_ROW.match(line)
                        for line in output.splitlines()
                        if line.startswith(" ")]
                self.assertTrue(rows and all(rows), output)
                got = {row.group(1): int(row.group(2)) for row in rows}
                for name in names:
                    self.assertGreater(got.get(name, 0), 0, output)

    def test_lines_of_function(self):
        workload = self.workload("lines_of_function")
        # without the workload's own lines ("# Preamble 1")
        expected = [line for line in reference(
            LINES_REFERENCE, workload, "test_line").splitlines()
            if not line.startswith("#")]
        self.assertTrue(expected)
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("lines_of_function " + mode)
                got = [line for line in output.splitlines()
                       if line and not line.startswith("#")]
                # DTrace prints one buffer per CPU in turn: a thread that
                # moved from one to another has its lines out of order.
                self.assertEqual(collections.Counter(got),
                                 collections.Counter(expected), output)

    def test_live_instances(self):
        # No Python-level hook sees every instance of every class, so:
        # - json's import (imp.py's, after -p attached) creates one
        #   JSONDecoder and one JSONEncoder (json's defaults), which the
        #   shutdown frees: seen created and deleted, live 0;
        # - traced from the start (-c), no class can have more deletions
        #   than creations: per module and name, but those of a class
        #   whose dictionary the shutdown cleared first are counted under
        #   "<unknown>" (ABCMeta 41 and <unknown> ABCMeta -41 here), so
        #   per name for those.
        for mode in self.MODES:
            with self.subTest(mode=mode):
                output = self.session("live_instances " + mode)
                rows = [re.match(r"^ +(\S+) +(\S+) +(-?\d+)$", line)
                        for line in output.splitlines() if line.strip()]
                self.assertTrue(rows and all(rows), output)
                live = {(row.group(1), row.group(2)): int(row.group(3))
                        for row in rows}
                self.assertEqual(live.get(("json.decoder", "JSONDecoder")),
                                 0, output)
                self.assertEqual(live.get(("json.encoder", "JSONEncoder")),
                                 0, output)
                if mode == "-c":
                    self.assertEqual(
                        [key for key, count in live.items()
                         if count < 0 and key[0] != "<unknown>"], [], output)
                    per_class = collections.Counter()
                    for (_, name), count in live.items():
                        per_class[name] += count
                    self.assertEqual([name for name, count in per_class.items()
                                      if count < 0], [], output)

    def test_gc_durations(self):
        # Every collection of the traced process, per generation, as its
        # gc reports them (SITECUSTOMIZE): the workload's own, automatic
        # ones and those of the shutdown.
        workload = self.workload("gc_durations")
        asked = json.loads(reference(GC_REFERENCE, workload))
        self.assertTrue(asked)
        for mode in self.MODES:
            with self.subTest(mode=mode):
                session = self.session_of("gc_durations " + mode)
                expected = collections.Counter()
                for line in truth_lines(session, mode):
                    match = re.match(r"gc: collecting generation (\d)\.\.\.$",
                                     line)
                    if match:
                        expected[int(match.group(1))] += 1
                    elif line.startswith("truth: before "):
                        for generation, count in enumerate(line.split()[2:]):
                            expected[generation] += int(count)
                # the workload's own collections are among them
                for generation, count in asked.items():
                    self.assertGreaterEqual(expected[int(generation)], count,
                                            session.stderr)
                got = {int(key[0]): sum(buckets.values())
                       for key, buckets in distributions(session.stdout)}
                self.assertEqual(got, dict(expected), session.stdout)

    def test_failed_imports(self):
        # What cannot be found: the workload's yaml, and with -c, the
        # modules the site module tries at start-up (sitecustomize, and
        # usercustomize where user site directories are enabled), which
        # a -p target has imported before DTrace attaches.
        proc = run([PYTHON, "-c", FAILED_IMPORTS_REFERENCE,
                    self.workload("failed_imports")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        at_start, workload = json.loads(proc.stdout)
        for mode, missing in (("-c", at_start + workload), ("-p", workload)):
            with self.subTest(mode=mode):
                output = self.session("failed_imports " + mode)
                self.assertEqual(output.split(), missing, output)

    def test_audit_stacks(self):
        # One stack per "open" audit event, as the traced process's own
        # audit hook sees them (SITECUSTOMIZE): with -p, all of them;
        # with -c, all but those of the imports that site makes before
        # it imports sitecustomize, which no hook can see.
        for mode in self.MODES:
            with self.subTest(mode=mode):
                session = self.session_of("audit_stacks " + mode)
                opened = truth_lines(session, mode).count("truth: open")
                self.assertGreater(opened, 0, session.stderr)
                output = session.stdout
                # DTrace names the frames when it prints the stack, which
                # it can only while the process lives: those it prints
                # after show addresses.
                stacks = [stack for stack in re.split(r"\n\s*\n", output)
                          if stack.strip()]
                if mode == "-p":
                    self.assertEqual(len(stacks), opened, output)
                else:
                    self.assertGreaterEqual(len(stacks), opened, output)
                self.assertIn("python`PySys_Audit+", output)

    def test_probe_listing(self):
        # dtrace -l -P python<PID>, with -p PID or without: the probes
        # readelf -n lists.
        notes = {name for provider, name, _ in stapsdt_notes(PYTHON)
                 if provider == "python"}
        for name in ("listing", "listing -p"):
            with self.subTest(name):
                output = self.session(name)
                listed = {line.split()[-1].replace("-", "__")
                          for line in output.splitlines()[1:]
                          if line.strip()}
                self.assertEqual(listed, notes, output)


if __name__ == "__main__":
    unittest.main()
