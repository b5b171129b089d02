"""Lib/usdt/stacks: the Python stacks of the threads hitting a probe.

Each workload knows its own stacks: at the very line where it makes the
call that hits the probe (os.write for write(2), gc.collect for
gc__start, time.sleep for taking the GIL back), it records
traceback.extract_stack(), and the names (co_qualname) of the same frames,
into a JSON file.  usdt.stacks must report exactly those stacks, as many
times as they were recorded: every frame's name, file and line.

The tool runs as documented, with the system's python3 when there is one
(it must not need the interpreter under test), and bpftrace -c.
"""

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from support import (IMPORT_USDT, PYTHON, TOP, USDT_PACKAGE, free_threaded,
                     readline, require_bpftrace, run, start, stapsdt_notes,
                     tracer_required, tracer_unusable)

# The tool, run by its path (its directory, with __main__.py).
TOOL = os.path.join(USDT_PACKAGE, "stacks")
# The tool runs under any Python 3: prefer the system's.
TOOL_PYTHON = shutil.which("python3") or sys.executable

# Imported by every workload: record() saves the stack of its caller, at
# the caller's current line, for the call made on that same line:
#     record(os.write(FD, b"x"))
RECORDER = textwrap.dedent("""\
    import atexit, json, sys, traceback

    _stacks = []

    def record(_=None):
        summary = traceback.extract_stack(sys._getframe(1))
        frame, qualnames = sys._getframe(1), []
        while frame is not None:
            qualnames.append(frame.f_code.co_qualname)
            frame = frame.f_back
        _stacks.append([[qualname, entry.name, entry.filename,
                         -1 if entry.lineno is None else entry.lineno]
                        for qualname, entry
                        in zip(qualnames, reversed(summary))])

    @atexit.register
    def _save():
        with open(sys.argv[1], "w") as f:
            json.dump(_stacks, f)
    """)

WRITES = textwrap.dedent("""\
    import asyncio, os, threading
    from recorder import record

    FD = 77
    os.dup2(os.open(os.devnull, os.O_WRONLY), FD)

    class Writer:
        def method(self, n):
            for _ in range(n):
                record(os.write(FD, b"m"))

    def nested():
        def inner():
            record(os.write(FD, b"i"))
        inner()
        inner()

    def generator():
        for i in range(3):
            record(os.write(FD, b"g"))
            yield i

    async def coroutine():
        record(os.write(FD, b"c"))
        await asyncio.sleep(0)
        record(os.write(FD,
                        b"multi-line call"))

    class Opened:
        # Called from Python, once specialized (CALL_ALLOC_AND_ENTER_INIT),
        # __init__ runs above the interpreter's _Py_InitCleanup frame,
        # which traceback leaves out.
        def __init__(self):
            record(os.write(FD, b"o"))

    def worker(n):
        Writer().method(n)
        nested()

    threads = [threading.Thread(target=worker, args=(n,))
               for n in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    list(generator())
    for _ in range(4):
        Opened()
    asyncio.run(coroutine())
    coro = coroutine()
    try:
        while True:
            coro.send(None)
    except StopIteration:
        pass
    """)

COLLECTIONS = textwrap.dedent("""\
    import gc
    from recorder import record

    gc.disable()

    def collect(generation):
        record(gc.collect(generation))

    class Objects:
        def churn(self):
            cycle = []
            cycle.append(cycle)
            del cycle
            collect(2)

    for generation in (0, 1, 2):
        collect(generation)
    Objects().churn()
    record(gc.collect())
    """)

GIL_WAITS = textwrap.dedent("""\
    import threading, time
    from recorder import record

    stop = False

    def spin():
        while not stop:
            pass

    def sleeper(n):
        for _ in range(n):
            record(time.sleep(0.001))

    spinner = threading.Thread(target=spin)
    spinner.start()
    sleeper(20)
    stop = True
    spinner.join()
    """)

# A function of more location-table entries than the program's old budget
# for a whole stack (--max-entries, 1000 at most), called recursively:
# every frame's line is at its end.
LONG_FUNCTION = textwrap.dedent("""\
    import gc
    from recorder import record

    gc.disable()

    def deep(n):
        x = 0
    %s
        if n:
            return deep(n - 1)
        record(gc.collect())

    for depth in (0, 7, 40):
        deep(depth)
    """) % "\n".join("    x += %d" % i for i in range(2000))

