"""Shared helpers for the tests of the built interpreter and its driver."""

import importlib
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(TOP, "build")
# The series under test: SERIES as make exports it, or the default that
# series/DEFAULT names (the Makefile and tools/lib.sh read it too).
with open(os.path.join(TOP, "series", "DEFAULT")) as _f:
    SERIES = os.environ.get("SERIES") or _f.read().strip()
# The interpreter under test: tools/check exports it; default to our build.
PYTHON = os.environ.get("CPYTHON_USDT_PYTHON",
                        os.path.join(BUILD, SERIES, "obj", "python"))


# The package usdt: the tracing tools (usdt.stacks, usdt.tools) and their
# ready scripts (usdt/scripts).  The copy that the interpreter under test
# imports, in the prepared tree, which make keeps the same as
# overlay/Lib/usdt (tools/sync-toolkit): one copy for the interpreter and
# the tests.
USDT_PACKAGE = os.path.join(BUILD, SERIES, "src", "Lib", "usdt")
# Code that imports USDT_PACKAGE (the path in sys.argv[1]) as usdt, under
# any Python 3, as python3 PATH/usdt/stacks does: for tests that run its
# modules in a process of their own.
IMPORT_USDT = textwrap.dedent("""\
    import os, runpy, sys
    runpy.run_path(os.path.join(sys.argv[1], "_frompath.py"))["load"](
        sys.argv[1])
    """)


def usdt_module(name):
    """The module usdt.<name> of USDT_PACKAGE, imported with the package
    as usdt in this process, which may be another Python than the one
    under test (test_driver's)."""
    package = sys.modules.get("usdt")
    if package is None or os.path.dirname(
            os.path.abspath(package.__file__)) != USDT_PACKAGE:
        runpy.run_path(os.path.join(USDT_PACKAGE, "_frompath.py"))["load"](
            USDT_PACKAGE)
    return importlib.import_module("usdt." + name)


def bpftrace_module():
    """usdt._bpftrace of USDT_PACKAGE, the runner that
    knows how each bpftrace version differs."""
    return usdt_module("_bpftrace")


def bpftrace_runner():
    """The bpftrace on PATH, as usdt._bpftrace finds it: its version, and
    environ(strlen, keys) that sets its limits the way it reads them."""
    return bpftrace_module().find()


def bpftrace_env(strlen=None, keys=None, **extra):
    """os.environ with bpftrace's string and map limits set the way the
    bpftrace on PATH reads them, and *extra*."""
    env = bpftrace_runner().environ(strlen=strlen, keys=keys)
    env.update(extra)
    return env


def bpftrace_output(text):
    """bpftrace's output *text* as usdt.tools shows it: without the known
    harmless warnings that 0.27 prints among it, in 0.17's format."""
    module = bpftrace_module()
    noise = module.NoiseFilter()
    return module.normalize("".join(
        noise.keep(line) for line in text.splitlines(keepends=True)))


def bpftrace_lines(pipe):
    """The lines of bpftrace's output as they come from *pipe*, as
    bpftrace_output() gives them."""
    module = bpftrace_module()
    noise = module.NoiseFilter()
    for line in pipe:
        line = noise.keep(line)
        if line:
            yield module.normalize(line)


def run(cmd, **kwargs):
    """Run cmd, capturing text output; never raise on failure."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(cmd, text=True, **kwargs)


_free_threaded = None


def free_threaded():
    """True when PYTHON is a free-threaded (--disable-gil) build."""
    global _free_threaded
    if _free_threaded is None:
        proc = run([PYTHON, "-c", "import sysconfig; print(sysconfig."
                    "get_config_var('Py_GIL_DISABLED'))"])
        _free_threaded = proc.stdout.strip() == "1"
    return _free_threaded


def start(testcase, cmd, **kwargs):
    """subprocess.Popen(cmd, text=True, **kwargs), stopped at cleanup."""
    proc = subprocess.Popen(cmd, text=True, **kwargs)
    testcase.addCleanup(stop, proc)
    return proc


def stop(proc):
    """Kill proc if it still runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


class Hang(AssertionError):
    """A wait for a process that ended without its answer, its message one
    line: a deadline passed (cause "timeout"), or a thread of the process
    stayed in ptrace_stop (cause "ptrace_stop")."""

    def __init__(self, message, cause="timeout"):
        super().__init__(message)
        self.cause = cause


