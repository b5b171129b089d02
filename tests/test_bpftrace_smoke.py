"""Tier 3: bpftrace fires real USDT probes of the built interpreter."""

import os
import tempfile
import textwrap
import unittest

from support import Bpftrace, PYTHON, require_bpftrace


class BpftraceSmokeTest(unittest.TestCase):

    def test_gc_start_fires(self):
        require_bpftrace(self)
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "collect.py")
            with open(script, "w") as f:
                f.write(textwrap.dedent("""\
                    import gc
                    for generation in (0, 1, 2, 2, 1):
                        gc.collect(generation)
                """))
            proc = Bpftrace.run(
                "usdt:%s:python:gc__start { @[arg0] = count(); }" % PYTHON,
                script)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        counts = {}
        for line in proc.stdout.splitlines():
            if line.startswith("@["):
                key, value = line.split(":")
                counts[int(key[2:-1])] = int(value)
        # Explicit collections only: automatic ones may add to these counts
        # but can never make them smaller.
        self.assertGreaterEqual(counts.get(0, 0), 1, proc.stdout)
        self.assertGreaterEqual(counts.get(1, 0), 2, proc.stdout)
        self.assertGreaterEqual(counts.get(2, 0), 2, proc.stdout)

    def test_audit_fires(self):
        # audit(event, tuple): one hit per sys.audit() call of our event.
        require_bpftrace(self)
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "audit.py")
            with open(script, "w") as f:
                f.write(textwrap.dedent("""\
                    import sys
                    for i in range(3):
                        sys.audit("cpython_usdt.test", i)
                """))
            proc = Bpftrace.run(
                'usdt:%s:python:audit /pid == cpid && '
                'str(arg0) == "cpython_usdt.test"/ { @hits = count(); }'
                % PYTHON, script)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        self.assertIn("@hits: 3", proc.stdout.splitlines(), proc.stdout)


if __name__ == "__main__":
    unittest.main()
