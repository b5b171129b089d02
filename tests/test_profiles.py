"""usdt.profiles and usdt.tools --pprof/--speedscope, read by the real
readers: pprof built from Debian's packages of its Go source, and the
speedscope app from npm in Debian's chromium, headless (tools/readers
makes both once, in build/readers).

pprof's -raw gives each sample's values and locations, its -top the
totals and per-function flat and cumulative values, its -traces each
stack: all must equal the folded stacks the same run printed, exactly.
speedscope's sandwich view lists every function with its total and self
weight, which must equal the folded stacks' too, and its picture must not
be blank.  Where a reader cannot be made, the tests skip with the reason,
and fail under CI.
"""

import collections
import fractions
import functools
import gzip
import http.server
import os
import re
import shutil
import tempfile
import threading
import time
import unittest

import chromium
from support import (PYTHON, TOP, USDT_PACKAGE, require_bpftrace, run,
                     tracer_required, tracer_unusable)

READERS = os.path.join(TOP, "tools", "readers")
_readers = {}


def reader(name):
    """The path of a reader that tools/readers made, or skip (fail under
    CI) with its reason."""
    if name not in _readers:
        proc = run([READERS, name], timeout=900)
        _readers[name] = (proc.stdout.strip() if proc.returncode == 0
                          else None,
                          (proc.stderr.strip().splitlines() or
                           ["exit %d" % proc.returncode])[-1])
    path, reason = _readers[name]
    if path is None:
        tracer_unusable("tools/readers %s: %s" % (name, reason))
    return path


def parse_folded(text):
    stacks = []
    for line in text.splitlines():
        if line.strip():
            stack, _, count = line.rpartition(" ")
            stacks.append((stack.split(";"), int(count)))
    return stacks


FRAME = re.compile(r"^(?P<name>.*) \((?P<file>.*):(?P<line>-?\d+|\?)\)$")
NATIVE = re.compile(r"^(?P<name>.*) \((?P<library>[^():]+)\)$")


def frame_name(frame):
    """The function name a reader shows for a frame of folded stacks."""
    match = FRAME.match(frame) or NATIVE.match(frame)
    return match.group("name") if match else frame


def by_function(stacks):
    """{name: [flat, cum]} of folded stacks, as pprof -top and
    speedscope's sandwich view count them: flat where the function is
    the leaf, cum once per stack that holds it."""
    values = collections.defaultdict(lambda: [0, 0])
    for frames, count in stacks:
        names = [frame_name(frame) for frame in frames]
        values[names[-1]][0] += count
        for name in set(names):
            values[name][1] += count
    return dict(values)


