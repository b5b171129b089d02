"""function__entry/function__return report exactly sys.setprofile's events.

data/parity_corpus.py takes every path by which the 3.13 interpreter starts
and stops a Python frame, from warm (specialised) call sites, in three
threads.  Its per-thread, per-function call and return counts under
sys.setprofile must equal the counts bpftrace sees from the probes.
"""

import collections
import os
import re
import shutil
import tempfile
import unittest

from support import Bpftrace, PYTHON, require_bpftrace, run

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                      "parity_corpus.py")
UNCOUNTED_NAMES = {"<module>", "main", "profiler"}
PROGRAM = """
usdt:%(python)s:python:function__entry /pid == cpid/
{ @call[tid, str(arg0), str(arg1)] = count(); }
usdt:%(python)s:python:function__return /pid == cpid/
{ @return[tid, str(arg0), str(arg1)] = count(); }
"""
COUNT_LINE = re.compile(r"@(call|return)\[(\d+), (.*), ([^,]*)\]: (\d+)$")


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
        # A short path: bpftrace copies at most BPFTRACE_STRLEN bytes of it.
        self.corpus = os.path.join(tmp, "parity_corpus.py")
        shutil.copy(CORPUS, self.corpus)

    def profile_counts(self):
        proc = run([PYTHON, self.corpus, "--profile"], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        names = roles(proc.stdout)
        counts = {}
        for line in proc.stdout.splitlines():
            if line.startswith("COUNT "):
                _, event, tid, filename, name, count = line.split()
                counts[event, names[int(tid)], filename, name] = int(count)
        return counts

    def probe_counts(self):
        env = dict(os.environ, BPFTRACE_STRLEN="200")
        proc = Bpftrace.run(PROGRAM % {"python": PYTHON}, self.corpus,
                            timeout=300, env=env)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        names = roles(proc.stdout)
        counts = {}
        for line in proc.stdout.splitlines():
            m = COUNT_LINE.match(line)
            if not m:
                continue
            event, tid, filename, name, count = m.groups()
            if filename not in (self.corpus, "<parity-exec>"):
                continue
            if filename == self.corpus and name in UNCOUNTED_NAMES:
                continue
            counts[event, names[int(tid)], filename, name] = int(count)
        return counts

    def test_counts_equal_setprofile(self):
        require_bpftrace(self)
        expected = self.profile_counts()
        # Sanity: the corpus really ran in three threads, warm.
        self.assertEqual({role for _, role, _, _ in expected},
                         {"main", "thread-1", "thread-2"})
        self.assertGreaterEqual(
            expected["call", "main", self.corpus, "plain"], 1000)
        found = self.probe_counts()
        differences = {
            key: (expected.get(key), found.get(key))
            for key in sorted(set(expected) | set(found))
            if expected.get(key) != found.get(key)
        }
        self.assertEqual(differences, {},
                         "(event, thread, file, function): "
                         "(sys.setprofile, probes)")

    def test_entries_balance_returns(self):
        # Every frame that starts also stops: per thread and function,
        # entries equal returns (generators included: each resumption is
        # an entry and each suspension a return).
        require_bpftrace(self)
        found = self.probe_counts()
        per_function = collections.Counter()
        for (event, role, filename, name), count in found.items():
            per_function[role, filename, name] += (count if event == "call"
                                                   else -count)
        self.assertTrue(found)
        self.assertEqual({k: v for k, v in per_function.items() if v}, {})


if __name__ == "__main__":
    unittest.main()
