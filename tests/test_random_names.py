"""Randomized names through the probes' string helpers, every probe armed.

data/random_names.py builds functions, classes, imports and audit events
from random code points (lone surrogates, 4-byte characters, names longer
than the helpers' 256-byte buffers), str subclasses that record any call
of their methods, and non-str values.  With every probe armed, the program
must observe exactly what it observes unarmed (an exception left set would
show as SystemError), no Python code of the str subclasses may run, and
function__entry must receive each random name as the helpers render it.
"""

import os
import subprocess
import tempfile
import unittest

from support import Bpftrace, PYTHON, require_bpftrace
from test_invisible import arm_all, hit_counts

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                      "random_names.py")
SEEDS = (1, 2, 3, 4)
# bpftrace's str() keeps BPFTRACE_STRLEN - 1 bytes (default 64).
STRLEN = 64


def run_bytes(cmd, **kwargs):
    return subprocess.run(cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, **kwargs)


class RandomNames(unittest.TestCase):

    def test_seeds(self):
        require_bpftrace(self)
        program = arm_all(
            'usdt:%s:python:function__entry /str(arg0) == "<random>"/ '
            '{ printf("F %%s\\n", str(arg1)); }' % PYTHON)
        for seed in SEEDS:
            with self.subTest(seed=seed):
                unarmed = run_bytes([PYTHON, SCRIPT, str(seed)])
                self.assertEqual(unarmed.returncode, 0, unarmed.stderr)
                with tempfile.TemporaryDirectory() as tmp:
                    output = os.path.join(tmp, "observed")
                    armed = run_bytes(
                        ["bpftrace", "-q", "-e", program,
                         "-c", "%s %s %d %s" % (PYTHON, SCRIPT, seed, output)],
                        env=dict(os.environ, BPFTRACE_STRLEN=str(STRLEN)),
                        timeout=300)
                    with open(output, "rb") as f:
                        program_lines = f.read().split(b"\n")
                errors = armed.stderr.decode(errors="replace")
                self.assertEqual(armed.returncode, 0, errors)
                lines = armed.stdout.split(b"\n")
                self.assertEqual(program_lines, unarmed.stdout.split(b"\n"))
                self.assertIn(b"calls 0", program_lines)
                expected = [bytes.fromhex(line.split()[1].decode())
                            for line in program_lines
                            if line.startswith(b"function ")]
                received = [line[2:] for line in lines
                            if line.startswith(b"F ")]
                self.assertEqual(received,
                                 [name[:STRLEN - 1] for name in expected])
                hits = hit_counts(armed.stdout.decode(
                    errors="surrogateescape"))
                for name in ("instance__new__start", "audit",
                             "import__find__load__start"):
                    self.assertGreater(hits.get(name, 0), 0, hits)


if __name__ == "__main__":
    unittest.main()
