"""Attaching bpftrace to a running interpreter with -p, and detaching.

A tracer attached to a running process arms the probes' semaphores with no
notice to the interpreter; the interpreter's watcher thread notices within
a second and switches its instrumentation on, and off again after the
tracer leaves.

bpftrace runs BEGIN before it attaches the probes, one at a time, so these
tests never count from BEGIN: they wait for what they can observe (each
probe firing, the probe's semaphore in the traced process).
"""

import os
import subprocess
import unittest

from support import (Bpftrace, PYTHON, Semaphore, readline,
                     require_bpftrace, run, start)

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                        "attach_workload.py")
# Give up on a tracer whose events have not started after this long: the
# watcher promises one second.
EVENTS_TIMEOUT_S = 30


def map_values(stdout):
    """{name: value} of bpftrace's printed integer maps without keys."""
    return {name: value for name, keys, value in Bpftrace.maps(stdout)
            if not keys}


class AttachTest(unittest.TestCase):

    def start(self, mode):
        """The workload, running until finish() closes its stdin."""
        proc = start(self, [PYTHON, WORKLOAD, mode, "-"],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
        self.assertEqual(readline(proc.stdout, 60, "the %s workload did "
                                  "not say 'ready'" % mode), "ready\n")
        return proc

    def finish(self, proc):
        # communicate() closes the workload's stdin: it stops.
        out, err = proc.communicate(timeout=120)
        self.assertEqual(proc.returncode, 0, err)
        self.assertTrue(out.startswith("done "), out)

    def count_pairs(self, pid, seconds):
        """function__entry and function__return counts in one attach, over
        `seconds` from the moment both probes fire."""
        # One action per probe, so that each probe sees whether the other
        # has fired: both are attached then, and counting starts.  It stops
        # at the first tick after `seconds`, before bpftrace detaches.
        program = """
        usdt:%(p)s:python:function__entry /pid == %(pid)d/ {
            @seen_entry = 1;
            if (@seen_return && @stop == 0) {
                if (@open == 0) { @open = nsecs; }
                @entry = count();
            }
        }
        usdt:%(p)s:python:function__return /pid == %(pid)d/ {
            @seen_return = 1;
            if (@seen_entry && @stop == 0) {
                if (@open == 0) { @open = nsecs; }
                @return = count();
            }
        }
        interval:ms:100 /@open != 0 && nsecs - @open > %(ns)d/ {
            @stop = 1; exit();
        }
        interval:s:%(timeout)d { @stop = 1; exit(); }
        """ % {"p": PYTHON, "pid": pid, "ns": seconds * 10**9,
               "timeout": EVENTS_TIMEOUT_S}
        proc = run(["bpftrace", "-q", "-p", str(pid), "-e", program],
                   timeout=EVENTS_TIMEOUT_S + 60)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        counts = map_values(proc.stdout)
        self.assertIn("open", counts,
                      "entry and return did not both fire within %d s: %s"
                      % (EVENTS_TIMEOUT_S, counts))
        return counts.get("entry", 0), counts.get("return", 0)

    def test_attach_detach_threaded(self):
        require_bpftrace(self)
        proc = self.start("threaded")
        for attempt in range(3):
            entry, ret = self.count_pairs(proc.pid, 2)
            self.assertGreater(entry, 1000, (attempt, entry, ret))
            # Counting starts and stops at one moment for all threads: only
            # frames running then may be unpaired, at most 3 (spin, middle,
            # leaf) per thread at each end.
            self.assertLessEqual(abs(entry - ret), 2 * 3 * 3,
                                 (attempt, entry, ret))
            self.assertIsNone(proc.poll(), "workload died while traced")
        self.finish(proc)

    def test_attach_forked_child(self):
        # The child of os.fork() has a watcher of its own, started by
        # PyOS_AfterFork_Child() with a lock made anew by the atfork
        # handler: a tracer attached to the child turns its probes on.
        require_bpftrace(self)
        proc = self.start("forked")
        with open("/proc/%d/task/%d/children" % (proc.pid, proc.pid)) as f:
            children = f.read().split()
        self.assertEqual(len(children), 1, children)
        entry, ret = self.count_pairs(int(children[0]), 2)
        self.assertGreater(entry, 1000, (entry, ret))
        self.assertLessEqual(abs(entry - ret), 2 * 3 * 3, (entry, ret))
        self.finish(proc)

    def test_line_events_start_at_the_next_poll(self):
        # From the moment the tracer arms the line probe's semaphore (what
        # the watcher polls once a second) to the first line event, in
        # bpftrace's clock: events must start by the watcher's next poll,
        # allowing one more for a loaded machine.  How fast they start is a
        # speed target, measured by bench/watcher.py (docs/watcher.md), not
        # here.
        require_bpftrace(self)
        proc = self.start("loop")
        semaphore = Semaphore(proc.pid, "line")
        snapshot = semaphore.snapshot()
        if snapshot[1]:
            self.skipTest("python:line is already armed (semaphore %d) in a "
                          "workload that just started: another tracer has a "
                          "uprobe on every %s process, so an attach cannot "
                          "be timed" % (snapshot[1], PYTHON))
        program = ('usdt:%s:python:line /pid == %d/ { @first = nsecs; '
                   'exit(); } interval:s:%d { exit(); }'
                   % (PYTHON, proc.pid, EVENTS_TIMEOUT_S))
        tracer = start(self, ["bpftrace", "-q", "-p", str(proc.pid), "-e",
                              program],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        armed = semaphore.wait_armed(
            snapshot, still_waiting=lambda: tracer.poll() is None)
        out, err = tracer.communicate(timeout=EVENTS_TIMEOUT_S + 60)
        self.assertEqual(tracer.returncode, 0, Bpftrace.errors(err))
        self.assertIsNotNone(armed, "bpftrace left without arming the probe")
        armed_after, armed_by = armed
        first = map_values(out).get("first")
        self.assertIsNotNone(first, "no line event within %d s"
                             % EVENTS_TIMEOUT_S)
        self.assertGreater(first, armed_after)
        # The semaphore was armed after armed_after: the latency is at most
        # first - armed_after.
        self.assertLess(first - armed_after, 2 * 10**9,
                        "first line event %.3f s after the semaphore was "
                        "armed (%.3f s after it was seen armed)"
                        % ((first - armed_after) / 1e9,
                           (first - armed_by) / 1e9))
        self.assertIsNone(proc.poll(), "workload died while traced")
        self.finish(proc)


if __name__ == "__main__":
    unittest.main()
