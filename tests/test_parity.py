"""The probes report exactly what sys.setprofile, sys.settrace and
sys.monitoring report.

data/parity_corpus.py takes every path by which the 3.13 interpreter starts
and stops a Python frame, from warm (specialised) call sites, in three
threads.  Its per-thread, per-function call and return counts under
sys.setprofile must equal the function__entry/function__return counts
bpftrace sees, and its per-thread, per-line counts under sys.settrace must
equal the line probe's.

data/cparity_corpus.py calls C functions (builtins, methods of builtin
types bound and unbound, classmethods, extension modules, through partial,
map, filter, sorted, in generators and with blocks) and raises exceptions
(from C calls, re-raised, in groups, through finally), in three threads,
from warm call sites.  Its per-thread, per-site 'c_call' and
'c_return'/'c_exception' counts under sys.setprofile must equal the
cfunction__entry/cfunction__return counts, and its RAISE, RERAISE and
EXCEPTION_HANDLED counts under sys.monitoring the exception__* counts.

On stock 3.13.5 these tests fail: the probes never fire there (the new
ones do not exist).
"""

import collections
import os
import shutil
import tempfile
import unittest

from support import Bpftrace, PYTHON, require_bpftrace, run

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CORPUS = os.path.join(DATA, "parity_corpus.py")
CCORPUS = os.path.join(DATA, "cparity_corpus.py")
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
# Keys as the corpus's reference hooks print them: (file, line, module,
# callable) and (file, function, line, exception type).
CFUNCTION_PROGRAM = """
usdt:%(python)s:python:cfunction__entry /pid == cpid/
{ @c_call[tid, str(arg0), arg2, str(arg3), str(arg1)] = count(); }
usdt:%(python)s:python:cfunction__return /pid == cpid/
{ @c_return[tid, str(arg0), arg2, str(arg3), str(arg1)] = count(); }
"""
EXCEPTION_PROGRAM = """
usdt:%(python)s:python:exception__raise /pid == cpid/
{ @raise[tid, str(arg0), str(arg1), arg2, str(arg3)] = count(); }
usdt:%(python)s:python:exception__reraise /pid == cpid/
{ @reraise[tid, str(arg0), str(arg1), arg2, str(arg3)] = count(); }
usdt:%(python)s:python:exception__handled /pid == cpid/
{ @handled[tid, str(arg0), str(arg1), arg2, str(arg3)] = count(); }
"""


