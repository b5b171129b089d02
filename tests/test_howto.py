"""The howto, Doc/howto/instrumentation.rst, and the toolkit's page,
Doc/howto/usdt-tools.rst, parse as reStructuredText, and their references
resolve.

CPython's Sphinx build stops at the first SEVERE report of docutils (a
title level out of order stopped it at line 1211 once, unseen).  Sphinx
and its extensions are not here, so docutils parses the howto alone
(Debian's python3-docutils, run by /usr/bin/python3), with Sphinx's roles
and directives that the howto uses registered as stand-ins that take any
argument, option and content; every report of level WARNING or above
fails the test: title levels, section underlines, indentation, tables,
references to targets, literal blocks.  Where docutils is missing, the
test skips with the reason, and fails under CI.
"""

import os
import re
import subprocess
import unittest

from support import TOP, tracer_unusable

HOWTO = os.path.join(TOP, "overlay", "Doc", "howto", "instrumentation.rst")
TOOLKIT = os.path.join(TOP, "overlay", "Doc", "howto", "usdt-tools.rst")
PAGES = (HOWTO, TOOLKIT)
# Upstream's documentation, in the prepared tree (make): the labels of
# its pages that ours refer to.
UPSTREAM_DOC = os.path.join(TOP, "build", os.environ.get("SERIES", "3.13"),
                            "src", "Doc")
SYSTEM_PYTHON = "/usr/bin/python3"
# A literalinclude directive: its path and its option lines.
LITERALINCLUDE = re.compile(r"^\.\. literalinclude:: (\S+)\n((?: +:.*\n)*)",
                            re.M)

CHECK = r'''
import collections, io, re, sys
import docutils.core, docutils.nodes
from docutils.parsers.rst import Directive, directives, roles


class StandIn(Directive):
    """A Sphinx directive: any arguments, options and content; the
    content is text of the page, parsed and checked with it."""
    has_content = True
    optional_arguments = 100
    final_argument_whitespace = True
    option_spec = collections.defaultdict(lambda: directives.unchanged)

    def run(self):
        node = docutils.nodes.container()
        self.state.nested_parse(self.content, self.content_offset, node)
        return [node]


class CodeStandIn(StandIn):
    """A Sphinx directive whose content is code."""

    def run(self):
        return [docutils.nodes.literal_block("", "\n".join(self.content))]


for name in ("object", "c:function", "c:macro", "option", "envvar",
             "impl-detail", "versionadded", "versionchanged", "seealso",
             "program", "describe", "index"):
    directives.register_directive(name, StandIn)
for name in ("highlight", "code-block", "literalinclude"):
    directives.register_directive(name, CodeStandIn)
for name in ("file", "ref", "mod", "func", "c:func", "c:macro", "c:type",
             "data", "kbd", "exc", "option", "envvar", "attr", "class",
             "meth", "program", "pep", "term", "doc", "samp", "const",
             "source", "manpage", "monitoring-event"):
    roles.register_generic_role(name, docutils.nodes.literal)
with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
# Through a writer (one that writes nothing): the transforms that find
# references to no target run only then, not in publish_doctree().
reports = io.StringIO()
docutils.core.publish_string(
    text, source_path=sys.argv[1], writer_name="null",
    settings_overrides={"report_level": 2, "halt_level": 5,
                        "warning_stream": reports})
for line in reports.getvalue().splitlines():
    if re.search(r"\((WARNING|ERROR|SEVERE)/\d\)", line):
        print(line.split(") ", 1)[-1])
'''


