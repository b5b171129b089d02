"""The probes report exactly what sys.setprofile and sys.settrace report.

data/parity_corpus.py takes every path by which the 3.13 interpreter starts
and stops a Python frame, from warm (specialised) call sites, in three
threads.  Its per-thread, per-function call and return counts under
sys.setprofile must equal the function__entry/function__return counts
bpftrace sees, and its per-thread, per-line counts under sys.settrace must
equal the line probe's.  On stock 3.13.5 these tests fail: the probes never
fire there.
"""

import collections
import os
import shutil
import tempfile
import unittest

from support import Bpftrace, PYTHON, require_bpftrace, run

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                      "parity_corpus.py")
# Kept in step with UNCOUNTED in the corpus.
UNCOUNTED_NAMES = {"<module>", "Widget", "Intercepting", "main", "profiler",
                   "tracer", "counted"}
FUNCTION_PROGRAM = """
usdt:%(python)s:python:function__entry /pid == cpid/
{ @call[tid, str(arg0), str(arg1)] = count(); }
usdt:%(python)s:python:function__return /pid == cpid/
{ @return[tid, str(arg0), str(arg1)] = count(); }
"""
LINE_PROGRAM = """
usdt:%(python)s:python:line /pid == cpid/
{ @line[tid, str(arg0), str(arg1), arg2] = count(); }
"""


def roles(stdout):
    """{native thread id: role} from the corpus's ROLE lines."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("ROLE "):
            _, name, tid = line.split()
            found[int(tid)] = name
    return found


class ParityTest(unittest.TestCase):

    def setUp(self):
        tmp = tempfile.mkdtemp(prefix="parity-")
        self.addCleanup(shutil.rmtree, tmp)
        # A short path: bpftrace copies at most BPFTRACE_STRLEN (64) bytes.
        self.corpus = os.path.join(tmp, "parity_corpus.py")
        shutil.copy(CORPUS, self.corpus)

    def reference_counts(self, mode):
        """Counts from the corpus's own sys.setprofile/settrace hook."""
        proc = run([PYTHON, self.corpus, mode], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        names = roles(proc.stdout)
        counts = {}
        for line in proc.stdout.splitlines():
            if line.startswith("COUNT "):
                event, tid, filename, name, *lineno, count = line.split()[1:]
                key = (event, names[int(tid)], filename, name, *map(int,
                                                                   lineno))
                counts[key] = int(count)
        self.assertEqual({key[1] for key in counts},
                         {"main", "thread-1", "thread-2"})
        return counts

    def probe_counts(self, program):
        proc = Bpftrace.run(program % {"python": PYTHON}, self.corpus,
                            timeout=300)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        names = roles(proc.stdout)
        counts = {}
        for line in proc.stdout.splitlines():
            if not line.startswith("@"):
                continue
            head, _, count = line.rpartition(": ")
            event, _, keys = head[1:-1].partition("[")
            tid, filename, name, *lineno = keys.split(", ")
            if filename not in (self.corpus, "<parity-exec>"):
                continue
            if filename == self.corpus and name in UNCOUNTED_NAMES:
                continue
            key = (event, names[int(tid)], filename, name, *map(int, lineno))
            counts[key] = int(count)
        return counts

    def assertSameCounts(self, expected, found, what):
        differences = {
            key: (expected.get(key), found.get(key))
            for key in sorted(set(expected) | set(found))
            if expected.get(key) != found.get(key)
        }
        self.assertEqual(differences, {}, what)

    def test_function_probes_equal_setprofile(self):
        require_bpftrace(self)
        expected = self.reference_counts("--profile")
        # The corpus really ran warm: 2000 rounds per thread.
        self.assertEqual(expected["call", "main", self.corpus, "plain"], 2000)
        found = self.probe_counts(FUNCTION_PROGRAM)
        self.assertSameCounts(expected, found,
                              "(event, thread, file, function): "
                              "(sys.setprofile, probes)")

    def test_line_probe_equals_settrace(self):
        require_bpftrace(self)
        expected = self.reference_counts("--trace")
        found = self.probe_counts(LINE_PROGRAM)
        self.assertSameCounts(expected, found,
                              "(event, thread, file, function, line): "
                              "(sys.settrace, probes)")

    def test_entries_balance_returns(self):
        # Every frame that starts also stops: per thread and function,
        # entries equal returns (generators included: each resumption is
        # an entry and each suspension a return).
        require_bpftrace(self)
        found = self.probe_counts(FUNCTION_PROGRAM)
        self.assertTrue(found)
        balance = collections.Counter()
        for (event, role, filename, name), count in found.items():
            balance[role, filename, name] += (count if event == "call"
                                              else -count)
        self.assertEqual({k: v for k, v in balance.items() if v}, {})


if __name__ == "__main__":
    unittest.main()
