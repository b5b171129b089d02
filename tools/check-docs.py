"""Build our pages of CPython's documentation with CPython's own Sphinx
configuration, and print every warning about them.

Run by tools/check-docs in the Debian root whose Sphinx it uses (see
there for which and why).  usage: check-docs.py DOC OUT PAGE... [--all]

DOC is the prepared tree's Doc/, with its conf.py and extensions; OUT a
scratch directory; each PAGE a file of ours under DOC (howto/x.rst).
Building all of Doc/ (514 pages) takes about 2 minutes on 2 cores, so
only our pages are built, together with the upstream pages that define
what they refer to (about 45), in two builds of 20 to 30 s together:

  1. our pages alone (include_patterns): every reference of theirs to an
     upstream target is unresolved, and Sphinx's warning names it;
  2. our pages, the upstream pages that define those targets (found by
     their directive or label lines, below), and those that define a
     label, C declaration, option or environment variable that ours
     define too (a duplicate), our pages written alone: what is still
     unresolved, and every other warning of our pages, is ours.

Sphinx reads serially (no -j): reading in parallel, it does not report a
label defined in two pages that two processes read (Sphinx 9.1's
StandardDomain.merge_domaindata).  A duplicate's warning is located at
the instance read second, which may be upstream's: a warning that names
one of our pages is ours too.

The finder only chooses what Sphinx reads: Sphinx alone says what
resolves.  A page it misses leaves a reference unresolved in the second
build; so when one is, all of Doc/ is built to confirm it (a finder's
miss costs time, not a false failure, and the line that says so shows
it).  --all builds all of Doc/ at once, the ground truth that the two
builds were checked against (tools/check-docs).

Prints each warning of our pages as path:line: WARNING: text; exits 1 if
there is one, 2 if Sphinx failed.
"""

import os
import re
import subprocess
import sys
import time

# Sphinx's text for a reference to no target: the target as the role
# named it, then the warning's type (which Sphinx 8.1 leaves out of some).
TYPE = r"(?: \[[\w.]+\])?$"
UNRESOLVED = [
    (re.compile(r"^(?P<domain>[\w-]+):(?P<role>[\w-]+) reference target not "
                r"found: (?P<target>.+?)" + TYPE), None),
    (re.compile(r"^'(?P<role>[\w-]+)' reference target not found: "
                r"(?P<target>.+?)" + TYPE), "std"),
    (re.compile(r"^unknown option: '(?P<target>.+?)'" + TYPE), "option"),
    (re.compile(r"^undefined label: '(?P<target>.+?)'" + TYPE), "ref"),
    (re.compile(r"^term not in glossary: '(?P<target>.+?)'" + TYPE), "term"),
]
# The first line of a warning of sphinx-build -w: its path and line (where
# Sphinx knows them), its text.
WARNING = re.compile(r"^(?:(?P<path>/[^:]+):(?:(?P<line>\d+):)? )?"
                     r"(?P<level>WARNING|ERROR|CRITICAL|SEVERE): "
                     r"(?P<text>.*)$")


def sphinx(doc, out, include, pages, all_pages=False):
    """Run sphinx-build (html, nitpicky, fresh) on doc: with include
    (patterns) and our pages as the root, writing our pages only; or on
    all of doc.  Returns (exit status, warning lines)."""
    warnings = os.path.join(out, "warnings.txt")
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-n", "-E",
               "-q", "-w", warnings,
               "-d", os.path.join(out, "doctrees")]
    if not all_pages:
        command += ["-D", "root_doc=" + pages[0][:-len(".rst")],
                    "-D", "include_patterns=" + ",".join(sorted(include))]
    command += [doc, os.path.join(out, "html")]
    if not all_pages:
        command += [os.path.join(doc, page) for page in pages]
    start = time.monotonic()
    proc = subprocess.run(command, cwd=doc, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    print("check-docs.py: sphinx-build read %s: %.0f s"
          % ("all of Doc/" if all_pages else "%d pages" % len(include),
             time.monotonic() - start), file=sys.stderr)
    lines = []
    if os.path.exists(warnings):
        with open(warnings, encoding="utf-8") as f:
            lines = f.read().splitlines()
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout)
    return proc.returncode, lines


def names(warning, doc, page):
    """Whether warning is of page: located there, or naming it (by path,
    or by document name as the C and Python domains do)."""
    path = os.path.join(doc, page)
    return (warning[0] == path or path in warning[2]
            or re.search(r"(?<![\w/])%s(?![\w-])"
                         % re.escape(page[:-len(".rst")]), warning[2]))


def located(lines, doc, pages):
    """The warnings of lines that are of our pages (names()), and the
    others: each a [path, line, text] whose text has the lines that
    follow it and are no warning of their own (a docutils report's
    quoted source, say).  Path and line are None where Sphinx did not
    say them."""
    found = []
    for line in lines:
        match = WARNING.match(line)
        if match:
            found.append([match["path"], match["line"], match["text"]])
        elif found and line.strip():
            found[-1][2] += "\n" + line
    ours = [w for w in found if any(names(w, doc, page) for page in pages)]
    return ours, [w for w in found if w not in ours]


def unresolved(text):
    """(domain, role, target) of a warning's text if it is a reference to
    no target, else None."""
    for pattern, domain in UNRESOLVED:
        match = pattern.match(text)
        if match:
            groups = match.groupdict()
            return (groups.get("domain", domain), groups.get("role", domain),
                    match["target"])
    return None


