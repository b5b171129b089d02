"""The README's shell examples, run as written from a fresh clone at an
unusual path, and `make demo`.

A shell example is an indented code block of README.md whose first line
starts with the root prompt "# ".  A command starts at a prompt and goes
on over the next lines while a quote is open or a line ends with a
backslash; the lines after it, up to the next prompt, are its output as the
README shows it.  (The build block, `make` and `make check`, has no
prompt: it is what runs this test.)

The examples run in one bash session, in the order of the README, so that
a variable one of them sets (PY) is seen by the next, in a `git clone` of
this repository made at a long, deep path (more than 100 characters, in
odd but legal characters, no space: bpftrace -c cannot take one) under the
system's temporary directory, outside the directories the other tests use.
The clone holds the committed files, as a user's would: uncommitted edits
are not seen.  build/ is not in git, and building the interpreter again in
the clone would take minutes and gigabytes, so the clone's build/ is a
symbolic link to this repository's build/: `$PWD/build/3.13/obj/python` in the
clone is then the interpreter that `make` built here, reached through the
clone's path.  The unprivileged user that the tests run as when they are
root (uid 65534) may not be able to follow that link (a clone under /root,
mode 0700), so it is given a copy of the clone whose build/3.13/obj/python is a
copy of the interpreter.

Output is compared by shape: line by line, after dropping blank lines, a
"..." line of the README standing for any number of lines, a number of
10 or more digits (a nanosecond timestamp) for any number, and "$PWD" for
the clone's path (the tools print a script's absolute path).  Everything
else (names, counts, line numbers, indentation) must be equal.

The README's DTrace example (tools/dtrace) runs only where DTrace can run
(test_dtrace_scripts.dtrace_unusable()); elsewhere it is left out, and
make demo must say that it skipped it.
"""

import os
import re
import shlex
import shutil
import tempfile
import unittest

from support import TOP, require_bpftrace, run
from test_dtrace_scripts import dtrace_unusable

PROMPT = "# "
# Numbers that differ from run to run: bpftrace's nsecs timestamps.
TIMESTAMP = re.compile(r"\d{10,}")
# A directory name per level of the clone's path, none with a space.
CLONE_DIRS = (
    "a-rather.long_directory+name,with=odd@chars~and.dots",
    "second-level.directory_with_a_long_name",
    "3rd",
    "cpython-usdt.clone",
)
INTERPRETER = os.path.join("build", "3.13", "obj", "python")
# How the README's DTrace example starts.
DTRACE_COMMAND = "tools/dtrace "
# The unprivileged user (nobody) that the tests run as when they are root.
NOBODY = 65534
AS_NOBODY = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY,
             "--clear-groups"]


def code_blocks(text):
    """The indented (4 spaces) code blocks of a Markdown text, dedented."""
    blocks, block, previous = [], None, ""
    for line in text.splitlines():
        if block is not None and (line.startswith("    ") or not line.strip()):
            block.append(line[4:])
            continue
        if block is not None:
            blocks.append(block)
            block = None
        if line.startswith("    ") and not previous.strip():
            block = [line[4:]]
        previous = line
    if block is not None:
        blocks.append(block)
    for block in blocks:
        while block and not block[-1].strip():
            block.pop()
    return blocks


def complete(command):
    """Whether a command is whole: no open quote, no trailing backslash."""
    if command.endswith("\\"):
        return False
    try:
        shlex.split(command)
    except ValueError:          # "No closing quotation"
        return False
    return True


def shell_examples(text):
    """[(command, output lines as shown)] of the README's shell examples."""
    examples = []
    for block in code_blocks(text):
        if not block[0].startswith(PROMPT):
            continue
        i = 0
        while i < len(block):
            command = block[i][len(PROMPT):]
            i += 1
            while not complete(command):
                if i == len(block):
                    raise ValueError("unfinished command in README: %r"
                                     % command)
                command += "\n" + block[i]
                i += 1
            output = []
            while i < len(block) and not block[i].startswith(PROMPT):
                output.append(block[i])
                i += 1
            examples.append((command, output))
    return examples


def shape(lines):
    """A regular expression for the output the README shows as lines."""
    parts = []
    for line in lines:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        elif line.strip():
            pieces = TIMESTAMP.split(line)
            parts.append(r"\d+".join(map(re.escape, pieces)) + r"\n")
    return re.compile("".join(parts))


def same_shape(expected, actual):
    """Whether actual (text) has the shape of the README's lines expected."""
    text = "".join(line + "\n" for line in actual.splitlines()
                   if line.strip())
    return shape(expected).fullmatch(text) is not None


def one_line(command):
    """command with its continuation lines joined, spaces collapsed."""
    return " ".join(command.replace("\\\n", " ").split())


