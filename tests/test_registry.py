"""The probe registry, series/SERIES/probes.tsv, against the tree and the
built interpreter.

Every marker of the build is in it and nothing else, with its kind and
number of arguments as the stapsdt notes give them; for each: its howto
entry (an ".. object::" of Doc/howto/instrumentation.rst with the same
arguments), whether upstream declares it (pristine Include/pydtrace.d), the
C file that fires it, the patch that adds its hook, every ready script of
Lib/usdt/scripts that uses it (per tracer, in that tracer's spelling, all of
them), the usdt.tools tools that trace it, and at least one test module
that tests it by name or through one of its scripts.  A probe that loses
its doc, a script or a test fails here.
"""

import glob
import os
import re
import unittest

from support import (PYTHON, SERIES, TOP, registry, stapsdt_notes,
                     usdt_module)

USDT = os.path.join(TOP, "overlay", "Lib", "usdt", "scripts")
HOWTO = os.path.join(TOP, "overlay", "Doc", "howto", "instrumentation.rst")
PATCHES = os.path.join(TOP, "series", SERIES, "patches")
TOOLS_PY = os.path.join(TOP, "overlay", "Lib", "usdt", "tools.py")
# The C files of the glue: the watcher (pydtrace_arming.c) and the
# helpers it asks whether their probes are armed.
GLUE = os.path.join(TOP, "overlay", "Python")
# The patched tree that make prepared (upstream's own probe sites).
SOURCE = os.path.join(TOP, "build", SERIES, "src")
EXTENSIONS = {"bpftrace": "bt", "dtrace": "d", "systemtap": "stp"}
# Tests that take every probe of the registry, not one by name.
EVERY_PROBE = ("test_invisible", "test_build_facts")


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def spelled(tracer, provider, name):
    """A regex of the probe as a script or test of tracer names it."""
    if tracer == "bpftrace":
        return r"\b%s:%s\b" % (provider, name)
    if tracer == "dtrace":
        return r"%s\$?\w*:::%s\b" % (provider, re.escape(
            name.replace("__", "-")))
    return r'mark\("%s"\)' % name


def c_function_body(name):
    """The body of the C function name(void) of the glue (GLUE)."""
    for path in sorted(glob.glob(os.path.join(GLUE, "*.c"))):
        match = re.search(r"\n%s\(void\)\n\{\n(.*?)\n\}\n" % name,
                          read(path), re.S)
        if match:
            return match.group(1)
    raise AssertionError("no function %s(void) in %s/*.c" % (name, GLUE))


def enabled_probes(text):
    """{(provider, NAME)} of the ENABLED() macros that text tests, NAME as
    dtrace -h spells it (function__entry: FUNCTION_ENTRY); the helpers
    that it calls, _PyDTrace_*Armed(), followed into their bodies."""
    found = set()
    for macro, name in re.findall(
            r"\b(PyDTrace|OTEL_MEMORY)_(\w+?)_ENABLED\(\)", text):
        found.add(("python" if macro == "PyDTrace" else "otel_memory",
                   name))
    for helper in re.findall(r"\b(_PyDTrace_\w+Armed)\(\)", text):
        found |= enabled_probes(c_function_body(helper))
    return found


def howto_entries():
    """{probe as the howto names it: arguments} of its .. object:: entries
    (a second signature on the next line is the same entry's)."""
    entries = {}
    for match in re.finditer(r"^(?:\.\. object::|            )\s*"
                             r"((?:\w+:)?\w+)\(([^)]*)\)\s*$", read(HOWTO),
                             re.M):
        entries[match.group(1)] = match.group(2).strip()
    return entries


class RegistryTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.rows = registry()
        cls.scripts = {path: read(path) for tracer, ext in EXTENSIONS.items()
                       for path in glob.glob(os.path.join(USDT, "*." + ext))}
        cls.howto = howto_entries()

    def probe(self, row):
        return self.subTest(probe="%s:%s" % (row["provider"], row["name"]))

    def test_the_build_has_exactly_these(self):
        notes = {(provider, name): count for provider, name, _, count
                 in stapsdt_notes(PYTHON, arguments=True)}
        self.assertEqual(sorted(notes), sorted((row["provider"], row["name"])
                                               for row in self.rows))
        for row in self.rows:
            with self.probe(row):
                arguments = [] if row["arguments"] == "-" else \
                    row["arguments"].split(",")
                self.assertEqual(notes[row["provider"], row["name"]],
                                 len(arguments), row["arguments"])
                self.assertIn(row["kind"], ("fires", "marker"))

    def test_documented(self):
        for row in self.rows:
            with self.probe(row):
                key = row["name"] if row["provider"] == "python" else \
                    "%s:%s" % (row["provider"], row["name"])
                self.assertTrue(key in self.howto,
                                "no .. object:: entry for %s in %s"
                                % (key, HOWTO))
                self.assertEqual(self.howto[key] or "-", row["arguments"])

    def test_upstream(self):
        # The pinned tarball's pristine tree (make prepares it).
        sha256 = re.search(r"^SHA256=(\w+)$", read(os.path.join(
            TOP, "series", SERIES, "pin")), re.M).group(1)
        declared = set(re.findall(r"probe (\w+)\(", read(os.path.join(
            TOP, "build", "pristine", sha256, "Include", "pydtrace.d"))))
        for row in self.rows:
            with self.probe(row):
                ours = row["provider"] != "python" or \
                    row["name"] not in declared
                self.assertEqual(row["upstream"] is None, ours, row["upstream"])
                if row["upstream"] is not None:
                    self.assertRegex(row["upstream"], r"^3\.\d+$")

    def test_fired_in(self):
        for row in self.rows:
            with self.probe(row):
                self.assertTrue(row["fired_in"])
                macro = ("PyDTrace_" if row["provider"] == "python"
                         else row["provider"].upper() + "_") + \
                    row["name"].upper().replace("__", "_")
                for where in row["fired_in"]:
                    if where.startswith("upstream:"):
                        path = os.path.join(SOURCE, where[len("upstream:"):])
                    else:
                        path = os.path.join(TOP, "overlay", where)
                    self.assertTrue(os.path.exists(path), path)
                    self.assertRegex(read(path), r"\b%s(_ENABLED)?\b" % macro,
                                     path)

    def test_patch(self):
        with open(os.path.join(PATCHES, "series")) as f:
            series = f.read().split()
        for row in self.rows:
            with self.probe(row):
                if row["patch"] is None:
                    # Only upstream's own sites need no hook of ours.
                    self.assertTrue(all(where.startswith("upstream:")
                                        for where in row["fired_in"]))
                    continue
                self.assertIn(row["patch"], series)
                text = read(os.path.join(PATCHES, row["patch"]))
                # The probe by name, as its macro or as the glue's function
                # that fires it (instance__new__start: InstanceNewStart).
                spellings = (row["name"],
                             row["name"].upper().replace("__", "_"),
                             "".join(part.capitalize()
                                     for part in row["name"].split("__")))
                self.assertTrue(any(
                    re.search(r"(?<![A-Za-z0-9])%s(?![A-Za-z0-9])" % word,
                              text) for word in spellings),
                    "%s does not name the probe" % row["patch"])

    def test_scripts(self):
        for row in self.rows:
            with self.probe(row):
                for tracer, ext in EXTENSIONS.items():
                    pattern = spelled(tracer, row["provider"], row["name"])
                    using = sorted(os.path.basename(path)
                                   for path, text in self.scripts.items()
                                   if path.endswith("." + ext)
                                   and re.search(pattern, text))
                    self.assertEqual(sorted(row[tracer]), using, tracer)

    def test_tools(self):
        text = read(TOOLS_PY)
        # Each Tool(...) of TOOLS: its name, and its script if any.
        tools = {}
        starts = [m for m in re.finditer(r'Tool\("(\w+)",', text)]
        for i, match in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else \
                text.index("]", match.end())
            script = re.search(r'"([\w-]+\.bt)"', text[match.end():end])
            tools[match.group(1)] = script.group(1) if script else None
        for row in self.rows:
            with self.probe(row):
                for tool in row["tool"]:
                    self.assertIn(tool, tools)
                    if tools[tool]:
                        self.assertIn(tools[tool], row["bpftrace"], tool)
                    else:
                        # A tool without a script of its own (alloc,
                        # profile) names the probe, or one of its
                        # scripts, in the front door.
                        self.assertTrue(any(
                            re.search(r"\b%s\b" % re.escape(word), text)
                            for word in [row["name"]] + row["bpftrace"]),
                            "%s names neither %s nor its scripts"
                            % (TOOLS_PY, row["name"]))

    def test_watched_as_the_watcher_reads_them(self):
        # probes_armed() of pydtrace_arming.c: each "if (...) { armed |=
        # ARMED_GROUP; }" and the probes whose semaphores its condition
        # reads, against the watched column.
        arming = read(os.path.join(GLUE, "pydtrace_arming.c"))
        flags = set(re.findall(r"^#define ARMED_(\w+) ", arming, re.M))
        body = c_function_body("probes_armed")
        theirs = {}
        for condition, flag in re.findall(
                r"if \((.*?)\)\s*\{\s*armed \|= ARMED_(\w+);", body, re.S):
            theirs[flag.lower()] = enabled_probes(condition)
        self.assertEqual(set(theirs), {flag.lower() for flag in flags})
        ours = {}
        for row in self.rows:
            if row["watched"]:
                ours.setdefault(row["watched"], set()).add(
                    (row["provider"], row["name"].replace("__", "_").upper()))
        self.assertEqual(ours, theirs)

    def test_watched_tools(self):
        # A tool waits for the watcher (Tool.watched) when its script uses
        # a watched probe; the tools without a script run usdt.stacks, which
        # waits for nothing.
        tools = usdt_module("tools").TOOLS
        waiting = 0
        for tool in tools:
            if tool.script is None:
                continue
            with self.subTest(tool=tool.name):
                uses = [row for row in self.rows
                        if tool.script in row["bpftrace"]]
                self.assertTrue(uses, tool.script)
                self.assertEqual(tool.watched,
                                 any(row["watched"] for row in uses))
                waiting += tool.watched
        self.assertGreater(waiting, 0)

    def test_tested(self):
        for row in self.rows:
            with self.probe(row):
                self.assertTrue(row["tests"], "no test")
                scripts = [s for tracer in EXTENSIONS for s in row[tracer]]
                patterns = [spelled(tracer, row["provider"], row["name"])
                            for tracer in EXTENSIONS]
                if row["provider"] == "python":
                    patterns.append(r"[\"']%s[\"']" % row["name"])
                patterns += [r"\b%s\b" % re.escape(s) for s in scripts]
                for test in row["tests"]:
                    self.assertNotIn(test, EVERY_PROBE)
                    path = os.path.join(TOP, "tests", test + ".py")
                    self.assertTrue(os.path.exists(path), path)
                    text = read(path)
                    self.assertTrue(any(re.search(p, text) for p in patterns),
                                    "%s names neither the probe nor its "
                                    "scripts" % test)


if __name__ == "__main__":
    unittest.main()