def check(path):
    """(exit status, reports of WARNING and above, stderr) of path."""
    proc = subprocess.run([SYSTEM_PYTHON, "-c", CHECK, path],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


class HowtoParses(unittest.TestCase):

    def setUp(self):
        proc = subprocess.run([SYSTEM_PYTHON, "-c", "import docutils"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            tracer_unusable("%s has no docutils (apt-get install "
                            "python3-docutils): %s"
                            % (SYSTEM_PYTHON, proc.stderr.strip()),
                            tracer="docutils")

    def test_no_warnings(self):
        for page in PAGES:
            with self.subTest(page=os.path.basename(page)):
                status, reports, stderr = check(page)
                self.assertEqual(status, 0, stderr)
                self.assertEqual(reports, [])

    def test_literal_includes(self):
        # Each literalinclude names a file of the tree (Doc/howto/ of
        # the prepared tree is overlay/Doc/howto/ here), and the lines
        # its :start-at: and :end-before: name are in it, in that order.
        for page in PAGES:
            with open(page, encoding="utf-8") as f:
                text = f.read()
            found = LITERALINCLUDE.findall(text)
            for path, options in found:
                with self.subTest(page=os.path.basename(page), path=path):
                    path = os.path.normpath(os.path.join(
                        os.path.dirname(page), path))
                    self.assertTrue(os.path.isfile(path), path)
                    with open(path, encoding="utf-8") as f:
                        included = f.read()
                    at = 0
                    for option, value in re.findall(
                            r"^ +:([a-z-]+): (.*)$", options, re.M):
                        if option in ("start-at", "end-before"):
                            at = included.find(value, at)
                            self.assertGreaterEqual(at, 0, (option, value))
        with open(HOWTO, encoding="utf-8") as f:
            self.assertIn("../../Lib/usdt/scripts/call_stack.d",
                          [path for path, _ in
                           LITERALINCLUDE.findall(f.read())])

    def check_text(self, text):
        """check() of a scratch page holding text: its reports."""
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                            "howto-check-%d.rst" % os.getpid())
        self.addCleanup(os.unlink, path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        status, reports, stderr = check(path)
        self.assertEqual(status, 0, stderr)
        return reports

    def test_title_level_out_of_order_found(self):
        # The check itself: the error that stopped Sphinx once.
        reports = self.check_text(
            "Title\n=====\n\nA\n-\n\nB\n~\n\nC\n-\n\nD\n^\n\ntext\n")
        self.assertTrue(any("Title level inconsistent" in report
                            for report in reports), reports)

    def test_reference_to_no_target_found(self):
        # The check itself: a reference to a section of the other page.
        reports = self.check_text("Title\n=====\n\nsee `latency.bt`_ there\n")
        self.assertEqual(reports, ['Unknown target name: "latency.bt".'])


def labels(text):
    return set(re.findall(r"^\.\. _([\w-]+):\s*$", text, re.M))


def references(text):
    """The targets of the :ref: roles of text."""
    found = set()
    for role in re.finditer(r":ref:`([^`]*)`", text):
        target = re.search(r"<([^>]+)>\s*$", role.group(1))
        found.add(target.group(1) if target else role.group(1).strip())
    return found


class PagesLinked(unittest.TestCase):
    """Sphinx resolves :ref: across pages; docutils alone does not, so
    this does: every target that our pages refer to is a label of one of
    them, or of upstream's documentation."""

    def test_references_resolve(self):
        ours, used = set(), set()
        for page in PAGES:
            with open(page, encoding="utf-8") as f:
                text = f.read()
            ours |= labels(text)
            used |= references(text)
        missing = used - ours
        if missing:
            if not os.path.isdir(UPSTREAM_DOC):
                self.skipTest("%s is not there (run make): the labels %s "
                              "are not ours" % (UPSTREAM_DOC,
                                                sorted(missing)))
            upstream = set()
            for root, _, files in os.walk(UPSTREAM_DOC):
                for name in files:
                    if name.endswith(".rst"):
                        with open(os.path.join(root, name),
                                  encoding="utf-8") as f:
                            upstream |= labels(f.read())
            missing -= upstream
        self.assertEqual(missing, set())

    def test_pages_link_each_other(self):
        with open(HOWTO, encoding="utf-8") as f:
            howto = f.read()
        with open(TOOLKIT, encoding="utf-8") as f:
            toolkit = f.read()
        self.assertIn("instrumentation-toolkit", labels(toolkit))
        self.assertIn("instrumentation-toolkit", references(howto))
        self.assertIn("instrumentation", references(toolkit))


if __name__ == "__main__":
    unittest.main()
