"""The tools stop at the end of -d, and on SIGINT, also when they were
started with SIGINT ignored, as a shell script starts its background jobs
(`python -m usdt.tools profile -p PID -d 10 &`).  Python leaves an
inherited SIG_IGN alone, so without their own handler usdt.tools and the
usdt.stacks it runs ignored the SIGINT that ends tracing: -d never ended.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import unittest

from support import PYTHON, readline, require_bpftrace, run, start


def ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class IgnoredSigintTest(unittest.TestCase):

    def setUp(self):
        require_bpftrace(self)
        tmp = tempfile.mkdtemp(prefix="test-signals")
        self.addCleanup(shutil.rmtree, tmp)
        self.workload = os.path.join(tmp, "spin.py")
        with open(self.workload, "w") as f:
            f.write("def work():\n"
                    "    return sum(range(100))\n"
                    "print('ready', flush=True)\n"
                    "while True:\n"
                    "    work()\n")
        self.app = start(self, [PYTHON, self.workload],
                         stdout=subprocess.PIPE)
        self.assertEqual(readline(self.app.stdout, 60, "the app did not "
                                  "say 'ready'"), "ready\n")

    def tool(self, *args):
        # -d 8: bpftrace 0.17 loses a SIGINT that comes before it has
        # attached the stack tool's program, which takes seconds.
        return run([PYTHON, "-m", "usdt.tools", *args, "-p",
                    str(self.app.pid), "-d", "8"], timeout=300,
                   preexec_fn=ignore_sigint)

    def test_script_tool_ends_at_d(self):
        # A ready script: usdt.tools stops bpftrace itself.
        proc = self.tool("calls")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stdout, r"@calls\[%s, work, 1\]: \d+"
                         % self.workload)

    def test_stack_tool_tool_ends_at_d(self):
        # profile: usdt.stacks, in usdt.tools' process, stops bpftrace.
        proc = self.tool("profile")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(";work (%s:2) " % self.workload, proc.stdout)


if __name__ == "__main__":
    unittest.main()