class Pprof:
    """pprof's views of one file."""

    def __init__(self, testcase, path):
        self.testcase = testcase
        self.binary = reader("pprof")
        self.path = path

    def view(self, *options):
        proc = run([self.binary, *options, self.path], timeout=120)
        self.testcase.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def raw(self):
        """(sample types, [(frames root first, values)]): -raw's samples,
        each location written back as the tools write frames."""
        text = self.view("-raw")
        types = None
        samples = []
        locations = {}
        section = None
        for line in text.splitlines():
            if line in ("Samples:", "Locations", "Mappings"):
                section = line
                continue
            if section == "Samples:":
                if types is None:
                    types = line.split()
                    continue
                match = re.match(r"^\s+([\d\s]+): ([\d ]+)\s*$", line)
                if match:
                    samples.append(([int(v) for v in match.group(1).split()],
                                    [int(i) for i in match.group(2).split()]))
            elif section == "Locations":
                # "N: 0x0 M=1 NAME FILE:LINE s=START(SYSTEM NAME)", the
                # system name "FILE:NAME" where the frame has a file (and
                # names and files may hold spaces and colons).
                match = re.match(r"^\s+(\d+): 0x0 M=\d+ (.*):(\d+) "
                                 r"s=\d+(?:\((.*)\))?$", line)
                if match:
                    number, both, line_no, system = match.groups()
                    name, filename = both[:-1], ""
                    for at in range(len(both)):
                        if both[at] == " " and system == "%s:%s" % (
                                both[at + 1:], both[:at]):
                            name, filename = both[:at], both[at + 1:]
                    locations[int(number)] = (name, filename, int(line_no))
        rows = []
        for values, ids in samples:
            rows.append(([locations[i] for i in reversed(ids)], values))
        return types, rows

    def top(self, index, unit):
        """(total, {name: [flat, cum]}) of -top at sample index, in the
        unit's smallest measure (pprof -unit: ns, B; counts as they
        are, with pprof's "ns" after them)."""
        text = self.view("-top", "-nodecount=100000", "-nodefraction=0",
                         "-edgefraction=0", "-sample_index=%s" % index,
                         "-unit=%s" % ("B" if unit == "bytes" else "ns"))
        match = re.search(r"accounting for (\d+)[a-zA-Z]*, 100% of "
                          r"(\d+)[a-zA-Z]* total", text)
        self.testcase.assertIsNotNone(match, text)
        total = int(match.group(2))
        functions = {}
        for line in text.splitlines():
            match = re.match(r"^\s*(\d+)[a-zA-Z]*\s+[\d.]+%\s+[\d.]+%\s+"
                             r"(\d+)[a-zA-Z]*\s+[\d.]+%\s+(.*)$", line)
            if match:
                functions[match.group(3)] = [int(match.group(1)),
                                             int(match.group(2))]
        return total, functions

    def traces(self, unit):
        """Counter of (names root first) -> value of -traces, of the
        last sample type (in unit's smallest measure, as top())."""
        counts = collections.Counter()
        text = self.view("-traces", "-unit=%s" % ("B" if unit == "bytes"
                                                    else "ns"))
        for block in text.split("-----------+")[1:]:
            lines = [line for line in block.splitlines()
                     if line.strip() and not line.startswith("-")]
            if not lines:
                continue
            value, _, first = lines[0].strip().partition(" ")
            names = [first.strip()] + [line.strip() for line in lines[1:]]
            counts[tuple(reversed(names))] += int(
                re.match(r"\d+", value).group())
        return counts


def expected_location(frame):
    match = FRAME.match(frame)
    if match:
        line = match.group("line")
        return (match.group("name"), match.group("file"),
                0 if line in ("?", "-1") else int(line))
    match = NATIVE.match(frame)
    if match:
        return (match.group("name"), "", 0)
    return (frame, "", 0)


