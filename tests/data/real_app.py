"""A real application that no one here wrote, for the toolkit on each
bpftrace version (tools/compare-bpftrace-versions): docutils renders the
first LINES lines of a reStructuredText file to its XML (Debian's
docutils reads its HTML templates from /usr/share/docutils, which a
Debian root of tools/bpftrace does not have), and pygments
highlights a Python file in two halves, one after the other, each in a
worker thread of asyncio (asyncio.to_thread), both libraries from Debian's
packages (python3-docutils, python3-pygments), found through
PYTHONPATH.  The output goes nowhere; one line says what was done.

usage: real_app.py RST_FILE LINES PY_FILE
"""

import asyncio
import sys

import docutils.core
import pygments
import pygments.formatters
import pygments.lexers


def main():
    rst, lines, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(rst, encoding="utf-8") as f:
        text = "".join(f.readlines()[:lines])
    # Sphinx's roles and directives are errors to plain docutils: reported
    # nowhere, and rendered as such.
    html = docutils.core.publish_string(
        text, writer_name="xml",
        settings_overrides={"report_level": 5, "halt_level": 5,
                            "warning_stream": False})
    with open(source, encoding="utf-8") as f:
        code = f.read()
    halves = [code[:len(code) // 2], code[len(code) // 2:]]
    highlighted = asyncio.run(highlight(halves))
    print("rendered %d bytes of XML, highlighted %d" % (
        len(html), sum(map(len, highlighted))))


async def highlight(texts):
    # One after the other, so that the two threads never run pygments at
    # the same time: the counts of its calls would depend on timing.
    return [await asyncio.to_thread(pygments.highlight, text,
                                    pygments.lexers.PythonLexer(),
                                    pygments.formatters.HtmlFormatter())
            for text in texts]


if __name__ == "__main__":
    main()