# readline()'s reads in progress: pipe -> (Event set when done, [line or
# exception]).  A read that timed out stays here, and the next readline()
# of the same pipe waits for it, so that no line is lost or reordered.
_reads = {}
_reads_lock = threading.Lock()


def readline(pipe, timeout, what, watch=None):
    """pipe.readline() ("" at EOF) of a subprocess's pipe, within timeout
    seconds; else Hang "timeout: WHAT within TIMEOUT s", WHAT saying what
    did not come, e.g. "pystat.d -p: the target did not answer 'ping'".
    watch, if given, is called about 5 times a second while this waits, and
    may raise (see PtraceWatch).

    A thread of its own reads the line with the pipe's own readline(), so
    that the pipe's buffers stay whole: after a line came, the pipe can be
    read as usual (read(), communicate()).  After a Hang, its read goes on
    until the line or EOF comes; read such a pipe with readline() only
    (killing the process ends the read)."""
    return _readline(pipe, time.monotonic() + timeout,
                     "timeout: %s within %g s" % (what, timeout), watch)


def iter_lines(pipe, timeout, what, watch=None):
    """The lines of pipe until EOF, as iterating over it gives them, with
    readline(): all of them within timeout seconds, else Hang "timeout:
    WHAT within TIMEOUT s"."""
    deadline = time.monotonic() + timeout
    message = "timeout: %s within %g s" % (what, timeout)
    while True:
        line = _readline(pipe, deadline, message, watch)
        if not line:
            return
        yield line


def _readline(pipe, deadline, message, watch):
    with _reads_lock:
        pending = _reads.get(pipe)
        if pending is None:
            pending = _reads[pipe] = (threading.Event(), [])
            done, box = pending

            def read():
                try:
                    box.append(pipe.readline())
                except BaseException as e:
                    box.append(e)
                done.set()

            threading.Thread(target=read, daemon=True).start()
    done, box = pending
    while not done.wait(max(0, min(0.2, deadline - time.monotonic()))):
        if watch is not None:
            watch()
        if time.monotonic() >= deadline:
            raise Hang(message)
    with _reads_lock:
        del _reads[pipe]
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def wait(proc, timeout, what, watch=None, communicate=False):
    """proc.wait(), or with communicate proc.communicate() (its (stdout,
    stderr)), within timeout seconds; else Hang "timeout: WHAT within
    TIMEOUT s".  watch as for readline()."""
    deadline = time.monotonic() + timeout
    while True:
        step = max(0, min(0.2, deadline - time.monotonic()))
        try:
            if communicate:
                # Retrying communicate() after its timeout loses nothing.
                return proc.communicate(timeout=step)
            return proc.wait(timeout=step)
        except subprocess.TimeoutExpired:
            pass
        if watch is not None:
            watch()
        if time.monotonic() >= deadline:
            raise Hang("timeout: %s within %g s" % (what, timeout))