# Code objects freed and others made at their addresses while traced:
# 300 functions f, each called once and freed before the next is made, so
# that the allocator gives each the blocks of the one before: the code
# object's, its location table's (of one size).  Their name ("f", one
# object) and file name (FILE) are shared, their first line is 1; only
# the line where they call record() differs, 2 or 3 (every third on 3).
# argv[2]: how many code objects were at the address of the one before.
REUSE = textwrap.dedent("""\
    import gc, json, sys
    from recorder import record

    FILE = "<reuse>"
    LINE_2 = "def f(record, gc):\\n    record(gc.collect())\\n"
    LINE_3 = "def f(record, gc):\\n\\n    record(gc.collect())\\n"
    gc.disable()
    addresses = []
    for i in range(300):
        namespace = {}
        exec(compile(LINE_3 if i % 3 == 0 else LINE_2, FILE, "exec"),
             namespace)
        function = namespace.pop("f")
        addresses.append(id(function.__code__))
        function(record, gc)
        del function, namespace
    with open(sys.argv[2], "w") as f:
        json.dump(sum(a == b for a, b in zip(addresses, addresses[1:])), f)
    """)


def defined_by(text, function, line):
    """Whether line (from 1) of the source lines text is in a function or
    class of that name: a def or class of it at or above the line, or the
    line one of the decorators right above one (a decorated function's
    first line, where it starts)."""
    defined = re.compile(r"^\s*(async\s+def|def|class)\s+%s\b"
                         % re.escape(function))
    if any(defined.match(text[n]) for n in range(line)):
        return True
    n = line - 1
    while n < len(text) and text[n].lstrip().startswith("@"):
        n += 1
    return n < len(text) and bool(defined.match(text[n]))


def cut(text, strlen):
    """What the tool shows of a name: its last strlen - 1 bytes."""
    if len(text.encode()) <= strlen - 1:
        return text
    return "..." + text.encode()[-(strlen - 1):].decode("utf-8", "replace")


def saved_words(records, frame):
    """What a saved run (--save) holds of the code objects named like
    *frame* (a frame of --json): for each, its address, co_version, the
    length of its location table, and the instruction offsets that its
    F records gave, with their counts.  For the message of a test that
    fails on a frame's line."""
    codes = {}
    offsets = collections.defaultdict(collections.Counter)
    with open(records) as f:
        lines = f.readlines()
    for line in lines:
        fields = line.split(" ", 5)
        if fields[:2] == ["PYSTACK", "C"]:
            name, filename, _, table, _ = json.loads(fields[5])
            if name.endswith(frame["name"]) and filename.endswith(
                    frame["filename"].lstrip(".")):
                codes[int(fields[3], 16), int(fields[4])] = len(table) // 2
    for line in lines:
        fields = line.split()
        if fields[:2] != ["PYSTACK", "F"]:
            continue
        for k in range(8):
            code, word = (int(w, 16) for w in fields[6 + 2 * k:8 + 2 * k])
            key = (code, word & 0xffffffff)
            if key in codes:
                offset = word >> 33
                offset -= (offset & 0x40000000) << 1  # 31 bits, signed
                offsets[key][offset] += 1
    return "; ".join(
        "code %#x co_version %d, table of %d bytes: offsets %s" % (
            code, version, size, dict(offsets[code, version]))
        for (code, version), size in codes.items()) or (
            "no C record of that name")