def roles(stdout):
    """{native thread id: role} from the corpus's ROLE lines."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("ROLE "):
            _, name, tid = line.split()
            found[int(tid)] = name
    return found


class CorpusTest(unittest.TestCase):
    """Runs a copy of the corpus SOURCE, at a short path: bpftrace copies
    at most BPFTRACE_STRLEN (64) bytes of a string."""

    SOURCE = None
    maxDiff = None

    def setUp(self):
        tmp = tempfile.mkdtemp(prefix="parity-")
        self.addCleanup(shutil.rmtree, tmp)
        self.corpus = os.path.join(tmp, os.path.basename(self.SOURCE))
        shutil.copy(self.SOURCE, self.corpus)
        # The module that runs it in three threads.
        shutil.copy(os.path.join(DATA, "corpus_threads.py"), tmp)

    def assertSameCounts(self, expected, found, what):
        differences = {
            key: (expected.get(key), found.get(key))
            for key in sorted(set(expected) | set(found))
            if expected.get(key) != found.get(key)
        }
        self.assertEqual(differences, {}, what)


class ParityTest(CorpusTest):

    SOURCE = CORPUS

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
        for event, keys, count in Bpftrace.maps(proc.stdout):
            tid, filename, name, *lineno = keys
            if filename not in (self.corpus, "<parity-exec>"):
                continue
            if filename == self.corpus and name in UNCOUNTED_NAMES:
                continue
            key = (event, names[int(tid)], filename, name, *map(int, lineno))
            counts[key] = count
        return counts

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


class CParityTest(CorpusTest):
    """cfunction__* against sys.setprofile, exception__* against
    sys.monitoring, on data/cparity_corpus.py.

    Counts are keyed by (event, thread, file, ...) with the rest of the
    probe's arguments as the reference hook computes them in Python; only
    lines of the corpus's own file count, minus the UNCOUNTED lines it
    prints (its hooks and the code around their installation).
    """

    SOURCE = CCORPUS
    # Where the line number is in a key: (event, thread, file, line,
    # module, callable) and (event, thread, file, function, line, type).
    CFUNCTION_LINE = 3
    EXCEPTION_LINE = 4

    def corpus_output(self, stdout):
        """(roles, rounds, the lines that do not count) from the corpus's
        own output."""
        rounds = None
        uncounted = set()
        for line in stdout.splitlines():
            if line.startswith("ROUNDS "):
                rounds = int(line.split()[1])
            elif line.startswith("UNCOUNTED "):
                first, last = map(int, line.split()[1:])
                uncounted.update(range(first, last + 1))
        self.assertIsNotNone(rounds, stdout)
        return roles(stdout), rounds, uncounted

    def select(self, raw, line_at, uncounted):
        """The counts of raw {(event, thread, file, ...): n} that count,
        a 'c_exception' counted as the 'c_return' it is for the probes."""
        counts = collections.Counter()
        for key, n in raw.items():
            if (key[2] == self.corpus
                    and int(key[line_at]) not in uncounted):
                event = "c_return" if key[0] == "c_exception" else key[0]
                counts[(event, *key[1:])] += n
        return dict(counts)

    def reference(self, mode, line_at):
        """(counts, rounds, raw counts) of the corpus's own hook."""
        proc = run([PYTHON, self.corpus, mode], timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        names, rounds, uncounted = self.corpus_output(proc.stdout)
        raw = {}
        for line in proc.stdout.splitlines():
            if line.startswith("COUNT\t"):
                _, tid, event, *key, n = line.split("\t")
                raw[(event, names[int(tid)], *key)] = int(n)
        self.assertEqual({key[1] for key in raw},
                         {"main", "thread-1", "thread-2"})
        return self.select(raw, line_at, uncounted), rounds, raw

    def probes(self, program, line_at):
        proc = Bpftrace.run(program % {"python": PYTHON}, self.corpus,
                            timeout=300)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        names, _, uncounted = self.corpus_output(proc.stdout)
        raw = {}
        for event, (tid, *key), n in Bpftrace.maps(proc.stdout):
            # A thread that is not the corpus's shows as its id.
            raw[(event, names.get(int(tid), tid), *key)] = n
        return self.select(raw, line_at, uncounted)

    def per_role(self, raw, event, name_of):
        """{(thread, name_of(key)): total} of raw's `event` entries."""
        totals = collections.Counter()
        for key, n in raw.items():
            if key[0] == event:
                totals[key[1], name_of(key)] += n
        return totals

    def assertRan(self, totals, names, rounds, what):
        # Each thread ran each case at least once per round.
        for role in ("main", "thread-1", "thread-2"):
            for name in names:
                self.assertGreaterEqual(totals[role, name], rounds,
                                        (what, role, name))

    def test_cfunction_probes_equal_setprofile(self):
        require_bpftrace(self)
        expected, rounds, raw = self.reference("--profile",
                                               self.CFUNCTION_LINE)

        def callable_name(key):
            return "%s.%s" % key[4:6]
        self.assertRan(self.per_role(raw, "c_call", callable_name), (
            "builtins.len", "builtins.print", "builtins.isinstance",
            "builtins.list.append", "builtins.dict.get", "builtins.str.join",
            "builtins.dict.fromkeys", "math.sqrt", "time.monotonic",
            "collections.deque.append", "_json.encode_basestring_ascii",
            "_json.scanstring",
            "_thread.lock.__exit__", "builtins.sorted", "builtins.hasattr",
            "builtins.generator.throw"), rounds, "c_call")
        self.assertRan(self.per_role(raw, "c_exception", callable_name),
                       ("math.sqrt", "builtins.divmod", "builtins.list.pop"),
                       rounds, "c_exception")
        found = self.probes(CFUNCTION_PROGRAM, self.CFUNCTION_LINE)
        self.assertSameCounts(expected, found,
                              "(event, thread, file, line, module, callable):"
                              " (sys.setprofile, probes)")

    def test_exception_probes_equal_monitoring(self):
        require_bpftrace(self)
        expected, rounds, raw = self.reference("--monitor",
                                               self.EXCEPTION_LINE)
        for event in ("raise", "reraise", "handled"):
            self.assertRan(self.per_role(raw, event, lambda key: "all"),
                           ("all",), rounds, event)
        self.assertRan(self.per_role(raw, "raise", lambda key: key[5]), (
            "ValueError", "KeyError", "json.decoder.JSONDecodeError",
            "Outer.InnerError", "fake.place.Relocated",
            "make_local_error.<locals>.LocalError", "ExceptionGroup"),
            rounds, "raise")
        found = self.probes(EXCEPTION_PROGRAM, self.EXCEPTION_LINE)
        self.assertSameCounts(expected, found,
                              "(event, thread, file, function, line, type):"
                              " (sys.monitoring, probes)")


if __name__ == "__main__":
    unittest.main()