def ptrace_stopped(pid):
    """The thread ids of process pid that a tracer stopped: in tracing stop
    (state "t" in /proc/PID/task/TID/stat) or waiting in the kernel's
    ptrace_stop() (/proc/PID/task/TID/wchan, which needs root to read);
    sorted, [] when the process is gone."""
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except FileNotFoundError:
        return []
    stopped = []
    for tid in tids:
        task = "/proc/%d/task/%s/" % (pid, tid)
        try:
            with open(task + "stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
            with open(task + "wchan") as f:
                wchan = f.read().strip()
        except (OSError, IndexError):
            continue  # the thread has just ended
        if state == "t" or wchan == "ptrace_stop":
            stopped.append(int(tid))
    return sorted(stopped)


class PtraceWatch:
    """A watch for readline() and wait(): raises Hang (cause "ptrace_stop")
    once a thread of process pid has been seen in ptrace_stop at every look
    for patience seconds.  A tracer stops threads for a moment as it works
    (DTrace for Linux 2.0.7 keeps a -p process stopped while it starts);
    DTrace 2.0.7 also, by a bug, leaves one stopped for good, and then the
    process hangs even after DTrace was killed."""

    def __init__(self, pid, what, patience=15):
        self.pid = pid
        self.what = what
        self.patience = patience
        self.since = {}

    def __call__(self):
        now = time.monotonic()
        self.since = {tid: self.since.get(tid, now)
                      for tid in ptrace_stopped(self.pid)}
        stuck = sorted(tid for tid, since in self.since.items()
                       if now - since >= self.patience)
        if stuck:
            raise Hang("ptrace_stop: %s: thread %s of process %d stayed in "
                       "ptrace_stop for %g s"
                       % (self.what, ",".join(map(str, stuck)), self.pid,
                          self.patience), "ptrace_stop")


def run_gdb(commands, *args, timeout=300):
    """Run gdb -batch with the gdb commands *commands* (text, from a temporary
    command file) on the program args (gdb --args), under LC_ALL=C.UTF-8 so
    that gdb prints non-ASCII strings as they are; the CompletedProcess,
    its output as bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "commands.gdb")
        with open(path, "w") as f:
            f.write(commands)
        return subprocess.run(["gdb", "-batch", "-nx", "-x", path, "--args",
                               *args], capture_output=True, timeout=timeout,
                              env=dict(os.environ, LC_ALL="C.UTF-8"))


def perf_map_path(pid):
    """The perf map a process writes while its perf trampoline is on."""
    return "/tmp/perf-%d.map" % pid


def perf_map_entries(pid):
    """The entry names ("py::QUALNAME:FILENAME") of a process's perf map,
    in file order; [] without a map."""
    try:
        with open(perf_map_path(pid)) as f:
            return [line.rstrip("\n").split(" ", 2)[2] for line in f
                    if line.count(" ") >= 2]
    except FileNotFoundError:
        return []


REGISTRY_COLUMNS = ("provider", "name", "kind", "arguments", "upstream",
                    "fired_in", "patch", "bpftrace", "dtrace", "systemtap",
                    "tool", "tests", "watched")


def registry_path():
    """series/SERIES/probes.tsv, the probe registry."""
    return os.path.join(TOP, "series", SERIES, "probes.tsv")


def registry():
    """The probe registry's rows, as dicts of REGISTRY_COLUMNS (the list
    columns split at commas, "-" as [] or None)."""
    rows = []
    with open(registry_path(), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != len(REGISTRY_COLUMNS):
                raise ValueError("%s:%d: %d columns, not %d"
                                 % (registry_path(), number, len(fields),
                                    len(REGISTRY_COLUMNS)))
            row = dict(zip(REGISTRY_COLUMNS, fields))
            for column in ("fired_in", "bpftrace", "dtrace", "systemtap",
                           "tool", "tests"):
                row[column] = [] if row[column] == "-" else \
                    row[column].split(",")
            for column in ("upstream", "patch", "watched"):
                if row[column] == "-":
                    row[column] = None
            rows.append(row)
    return rows


def promised_probe_pairs(firing=False):
    """[(provider, name)] of the probe registry, sorted; with *firing*,
    without the markers that never fire."""
    return sorted((row["provider"], row["name"]) for row in registry()
                  if not (firing and row["kind"] == "marker"))


def promised_probes(firing=False, provider="python"):
    """The names of the probes of *provider* in the registry, sorted;
    with *firing*, without the markers that never fire."""
    return [name for p, name in promised_probe_pairs(firing)
            if p == provider]


def stapsdt_notes(binary, arguments=False):
    """[(provider, name, semaphore address or None)], from readelf -n;
    with *arguments*, each with its number of arguments too."""
    proc = run(["readelf", "-n", binary])
    if proc.returncode != 0:
        raise RuntimeError("readelf -n %s: %s" % (binary, proc.stderr))
    notes = []
    for note in proc.stdout.split("NT_STAPSDT")[1:]:
        provider = re.search(r"Provider: (\S+)", note).group(1)
        name = re.search(r"Name: (\S+)", note).group(1)
        semaphore = re.search(r"Semaphore: (0x[0-9a-f]+)", note)
        note_entry = (provider, name,
                      int(semaphore.group(1), 16) if semaphore else None)
        if arguments:
            given = re.search(r"Arguments:(.*)", note)
            note_entry += (len(given.group(1).split()) if given else 0,)
        notes.append(note_entry)
    return notes


# The instructions at every USDT marker, from the note's address on: a
# 1-byte nop, then the 10-byte nop that Linux 7.3 optimizes
# (docs/marker-sites.md).
MARKER_PAIR = bytes.fromhex("90 66 2e 0f 1f 84 00 00 00 00 00")


def marker_sites(binary):
    """[(provider, name, address, bytes)] of the stapsdt notes of binary:
    each note's address (readelf -n's Location) and the len(MARKER_PAIR)
    bytes of the file there, found through its PT_LOAD segments (readelf
    -lW: the tests read ELF with binutils, not with usdt._elf)."""
    proc = run(["readelf", "-n", binary])
    if proc.returncode != 0:
        raise RuntimeError("readelf -n %s: %s" % (binary, proc.stderr))
    # The PT_LOAD segments, as readelf -lW prints them: Offset VirtAddr
    # PhysAddr FileSiz ...
    headers = run(["readelf", "-lW", binary])
    if headers.returncode != 0:
        raise RuntimeError("readelf -lW %s: %s" % (binary, headers.stderr))
    segments = [(int(vaddr, 16), int(offset, 16), int(filesz, 16))
                for offset, vaddr, filesz in re.findall(
                    r"^\s+LOAD\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+"
                    r"0x[0-9a-f]+\s+(0x[0-9a-f]+)", headers.stdout, re.M)]
    sites = []
    with open(binary, "rb") as f:
        for note in proc.stdout.split("NT_STAPSDT")[1:]:
            provider = re.search(r"Provider: (\S+)", note).group(1)
            name = re.search(r"Name: (\S+)", note).group(1)
            address = int(re.search(r"Location: (0x[0-9a-f]+)",
                                    note).group(1), 16)
            code = b""
            for vaddr, offset, filesz in segments:
                if vaddr <= address < vaddr + filesz:
                    f.seek(offset + address - vaddr)
                    code = f.read(len(MARKER_PAIR))
            sites.append((provider, name, address, code))
    return sites


# the stack tool's default BPFTRACE_STRLEN: it keeps the last PYSTACK_STRLEN - 1
# bytes of a file name.
PYSTACK_STRLEN = 128


def pystack_filename(filename, strlen=PYSTACK_STRLEN):
    """filename as usdt.stacks prints it: its last strlen - 1 bytes, after
    "..." when cut (the paths of a clone under a deep directory are)."""
    raw = filename.encode()
    if len(raw) <= strlen - 1:
        return filename
    return "..." + raw[-(strlen - 1):].decode("utf-8", "replace")


class Semaphore:
    """The semaphore of probe PROVIDER:NAME of PYTHON in process pid
    (provider python unless given).

    The kernel increments the semaphore in the traced process when it puts
    a tracer's uprobe on the probe, and decrements it when the uprobe goes:
    value() > 0 is what the interpreter's watcher looks for.  Reading
    another process's memory needs root, like bpftrace.
    """

    def __init__(self, pid, name, provider="python"):
        self.pid = pid
        self.name = name
        found = [sem for p, probe, sem in stapsdt_notes(PYTHON)
                 if p == provider and probe == name]
        # The semaphore is one per probe, whatever the number of its sites.
        found = sorted(set(found))
        if len(found) != 1 or not found[0]:
            raise ValueError("no semaphore for %s:%s in %s: %r"
                             % (provider, name, PYTHON, found))
        self.address = self._load_bias() + found[0]

    def _load_bias(self):
        """Where the ELF segment at file offset 0 is mapped in pid."""
        headers = run(["readelf", "-lW", PYTHON]).stdout
        vaddr = int(re.search(r"^\s*LOAD\s+0x0+\s+(0x[0-9a-f]+)", headers,
                              re.M).group(1), 16)
        path = os.path.realpath(PYTHON)
        with open("/proc/%d/maps" % self.pid) as f:
            for line in f:
                fields = line.split(None, 5)
                if (len(fields) == 6 and fields[5].strip() == path
                        and int(fields[2], 16) == 0):
                    return int(fields[0].split("-")[0], 16) - vaddr
        raise ValueError("%s is not mapped in process %d" % (path, self.pid))

    def value(self):
        with open("/proc/%d/mem" % self.pid, "rb") as f:
            f.seek(self.address)
            return int.from_bytes(f.read(2), sys.byteorder)

    def add(self, delta):
        """Add *delta* to the semaphore, as the kernel does when it puts a
        uprobe with a reference counter on the probe (+1) or takes it off
        (-1): the watcher cannot tell the difference.  Only for a process
        that no tracer attaches to meanwhile."""
        with open("/proc/%d/mem" % self.pid, "r+b", buffering=0) as f:
            f.seek(self.address)
            value = int.from_bytes(f.read(2), sys.byteorder) + delta
            if not 0 <= value < 1 << 16:
                raise ValueError("semaphore of python:%s would be %d"
                                 % (self.name, value))
            f.seek(self.address)
            f.write(value.to_bytes(2, sys.byteorder))

    def snapshot(self):
        """(time.monotonic_ns() just before reading the semaphore, its
        value).  time.monotonic_ns() is bpftrace's nsecs clock."""
        return time.monotonic_ns(), self.value()

    def wait_armed(self, snapshot, still_waiting, timeout=60):
        """Poll until more tracers than at snapshot() arm the probe.

        Returns (t0, t1): the semaphore went up after t0 and by t1; or None
        as soon as still_waiting() is false.  AssertionError at timeout.
        """
        since, before = snapshot
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic_ns()
            if self.value() > before:
                return since, time.monotonic_ns()
            since = now
            if not still_waiting():
                return None
            if time.monotonic() > deadline:
                raise AssertionError("no tracer armed python:%s in process "
                                     "%d within %d s"
                                     % (self.name, self.pid, timeout))
            time.sleep(0.001)