class ReaderChecks:
    """Checks of a pprof file and a speedscope file against the folded
    stacks they were made of."""

    def check_pprof(self, path, folded, types, scale=(1,), total_index=0,
                    default_index=None):
        """The file's samples against the folded stacks: the first
        len(scale) values of each (the rest, alloc's objects, are not
        the folded counts': test_alloc_objects checks them).  The file
        names types[default_index] its default sample type (pprof marks
        it [dflt]), or, with None, none (pprof's default: the last)."""
        stacks = parse_folded(folded)
        self.assertTrue(stacks, "no stacks to check")
        with open(path, "rb") as f:
            self.assertEqual(f.read(2), b"\x1f\x8b", "not gzipped")
        pprof = Pprof(self, path)
        got_types, rows = pprof.raw()
        marked = ["%s/%s" % t for t in types]
        if default_index is not None:
            marked[default_index] += "[dflt]"
        else:
            default_index = -1
        self.assertEqual(got_types, marked)
        expected = collections.Counter()
        for frames, count in stacks:
            key = tuple(expected_location(frame) for frame in frames)
            expected[key, tuple(count * f for f in scale)] += 1
        for frames, values in rows:
            self.assertEqual(len(values), len(types), frames)
        got = collections.Counter((tuple(frames), tuple(values[:len(scale)]))
                                  for frames, values in rows)
        self.assertEqual(got, expected)
        # -top: the total and each function's flat and cum values.
        total, functions = pprof.top(*types[total_index])
        factor = scale[total_index]
        self.assertEqual(total, factor * sum(c for _, c in stacks))
        want = {name: [flat * factor, cum * factor]
                for name, (flat, cum) in by_function(stacks).items()}
        self.assertEqual(functions, want)
        # -traces: each stack, by its function names.
        traces = collections.Counter()
        for frames, count in stacks:
            traces[tuple(frame_name(f) for f in frames)] += (
                count * scale[default_index])
        self.assertEqual(pprof.traces(types[default_index][1]), traces)

    def check_speedscope(self, path, folded):
        executable = chromium.find()
        if executable is None:
            tracer_unusable("chromium not found (apt-get install chromium)")
        app = reader("speedscope")
        site = os.path.join(self.tmp, "site")
        shutil.copytree(app, site)
        shutil.copy(path, os.path.join(site, "profile.json"))
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(QuietHandler,
                                                directory=site))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.server_close)
        self.addCleanup(server.shutdown)
        try:
            browser = chromium.Browser(executable)
        except (chromium.BrowserError, OSError) as error:
            tracer_unusable("chromium: %s" % error)
        self.addCleanup(browser.close)
        # Tall enough for every row of the table, which draws only those
        # in view.
        browser.command("Emulation.setDeviceMetricsOverride", width=1200,
                        height=6000, deviceScaleFactor=1, mobile=False)
        base = "http://127.0.0.1:%d/" % server.server_address[1]
        browser.command("Page.navigate", url=base + "index.html#profileURL="
                        + base + "profile.json&view=sandwich")
        # The sandwich view's table: a row per function, "TOTAL (P%)
        # SELF (P%) NAME"; counts as they are, bytes and nanoseconds
        # with a unit and two decimals ("78.31 MB", "1.50ms").
        want = by_function(parse_folded(folded))
        value = r"([\d.]+ ?(?:[a-zA-Z\u00b5]+)?)"
        deadline = time.monotonic() + 60
        while True:
            text = browser.evaluate("document.body ? "
                                    "document.body.innerText : ''")
            rows = re.findall(value + r" \([^)]*\)\s+" + value +
                              r" \([^)]*\)\s+([^\n]+)", text)
            if len(rows) >= len(want) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        got = collections.defaultdict(lambda: [0, 0, 0])
        for total, own, name in rows:
            # speedscope keeps one row per frame (name, file, line):
            # summed by name, as pprof's -top counts; each row's value
            # is exact to half its last digit.
            own, error = shown_value(own)
            got[name.strip()][0] += own
            got[name.strip()][1] = max(got[name.strip()][1],
                                       shown_value(total)[0])
            got[name.strip()][2] += error
        self.assertEqual(sorted(got), sorted(want), text[:2000])
        for name, (flat, cum) in want.items():
            self.assertLessEqual(abs(got[name][0] - flat), got[name][2],
                                 (name, got[name], flat))
        png = browser.screenshot(1200, 600)
        width, height, channels, pixels = chromium.png_pixels(png)
        colors = {bytes(row[i:i + 3]) for row in pixels[::10]
                  for i in range(0, len(row), 4 * channels)}
        self.assertGreater(len(colors), 5, "a blank picture")


# speedscope's units: its byte formatter's (powers of 1,024) and its
# time formatter's for nanoseconds.
SHOWN_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3,
               "ns": 1, "\u00b5s": 10 ** 3, "us": 10 ** 3, "ms": 10 ** 6,
               "s": 10 ** 9, "min": 60 * 10 ** 9}


def shown_value(text):
    """(value, how far it may be from the exact one) of a value as
    speedscope shows it: an integer count, or a number with a unit."""
    match = re.fullmatch(r"([\d.]+) ?(\S*)", text.strip())
    number, unit = match.groups()
    factor = SHOWN_UNITS[unit]
    # Fractions, exact: a value on the boundary, 8125 ns shown "8.13ms"
    # (8130 +- 5), is in, which floats (8130.000000000001) put out.
    if "." not in number:
        return int(number) * factor, (0 if factor == 1
                                      else fractions.Fraction(factor, 2))
    decimals = len(number.partition(".")[2])
    return (fractions.Fraction(number) * factor,
            fractions.Fraction(factor, 2 * 10 ** decimals))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


# Frames of every kind the tools print: Python frames with a line, one
# without ("?"), names pprof would take for C++ (<module>, <locals>),
# non-ASCII names, native frames, py:: frames, pseudo-frames.
FOLDED = """\
<module> (/srv/app/main.py:12);serve (/srv/app/main.py:40);handle.<locals>.<lambda> (/srv/app/h.py:7) 5
<module> (/srv/app/main.py:12);serve (/srv/app/main.py:41);réponse (/srv/app/h.py:90) 3
<module> (/srv/app/main.py:12);serve (/srv/app/main.py:41) 1
<module> (/srv/app/main.py:12);lost (/srv/app/main.py:?) 2
_start (python3.13);main (python3.13);py::<module> (/srv/app/main.py:12);PyObject_Vectorcall (python3.13);__GI___send (libc.so.6) 4
[not this Python] 6
"""


