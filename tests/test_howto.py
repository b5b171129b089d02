"""The howto, Doc/howto/instrumentation.rst, parses as reStructuredText.

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
import subprocess
import unittest

from support import TOP, tracer_unusable

HOWTO = os.path.join(TOP, "overlay", "Doc", "howto", "instrumentation.rst")
SYSTEM_PYTHON = "/usr/bin/python3"

CHECK = r'''
import collections, io, sys
import docutils.core, docutils.nodes
from docutils.parsers.rst import Directive, directives, roles


class StandIn(Directive):
    """A Sphinx directive: any arguments, options and content."""
    has_content = True
    optional_arguments = 100
    final_argument_whitespace = True
    option_spec = collections.defaultdict(lambda: directives.unchanged)

    def run(self):
        return [docutils.nodes.literal_block("", "\n".join(self.content))]


for name in ("object", "c:function", "c:macro", "option", "envvar",
             "highlight", "impl-detail", "code-block", "versionadded",
             "versionchanged", "seealso", "program", "describe", "index"):
    directives.register_directive(name, StandIn)
for name in ("file", "ref", "mod", "func", "c:func", "c:macro", "c:type",
             "data", "kbd", "exc", "option", "envvar", "attr", "class",
             "meth", "program", "pep", "term", "doc", "samp", "const",
             "source", "manpage"):
    roles.register_generic_role(name, docutils.nodes.literal)
with open(sys.argv[1], encoding="utf-8") as f:
    text = f.read()
document = docutils.core.publish_doctree(
    text, source_path=sys.argv[1],
    settings_overrides={"report_level": 5, "halt_level": 5,
                        "warning_stream": io.StringIO()})
for message in document.traverse(docutils.nodes.system_message):
    if message["level"] >= 2:
        print(message.astext().splitlines()[0])
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
        status, reports, stderr = check(HOWTO)
        self.assertEqual(status, 0, stderr)
        self.assertEqual(reports, [])

    def test_title_level_out_of_order_found(self):
        # The check itself: the error that stopped Sphinx once.
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                            "howto-check-%d.rst" % os.getpid())
        self.addCleanup(os.unlink, path)
        with open(path, "w", encoding="utf-8") as f:
            f.write("Title\n=====\n\nA\n-\n\nB\n~\n\nC\n-\n\nD\n^\n\ntext\n")
        status, reports, stderr = check(path)
        self.assertEqual(status, 0, stderr)
        self.assertTrue(any("Title level inconsistent" in report
                            for report in reports), reports)


if __name__ == "__main__":
    unittest.main()