class Bpftrace:
    """Run bpftrace programs against the interpreter under test.

    usable() returns None when bpftrace can attach a USDT probe of PYTHON,
    else the reason (bpftrace's own error output), for skipTest().
    """

    _reason = "not checked"

    @classmethod
    def usable(cls):
        if cls._reason == "not checked":
            cls._reason = cls._check()
        return cls._reason

    @classmethod
    def _check(cls):
        exe = shutil.which("bpftrace")
        if exe is None:
            return "bpftrace not found (apt-get install bpftrace)"
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "noop.py")
            with open(script, "w") as f:
                f.write("pass\n")
            proc = cls.run(
                'usdt:%s:python:audit { } END { printf("attached\\n"); }'
                % PYTHON, script, timeout=60)
        if proc.returncode != 0 or "attached" not in proc.stdout:
            return ("bpftrace cannot attach to %s: %s"
                    % (PYTHON, cls.errors(proc) or "exit %d" % proc.returncode))
        return None

    @staticmethod
    def run(program, script, timeout=120, env=None, args=()):
        """bpftrace -e program -c 'PYTHON script' (paths without spaces),
        its output as bpftrace_output() gives it."""
        if " " in PYTHON or " " in script:
            raise ValueError("bpftrace -c splits on spaces: %r %r"
                             % (PYTHON, script))
        cmd = ["bpftrace", "-q", *args, "-e", program,
               "-c", "%s %s" % (PYTHON, script)]
        proc = run(cmd, timeout=timeout, env=env)
        proc.stdout = bpftrace_output(proc.stdout)
        return proc

    @staticmethod
    def maps(stdout):
        """(map name, [key fields], value) for each entry of the maps
        bpftrace prints at exit (keys split at ", ", values int)."""
        for line in stdout.splitlines():
            if line.startswith("@"):
                head, _, value = line.rpartition(": ")
                name, _, keys = head[1:].partition("[")
                yield name, keys[:-1].split(", ") if keys else [], int(value)

    @staticmethod
    def interrupt(proc, collect=True):
        """Send SIGINT to the bpftrace process proc until it exits: bpftrace
        0.17 misses about one SIGINT in five (and as many SIGTERMs), so
        another follows each second, up to 10.  Returns (stdout, stderr) of
        proc.communicate() when collect, else None (another thread reads
        its output)."""
        for _ in range(10):
            proc.send_signal(signal.SIGINT)
            try:
                if collect:
                    return proc.communicate(timeout=1)
                proc.wait(timeout=1)
                return None
            except subprocess.TimeoutExpired:
                pass
        raise AssertionError("bpftrace ignored 10 SIGINTs")

    @staticmethod
    def errors(proc):
        """bpftrace's stderr (proc's, or the string proc) without its
        harmless RLIMIT_MEMLOCK notice, and what the kernel said if it
        refused a uprobe."""
        stderr = proc if isinstance(proc, str) else proc.stderr
        text = "\n".join(line for line in stderr.splitlines()
                         if "RLIMIT_MEMLOCK" not in line
                         and not LEFT_OUT_NOTE.match(line)
                         and not CPU_NOTE.match(line)).strip()
        if "Error attaching probe" in text:
            refused = ref_ctr_mismatches(PYTHON)
            if refused:
                text += ("\n(the kernel refused the uprobe because another "
                         "tool left one on the same probe of %s with a "
                         "different semaphore offset; stop that tool.  "
                         "dmesg: %s)" % (PYTHON, refused[-1]))
        return text