class EncoderTest(ReaderChecks, unittest.TestCase):
    """usdt.profiles on made-up stacks of every kind of frame."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="profiles")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, *args):
        folded = os.path.join(self.tmp, "stacks.folded")
        with open(folded, "w", encoding="utf-8") as f:
            f.write(FOLDED)
        proc = run([PYTHON, os.path.join(USDT_PACKAGE, "profiles.py"),
                    folded, *args], timeout=60)
        return proc

    def test_pprof(self):
        path = os.path.join(self.tmp, "cpu.pb.gz")
        proc = self.write("--pprof", path, "--sample-type", "cpu/nanoseconds",
                          "--period-type", "cpu/nanoseconds", "--period",
                          "10101010")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_pprof(path, FOLDED, [("cpu", "nanoseconds")])
        text = Pprof(self, path).view("-raw")
        self.assertIn("PeriodType: cpu nanoseconds\nPeriod: 10101010\n",
                      text)
        # The native frames' libraries are mappings.
        self.assertRegex(text, r"\n\d+: 0x0/0x0/0x0 libc\.so\.6 ")

    def test_speedscope(self):
        path = os.path.join(self.tmp, "cpu.json")
        proc = self.write("--speedscope", path)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.check_speedscope(path, FOLDED)

    def test_refusals(self):
        for args, message in (
                ((), "nothing to write: give --pprof FILE or --speedscope "
                 "FILE"),
                (("--pprof", os.path.join(self.tmp, "no", "x.pb.gz")),
                 "--pprof %s: no directory %s"
                 % (os.path.join(self.tmp, "no", "x.pb.gz"),
                    os.path.join(self.tmp, "no"))),
                (("--pprof", self.tmp), "--pprof %s: is a directory"
                 % self.tmp),
                (("--pprof", os.path.join(self.tmp, "x"), "--sample-type",
                  "cpu"), "--sample-type 'cpu': write TYPE/UNIT")):
            with self.subTest(args=args):
                proc = self.write(*args)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn("usdt.profiles: " + message, proc.stderr)


WORKLOAD = """\
import sys
def leaf(n):
    total = 0
    for i in range(n):
        total += i * i
    return total
def middle():
    return sum(leaf(3000) for _ in range(20))
class Holder:
    def __init__(self):
        self.data = [bytearray(256) for _ in range(40)]
keep = []
for _ in range(int(sys.argv[1])):
    middle()
    keep.append(Holder())
    open(__file__).close()
