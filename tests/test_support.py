"""The helpers of support.py that the other tests lean on to not wait
forever: readline() and wait() with a deadline, and the detection of
threads that a tracer left in ptrace_stop."""

import ctypes
import os
import subprocess
import time
import unittest

from support import (PYTHON, Hang, PtraceWatch, iter_lines, ptrace_stopped,
                     readline, start, wait)

PTRACE_ATTACH = 16
PTRACE_DETACH = 17


class ReadlineTest(unittest.TestCase):

    def child(self, code):
        return start(self, [PYTHON, "-c", code], stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def test_timeout(self):
        # A child that never answers: one line that says what did not come.
        proc = self.child("import sys; sys.stdin.read()")
        t0 = time.monotonic()
        with self.assertRaises(Hang) as caught:
            readline(proc.stdout, 0.5, "quiet child: no 'ready'")
        self.assertGreaterEqual(time.monotonic() - t0, 0.5)
        self.assertEqual(str(caught.exception),
                         "timeout: quiet child: no 'ready' within 0.5 s")
        self.assertEqual(caught.exception.cause, "timeout")
        self.assertIsInstance(caught.exception, AssertionError)

    def test_lines_and_buffers(self):
        # Lines come in order, what came in the same write stays in the
        # pipe's buffers for its other readers, and "" is EOF.
        proc = self.child("import sys; print('a\\nb\\nc', flush=True); "
                          "sys.stdin.readline(); print('d')")
        self.assertEqual(readline(proc.stdout, 60, "a"), "a\n")
        self.assertEqual(readline(proc.stdout, 60, "b"), "b\n")
        proc.stdin.write("go\n")
        proc.stdin.close()
        self.assertEqual(proc.stdout.read(), "c\nd\n")
        self.assertEqual(readline(proc.stdout, 60, "EOF"), "")
        proc.wait(timeout=60)

    def test_late_line_after_timeout(self):
        # The line a timed-out readline() waited for goes to the next one.
        proc = self.child("import sys; sys.stdin.readline(); print('late', "
                          "flush=True); print('next', flush=True)")
        with self.assertRaises(Hang):
            readline(proc.stdout, 0.2, "late")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        self.assertEqual(readline(proc.stdout, 60, "late"), "late\n")
        self.assertEqual(readline(proc.stdout, 60, "next"), "next\n")

    def test_iter_lines(self):
        # One deadline for all the lines, until EOF.
        proc = self.child("import sys; print('a\\nb', flush=True); "
                          "sys.stdin.readline(); print('c')")
        self.assertEqual(readline(proc.stdout, 60, "a"), "a\n")
        seen = []
        with self.assertRaises(Hang) as caught:
            for line in iter_lines(proc.stdout, 0.5, "no EOF"):
                seen.append(line)
        self.assertEqual(seen, ["b\n"])
        self.assertEqual(str(caught.exception),
                         "timeout: no EOF within 0.5 s")
        proc.stdin.write("go\n")
        proc.stdin.flush()
        self.assertEqual(list(iter_lines(proc.stdout, 60, "EOF")), ["c\n"])

    def test_watch(self):
        # What watch raises ends the wait, before the deadline.
        proc = self.child("import sys; sys.stdin.read()")

        def watch():
            raise Hang("watched", "ptrace_stop")
        with self.assertRaises(Hang) as caught:
            readline(proc.stdout, 60, "never", watch)
        self.assertEqual(caught.exception.cause, "ptrace_stop")

    def test_wait(self):
        proc = self.child("import sys; sys.stdin.read(); print('out')")
        with self.assertRaises(Hang) as caught:
            wait(proc, 0.3, "quiet child: did not exit")
        self.assertEqual(str(caught.exception),
                         "timeout: quiet child: did not exit within 0.3 s")
        proc.stdin.close()
        self.assertEqual(wait(proc, 60, "child", communicate=True),
                         ("out\n", ""))


class PtraceStopTest(unittest.TestCase):

    def setUp(self):
        if not os.path.exists("/proc/self/task/%d/wchan" % os.getpid()):
            self.skipTest("no /proc/PID/task/TID/wchan")
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.restype = ctypes.c_long
        self.libc.ptrace.argtypes = [ctypes.c_int, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_void_p]

    def ptrace(self, request, pid):
        if self.libc.ptrace(request, pid, None, None) == -1:
            errno = ctypes.get_errno()
            self.skipTest("ptrace(%d, %d): %s"
                          % (request, pid, os.strerror(errno)))

    def test_stopped_thread(self):
        # A sleeping child with a second thread: PTRACE_ATTACH stops the
        # main thread (state "t"); the others run on.
        proc = start(self, [PYTHON, "-c", "import sys, threading, time; "
                            "threading.Thread(target=time.sleep, args=(60,),"
                            " daemon=True).start(); print('ready', "
                            "flush=True); time.sleep(60)"],
                     stdout=subprocess.PIPE)
        self.assertEqual(readline(proc.stdout, 60, "sleeper: no 'ready'"),
                         "ready\n")
        # (and the interpreter's probe watcher, in our build)
        self.assertGreaterEqual(len(os.listdir("/proc/%d/task" % proc.pid)),
                                2)
        self.assertEqual(ptrace_stopped(proc.pid), [])
        watch = PtraceWatch(proc.pid, "sleeper", patience=0.5)
        watch()
        self.ptrace(PTRACE_ATTACH, proc.pid)
        try:
            os.waitpid(proc.pid, os.WUNTRACED | 0x40000000)  # __WALL
            self.assertEqual(ptrace_stopped(proc.pid), [proc.pid])
            watch()  # not for patience seconds yet
            time.sleep(0.6)
            with self.assertRaises(Hang) as caught:
                watch()
            self.assertEqual(caught.exception.cause, "ptrace_stop")
            self.assertEqual(str(caught.exception),
                             "ptrace_stop: sleeper: thread %d of process %d "
                             "stayed in ptrace_stop for 0.5 s"
                             % (proc.pid, proc.pid))
        finally:
            self.ptrace(PTRACE_DETACH, proc.pid)
        deadline = time.monotonic() + 60
        while ptrace_stopped(proc.pid):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        watch()  # forgets a thread that went on

    def test_gone(self):
        proc = subprocess.Popen([PYTHON, "-c", "pass"])
        proc.wait(timeout=60)
        self.assertEqual(ptrace_stopped(proc.pid), [])


if __name__ == "__main__":
    unittest.main()