# The line in which usdt.tools and usdt.stacks count the known harmless
# warnings of bpftrace they left out (usdt._bpftrace.left_out_note()).
LEFT_OUT_NOTE = re.compile(r"^(usdt\.tools \w+|usdt.stacks): \d+ known harmless "
                           r"bpftrace warnings? not shown \(-v shows "
                           r"(them|it)\)$")


# The line in which usdt.tools calls and latency say the CPU time of the
# traced process and their own (usdt.tools.report_cpu()).
CPU_NOTE = re.compile(r"^usdt\.tools \w+: CPU time: the traced process "
                      r"(\d+\.\d\d s|unknown \(it has exited\)); the tool "
                      r"\d+\.\d\d s \(bpftrace \d+\.\d\d s, usdt\.tools "
                      r"\d+\.\d\d s\)$")


def ref_ctr_mismatches(binary, seconds=600):
    """The kernel's "ref_ctr_offset mismatch" messages about binary (its
    inode) in the last `seconds`.

    The kernel refuses a uprobe on a probe that already has one with another
    semaphore (reference counter) offset, and tells only dmesg; bpftrace just
    says "Error attaching probe".
    """
    proc = run(["dmesg"])
    with open("/proc/uptime") as f:
        since = float(f.read().split()[0]) - seconds
    inode = "inode: %#x " % os.stat(binary).st_ino
    found = []
    for line in proc.stdout.splitlines():
        stamp = re.match(r"\[\s*(\d+\.\d+)\]", line)
        if ("ref_ctr_offset mismatch" in line and inode in line
                and stamp and float(stamp.group(1)) >= since):
            found.append(line.strip())
    return found