def user_env():
    """The environment, without the PYTHON* variables a user may not have."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


class ReadmeExamples(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="readme-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp)
        cls.clone = os.path.join(cls.tmp, *CLONE_DIRS)
        os.makedirs(os.path.dirname(cls.clone))
        proc = run(["git", "clone", "--quiet", TOP, cls.clone])
        if proc.returncode != 0:
            raise RuntimeError("git clone %s failed: %s" % (TOP, proc.stderr))
        # The build, shared rather than rebuilt (see the module docstring).
        os.symlink(os.path.join(TOP, "build"),
                   os.path.join(cls.clone, "build"))
        with open(os.path.join(cls.clone, "README.md")) as f:
            cls.examples = shell_examples(f.read())

    def require_interpreter(self):
        if not os.access(os.path.join(self.clone, INTERPRETER), os.X_OK):
            self.skipTest("no %s: the README's examples trace it; run make"
                          % INTERPRETER)

    def test_clone_path_is_unusual(self):
        self.assertGreater(len(self.clone), 100)
        self.assertFalse(os.path.realpath(self.clone).startswith(
            os.path.realpath(TOP) + os.sep))

    def test_examples_found(self):
        # Each example is a command; a README without any, or whose
        # examples no longer parse, fails here rather than passing empty.
        self.assertTrue(self.examples, "no shell examples in README.md")
        self.assertTrue(any(cmd.startswith("bpftrace ")
                            for cmd, _ in self.examples), self.examples)

    def test_named_files_exist(self):
        # Paths relative to the clone's top (examples/fib.py,
        # overlay/Lib/usdt/scripts/call_stack.bt) must be in the repository, and
        # no command may name an absolute path of some machine.
        relative = re.compile(r"(?<![\w$/.-])((?:[\w.+-]+/)+[\w.+-]+)")
        absolute = re.compile(r"(?<![\w$}])/[\w.+-]+/[\w./+-]+")
        for command, _ in self.examples:
            with self.subTest(command=command):
                self.assertEqual(absolute.findall(command), [])
                for path in relative.findall(command):
                    if path == INTERPRETER:
                        continue    # built by make, not in git
                    self.assertTrue(
                        os.path.exists(os.path.join(self.clone, path)),
                        "%s is not in the repository" % path)

    def runnable_examples(self):
        """The README's examples, without its DTrace ones where DTrace
        cannot run (tools/dtrace says why: not root, no mmdebstrap)."""
        if dtrace_unusable() is None:
            return self.examples
        return [(command, output) for command, output in self.examples
                if not command.startswith(DTRACE_COMMAND)]

    def test_examples_run_as_written(self):
        self.require_interpreter()
        require_bpftrace(self)
        marker = "@@readme-example-done@@"
        script = ["set -o pipefail"]
        examples = self.runnable_examples()
        for command, _ in examples:
            script += [command, "printf '\\n%s %d\\n' " + marker + ' "$?"']
        env = user_env()
        env["PWD"] = self.clone
        proc = run(["bash", "-c", "\n".join(script)], cwd=self.clone,
                   env=env, timeout=600)
        chunks = re.split(r"\n%s (\d+)\n" % re.escape(marker), proc.stdout)
        # [out0, rc0, out1, rc1, ..., rest]
        self.assertEqual(len(chunks), 2 * len(examples) + 1,
                         "bash stopped early:\n%s\n%s"
                         % (proc.stdout, proc.stderr))
        for k, (command, expected) in enumerate(examples):
            out, rc = chunks[2 * k], int(chunks[2 * k + 1])
            expected = [line.replace("$PWD", self.clone) for line in expected]
            with self.subTest(command=command):
                self.assertEqual(rc, 0, "exit status %d; stderr of the "
                                 "session:\n%s" % (rc, proc.stderr))
                self.assertTrue(
                    same_shape(expected, out),
                    "output of\n%s\nin %s:\n%s\ndoes not have the shape "
                    "the README shows:\n%s"
                    % (command, self.clone, out, "\n".join(expected)))

    def demo(self, *wrapper, clone=None):
        """Run `make demo`'s recipe, tools/demo, in the clone (or in
        clone)."""
        # Not `make demo` itself: its `build` prerequisite would find the
        # clone's files newer than the stamps of the shared build/ and
        # rebuild it.
        return run([*wrapper, "tools/demo", "build/3.13/obj"],
                   cwd=clone or self.clone, env=user_env(), timeout=600)

    def test_demo_shows_the_readme_examples(self):
        # make demo runs the README's bpftrace examples, then its DTrace
        # one: each must appear in its output, as the README writes it,
        # followed by output of the shape the README shows; where DTrace
        # cannot run, the DTrace one says it was skipped, and why.
        self.require_interpreter()
        require_bpftrace(self)
        proc = self.demo()
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        sections = {}
        for section in proc.stdout.split("\n== ")[1:]:
            lines = section.splitlines()
            shown = [i for i, line in enumerate(lines)
                     if line.startswith(PROMPT)]
            self.assertTrue(shown, section)
            command = lines[shown[0]][len(PROMPT):]
            sections[one_line(command)] = "\n".join(lines[shown[0] + 1:])
        traces = [(c, e) for c, e in self.runnable_examples()
                  if c.startswith(("bpftrace ", DTRACE_COMMAND))]
        dtrace = [one_line(c) for c, _ in self.examples
                  if c.startswith(DTRACE_COMMAND)]
        self.assertEqual(len(dtrace), 1, self.examples)
        if dtrace_unusable() is not None:
            self.assertEqual(sections.pop(dtrace[0], None), "",
                             proc.stdout)
            self.assertIn("SKIPPED the DTrace example", proc.stderr)
        self.assertEqual(len(sections), len(traces), proc.stdout)
        for command, expected in traces:
            with self.subTest(command=command):
                self.assertIn(one_line(command), sections, proc.stdout)
                out = sections[one_line(command)]
                self.assertTrue(same_shape(expected, out),
                                "make demo printed:\n%s\nthe README shows:"
                                "\n%s" % (out, "\n".join(expected)))

    def test_demo_says_what_is_missing(self):
        # Without root, and as root of a user namespace (which cannot load
        # BPF programs), make demo fails with bpftrace's own error, that of
        # the README's first trace run the same way, and says what is
        # missing.
        self.require_interpreter()
        self.check_demo_says_what_is_missing(self.clone)

    def test_demo_says_what_is_missing_from_a_private_top(self):
        # The same from a clone whose build/ is in a directory only its
        # owner may enter, as a root user's clone under /root (mode 0700)
        # is: another user must still be given what it needs.
        self.require_interpreter()
        private = os.path.join(self.tmp, "private")
        os.mkdir(private, 0o700)
        obj = os.path.join(private, "top", "build", "3.13", "obj")
        os.makedirs(obj)
        shutil.copy2(os.path.join(self.clone, INTERPRETER), obj)
        clone = os.path.join(self.tmp, "clone-of-a-private-top",
                             CLONE_DIRS[-1])
        shutil.copytree(self.clone, clone, symlinks=True,
                        ignore=shutil.ignore_patterns("build", ".git"))
        os.symlink(os.path.dirname(os.path.dirname(obj)),
                   os.path.join(clone, "build"))
        self.check_demo_says_what_is_missing(clone)

    def copy_for_another_user(self, clone):
        """A copy of clone that uid NOBODY can read and run: its files, and
        a real copy of its interpreter as build/3.13/obj/python.  The clone's
        build/ is a link to this repository's, which may be in a directory
        closed to other users (a home of mode 0700, such as /root); bpftrace
        and tools/demo fail for that user before they run the interpreter,
        so the binary alone is enough.  Skips, saying why, where that user
        cannot reach the temporary directory itself."""
        os.chmod(self.tmp, 0o755)
        copy = os.path.join(self.tmp, "for-uid-%d" % NOBODY, CLONE_DIRS[-1])
        if not os.path.exists(copy):
            shutil.copytree(clone, copy, symlinks=True,
                            ignore=shutil.ignore_patterns("build", ".git"))
            os.makedirs(os.path.join(copy, "build", "3.13", "obj"))
            shutil.copy2(os.path.join(clone, INTERPRETER),
                         os.path.join(copy, INTERPRETER))
        # setpriv does not search PATH the same way after dropping
        # privileges: name test by its path.
        reach = run([*AS_NOBODY, "/usr/bin/test", "-x",
                     os.path.join(copy, INTERPRETER)])
        if reach.returncode != 0:
            self.skipTest("uid %d cannot reach %s (a parent directory is "
                          "closed to other users; set TMPDIR to one that "
                          "is not): the case without root is not tested"
                          % (NOBODY, copy))
        return copy

    def check_demo_says_what_is_missing(self, clone):
        cases = {"not root": ([], "needs root", clone)}
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                self.skipTest("setpriv not found (util-linux)")
            cases["not root"] = (AS_NOBODY, "needs root",
                                 self.copy_for_another_user(clone))
            if shutil.which("unshare"):
                cases["user namespace"] = (["unshare", "-r"],
                                           "user namespace", clone)
        # The README's first bpftrace command, after the variables set
        # before it (PY=...); not the usdt.tools command before it, whose
        # own error make demo does not print.
        commands = [c for c, _ in self.examples]
        first = next(i for i, c in enumerate(commands)
                     if c.startswith("bpftrace "))
        session = "\n".join([c for c in commands[:first]
                             if re.fullmatch(r"\w+=\S+", c)]
                            + [commands[first]])
        for name, (wrapper, missing, where) in cases.items():
            with self.subTest(name):
                probe = run([*wrapper, "bash", "-c", session],
                            cwd=where, env=user_env(), timeout=120)
                if probe.returncode == 0:
                    self.skipTest("bpftrace works here %s" % name)
                errors = [line for line in probe.stderr.splitlines()
                          if line.strip() and "RLIMIT_MEMLOCK" not in line]
                self.assertTrue(errors, "bpftrace failed without a word")
                proc = self.demo(*wrapper, clone=where)
                self.assertNotEqual(proc.returncode, 0, proc.stdout)
                for line in errors:
                    self.assertIn(line, proc.stderr.splitlines())
                self.assertIn(missing, proc.stderr.splitlines()[-1])

if __name__ == "__main__":
    unittest.main()
