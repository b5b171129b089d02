"""Attaching bpftrace to a running interpreter with -p, and detaching.

A tracer attached to a running process arms the probes' semaphores with no
notice to the interpreter; the interpreter's watcher thread notices within
a fraction of a second and switches its instrumentation on, and off again
after the tracer leaves.
"""

import os
import re
import subprocess
import sys
import time
import unittest

from support import Bpftrace, PYTHON, require_bpftrace, run

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                        "attach_workload.py")


class AttachTest(unittest.TestCase):

    def start(self, mode, seconds):
        proc = subprocess.Popen([PYTHON, WORKLOAD, mode, str(seconds)],
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.addCleanup(proc.kill)
        self.assertEqual(proc.stdout.readline(), "ready\n")
        return proc

    def attach(self, pid, program, seconds):
        # bpftrace attaches probes one by one and detaches them one by one:
        # count only between BEGIN (all attached) and the interval that
        # ends the run, using the predicate ACTIVE.
        full = ('BEGIN { @start = nsecs; } %s '
                'interval:ms:%d { @stop = 1; exit(); }'
                % (program.replace("ACTIVE", "@start != 0 && @stop == 0"),
                   seconds * 1000))
        proc = run(["bpftrace", "-q", "-p", str(pid), "-e", full],
                   timeout=60 + seconds)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        return {m.group(1): int(m.group(2)) for m in
                re.finditer(r"^@(\w+): (-?\d+)$", proc.stdout, re.M)}

    def finish(self, proc):
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, err)
        self.assertTrue(out.startswith("done "), out)

    def test_attach_detach_threaded(self):
        require_bpftrace(self)
        proc = self.start("threaded", 20)
        program = (
            'usdt:%(p)s:python:function__entry /pid == %(pid)d && ACTIVE/ '
            '{ @entry = count(); } '
            'usdt:%(p)s:python:function__return /pid == %(pid)d && ACTIVE/ '
            '{ @return = count(); }' % {"p": PYTHON, "pid": proc.pid})
        for attempt in range(3):
            counts = self.attach(proc.pid, program, 2)
            entry, ret = counts.get("entry", 0), counts.get("return", 0)
            self.assertGreater(entry, 1000, (attempt, counts))
            # Only frames running at the moment of attaching or detaching
            # may be unpaired: at most 3 (spin, middle, leaf) per thread at
            # each end.
            self.assertLessEqual(abs(entry - ret), 2 * 3 * 3,
                                 (attempt, counts))
            self.assertIsNone(proc.poll(), "workload died while traced")
            time.sleep(0.5)
        self.finish(proc)

    def test_line_events_start_within_a_second(self):
        require_bpftrace(self)
        proc = self.start("loop", 15)
        program = (
            'usdt:%(p)s:python:line /pid == %(pid)d && @first == 0 && '
            'ACTIVE/ { @first = nsecs - @start; } '
            'usdt:%(p)s:python:line /pid == %(pid)d && ACTIVE/ '
            '{ @lines = count(); }'
            % {"p": PYTHON, "pid": proc.pid})
        counts = self.attach(proc.pid, program, 3)
        self.assertGreater(counts.get("lines", 0), 0, counts)
        self.assertLess(counts["first"], 1_000_000_000,
                        "first line event %.3f s after attaching"
                        % (counts["first"] / 1e9))
        self.finish(proc)


if __name__ == "__main__":
    unittest.main()
