"""The tools where tracefs is not mounted, as on a fresh machine and in
most containers: as root they mount it and say so, with none of the
"uprobe_events" noise bpftrace prints without it; not root, they refuse
in one line that gives the command to mount it.

The root case unmounts /sys/kernel/tracing for the length of one tool run
(tier 2 runs its tests one at a time) and mounts it again afterwards,
whatever happened.
"""

import os
import subprocess
import tempfile
import textwrap
import unittest

from support import PYTHON, require_bpftrace, run

TRACEFS = "/sys/kernel/tracing"


def tracefs_mounted():
    return os.path.exists(os.path.join(TRACEFS, "uprobe_events"))


class NotRootTest(unittest.TestCase):
    """ensure_tracefs() of a process that is not root, on a path where
    nothing is mounted: one line, with the command."""

    def test_refused_with_the_command(self):
        with tempfile.TemporaryDirectory() as tmp:
            proc = run([PYTHON, "-c", textwrap.dedent("""\
                import os, sys
                os.geteuid = lambda: 1000
                from usdt import _bpftrace
                try:
                    _bpftrace.ensure_tracefs(sys.argv[1])
                except _bpftrace.Error as error:
                    print(error)
                else:
                    print("no error")
                """), tmp], timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(proc.stdout, "tracefs is not mounted on %s, "
                             "and bpftrace needs it; as root, run: mount -t "
                             "tracefs nodev %s\n" % (tmp, tmp))


class RootTest(unittest.TestCase):

    def setUp(self):
        require_bpftrace(self)
        if os.geteuid() != 0:
            self.skipTest("unmounting tracefs needs root")
        if not tracefs_mounted():
            self.skipTest("tracefs is not mounted here to begin with")

    def test_mounted_by_the_tool(self):
        # The tool's usage error comes before tracing: give it a command
        # that runs, and count its calls.
        with tempfile.TemporaryDirectory() as tmp:
            script = os.path.join(tmp, "calls.py")
            with open(script, "w") as f:
                f.write("def f():\n    pass\nfor _ in range(1000):\n"
                        "    f()\n")
            subprocess.run(["umount", TRACEFS], check=True, timeout=60)
            try:
                self.assertFalse(tracefs_mounted())
                proc = run([PYTHON, "-m", "usdt.tools", "calls", "-c",
                            "%s %s" % (PYTHON, script)], timeout=300)
            finally:
                if not tracefs_mounted():
                    subprocess.run(["mount", "-t", "tracefs", "nodev",
                                    TRACEFS], timeout=60)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertTrue(tracefs_mounted())
            self.assertIn("usdt: mounted tracefs on %s (bpftrace needs it)"
                          % TRACEFS, proc.stderr.splitlines())
            self.assertNotIn("uprobe_events", proc.stderr)
            self.assertNotIn("failed to detach", proc.stderr)
            self.assertRegex(proc.stdout, r"@calls\[%s, f, 1\]: 1000\n"
                             % script)


if __name__ == "__main__":
    unittest.main()
