"""Shared helpers for the tests of the built interpreter and its driver."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(TOP, "build")
# The interpreter under test: tools/check exports it; default to our build.
PYTHON = os.environ.get("CPYTHON_USDT_PYTHON",
                        os.path.join(BUILD, "obj", "python"))


def run(cmd, **kwargs):
    """Run cmd, capturing text output; never raise on failure."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(cmd, text=True, **kwargs)


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
        """bpftrace -e program -c 'PYTHON script' (paths without spaces)."""
        if " " in PYTHON or " " in script:
            raise ValueError("bpftrace -c splits on spaces: %r %r"
                             % (PYTHON, script))
        cmd = ["bpftrace", "-q", *args, "-e", program,
               "-c", "%s %s" % (PYTHON, script)]
        return run(cmd, timeout=timeout, env=env)

    @staticmethod
    def errors(proc):
        """bpftrace's stderr without its harmless RLIMIT_MEMLOCK notice."""
        return "\n".join(line for line in proc.stderr.splitlines()
                         if "RLIMIT_MEMLOCK" not in line).strip()


def require_bpftrace(testcase):
    reason = Bpftrace.usable()
    if reason is not None:
        testcase.skipTest(reason)


if __name__ == "__main__":
    sys.exit("support.py is a helper module, not a test")