class PystackTest(unittest.TestCase):

    maxDiff = None
    strlen = 128

    @classmethod
    def setUpClass(cls):
        cls.tool_error = None

    def setUp(self):
        require_bpftrace(self)
        self.tmp = tempfile.mkdtemp(prefix="usdt-stacks")
        self.addCleanup(shutil.rmtree, self.tmp)
        if PystackTest.tool_error is None:
            PystackTest.tool_error = self._tool_usable()
        if PystackTest.tool_error:
            tracer_unusable(PystackTest.tool_error)

    def _tool_usable(self):
        """"" if the tool attaches, else its error, for skipTest()."""
        noop = self.write("noop.py", "pass\n")
        proc = self.tool(["--probe", "usdt:PYTHON:python:audit",
                          "--max-depth", "1"], noop)
        if proc.returncode != 0:
            return proc.stderr.strip() or "exit %d" % proc.returncode
        return ""

    def write(self, name, text, directory=None):
        path = os.path.join(directory or self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def tool(self, options, workload, *args):
        command = [PYTHON, workload, *args]
        if any(" " in word for word in command):
            raise ValueError("bpftrace -c splits on spaces: %r" % command)
        return run([TOOL_PYTHON, TOOL, *options, "-c", " ".join(command)],
                   timeout=300)

    def workload(self, text, directory=None):
        directory = directory or self.tmp
        self.write("recorder.py", RECORDER, directory)
        return self.write("workload.py", text, directory)

    def trace(self, options, text, directory=None):
        """(the tool's stacks as a Counter, the expected ones)."""
        workload = self.workload(text, directory)
        expected = os.path.join(self.tmp, "expected.json")
        proc = self.tool(options + ["--json"], workload, expected)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # Other stacks (imports at start-up) may be too deep to decode
        # every line; none may be lost.
        self.assertNotIn("lost", proc.stderr)
        found = collections.Counter()
        for row in json.loads(proc.stdout):
            found[tuple((f["name"], f["filename"], f["line"])
                        for f in row["frames"])] = row["count"]
        with open(expected) as f:
            recorded = json.load(f)
        self.assertTrue(recorded)
        return found, recorded

    def expect(self, recorded, name_field=0):
        """The recorded stacks as the tool shows them."""
        expected = collections.Counter()
        for stack in recorded:
            expected[tuple((cut(frame[name_field], self.strlen),
                            cut(frame[2], self.strlen), frame[3])
                           for frame in stack)] += 1
        return expected

    @staticmethod
    def ending_like(found, expected):
        """The stacks of found whose innermost frame is that of one of
        the expected stacks: the hits of the recorded calls, and of others
        that the workload does not record (imports at start-up, the
        interpreter's own collections) only if they hit the same lines."""
        innermost = {stack[0] for stack in expected}
        return collections.Counter(
            {stack: count for stack, count in found.items()
             if stack[0] in innermost})

    def require_tracepoint(self, category, name):
        # bpftrace finds tracepoints in tracefs; unmounted, it only says
        # "tracepoint not found" (tools/check mounts it when run as root).
        places = ("/sys/kernel/tracing/events",
                  "/sys/kernel/debug/tracing/events")
        if not any(os.path.isdir(os.path.join(events, category, name))
                   for events in places):
            tracer_unusable("tracepoint %s:%s not in %s: tracefs is not "
                            "mounted (as root: mount -t tracefs nodev "
                            "/sys/kernel/tracing)"
                            % (category, name, " or ".join(places)))

    def test_write_stacks(self):
        self.require_tracepoint("syscalls", "sys_enter_write")
        # Threads (whose thread state is found while they do not hold the
        # GIL), a method, a nested function, a generator, coroutines run
        # by asyncio and by hand: all the writes to FD, and only them.
        found, recorded = self.trace(
            ["--probe", "tracepoint:syscalls:sys_enter_write",
             "--filter", "args->fd == 77"], WRITES)
        expected = self.expect(recorded)
        self.assertEqual(sum(expected.values()), 6 + 6 + 3 + 4 + 4)
        self.assertEqual(found, expected)
        names = {frame[0] for stack in found for frame in stack}
        self.assertTrue({"Writer.method", "nested.<locals>.inner",
                         "generator", "coroutine", "Opened.__init__"}
                        <= names, names)

    def test_write_folded_co_name(self):
        # --co-name names frames as tracebacks do; --folded prints
        # "root;...;innermost count" lines.
        self.require_tracepoint("syscalls", "sys_enter_write")
        workload = self.workload(WRITES)
        expected_path = os.path.join(self.tmp, "expected.json")
        proc = self.tool(["--probe", "tracepoint:syscalls:sys_enter_write",
                          "--filter", "args->fd == 77", "--co-name",
                          "--folded"], workload, expected_path)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(expected_path) as f:
            recorded = json.load(f)
        expected = collections.Counter()
        for stack, count in self.expect(recorded, name_field=1).items():
            expected[";".join("%s (%s:%d)" % frame
                              for frame in reversed(stack))] += count
        found = collections.Counter()
        for line in proc.stdout.splitlines():
            stack, _, count = line.rpartition(" ")
            found[stack] += int(count)
        self.assertEqual(found, expected, proc.stdout)

    def test_gc_start_deep_path(self):
        # gc__start, in a workload whose path is longer than the 127
        # bytes the tool keeps of a file name.
        deep = os.path.join(self.tmp, *["directory-%02d" % i
                                        for i in range(12)])
        os.makedirs(deep)
        self.assertGreater(len(os.path.join(deep, "workload.py")), 127)
        found, recorded = self.trace(
            ["--probe", "usdt:PYTHON:python:gc__start"], COLLECTIONS, deep)
        expected = self.expect(recorded)
        self.assertEqual(sum(expected.values()), 5)
        filename = cut(os.path.join(deep, "workload.py"), self.strlen)
        self.assertTrue(filename.startswith("..."), filename)
        self.assertEqual(self.ending_like(found, expected), expected)

    @staticmethod
    def gone_count(stderr):
        """The frames the tool's note counts as [code object gone] (those
        of code objects freed before it could read them: a module's body,
        freed once imported, in a hit during an import)."""
        found = re.search(r"usdt.stacks: (\d+) frames whose code object was "
                          r"gone", stderr)
        return int(found.group(1)) if found else 0

    def test_saved_records_keep_their_symbols(self):
        # --save keeps, after the program's records, what the tool read
        # of each code object (C records), so that --read names the
        # frames of a process long gone.  A frame whose code object is
        # not known (the same hit again under another key, its second
        # frame's code object at an address nothing was read at) is
        # counted, named [code object gone], never after another code
        # object, and sorts beside the stacks with lines (None does not
        # compare with an int).  Without --save, the records go to a
        # temporary file that the tool removes once it has counted them.
        workload = self.workload(COLLECTIONS)
        expected_path = os.path.join(self.tmp, "expected.json")
        records = os.path.join(self.tmp, "records")
        temporary = os.path.join(self.tmp, "tmpdir")
        os.mkdir(temporary)
        command = [PYTHON, workload, expected_path]
        proc = run([TOOL_PYTHON, TOOL, "--probe",
                    "usdt:PYTHON:python:gc__start", "--json", "--save",
                    records, "-c", " ".join(command)], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(expected_path) as f:
            expected = self.expect(json.load(f))
        # Objects.churn's collection: one hit, three frames deep.
        churn = [stack for stack in expected
                 if len(stack) > 1 and stack[1][0] == "Objects.churn"]
        self.assertEqual(len(churn), 1, expected)
        churn = churn[0]
        self.assertEqual(expected[churn], 1)
        with open(records) as f:
            lines = f.readlines()
        # PYSTACK C pid code version [name, filename, firstlineno, table,
        # firsttraceable]
        names = {}
        for line in lines:
            if line.startswith("PYSTACK C "):
                fields = line.split(" ", 5)
                names[int(fields[3], 16)] = json.loads(fields[5])[0]
        self.assertIn("Objects.churn", names.values())
        hits = collections.defaultdict(list)
        for line in lines:
            if line.startswith("PYSTACK ") and line.split(" ")[1] != "C":
                fields = line.split(" ")
                hits[(fields[2], fields[3])].append(fields)
        # PYSTACK F tid event pid batch, then code and word (offset,
        # entry, version) for frames 8 * batch to 8 * batch + 7: frame 1's
        # code object is field 8.
        keys = [key for key, fields in hits.items()
                if any(f[1] == "F" and f[5] == "0" and
                       names.get(int(f[8], 16)) == "Objects.churn"
                       for f in fields)]
        self.assertEqual(len(keys), 1, keys)
        copy = []
        for fields in hits[keys[0]]:
            fields = list(fields)
            if fields[1] == "F" and fields[5] == "0":
                fields[8] = "1"
            fields[3] = "1" + fields[3]
            copy.append(" ".join(fields))
        gone_before = self.gone_count(run([TOOL_PYTHON, TOOL, "--read",
                                           records]).stderr)
        with open(records, "a") as f:
            f.writelines(copy)
        gone = tuple(frame if depth != 1 else ("[code object gone]", "",
                                               None)
                     for depth, frame in enumerate(churn))
        for options in (["--json"], []):
            proc = run([TOOL_PYTHON, TOOL, "--read", records, *options])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertNotIn("Traceback", proc.stderr)
            self.assertEqual(self.gone_count(proc.stderr), gone_before + 1,
                             proc.stderr)
            if options:
                found = collections.Counter()
                for row in json.loads(proc.stdout):
                    found[tuple((f["name"], f["filename"], f["line"])
                                for f in row["frames"])] = row["count"]
                self.assertEqual(found[churn], 1, proc.stdout)
                self.assertEqual(found[gone], 1, proc.stdout)
            else:
                text = "    %s (%s:%d)\n" % churn[1]
                self.assertEqual(proc.stdout.count(text), 1, proc.stdout)
                self.assertIn("    %s (%s:%d)\n    [code object gone]\n"
                              % churn[0], proc.stdout)
        # Without --save: no records left behind after counting.
        proc = run([TOOL_PYTHON, TOOL, "--probe",
                    "usdt:PYTHON:python:gc__start", "--json",
                    "-c", " ".join(command)], timeout=300,
                   env=dict(os.environ, TMPDIR=temporary))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(os.listdir(temporary), [])

    def test_lines_equal_traceback_in_long_functions(self):
        # Lines are decoded without a budget: at every depth of a
        # recursion through a function of 2,000 location-table entries,
        # each frame's line is traceback's, and no frame lacks one.
        found, recorded = self.trace(
            ["--probe", "usdt:PYTHON:python:gc__start"], LONG_FUNCTION)
        expected = self.expect(recorded)
        self.assertEqual(sum(expected.values()), 3)
        self.assertEqual(max(len(stack) for stack in expected), 42)
        self.assertEqual(self.ending_like(found, expected), expected)

    def test_reused_code_address_never_misnames(self):
        # 300 code objects made, sampled, and freed in turn, most at the
        # address of the one before, with the same name, file and first
        # line: each frame has the line of its own code object, or is
        # [code object gone] when that was freed before the tool could
        # read it, never another one's line.
        if free_threaded():
            self.skipTest("the free-threaded build frees code objects "
                          "only in its collector, which the workload "
                          "keeps off (deferred reference counts; and "
                          "3.13 makes them immortal once a thread has "
                          "started, gh-117696): no address is reused")
        workload = self.workload(REUSE)
        expected_path = os.path.join(self.tmp, "expected.json")
        reused_path = os.path.join(self.tmp, "reused.json")
        proc = self.tool(["--probe", "usdt:PYTHON:python:gc__start",
                          "--json"], workload, expected_path, reused_path)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(reused_path) as f:
            self.assertGreater(json.load(f), 100)
        with open(expected_path) as f:
            recorded = json.load(f)
        self.assertEqual(len(recorded), 300)
        caller = tuple(recorded[0][1][1:])
        expected = collections.Counter(tuple(stack[0][1:])
                                       for stack in recorded)
        self.assertEqual(expected, {("f", "<reuse>", 3): 100,
                                    ("f", "<reuse>", 2): 200})
        named = collections.Counter()
        gone = 0
        for row in json.loads(proc.stdout):
            frames = [(f["name"], f["filename"], f["line"])
                      for f in row["frames"]]
            if len(frames) != 2 or frames[1] != caller:
                continue
            if frames[0] == ("[code object gone]", "", None):
                gone += row["count"]
            else:
                named[frames[0]] += row["count"]
        self.assertEqual(sum(named.values()) + gone, 300, proc.stdout)
        self.assertEqual(named - expected, collections.Counter())
        # The tool's records tell each hit's line apart: none is named
        # after a code object that the record did not name.
        self.assertTrue(named, proc.stderr)

    def test_real_application_every_line(self):
        # A real application that no one here wrote, sampled at 99 Hz
        # (tests/data/real_app.py: docutils renders the first 150 lines
        # of the howto, pygments highlights a Python file in asyncio's
        # worker threads; Debian's packages): every frame has a line, in
        # a function of that name in its file.  The one exception, a
        # documented limit: a module or class body that an import ran and
        # freed before the tool read it, [code object gone].
        app = os.path.join(self.tmp, "app")
        os.mkdir(app)
        for name in ("docutils", "pygments", "roman.py"):
            source = os.path.join("/usr/lib/python3/dist-packages", name)
            if not os.path.exists(source):
                message = ("no %s: install python3-docutils and "
                           "python3-pygments (make does, as root)" % source)
                if tracer_required():
                    self.fail(message)
                self.skipTest(message)
            # Copies, not links: a -c command of tools/bpftrace SUITE
            # runs in that root, whose /usr has no such package.
            copy = shutil.copytree if os.path.isdir(source) else (
                shutil.copy2)
            copy(source, os.path.join(app, name))
        command = [PYTHON, os.path.join(TOP, "tests", "data", "real_app.py"),
                   os.path.join(TOP, "overlay", "Doc", "howto",
                                "instrumentation.rst"), "150",
                   os.path.join(TOP, "overlay", "Lib", "usdt",
                                "_bpftrace.py")]
        if any(" " in word for word in command):
            raise ValueError("bpftrace -c splits on spaces: %r" % command)
        counts = os.path.join(self.tmp, "counts.json")
        records = os.path.join(self.tmp, "records")
        proc = run([TOOL_PYTHON, TOOL, "--probe", "profile:hz:99", "--json",
                    "--max-depth", "512", "--output", counts,
                    "--save", records, "-c", " ".join(command)],
                   timeout=300, env=dict(os.environ, PYTHONPATH=app))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("lost", proc.stderr)
        # The application did its work (its one line).
        self.assertRegex(proc.stdout, r"rendered \d+ bytes of XML, "
                         r"highlighted \d+")
        with open(counts) as f:
            rows = json.load(f)
        self.assertGreaterEqual(sum(row["count"] for row in rows), 50,
                                proc.stderr)
        sources = {}
        seen = collections.Counter()
        for row in rows:
            frames = row["frames"]
            for i, frame in enumerate(frames):
                name, filename, line = (frame["name"], frame["filename"],
                                        frame["line"])
                if name == "[code object gone]":
                    # A module or class body that an import ran (a frozen
                    # module's: FrozenImporter.exec_module), or that the
                    # interpreter ran from C at start-up (importlib's own:
                    # no Python frame outside it).
                    outer = {f["name"] for f in frames[i + 1:]}
                    self.assertTrue(
                        outer & {"_call_with_frames_removed",
                                 "FrozenImporter.exec_module"}
                        or outer <= {"[code object gone]"}, row)
                    continue
                if name in ("[no Python frame]", "[no Python thread state]",
                            "[not this Python]"):
                    # A thread that runs no Python (or the -c command
                    # before it became the interpreter): the whole stack.
                    self.assertEqual(len(frames), 1, row)
                    continue
                if not isinstance(line, int):
                    self.fail("%r in %r: %s" % (frame, row, saved_words(
                        records, frame)))
                if filename.startswith(app):
                    seen[filename[len(app):].split(os.sep)[1]] += 1
                if not os.path.isfile(filename):
                    continue  # <frozen ...>, or a name cut at --strlen
                if filename not in sources:
                    with open(filename, encoding="utf-8") as f:
                        sources[filename] = f.read().splitlines()
                text = sources[filename]
                # Line 0: a module's first instruction (RESUME), as
                # PyCode_Addr2Line() and f_lineno give it.
                if not 0 <= line <= len(text):
                    self.fail("%r, %d lines: %s" % (frame, len(text),
                                                   saved_words(records,
                                                               frame)))
                self.assertTrue(line or name == "<module>", frame)
                function = name.rsplit(".", 1)[-1]
                if function.startswith("<"):
                    continue  # <module>, <lambda>, <genexpr>...
                self.assertTrue(defined_by(text, function, line), frame)
        self.assertTrue(seen["docutils"] and seen["pygments"], seen)

    def test_gil_waits(self):
        # The thread that takes the GIL back after time.sleep(); the
        # gil__take__start marker where the build has it, else a uprobe
        # on take_gil().
        if free_threaded():
            self.skipTest("the free-threaded build takes no GIL")
        if any(provider == "python" and name == "gil__take__start"
               for provider, name, _ in stapsdt_notes(PYTHON)):
            probe = "usdt:PYTHON:python:gil__take__start"
        else:
            probe = "uprobe:PYTHON:take_gil"
        found, recorded = self.trace(["--probe", probe], GIL_WAITS)
        expected = self.expect(recorded)
        self.assertEqual(sum(expected.values()), 20)
        self.assertEqual(self.ending_like(found, expected), expected)

    def test_attach_to_pid(self):
        # -p PID: the tool attaches to a running interpreter.  The probe's
        # semaphore is set when bpftrace creates the uprobe, which can be
        # seconds before the kernel has verified and attached the program,
        # so the workload collects in warm_up() until the tool has saved a
        # record (--save), and only then makes its 3 counted collections.
        # SIGINT stops the tool; bpftrace reads what its buffers still hold
        # before it exits, and the tool then prints.
        workload = self.workload(textwrap.dedent("""\
            import gc, sys, threading, time
            from recorder import record

            def warm_up():
                gc.collect()

            def collect():
                record(gc.collect())

            go = threading.Event()
            threading.Thread(target=lambda: (sys.stdin.readline(), go.set()),
                             daemon=True).start()
            print("ready", flush=True)
            while not go.is_set():
                warm_up()
                time.sleep(0.02)
            for _ in range(3):
                collect()
            print("done", flush=True)
            sys.stdin.readline()
            """))
        expected_path = os.path.join(self.tmp, "expected.json")
        records = os.path.join(self.tmp, "records")
        target = start(self, [PYTHON, workload, expected_path],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.assertEqual(readline(target.stdout, 60, "the gc workload did "
                                  "not say 'ready'"), "ready\n")
        tool = start(self, [TOOL_PYTHON, TOOL, "--probe",
                            "usdt:PYTHON:python:gc__start", "--json",
                            "--save", records, "-p", str(target.pid)],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def saved(kind):
            """How many saved records are of *kind* (the program's
            records name code objects by address, not by name)."""
            if not os.path.exists(records):
                return 0
            with open(records, errors="replace") as f:
                return sum(1 for line in f
                           if line.startswith("PYSTACK %s " % kind))

        # gc__start hits in warm_up() (or a collection of the
        # interpreter's own): the program is attached.
        self.assertTrue(self.wait_for(lambda: saved("Z") > 0, tool),
                        tool.poll() is not None and tool.stderr.read())
        target.stdin.write("go\n")
        target.stdin.flush()
        self.assertEqual(readline(target.stdout, 60, "the gc workload did "
                                  "not say 'done'"), "done\n")
        tool.send_signal(signal.SIGINT)
        stdout, stderr = tool.communicate(timeout=60)
        target.stdin.write("exit\n")
        target.stdin.flush()
        target.wait(timeout=60)
        with open(expected_path) as f:
            expected = self.expect(json.load(f))
        found = collections.Counter()
        for row in json.loads(stdout):
            if row["frames"][0]["name"] == "warm_up":
                continue
            found[tuple((f["name"], f["filename"], f["line"])
                        for f in row["frames"])] = row["count"]
        self.assertEqual(sum(expected.values()), 3)
        self.assertEqual(found, expected, stderr)

    def test_duration_counts_from_attach(self):
        # --duration S: the tool stops S seconds after bpftrace has
        # attached (its ATTACHED_CLAUSE record), by itself, and prints.
        # The workload collects every 20 ms; some collections are counted,
        # and the attach record is there once.
        workload = self.workload(textwrap.dedent("""\
            import gc, time
            print("ready", flush=True)
            while True:
                gc.collect(0)
                time.sleep(0.02)
            """))
        target = start(self, [PYTHON, workload], stdout=subprocess.PIPE)
        self.assertEqual(readline(target.stdout, 60, "the workload did "
                                  "not say 'ready'"), "ready\n")
        records = os.path.join(self.tmp, "records")
        proc = run([TOOL_PYTHON, TOOL, "--probe",
                    "usdt:PYTHON:python:gc__start", "--json", "--save",
                    records, "--duration", "1", "-p", str(target.pid)],
                   timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertGreater(sum(row["count"] for row in
                               json.loads(proc.stdout)), 0, proc.stderr)
        with open(records) as f:
            kinds = [line.split(" ")[1] for line in f
                     if line.startswith("PYSTACK ")]
        self.assertEqual(kinds.count("B"), 1, kinds)
        proc = run([TOOL_PYTHON, TOOL, "--probe", "x", "-p", "1",
                    "--duration", "0"])
        self.assertEqual(proc.returncode, 2)
        self.assertIn("--duration must be more than 0", proc.stderr)

    @staticmethod
    def wait_for(condition, tool, timeout=60):
        """Poll *condition* while the tool runs; False after *timeout* s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and tool.poll() is None:
            if condition():
                return True
            time.sleep(0.05)
        return condition()

    def test_max_entries_has_no_effect(self):
        # Lines are decoded in user space, without a budget: the scripts
        # that give --max-entries still run, with any value.
        proc = self.tool(["--probe", "usdt:PYTHON:python:audit",
                          "--max-entries", "100000"],
                         self.write("noop.py", "pass\n"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("--max-entries N       no effect", run(
            [TOOL_PYTHON, TOOL, "--help"]).stdout)

    def test_print_program(self):
        # The program shows its offsets by name, and needs no target.
        proc = run([TOOL_PYTHON, TOOL, "--probe",
                    "usdt:PYTHON:python:gc__start", "--python", PYTHON,
                    "--print-program"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("usdt:%s:python:gc__start" % os.path.realpath(PYTHON),
                      proc.stdout)
        self.assertIn("#define COOKIE                 0x7970677562656478",
                      proc.stdout)


class PystackOffsetsTest(unittest.TestCase):
    """What the tool reads from the interpreter's ELF file, compared with
    what the interpreter says about itself."""

    def test_offsets_and_runtime(self):
        proc = run([TOOL_PYTHON, "-c", IMPORT_USDT + textwrap.dedent("""\
            import json
            from usdt.stacks.offsets import Interpreter
            i = Interpreter(sys.argv[2])
            print(json.dumps([i.version, i.runtime_vaddr, i.tls_offset,
                              i.text_vaddr]))
            """), USDT_PACKAGE, PYTHON])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        version, runtime, tls, text = json.loads(proc.stdout)
        proc = run([PYTHON, "-c", "import sys; print(sys.hexversion)"])
        self.assertEqual(version, int(proc.stdout))
        symbols = run(["readelf", "-sW", PYTHON]).stdout
        self.assertIn("%016x" % runtime, symbols)
        self.assertGreater(tls, 0)
        self.assertGreater(text, 0)

    def test_unknown_layout(self):
        # A copy of the interpreter whose _Py_DebugOffsets say 3.99: the
        # tool names the version it found and the ones it knows.
        with open(PYTHON, "rb") as f:
            data = bytearray(f.read())
        # _PyRuntime's cookie: the one followed by a 3.13 version.
        cookies = []
        i = data.find(b"xdebugpy")
        while i != -1:
            if int.from_bytes(data[i + 8:i + 16], "little") >> 16 == 0x030d:
                cookies.append(i)
            i = data.find(b"xdebugpy", i + 1)
        self.assertEqual(len(cookies), 1, cookies)
        cookie = cookies[0]
        version = int.from_bytes(data[cookie + 8:cookie + 16], "little")
        data[cookie + 8:cookie + 16] = ((0x0363 << 16) | (version & 0xffff)
                                        ).to_bytes(8, "little")
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "python")
            with open(copy, "wb") as f:
                f.write(data)
            os.chmod(copy, 0o755)
            proc = run([TOOL_PYTHON, TOOL, "--probe", "BEGIN", "--python",
                        copy, "--print-program"])
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("usdt.stacks: %s is Python 3.99: this tool knows the "
                      "_Py_DebugOffsets layout of 3.13 only" % copy,
                      proc.stderr)

    def test_not_an_interpreter(self):
        proc = run([TOOL_PYTHON, TOOL, "--probe", "BEGIN", "--python",
                    "/bin/true", "--print-program"])
        self.assertEqual(proc.returncode, 2)
        self.assertIn("usdt.stacks: ", proc.stderr)
        self.assertIn("no .PyRuntime section", proc.stderr)


if __name__ == "__main__":
    unittest.main()
