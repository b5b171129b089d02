"""usdt.stacks --native: whole stacks, native and Python frames merged.

The ground truth is the traced program itself and gdb:

- the Python part: at the very line where the workload makes the call
  that hits the probe, it records traceback.extract_stack() (and the
  co_qualname of each frame), as in test_stack_tool;
- the native part: gdb stops the same program at the same events (the
  write(2) syscall to one file descriptor, the gc__start marker) and
  prints its backtrace without inlined frames, as the frame pointers see
  it.  Each run of Python frames of the stack tool's stack stands for one
  activation of the evaluator, _PyEval_EvalFrameDefault in gdb's.

And, as a held-out check: attached with -p to a process whose outer()
began before the tracer, at least 90 % of the samples that reach leaf()
show outer, middle and leaf, in order, between native frames.
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

import support
import test_stack_tool as base
from support import (IMPORT_USDT, PYTHON, USDT_PACKAGE, free_threaded,
                     perf_map_entries, perf_map_path, pystack_filename,
                     readline, require_bpftrace, run, run_gdb, start,
                     usdt_module)

# Writes to FD from Python code re-entered from C (sorted's key, map's
# function), in a thread, a generator and coroutines.
WRITES = textwrap.dedent("""\
    import asyncio, os, threading
    from recorder import record

    FD = 77
    os.dup2(os.open(os.devnull, os.O_WRONLY), FD)

    def key(x):
        record(os.write(FD, b"k"))
        return -x

    def outer():
        return sorted([3, 1, 2], key=key)

    def mapped(x):
        record(os.write(FD, b"m"))
        return x

    def worker():
        outer()
        list(map(mapped, [1, 2]))

    def generator():
        for i in range(2):
            record(os.write(FD, b"g"))
            yield i

    async def coroutine():
        record(os.write(FD, b"c"))
        await asyncio.sleep(0)
        record(os.write(FD, b"d"))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    outer()
    list(generator())
    asyncio.run(coroutine())
    """)

# A threaded HTTP server of the standard library, and a client of it in
# the same process: every request and answer goes through glibc's send(),
# which, with threads, saves rbp and then uses it for the cancellation
# state.
SERVER = textwrap.dedent("""\
    import http.server, threading, urllib.request

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"x" * 100
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for _ in range(5):
        urllib.request.urlopen("http://127.0.0.1:%d/"
                               % server.server_address[1]).read()
    server.shutdown()
    """)

# The workload frees large blocks, which glibc's free() returns with
# munmap(): a system call's site in libc that libc called, whose callers
# usdt.stacks unwinds from a window of the stack with libc's CFI.
FREES = textwrap.dedent("""\
    from recorder import record

    def release(megabytes):
        box = [bytearray(megabytes << 20)]
        record(box.clear())

    def outer():
        for megabytes in (40, 48, 56):
            release(megabytes)

    outer()
    """)

# Samples in glibc's memcpy(), which keeps no frame pointer and leaves rbp
# as its caller had it: the frame pointers alone go from it to its
# caller's caller (gdb, in copy(): __memcpy_* <- PyBuffer_ToContiguous <-
# _PyBytes_FromBuffer), and in malloc(), realloc() and free(), which use
# rbp for other things.
COPIES = textwrap.dedent("""\
    import time

    data = bytearray(8 << 20)

    def copy():
        return bytes(data)

    def churn():
        return [str(i) for i in range(2000)]

    end = time.monotonic() + 3
    while time.monotonic() < end:
        copy()
        churn()
    """)

# What usdt.stacks says when it found the callers of frames in libc (which
# has no frame pointers) from libc's call-frame information: at a system
# call's site, or from a window of the stack.
CFI_NOTES = ("callers of system calls in libc found from its call-frame "
             "information",
             "stacks in libc unwound from a window of the stack with its "
             "call-frame information")

COLLECTIONS = textwrap.dedent("""\
    import gc
    from recorder import record

    gc.disable()

    def key(x):
        record(gc.collect())
        return x

    def collect(generation):
        record(gc.collect(generation))

    collect(0)
    sorted([2, 1], key=key)
    """)

# Writes from the callbacks of sys.monitoring and of sys.settrace: the
# interpreter calls them from its instrumented instructions, which the
# release build's evaluator runs in its .cold part.
CALLBACKS = textwrap.dedent("""\
    import os, sys
    from recorder import record

    FD = 77
    os.dup2(os.open(os.devnull, os.O_WRONLY), FD)
    M = sys.monitoring
    E = M.events

    def on_line(code, line):
        record(os.write(FD, b"l"))

    def on_branch(code, offset, destination):
        record(os.write(FD, b"b"))

    def on_raise(code, offset, exception):
        record(os.write(FD, b"r"))

    def on_return(code, offset, value):
        record(os.write(FD, b"v"))

    def tracer(frame, event, arg):
        record(os.write(FD, b"t"))
        return tracer

    def work(n):
        total = 0
        for i in range(n):
            try:
                if i % 2:
                    raise ValueError(i)
                total += i
            except ValueError:
                total -= 1
        return total

    M.use_tool_id(3, "test")
    for event, callback in ((E.LINE, on_line), (E.BRANCH, on_branch),
                            (E.RAISE, on_raise), (E.PY_RETURN, on_return)):
        M.register_callback(3, event, callback)
    M.set_local_events(3, work.__code__, E.LINE | E.BRANCH | E.PY_RETURN)
    M.set_events(3, E.RAISE)
    work(3)
    M.set_events(3, 0)
    M.set_local_events(3, work.__code__, 0)
    M.free_tool_id(3)
    sys.settrace(tracer)
    work(3)
    sys.settrace(None)
    """)

# gdb's side: at each stop, the frames that are on the stack (not those
# inlined, nor those that made a tail call, which gdb shows from the debug
# information), innermost first, as "GDBFRAME depth name|library" lines, then "GDBEND".
GDB_DUMP = textwrap.dedent("""\
    python
    import gdb, os
    def dump_stack():
        frame = gdb.newest_frame()
        depth = 0
        while frame is not None:
            if frame.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):
                library = (gdb.solib_name(frame.pc())
                           or gdb.current_progspace().filename)
                # The ELF symbol of the evaluator's frames: the debug
                # information names its .cold part as the function.
                symbol = ""
                if frame.name() == "_PyEval_EvalFrameDefault":
                    symbol = gdb.execute("info symbol %d" % frame.pc(),
                                         to_string=True).split(" ")[0]
                print("GDBFRAME %d %s|%s|%s" % (depth, frame.name() or "??",
                                                os.path.realpath(library),
                                                symbol))
                depth += 1
            frame = frame.older()
        print("GDBEND")
    end
    """)

# Clones GCC makes of a function keep its name with a suffix, which gdb
# and bpftrace do not always both show.
CLONE = re.compile(r"\.(constprop|isra|part|cold|lto_priv)(\.\d+)?")

# What gdb unwinds past the outermost frame that the frame pointers reach
# (glibc's start-up code and clone3 have none).
BEYOND_FRAME_POINTERS = {"__libc_start_main_impl", "__libc_start_main",
                         "_start", "clone3", "clone", "__clone3"}


def normal(name):
    return CLONE.sub("", name)


def collapsed(frames):
    """A merged stack as gdb shows it: each run of Python frames one
    activation of the evaluator, native frames (name, library)."""
    shown = []
    for frame in frames:
        if "symbol" in frame:
            shown.append((normal(frame["symbol"]),
                          os.path.realpath(frame["library"])
                          if frame["library"].startswith("/")
                          else frame["library"]))
        elif not shown or shown[-1][0] != "_PyEval_EvalFrameDefault":
            shown.append(("_PyEval_EvalFrameDefault",
                          os.path.realpath(PYTHON)))
    return shown


class NativeStacksBase(unittest.TestCase):
    """What the tests of a -c run share: the workload, the tools, gdb,
    and the comparisons."""

    maxDiff = None

    def setUp(self):
        require_bpftrace(self)
        self.tmp = tempfile.mkdtemp(prefix="usdt-stacks-native")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def workload(self, text):
        self.write("recorder.py", base.RECORDER)
        return self.write("workload.py", text)

    def stack_tool(self, options, command, cfi=False):
        """The tool's rows and stderr; with cfi, skip unless it found the
        callers of libc's system calls from libc's call-frame information
        (not with a libc it did not read: -c under another root's
        bpftrace, tools/bpftrace SUITE)."""
        proc = run([base.TOOL_PYTHON, base.TOOL, "--native", "--json",
                    *options, "-c", " ".join(command)], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        if cfi and not any(note in proc.stderr for note in CFI_NOTES):
            self.skipTest("the command ran with a libc that the tool did "
                          "not read (-c under another root's bpftrace, "
                          "tools/bpftrace SUITE); with -p it reads the "
                          "process's own")
        self.assertNotIn("lost", proc.stderr)
        return json.loads(proc.stdout), proc.stderr

    def gdb_stacks(self, commands, command):
        proc = run_gdb(GDB_DUMP + commands + "run\n", *command)
        out = proc.stdout.decode("utf-8", "replace")
        stacks, stack = [], []
        self.gdb_evaluator_symbols = collections.Counter()
        for line in out.splitlines():
            if line.startswith("GDBFRAME "):
                name, library, symbol = line.split(" ", 2)[2].split("|")
                stack.append((normal(name), library))
                if symbol:
                    self.gdb_evaluator_symbols[symbol] += 1
            elif line == "GDBEND":
                stacks.append(stack)
                stack = []
        self.assertTrue(stacks, out + proc.stderr.decode("utf-8", "replace"))
        return stacks

    def check_native(self, rows, gdb_stacks, innermost_by_library,
                     stderr=""):
        """Each merged stack, collapsed, is one of gdb's stacks frame by
        frame, as many times; the first innermost_by_library frames are
        compared by library only (glibc's aliases: bpftrace and gdb name
        the same address differently).  stderr: the tool's, which says
        whether it found the callers of libc's system calls from libc's
        call-frame information (when the process's libc is the one it
        read: not under another root's bpftrace with -c)."""
        cfi = any(note in stderr for note in CFI_NOTES)
        def key(stack):
            return tuple((library if i < innermost_by_library else name,
                          library)
                         for i, (name, library) in enumerate(stack))
        expected = collections.Counter()
        interpreter = os.path.realpath(PYTHON)
        for stack in gdb_stacks:
            if stack[0][1] != interpreter and not cfi:
                # glibc's write has no frame pointer: the frame pointers
                # go from it to its caller's caller (_Py_write is lost),
                # unless the tool read libc's call-frame information.
                stack = stack[:1] + stack[2:]
            expected[key(stack)] += 1
        found = collections.Counter()
        for row in rows:
            stack = key(collapsed(row["frames"]))
            # The frame pointers end before glibc's start-up code: take
            # the gdb stack this one begins, if what gdb has beyond is
            # only that.
            for candidate in expected:
                if (candidate[:len(stack)] == stack and all(
                        name in BEYOND_FRAME_POINTERS
                        for name, _ in candidate[len(stack):])):
                    stack = candidate
                    break
            found[stack] += row["count"]
        self.assertEqual(found, expected)

    def check_python(self, rows, recorded, stderr=None):
        """The Python frames of each merged stack are the recorded ones,
        their file names as usdt.stacks prints them: the last
        DEFAULT_STRLEN - 1 bytes, after "..." when cut (the standard
        library's paths are longer in a clone under a deep directory)."""
        found = collections.Counter()
        for row in rows:
            found[tuple((f["name"], f["filename"], f["line"])
                        for f in row["frames"] if "name" in f)] \
                += row["count"]
        expected = collections.Counter(
            tuple((frame[0], pystack_filename(frame[2]), frame[3])
                  for frame in stack)
            for stack in recorded)
        self.assertEqual(found, expected, stderr)



class NativeStacksTest(NativeStacksBase):

    def check_writes(self, text):
        """Run the workload *text*, which records its writes to file
        descriptor 77: the merged stacks of those writes against the
        recorded ones and gdb's, as many of each; the rows and the number
        of writes."""
        workload = self.workload(text)
        expected = os.path.join(self.tmp, "expected.json")
        command = [PYTHON, workload, expected]
        rows, stderr = self.stack_tool(
            ["--probe", "tracepoint:syscalls:sys_enter_write",
             "--filter", "args->fd == 77"], command)
        with open(expected) as f:
            recorded = json.load(f)
        self.check_python(rows, recorded)
        gdb = self.gdb_stacks("catch syscall write\n"
                              "condition 1 $rdi == 77 && $rax == -38\n"
                              "commands 1\nsilent\npython dump_stack()\n"
                              "continue\nend\n", command)
        self.assertEqual(len(gdb), len(recorded))
        self.check_native(rows, gdb, 1, stderr)
        return rows, len(recorded)

    def test_sendto_of_a_threaded_server_against_gdb(self):
        # The case: a threaded server's send() stacks.  Where the
        # tool read libc's call-frame information, each is gdb's at the
        # same system call, the C frames between glibc and the Python
        # frames included, none [native frames lost].
        workload = self.workload(SERVER)
        command = [PYTHON, workload]
        rows, stderr = self.stack_tool(
            ["--probe", "tracepoint:syscalls:sys_enter_sendto"], command,
            cfi=True)
        gdb = self.gdb_stacks("catch syscall sendto\n"
                              "condition 1 $rax == -38\n"
                              "commands 1\nsilent\npython dump_stack()\n"
                              "continue\nend\n", command)
        self.assertGreaterEqual(len(gdb), 10)
        self.assertEqual(sum(row["count"] for row in rows), len(gdb))
        for row in rows:
            self.assertNotIn("[native frames lost]",
                             [f.get("symbol") for f in row["frames"]], row)
        self.check_native(rows, gdb, 1, stderr)

    def test_frees_through_glibc_against_traceback_and_gdb(self):
        # munmap() called by free(), both in glibc, which has no frame
        # pointers: every C frame between glibc and the Python frames,
        # as gdb has them at the same system call, none lost.
        workload = self.workload(FREES)
        expected = os.path.join(self.tmp, "expected.json")
        command = [PYTHON, workload, expected]
        rows, stderr = self.stack_tool(
            ["--probe", "tracepoint:syscalls:sys_enter_munmap",
             "--filter", "args->len >= 0x2000000"], command, cfi=True)
        self.assertIn(CFI_NOTES[1], stderr)
        with open(expected) as f:
            recorded = json.load(f)
        self.assertEqual(len(recorded), 3)
        self.check_python(rows, recorded, stderr)
        gdb = self.gdb_stacks("catch syscall munmap\n"
                              "condition 1 $rsi >= 0x2000000 && "
                              "$rax == -38\n"
                              "commands 1\nsilent\npython dump_stack()\n"
                              "continue\nend\n", command)
        self.assertEqual(len(gdb), 3)
        for row in rows:
            self.assertNotIn("[native frames lost]",
                             [f.get("symbol") for f in row["frames"]], row)
        self.check_native(rows, gdb, 1, stderr)

    def test_samples_in_glibc_find_their_callers(self):
        # profile samples anywhere in glibc: every one unwound from its
        # window with libc's CFI, none [native frames lost], and those in
        # memcpy() name its caller, which the frame pointers skip.
        workload = self.write("copies.py", COPIES)
        proc = run([base.TOOL_PYTHON, base.TOOL, "--native", "--json",
                    "--probe", "profile:hz:199", "-c",
                    "%s %s" % (PYTHON, workload)], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        if not any(note in proc.stderr for note in CFI_NOTES):
            self.skipTest("the command ran with a libc that the tool did "
                          "not read (-c under another root's bpftrace, "
                          "tools/bpftrace SUITE)")
        self.assertNotIn("its call-frame information did not find",
                         proc.stderr)
        in_libc = copies = 0
        for row in json.loads(proc.stdout):
            frames = row["frames"]
            if not os.path.basename(frames[0].get("library", "")).startswith(
                    "libc.so"):
                continue
            in_libc += row["count"]
            self.assertNotIn("[native frames lost]",
                             [f.get("symbol") for f in frames], row)
            if re.match(r"__mem(cpy|move)_", frames[0]["symbol"]) and any(
                    f.get("name") == "copy" for f in frames):
                # bytes(data)'s; not realloc()'s, say, in churn().
                copies += row["count"]
                self.assertEqual(frames[1]["symbol"],
                                 "PyBuffer_ToContiguous", row)
        self.assertGreater(copies, 10, proc.stderr)
        self.assertGreater(in_libc, copies, proc.stderr)

    def test_writes_against_traceback_and_gdb(self):
        rows, writes = self.check_writes(WRITES)
        self.assertEqual(writes, 12)
        # The sort key in the true order: outer, then sorted's C code,
        # then key; and the same for map.
        for row in rows:
            names = [f.get("name") or f["symbol"] for f in row["frames"]]
            if "key" in names:
                self.assertLess(names.index("key"),
                                names.index("builtin_sorted"))
                self.assertLess(names.index("builtin_sorted"),
                                names.index("outer"))
            if "mapped" in names:
                self.assertLess(names.index("mapped"),
                                names.index("map_next"))
                self.assertLess(names.index("map_next"),
                                names.index("worker"))

    def test_gc_start_against_traceback_and_gdb(self):
        workload = self.workload(COLLECTIONS)
        expected = os.path.join(self.tmp, "expected.json")
        command = [PYTHON, workload, expected]
        rows, _ = self.stack_tool(["--probe", "usdt:PYTHON:python:gc__start"],
                               command)
        with open(expected) as f:
            recorded = json.load(f)
        # Only the recorded collections: the interpreter collects at exit
        # too, with no Python frame.
        rows = [row for row in rows
                if any(f.get("name") in ("collect", "key")
                       for f in row["frames"])]
        self.check_python(rows, recorded)
        gdb = self.gdb_stacks("break -probe-stap python:gc__start\n"
                              "commands 1\nsilent\npython dump_stack()\n"
                              "continue\nend\n", command)
        # The recorded collections are the last that Python code runs
        # (those at start-up may too, before gc.disable(); those at exit
        # do not).
        gdb = [stack for stack in gdb
               if any(name == "_PyEval_EvalFrameDefault"
                      for name, _ in stack)][-len(recorded):]
        self.assertEqual(len(recorded), 3)
        self.check_native(rows, gdb, 0)

    def test_instrumentation_callbacks_against_traceback_and_gdb(self):
        # In the release build (PGO), the evaluator calls these callbacks
        # from its .cold part: gdb must see that there, and usdt.stacks
        # must take it for the evaluator as well.
        _, writes = self.check_writes(CALLBACKS)
        self.assertGreater(writes, 20)
        nm = run(["nm", PYTHON])
        self.assertEqual(nm.returncode, 0, nm.stderr)
        if re.search(r" _PyEval_EvalFrameDefault\.cold$", nm.stdout,
                     re.MULTILINE):
            self.assertIn("_PyEval_EvalFrameDefault.cold",
                          self.gdb_evaluator_symbols)


WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                        "whole_stacks_workload.py")


class AttachTest(unittest.TestCase):
    """-p on a process whose outer() began before the tracer attached."""

    maxDiff = None
    # Samples taken after the first one came.
    SECONDS = 4

    def setUp(self):
        require_bpftrace(self)
        self.tmp = tempfile.mkdtemp(prefix="usdt-stacks-native")
        self.addCleanup(shutil.rmtree, self.tmp)

    def sample(self, *python_options, arm=False):
        target = start(self, [PYTHON, *python_options, WORKLOAD],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        # Its perf map (-X perf, or the trampoline stacks__enable turns
        # on) is removed at the test's end: make check fails on leftovers.
        self.addCleanup(remove_perf_map, target.pid)
        ready = readline(target.stdout, 60, "the native workload did not "
                         "say 'ready'").split()
        self.assertEqual(ready[:1], ["ready"])
        if arm:
            self.arm_stacks_enable(target.pid)
        records = os.path.join(self.tmp, "records")
        tool = start(self, [base.TOOL_PYTHON, base.TOOL, "--native",
                            "--json", "--probe", "profile:hz:99",
                            "--save", records, "-p", str(target.pid)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # SIGINT before bpftrace has attached would be lost: wait for the
        # first sample.
        deadline = time.monotonic() + 120
        while (time.monotonic() < deadline and tool.poll() is None
               and not self.saved(records)):
            time.sleep(0.1)
        if tool.poll() is not None:
            self.fail(tool.stderr.read())
        time.sleep(self.SECONDS)
        tool.send_signal(signal.SIGINT)
        stdout, stderr = tool.communicate(timeout=120)
        self.assertEqual(tool.returncode, 0, stderr)
        target.stdin.close()
        target.wait(timeout=60)
        return json.loads(stdout), stderr

    def arm_stacks_enable(self, pid):
        """A tracer of its own arms python:stacks__enable in pid (as the
        howto's "Python names in native stacks" does); returns once the
        trampoline is on: the perf map names leaf(), which the workload
        calls anew all the time."""
        arming = start(self, ["bpftrace", "-q", "-p", str(pid), "-e",
                              "usdt:%s:python:stacks__enable { }"
                              % os.path.realpath(PYTHON)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.addCleanup(arming.send_signal, signal.SIGINT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and arming.poll() is None:
            if any(entry.startswith("py::leaf:")
                   for entry in perf_map_entries(pid)):
                return
            time.sleep(0.1)
        self.fail("the trampoline did not come on: %s"
                  % (arming.poll() is not None and arming.stderr.read()))

    @staticmethod
    def saved(records):
        if not os.path.exists(records):
            return False
        with open(records, errors="replace") as f:
            return any(line.startswith("PYSTACK N") for line in f)

    def check_chain(self, rows):
        """At least 90 % of the samples in leaf() show leaf, middle and
        outer in order, the threads' native frames outside them, and no
        Python frame twice."""
        reaching = complete = 0
        for row in rows:
            frames = row["frames"]
            names = [f["name"] for f in frames if "name" in f]
            if "leaf" not in names:
                continue
            reaching += row["count"]
            # The Python frames after leaf, whatever native frames are
            # between them (with -X perf, each call is an activation of
            # its own, called from C).
            i = names.index("leaf")
            at = next((k for k, f in enumerate(frames)
                       if f.get("name") == "outer"), len(frames))
            outside = [f.get("symbol") for f in frames[at + 1:]]
            if (names[i:i + 3] == ["leaf", "middle", "outer"]
                    and "pythread_wrapper" in outside
                    and "symbol" in frames[-1]
                    and names.count("outer") == 1
                    and names.count("middle") == 1):
                complete += row["count"]
        self.assertGreater(reaching, 20, rows)
        self.assertGreaterEqual(complete, 0.9 * reaching,
                                json.dumps(rows, indent=1))
        return reaching, complete

    def test_outer_entered_before_attach(self):
        rows, stderr = self.sample()
        self.check_chain(rows)

    def test_perf_trampoline(self):
        # -X perf: every Python call goes through a trampoline, a native
        # frame in anonymous memory named in the perf map; usdt.stacks
        # leaves it out, for its Python frame is there already.
        rows, stderr = self.sample("-X", "perf")
        self.check_trampolines(rows, stderr)

    def test_perf_and_stacks_enable(self):
        # -X perf, and stacks__enable armed by another tracer, in a
        # process that allows it (-X dtrace_stacks): one trampoline, whose
        # frames are left out as well.
        rows, stderr = self.sample("-X", "perf", "-X", "dtrace_stacks",
                                   arm=True)
        self.check_trampolines(rows, stderr)

    def test_stacks_enable_armed_after_outer(self):
        # stacks__enable alone: the trampoline wraps the calls made after
        # it was armed (middle, leaf), not outer; the merged stacks have
        # them all, once each.
        if free_threaded():
            self.skipTest("the free-threaded build has no stack trampoline "
                          "for the marker")
        rows, stderr = self.sample("-X", "dtrace_stacks", arm=True)
        self.check_trampolines(rows, stderr)

    def check_trampolines(self, rows, stderr):
        self.check_chain(rows)
        self.assertIn("trampoline frames left out", stderr)
        for row in rows:
            for frame in row["frames"]:
                self.assertFalse(frame.get("symbol", "").startswith("py::"),
                                 row)


class FoldedTest(NativeStacksBase):

    def test_folded_sort_key(self):
        # examples/sort_key.py: root first, outer, then sorted's C code,
        # then key, then write(2)'s; and the flame graph's parser takes it.
        example = os.path.join(base.TOP, "examples", "sort_key.py")
        proc = run([base.TOOL_PYTHON, base.TOOL, "--native", "--folded",
                    "--probe", "tracepoint:syscalls:sys_enter_write",
                    "--filter", "args->fd == 2", "-c",
                    "%s %s" % (PYTHON, example)], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual(sum(int(line.rpartition(" ")[2]) for line in lines),
                         3, proc.stdout)
        python = os.path.basename(os.path.realpath(PYTHON))
        # The file name as usdt.stacks prints it: cut, after "...", in a
        # clone under a deep directory.
        shown = pystack_filename(example)
        for line in lines:
            frames = line.rpartition(" ")[0].split(";")
            wanted = ("py::<module> (%s:10)" % shown,
                      "py::outer (%s:8)" % shown,
                      "builtin_sorted (%s)" % python,
                      "list_sort_impl (%s)" % python,
                      "py::key (%s:4)" % shown,
                      "os_write (%s)" % python)
            self.assertLessEqual(set(wanted), set(frames), line)
            order = [frames.index(frame) for frame in wanted]
            self.assertEqual(order, sorted(order), line)
            self.assertTrue(frames[-1].endswith("(libc.so.6)"), line)
        check = run([PYTHON, "-c", "import sys, usdt.flamegraph as f; "
                     "print(sum(c for _, c in f.parse_folded("
                     "sys.stdin.read().splitlines(), '-')))"],
                    input=proc.stdout)
        self.assertEqual(check.stdout.strip(), "3", check.stderr)

    def test_libraries_named_after_exit(self):
        # The records of a command that has ended, counted again with
        # --read: no process is left whose mappings could be read, and
        # the loader's list (M records) names the C library's frames,
        # read in this root.  Where bpftrace ran the command in another
        # root (tools/bpftrace's), this root's file of that name is
        # another C library: its frames stay unnamed, never named from
        # the wrong file.
        example = os.path.join(base.TOP, "examples", "sort_key.py")
        records = os.path.join(self.tmp, "records")
        proc = run([base.TOOL_PYTHON, base.TOOL, "--native", "--folded",
                    "--probe", "tracepoint:syscalls:sys_enter_write",
                    "--filter", "args->fd == 2", "--save", records, "-c",
                    "%s %s" % (PYTHON, example)], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(records) as f:
            listed = [line.split(" ", 7)[7].strip() for line in f
                      if line.startswith("PYSTACK M ")]
        self.assertIn(True, [os.path.basename(name) == "libc.so.6"
                             for name in listed], listed)
        proc = run([base.TOOL_PYTHON, base.TOOL, "--native", "--folded",
                    "--read", records, "--python", PYTHON], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertEqual(sum(int(line.rpartition(" ")[2]) for line in lines),
                         3, proc.stdout)
        shim = os.path.realpath(shutil.which("bpftrace") or "bpftrace")
        own_root = not shim.startswith(os.path.realpath(os.path.join(
            base.TOP, "build", "bpftrace")) + os.sep)
        for line in lines:
            frames = line.rpartition(" ")[0].split(";")
            self.assertIn("os_write (%s)" % os.path.basename(
                os.path.realpath(PYTHON)), frames, line)
            if own_root:
                self.assertTrue(frames[0].endswith(" (libc.so.6)"), line)
                self.assertTrue(frames[-1].endswith(" (libc.so.6)"), line)
            else:
                self.assertEqual(frames[-1], "[unknown] ([unknown])", line)
                self.assertNotIn("libc.so.6", line)


class ToolsTest(NativeStacksBase):
    """python -m usdt.tools stacks takes the stack tool's options."""

    def test_stacks_native_json_filtered(self):
        workload = self.workload(WRITES)
        expected = os.path.join(self.tmp, "expected.json")
        proc = run([PYTHON, "-m", "usdt.tools", "stacks", "--native",
                    "--json", "-f", "builtin_sorted", "--probe",
                    "tracepoint:syscalls:sys_enter_write",
                    "-c", "%s %s %s" % (PYTHON, workload, expected)],
                   timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        rows = json.loads(proc.stdout)
        with open(expected) as f:
            recorded = [stack for stack in json.load(f)
                        if stack[0][0] == "key"]
        self.assertEqual(len(recorded), 6)
        self.check_python(rows, recorded, proc.stderr)


    def test_walker_limits_passed_on(self):
        # alloc passes its limits to usdt.stacks, whose error says what to
        # lower; a failed run prints no tables.  (--max-entries, which
        # alloc still passes on, has no effect: lines are decoded in user
        # space.)
        workload = self.write("noop.py", "pass\n")
        proc = run([PYTHON, "-m", "usdt.tools", "alloc", "--max-entries",
                    "100000", "--max-depth", "100000",
                    "-c", "%s %s" % (PYTHON, workload)], timeout=300)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--max-depth must be 1 to 512", proc.stderr)
        self.assertNotIn("Bytes allocated", proc.stdout)

    def test_pid_of_no_process(self):
        # -p of a process that has ended: one line that says so, not a
        # traceback (it was a FileNotFoundError of /proc/PID/exe).
        gone = subprocess.Popen([PYTHON, "-c", "pass"])
        gone.wait()
        proc = run([PYTHON, base.TOOL, "--probe", "profile:hz:99",
                    "-p", str(gone.pid)], timeout=60)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("usdt.stacks: no process %d\n" % gone.pid, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


def remove_perf_map(pid):
    """Remove /tmp/perf-PID.map, if the process wrote one."""
    if os.path.exists(perf_map_path(pid)):
        os.unlink(perf_map_path(pid))




class FakeSymbolizer:
    """Names the addresses 1, 2, 3... of a made-up process."""

    maps = {1: True}

    def __init__(self, names, read_at=10):
        self.names = names
        self.read_at = read_at

    def read_after(self, pid, time_ns):
        # The records below are hits at time 9.
        return self.read_at > time_ns

    def lookup(self, pid, address, bias=None):
        # Return addresses are named by the byte before them: +1 below.
        return self.names.get(address) or self.names.get(address + 1)


class MergeTest(unittest.TestCase):
    """the stack tool's merge of made-up records, cut stacks included: what
    the limits of the howto's "Whole stacks" say."""

    NAMES = {0x10: ("leaf_c", "/lib/x.so"),
             0x20: ("_PyEval_EvalFrameDefault", "/py"),
             0x30: ("sorted_c", "/py"),
             0x40: ("_PyEval_EvalFrameDefault.cold", "/py"),
             0x50: ("main", "/py"),
             0x60: ("py::trampoline", "[anon]"),
             0x70: ("_int_malloc", "/usr/lib/x86_64-linux-gnu/libc.so.6")}

    def records(self, addresses, frames, entries, more=0, native_more=0):
        """The records of one hit: native addresses, and Python frames
        (names) innermost first, entries: depths after which the chain
        crosses an entry frame."""
        lines = []
        padded = addresses + [0] * (-len(addresses) % 8 or 8)
        for batch in range(len(padded) // 8):
            lines.append("PYSTACK A 1 9 %d %s\n" % (batch, " ".join(
                "%x" % a for a in padded[8 * batch:8 * batch + 8])))
        lines.append("PYSTACK N 1 9 1 0 %d 1\n" % native_more)
        # Frame d: code object 0x100 + d, version 7, first line d + 1,
        # whose location table's one entry (kind 13, line delta 0) covers
        # 8 code units; its code object as a saved run keeps it (C
        # record).  F records hold 8 frames (code 0: none), each its code
        # object and a word: offset << 33 | entry << 32 | version.
        words = []
        for depth, name in enumerate(frames):
            entry = int(depth in entries)
            words.append("%x %x" % (0x100 + depth, entry << 32 | 7))
            lines.append("PYSTACK C 1 %x 7 %s\n"
                         % (0x100 + depth,
                            json.dumps([name, "f.py", depth + 1, "ef00", 0])))
        words += ["0 0"] * (-len(words) % 8 or 8)
        for batch in range(len(words) // 8):
            lines.append("PYSTACK F 1 9 1 %d %s\n"
                         % (batch, " ".join(words[8 * batch:8 * batch + 8])))
        lines.append("PYSTACK D 1 9 64 %d 0\n" % more)
        lines.append("PYSTACK Z 1 9 0\n")
        return lines

    def test_support_knows_the_default_strlen(self):
        # support.pystack_filename() cuts file names as usdt.stacks does.
        self.assertEqual(usdt_module("stacks.offsets").DEFAULT_STRLEN,
                         support.PYSTACK_STRLEN)

    def merged(self, lines, max_native=128, read_at=10):
        stacks, notes = usdt_module("stacks.output").parse(
            lines, usdt_module("stacks.records").CodeReader(),
            FakeSymbolizer(self.NAMES, read_at),
            max_native)
        (stack, count), = stacks.items()
        return [frame[0] for frame in stack], notes

    def test_activations_replaced_in_order(self):
        # leaf_c <- [key] <- sorted_c <- [outer, <module>] <- main
        names, _ = self.merged(self.records(
            [0x10, 0x21, 0x31, 0x41, 0x51], ["key", "outer", "<module>"],
            {0, 2}))
        self.assertEqual(names, ["leaf_c", "key", "sorted_c", "outer",
                                 "<module>", "main"])

    def test_trampoline_left_out(self):
        names, notes = self.merged(self.records(
            [0x10, 0x21, 0x61, 0x31, 0x21, 0x51], ["key", "outer"], {0, 1}))
        self.assertEqual(names, ["leaf_c", "key", "sorted_c", "outer",
                                 "main"])
        self.assertTrue(any("trampoline" in note for note in notes))

    def test_python_depth_cut_is_marked(self):
        # --max-depth 1: only key was walked; the outer activation stays
        # as the native frame it is.
        names, notes = self.merged(self.records(
            [0x10, 0x21, 0x31, 0x21, 0x51], ["key"], {0}, more=1))
        self.assertEqual(names, ["leaf_c", "key", "[more frames]",
                                 "sorted_c", "_PyEval_EvalFrameDefault",
                                 "main"])
        self.assertIn("stacks cut at --max-depth frames", notes)

    def test_native_cut_is_marked(self):
        # --max-native 3: the outer activation's Python frames follow the
        # mark.
        names, notes = self.merged(self.records(
            [0x10, 0x21, 0x31, 0x21, 0x51], ["key", "outer"], {0, 1}),
            max_native=3)
        self.assertEqual(names, ["leaf_c", "key", "sorted_c",
                                 "[more native frames]", "outer"])
        self.assertIn("native stacks cut at --max-native frames", notes)

    def test_chain_out_of_code_is_marked(self):
        # An address in no mapping: the frame pointers went astray.
        names, _ = self.merged(self.records(
            [0x10, 0x999, 0x21, 0x51], ["key", "outer"], {0, 1}))
        self.assertEqual(names, ["leaf_c", "[native frames lost]", "key",
                                 "outer"])

    def test_activations_lost_in_libc_say_where(self):
        # A sample in glibc's malloc, whose rbp is no frame pointer: the
        # chain skipped two of the three activations, and the note names
        # the function where it broke.
        names, notes = self.merged(self.records(
            [0x70, 0x21, 0x51], ["key", "middle", "outer"], {0, 1, 2}))
        self.assertEqual(names, ["_int_malloc", "key", "middle",
                                 "[native frames lost]", "outer", "main"])
        self.assertIn("stacks marked [native frames lost] sampled in "
                      "_int_malloc (libc.so.6), built without frame "
                      "pointers, whose call-frame information was not "
                      "used (not the libc the tool read)", notes)

    def test_address_mapped_after_the_last_read_is_unknown(self):
        # The mappings were last read before the hit (a starved poller):
        # 0x999 may be a library mapped since, so the walk goes on.
        names, notes = self.merged(self.records(
            [0x999, 0x21, 0x31, 0x41, 0x51], ["key", "outer", "<module>"],
            {0, 2}), read_at=5)
        self.assertEqual(names, ["[unknown]", "key", "sorted_c", "outer",
                                 "<module>", "main"])
        self.assertTrue(any("not named" in note for note in notes))

    def test_loaded_once_a_library_is_mapped(self):
        # bpftrace -c holds the command after its exec() while it
        # attaches: the interpreter and the dynamic loader are mapped, no
        # library yet.
        symbolizer = usdt_module("stacks.native").Symbolizer(
            "/opt/py/bin/python3.13")
        symbolizer.maps[7] = [
            (0x1000, 0x2000, 0, "/opt/py/bin/python3.13"),
            (0x3000, 0x4000, 0, "/usr/lib/x86_64-linux-gnu/"
                                "ld-linux-x86-64.so.2"),
            (0x5000, 0x6000, 0, "[vdso]")]
        self.assertFalse(symbolizer.loaded(7))
        symbolizer.maps[7].append(
            (0x7000, 0x8000, 0, "/usr/lib/x86_64-linux-gnu/libc.so.6"))
        self.assertTrue(symbolizer.loaded(7))
        self.assertFalse(symbolizer.loaded(8))

    def test_read_after_compares_with_bpftrace_clock(self):
        # The hit times are bpftrace's nsecs, CLOCK_MONOTONIC.
        symbolizer = usdt_module("stacks.native").Symbolizer()
        before = time.monotonic_ns()
        symbolizer.snapshot(os.getpid())
        after = time.monotonic_ns()
        self.assertTrue(symbolizer.read_after(os.getpid(), before))
        self.assertFalse(symbolizer.read_after(os.getpid(), after))
        self.assertFalse(symbolizer.read_after(os.getpid() + 1, before))


# usage: PYTHON -c OBJECT_HEADER PYSTACK: CodeReader's alive() and
# immortal() of this process's own objects, as "name alive immortal"
# lines: a live code object, None, and the code object once freed (with
# its header's bytes from ob_type on, before and after, which must be
# equal: not another object's since).  No thread is started, which in
# the free-threaded build would make code objects immortal (gh-117696).
OBJECT_HEADER = IMPORT_USDT + textwrap.dedent("""\
    import gc, weakref
    from usdt.stacks.offsets import Interpreter
    from usdt.stacks.records import CodeReader
    reader = CodeReader(Interpreter(sys.executable))
    print("build", reader.header.build)
    namespace = {}
    exec(compile("def f():\\n    pass\\n", "<header>", "exec"), namespace)
    code = namespace.pop("f").__code__
    address = id(code)
    after_type = reader.header.ob_type
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        def show(name, address, *checks):
            raw = os.pread(mem.fileno(), 32, address)
            print(name, *(check(raw) for check in checks))
            return raw[after_type:]
        both = reader.alive, reader.immortal
        before = show("code", address, *both)
        show("None", id(None), *both)
        gone = weakref.ref(code)
        del code, namespace
        # The free-threaded build frees code objects in its collector
        # (deferred reference counts).
        gc.collect()
        print("freed", gone() is None)
        # (immortal() means nothing of a freed block: the tool asks it
        # only of a live object.)
        print("same", show("freed", address, reader.alive) == before)
    """)


class WindowTest(unittest.TestCase):
    """native.unwind_window() on made-up windows of the stack, at the
    entry of this machine's libc's malloc() (CFA = rsp + 8, rbp the
    caller's): which walk of the frame pointers it takes, and where."""

    LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
    BIAS, SP = 0x7f0000000000, 0x7ffd00001000
    CALLER = 0x5500000001234  # a return address in the interpreter

    def setUp(self):
        program = usdt_module("stacks.program")
        self.native = usdt_module("stacks.native")
        try:
            self.libc = program.Libc(self.LIBC)
        except OSError as error:
            self.skipTest("no %s: %s" % (self.LIBC, error))
        malloc = self.libc_symbol("malloc")
        self.records = usdt_module("stacks.records")
        self.pc = self.BIAS + malloc

    def libc_symbol(self, name):
        elf = usdt_module("_elf").ElfFile(self.LIBC)
        return elf.symbols()[name][0]

    def event(self, words, bp, start, pointers):
        event = self.records.Event()
        event.addresses = {0: self.pc, 1: 0x5500000005678, 2: 0}
        event.window = dict(enumerate(words))
        event.window_regs = (self.BIAS, self.SP, bp, start,
                             self.libc.build_id)
        event.pointers = dict(enumerate(pointers))
        return event

    def unwind(self, event):
        notes = collections.Counter()
        return self.native.unwind_window(event, self.libc, notes), notes

    def test_walk_from_rbp(self):
        # rbp is the caller's frame pointer, where the walk began.
        fp = self.SP + 0x40
        found, notes = self.unwind(self.event(
            [self.CALLER] + [0] * 15, fp, fp, [fp, 0]))
        self.assertEqual(found, ([self.CALLER], 0), notes)

    def test_frame_pointers_inside_the_window(self):
        # The walk began one frame further up: the frame between is read
        # from the window.
        fp, older = self.SP + 0x40, self.SP + 0x60
        words = [self.CALLER] + [0] * 15
        words[8], words[9] = older, 0x550000000abcd
        found, notes = self.unwind(self.event(words, fp, older, [older]))
        self.assertEqual(found, ([self.CALLER, 0x550000000abcd], 0), notes)

    def test_walk_that_began_below_the_live_frames(self):
        # The walk began at a pair that a returned call left, and its
        # second frame pointer is the caller's: its first address is
        # left out.
        fp, stale = self.SP + 0x40, self.SP + 0x20
        found, notes = self.unwind(self.event(
            [self.CALLER] + [0] * 15, fp, stale, [stale, fp, 0]))
        self.assertEqual(found, ([self.CALLER], 1), notes)

    def test_walk_that_never_joins_is_not_taken(self):
        fp, stale = self.SP + 0x40, self.SP + 0x20
        found, notes = self.unwind(self.event(
            [self.CALLER] + [0] * 15, fp, stale, [stale, stale + 0x10]))
        self.assertIsNone(found)
        self.assertIn("its frame pointers do not lead to the walk's",
                      " ".join(notes))

    def test_frames_past_the_window(self):
        found, notes = self.unwind(self.event([], self.SP + 0x40, 0, []))
        self.assertIsNone(found)
        self.assertIn("libc's frames go past the 0 bytes copied",
                      " ".join(notes))

    def test_another_libc(self):
        event = self.event([self.CALLER], self.SP + 0x40, 0, [])
        event.window_regs = event.window_regs[:4] + (0x1234,)
        found, notes = self.unwind(event)
        self.assertIsNone(found)
        self.assertIn("no call-frame information of this libc, build ID "
                      "0000000000001234", " ".join(notes))


class ObjectHeaderTest(unittest.TestCase):
    """CodeReader's reading of an object's header, in the memory of a
    process of the build under test (each build has its own header): a
    live code object is alive and not immortal, None is immortal, and a
    code object freed since is not alive."""

    def test_alive_immortal_freed(self):
        proc = run([PYTHON, "-c", OBJECT_HEADER, USDT_PACKAGE], timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.splitlines(), [
            "build %s" % ("free-threaded" if free_threaded() else "default"),
            "code True False",
            "None True True",
            "freed True",
            "freed False",
            "same True"])


class RefusalTest(unittest.TestCase):
    """What --native refuses, in one line."""

    def test_header_of_another_build_refused_with_reason(self):
        # A copy of the interpreter whose _Py_DebugOffsets say that it is
        # of the other build (the field after the version): its objects'
        # header (ob_type's offset) is not that build's, and CodeReader
        # would misread which code objects are alive.
        with open(PYTHON, "rb") as f:
            data = bytearray(f.read())
        cookies = []
        i = data.find(b"xdebugpy")
        while i != -1:
            if int.from_bytes(data[i + 8:i + 16], "little") >> 16 == 0x030d:
                cookies.append(i)
            i = data.find(b"xdebugpy", i + 1)
        self.assertEqual(len(cookies), 1, cookies)
        other = 0 if free_threaded() else 1
        data[cookies[0] + 16:cookies[0] + 24] = other.to_bytes(8, "little")
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "python")
            with open(copy, "wb") as f:
                f.write(data)
            proc = run([base.TOOL_PYTHON, base.TOOL, "--native", "--probe",
                        "BEGIN", "--python", copy, "--print-program"])
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(proc.stderr,
                         "usdt.stacks: %s: its objects' header is not the one "
                         "this tool knows for a %s build (ob_type at %d, "
                         "not %d)\n" % ((copy, "default", 24, 8) if other == 0
                                       else (copy, "free-threaded", 8, 24)))

    def test_max_native_out_of_range(self):
        for value in ("0", "1025"):
            proc = run([base.TOOL_PYTHON, base.TOOL, "--native", "--probe",
                        "BEGIN", "--python", PYTHON, "--print-program",
                        "--max-native", value])
            self.assertEqual(proc.returncode, 2)
            self.assertIn("--max-native must be 1 to 1024",
                          proc.stderr.splitlines()[-1])
