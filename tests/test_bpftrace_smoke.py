"""Tier 3: bpftrace fires real USDT probes of the built interpreter."""

import os
import tempfile
import textwrap
import unittest

from support import Bpftrace, PYTHON, require_bpftrace


class BpftraceSmokeTest(unittest.TestCase):

    def trace(self, program, source):
        """Run source as a script under bpftrace -e program; its stdout."""
        require_bpftrace(self)
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "script.py")
            with open(script, "w") as f:
                f.write(textwrap.dedent(source))
            proc = Bpftrace.run(program % PYTHON, script)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        return proc.stdout

    def test_gc_start_fires(self):
        out = self.trace(
            "usdt:%s:python:gc__start { @[arg0] = count(); }", """\
            import gc
            for generation in (0, 1, 2, 2, 1):
                gc.collect(generation)
            """)
        counts = {}
        for line in out.splitlines():
            if line.startswith("@["):
                key, value = line.split(":")
                counts[int(key[2:-1])] = int(value)
        # Explicit collections only: automatic ones may add to these counts
        # but can never make them smaller.
        self.assertGreaterEqual(counts.get(0, 0), 1, out)
        self.assertGreaterEqual(counts.get(1, 0), 2, out)
        self.assertGreaterEqual(counts.get(2, 0), 2, out)

    def test_audit_fires(self):
        # audit(event, tuple): one hit per sys.audit() call of our event.
        out = self.trace(
            'usdt:%s:python:audit /pid == cpid && '
            'str(arg0) == "cpython_usdt.test"/ { @hits = count(); }', """\
            import sys
            for i in range(3):
                sys.audit("cpython_usdt.test", i)
            """)
        self.assertIn("@hits: 3", out.splitlines(), out)


if __name__ == "__main__":
    unittest.main()