"""


class ToolsTest(ReaderChecks, unittest.TestCase):
    """usdt.tools --pprof and --speedscope: one run writes the folded
    stacks and both files, of the same samples."""

    def setUp(self):
        require_bpftrace(self)
        self.tmp = tempfile.mkdtemp(prefix="profiles")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.workload = os.path.join(self.tmp, "workload.py")
        with open(self.workload, "w") as f:
            f.write(WORKLOAD)

    def tool(self, *args, rounds=150):
        files = {name: os.path.join(self.tmp, name)
                 for name in ("folded", "pb.gz", "json")}
        proc = run([PYTHON, "-m", "usdt.tools", *args, "-c",
                    "%s %s %d" % (PYTHON, self.workload, rounds),
                    "-o", files["folded"], "--pprof", files["pb.gz"],
                    "--speedscope", files["json"]], timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(files["folded"], encoding="utf-8") as f:
            folded = f.read()
        self.assertTrue(folded.strip(), proc.stderr)
        return files, folded

    def test_profile(self):
        files, folded = self.tool("profile", "--hz", "199")
        period = 10 ** 9 // 199
        self.check_pprof(files["pb.gz"], folded,
                         [("samples", "count"), ("cpu", "nanoseconds")],
                         scale=(1, period))
        self.assertIn("Period: %d\n" % period,
                      Pprof(self, files["pb.gz"]).view("-raw"))
        self.check_speedscope(files["json"], folded)

    def test_stacks(self):
        files, folded = self.tool(
            "stacks", "--probe", "tracepoint:syscalls:sys_enter_openat",
            "--folded", rounds=30)
        self.check_pprof(files["pb.gz"], folded, [("hits", "count")])
        self.check_speedscope(files["json"], folded)

    def test_alloc(self):
        files, folded = self.tool("alloc", "--folded", rounds=60)
        self.check_pprof(files["pb.gz"], folded,
                         [("alloc_space", "bytes"),
                          ("alloc_objects", "count")], default_index=0)
        self.check_speedscope(files["json"], folded)

    def test_alloc_objects(self):
        # alloc_objects against the allocations the program made: N
        # bytes objects of 4,000 bytes at one line (one allocation of
        # 4,033 bytes each) and N of 200 at another, sampled every 64 KiB
        # on average: about 2,400 and 120 samples, so the estimates are
        # within 2 % and 9 % of N (one standard deviation).
        workload = os.path.join(self.tmp, "objects.py")
        with open(workload, "w") as f:
            f.write("import sys\n"
                    "def large(n):\n"
                    "    for i in range(n):\n"
                    "        b = bytes(4000)\n"
                    "def small(n):\n"
                    "    for i in range(n):\n"
                    "        b = bytes(200)\n"
                    "large(int(sys.argv[1]))\n"
                    "small(int(sys.argv[1]))\n")
        n = 40000
        path = os.path.join(self.tmp, "objects.pb.gz")
        proc = run([PYTHON, "-m", "usdt.tools", "alloc", "--folded", "-c",
                    "%s -X usdt_alloc_interval=65536 %s %d"
                    % (PYTHON, workload, n), "--pprof", path,
                    "-o", os.path.join(self.tmp, "folded")], timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # Records lost by bpftrace are samples missing from the counts.
        self.assertNotIn("records lost", proc.stderr)
        types, rows = Pprof(self, path).raw()
        self.assertEqual(types, ["alloc_space/bytes[dflt]",
                                 "alloc_objects/count"])
        objects = collections.Counter()
        for frames, values in rows:
            objects[frames[-1][0], frames[-1][2]] += values[1]
        for where, tolerance in ((("large", 4), 0.1), (("small", 7), 0.4)):
            with self.subTest(where=where):
                self.assertLess(abs(objects[where] - n), tolerance * n,
                                objects)

    def test_alloc_tables(self):
        # Without --folded the counts are alloc's tables, and usdt.stacks
        # writes the stacks a second time, folded, for the pprof file:
        # its total is the tables' total.
        path = os.path.join(self.tmp, "alloc.pb.gz")
        proc = run([PYTHON, "-m", "usdt.tools", "alloc", "-c",
                    "%s %s 60" % (PYTHON, self.workload), "--pprof", path],
                   timeout=600)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        total = re.search(r"^Bytes allocated: ([\d,]+) ", proc.stdout,
                          re.M)
        self.assertIsNotNone(total, proc.stdout)
        self.assertEqual(Pprof(self, path).top("alloc_space", "bytes")[0],
                         int(total.group(1).replace(",", "")))

    def test_latency(self):
        files, folded = self.tool("latency", "--folded", rounds=30)
        self.check_pprof(files["pb.gz"], folded, [("wall", "nanoseconds")])
        # The frames' lines are the functions' first lines.
        text = Pprof(self, files["pb.gz"]).view("-raw")
        self.assertRegex(text, r" leaf \S+workload\.py:2 s=2\b")
        self.check_speedscope(files["json"], folded)

    def test_refused_before_tracing(self):
        started = time.monotonic()
        proc = run([PYTHON, "-m", "usdt.tools", "profile", "-c",
                    "%s %s 1" % (PYTHON, self.workload), "--pprof",
                    os.path.join(self.tmp, "missing", "cpu.pb.gz")],
                   timeout=120)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("usdt.tools profile: --pprof %s: no directory"
                      % os.path.join(self.tmp, "missing", "cpu.pb.gz"),
                      proc.stderr)
        self.assertNotIn("Attaching", proc.stderr)
        self.assertLess(time.monotonic() - started, 30)


if __name__ == "__main__":
    unittest.main()