# The ground truth of the line tools: line counts of the files in TARGET's
# directory, with sys.settrace() in every thread, as JSON {file: {line:
# count}}; of the whole run ("all"), or of the main() that TARGET defines
# alone ("main", as a tool attached after the imports sees it).
# usage: PYTHON -c SETTRACE_LINES all|main TARGET
SETTRACE_LINES = textwrap.dedent("""\
    import collections, json, os, runpy, sys, threading
    what, target = sys.argv[1:]
    del sys.argv[1]
    top = os.path.dirname(target)
    counts = collections.defaultdict(collections.Counter)
    # Threads run the trace function at the same time in a free-threaded
    # build, where += on the counts would lose some.
    lock = threading.Lock()
    def trace(frame, event, arg):
        if not frame.f_code.co_filename.startswith(top + os.sep):
            return None
        if event == "line":
            with lock:
                counts[frame.f_code.co_filename][frame.f_lineno] += 1
        return trace
    sys.path.insert(0, top)
    if what == "all":
        threading.settrace_all_threads(trace)
        runpy.run_path(target, run_name="__main__")
    else:
        namespace = runpy.run_path(target, run_name="reference")
        threading.settrace_all_threads(trace)
        namespace["main"]()
    threading.settrace_all_threads(None)
    print(json.dumps(counts))
""")


def tracer_required():
    """True where a tracer that cannot trace is a failure, not a skip: when
    CI is set (non-empty; .ci/run runs under it) or REQUIRE_TRACER is set
    to anything but "" or "0" (make check REQUIRE_TRACER=1), so that a
    machine that cannot trace does not pass without firing a probe."""
    return bool(os.environ.get("CI")) or os.environ.get(
        "REQUIRE_TRACER", "") not in ("", "0")


def tracer_unusable(reason, tracer="bpftrace"):
    """Raise for a test that cannot run because the tracer (bpftrace, or
    DTrace) cannot trace here (missing, not root, cannot attach): SkipTest
    with the tracer's reason, or, where tracer_required(), AssertionError
    with it."""
    if tracer_required():
        raise AssertionError("%s cannot trace here, and CI or "
                             "REQUIRE_TRACER requires it: %s"
                             % (tracer, reason))
    raise unittest.SkipTest(reason)


def require_bpftrace(testcase):
    """Skip (fail where tracer_required()) unless bpftrace can attach."""
    reason = Bpftrace.usable()
    if reason is not None:
        tracer_unusable(reason)


if __name__ == "__main__":
    sys.exit("support.py is a helper module, not a test")