def definitions(domain, role, target):
    """Regular expressions of the lines that define target, and of a line
    that a page defining it must have as well (or None)."""
    name = re.escape(target)
    if domain == "ref":
        return re.compile(r"^\.\. _%s:\s*$" % name, re.M | re.I), None
    if domain == "term":
        return re.compile(r"^\.\. glossary::", re.M), None
    if domain == "option":
        return re.compile(r"^\s*\.\. (?:option|cmdoption)::\s+(?:.*[\s,])?"
                          r"%s(?=[\s,=\[<]|$)" % name, re.M), None
    if domain == "std":
        return re.compile(r"^\s*\.\. %s::\s+%s\s*$"
                          % (re.escape(role), name), re.M), None
    if domain == "c":
        # The declared name: a function's or macro's before its
        # parameters, a type's or variable's last.
        return re.compile(r"^\s*\.\. c:\w+::.*\b%s(?:\s*\(|\s*$)" % name,
                          re.M), None
    # Python: a directive naming the object by its last component, in a
    # page that declares a module that the target's name starts with (or
    # names it whole, as datamodel.rst's function.__name__); a name
    # without a dot is a builtin's.
    parts = target.lstrip("~.!").split(".")
    last = re.escape(parts[-1])
    directive = re.compile(r"^\s*\.\. (?:py:)?[\w-]+::\s+(?:[\w.]+\.)?%s\b"
                           % last, re.M)
    if len(parts) == 1:
        return directive, None
    prefixes = "|".join(re.escape(".".join(parts[:n]))
                        for n in range(1, len(parts)))
    context = re.compile(r"^\s*\.\. (?:py:)?(?:current)?module::\s+(?:%s)\s*$"
                         r"|^\s*\.\. (?:py:)?[\w-]+::\s+%s\b"
                         % (prefixes, re.escape(target)), re.M)
    return directive, context


def our_definitions(doc, pages):
    """(domain, role, name) of the labels, C declarations, options and
    environment variables that our pages define: an upstream page that
    defines one too makes a duplicate."""
    found = set()
    for page in pages:
        with open(os.path.join(doc, page), encoding="utf-8") as f:
            text = f.read()
        for label in re.findall(r"^\.\. _([^:`]+):\s*$", text, re.M):
            found.add(("ref", "ref", label))
        for signature in re.findall(r"^\s*\.\. c:\w+::\s+(.*)$", text,
                                    re.M):
            name = re.findall(r"\w+", signature.partition("(")[0])
            if name:
                found.add(("c", "c", name[-1]))
        for name in re.findall(r"^\s*\.\. envvar::\s+(\S+)\s*$", text,
                               re.M):
            found.add(("std", "envvar", name))
        for options in re.findall(r"^\s*\.\. option::\s+(.*)$", text, re.M):
            for option in options.split(", "):
                found.add(("option", "option", option.split()[0]))
    return found


def defining_pages(doc, pages, targets):
    """The pages of doc (relative paths) that define any of targets."""
    found = set()
    wanted = [definitions(*target) for target in targets]
    for root, dirs, files in os.walk(doc):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if not name.endswith(".rst"):
                continue
            path = os.path.join(root, name)
            page = os.path.relpath(path, doc)
            if page in pages or page.startswith("includes/"):
                continue
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for directive, context in wanted:
                if directive.search(text) and (context is None
                                               or context.search(text)):
                    found.add(page)
                    break
    return found


def main(argv):
    all_pages = "--all" in argv
    argv = [arg for arg in argv if arg != "--all"]
    if len(argv) < 3:
        sys.exit("usage: check-docs.py DOC OUT PAGE... [--all]")
    doc, out, pages = os.path.abspath(argv[0]), argv[1], argv[2:]
    if all_pages:
        status, lines = sphinx(doc, out, None, pages, all_pages=True)
    else:
        status, lines = sphinx(doc, out, pages, pages)
        if status == 0:
            ours, _ = located(lines, doc, pages)
            targets = {t for t in (unresolved(w[2]) for w in ours) if t}
            extra = defining_pages(doc, pages, targets)
            defined = our_definitions(doc, pages)
            twins = defining_pages(doc, pages, defined)
            print("check-docs.py: %d references of our pages to upstream "
                  "targets, defined in %d upstream pages; %d upstream pages "
                  "define a name that ours define (of %d)"
                  % (len(targets), len(extra), len(twins), len(defined)),
                  file=sys.stderr)
            extra |= twins
            status, lines = sphinx(doc, out, set(pages) | extra, pages)
        if status == 0:
            ours, _ = located(lines, doc, pages)
            left = [w for w in ours if unresolved(w[2])]
            if left:
                print("check-docs.py: %d references of our pages are "
                      "still unresolved: building all of Doc/ to confirm "
                      "(about 2 minutes)" % len(left), file=sys.stderr)
                status, lines = sphinx(doc, out, None, pages,
                                       all_pages=True)
    if status != 0:
        print("check-docs.py: sphinx-build failed (exit status %d)" % status,
              file=sys.stderr)
        return 2
    ours, others = located(lines, doc, pages)
    for path, line, text in ours:
        print("%s:%s WARNING: %s" % (path, line + ":" if line else "", text))
    for path, line, text in others:
        if path is None:
            # Not located: a configuration's warning, say; shown, not
            # counted as ours.
            print("check-docs.py: not located: %s" % text, file=sys.stderr)
    for page in pages:
        count = sum(1 for w in ours if names(w, doc, page))
        print("check-docs.py: %s: %d warnings" % (page, count),
              file=sys.stderr)
    print("check-docs.py: %d warnings elsewhere (upstream's pages, or none: "
          "not ours, not counted)" % len(others), file=sys.stderr)
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
