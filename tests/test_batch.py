"""python:batch (Python/pydtrace_batch.c) against sys.setprofile().

The records of the batches a tracer receives, counted per code object and
kind, equal the 'call' and 'return' events that a sys.setprofile()
function (threading.setprofile_all_threads()) receives in a run of the
same deterministic workload: generators, exceptions that unwind several
frames, threads.  A forked child's batches hold the child's events only.
python -m usdt.tools calls, which reads the batches, counts as
sys.setprofile() does.
"""

import collections
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

from support import (PYTHON, Bpftrace, bpftrace_env, bpftrace_runner,
                     require_bpftrace, run, usdt_module)

# The workload: deterministic calls of its own functions.  With argv[1]
# "profile", it counts its functions' setprofile events in every thread
# and prints them as JSON; otherwise, given the offset of co_version in a
# code object in CO_VERSION_OFFSET, it prints {address of each code object: [its
# qualname, its co_version]} at the end, for the records to be named
# (an address alone may have been another code object's before, such as
# a module body's that ran at start-up).
WORKLOAD = textwrap.dedent("""\
    import ctypes, json, sys, threading

    def leaf(i):
        return i + 1

    def gen(n):
        for i in range(n):
            yield leaf(i)

    def deep(k):
        if k == 0:
            raise ValueError(k)
        return deep(k - 1)

    def catcher():
        try:
            deep(5)
        except ValueError:
            return 1

    def closer():
        g = gen(10)
        next(g)
        try:
            g.throw(KeyError)
        except KeyError:
            pass

    def work(n):
        total = 0
        for i in range(n):
            total += leaf(i)
            total += sum(gen(3))
            total += catcher()
        closer()
        return total

    def threaded():
        threads = [threading.Thread(target=work, args=(300,))
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def main():
        work(2000)
        threaded()

    def version(code, off):
        return ctypes.c_uint32.from_address(id(code) + off).value

    FUNCS = [leaf, gen, deep, catcher, closer, work, threaded, main]
    CODES = {f.__code__: f.__qualname__ for f in FUNCS}

    if sys.argv[1:] == ["profile"]:
        # Per thread: a thread switch between the read and the write of
        # a count shared by the threads would lose calls.
        per_thread = {}
        def prof(frame, event, arg):
            name = CODES.get(frame.f_code)
            if name is not None and event in ("call", "return"):
                key = (threading.get_ident(), name + " " + event)
                per_thread[key] = per_thread.get(key, 0) + 1
        threading.setprofile_all_threads(prof)
        main()
        threading.setprofile_all_threads(None)
        counts = {}
        for (_, key), n in per_thread.items():
            counts[key] = counts.get(key, 0) + n
        print(json.dumps(counts))
    else:
        main()
        import os
        off = int(os.environ.get("CO_VERSION_OFFSET", "0"))
        if off:
            print(json.dumps({str(id(c)): [n, version(c, off)]
                              for c, n in CODES.items()}))
""")

# Every record of every batch: (pid, code, co_version, kind) counts; its
# range loop as the bpftrace at hand takes it (program()).
RECORDS = """
usdt:%s:python:batch
{
	@batches[pid] = count();
	@lost = sum(arg4);
	if (arg2 != 24 || arg3 != 1) {
		@bad_layout = count();
	}
	for ($i : 0..512) {
		if ($i >= arg1) {
			break;
		}
		$r = (uint64)arg0 + (uint64)$i * 24;
		@n[pid, *(uint64 *)uptr($r), *(uint32 *)uptr($r + 20),
		   *(uint32 *)uptr($r + 16)] = count();
	}
	if (arg1 > 512) {
		@too_many = count();
	}
}
"""

def program():
    runner = bpftrace_runner()
    return runner.stack_config() + runner.loops(RECORDS % PYTHON)


KINDS = {1: "call", 2: "call", 3: "call", 4: "return", 5: "return",
         6: "return"}


class BatchTest(unittest.TestCase):

    def setUp(self):
        require_bpftrace(self)
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def script(self, text, name="workload.py"):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def records(self, script):
        """{pid: Counter {(code, co_version, kind): records}} and the
        counters of the traced run, with the program's stdout."""
        offset = usdt_module("stacks.offsets").Interpreter(PYTHON).co_version
        env = dict(os.environ, CO_VERSION_OFFSET=str(offset))
        proc = Bpftrace.run(program(), script, timeout=300, env=env)
        self.assertEqual(proc.returncode, 0, Bpftrace.errors(proc))
        per_pid = collections.defaultdict(collections.Counter)
        counters = collections.Counter()
        lines = []
        for line in proc.stdout.splitlines():
            if not line.startswith("@"):
                if line.startswith("{"):
                    lines.append(line)
                continue
            for name, keys, value in Bpftrace.maps(line):
                if name == "n":
                    pid, code, version, kind = map(int, keys)
                    per_pid[pid][code, version, kind] += value
                else:
                    counters[name] += value
        return per_pid, counters, lines

    def records_everywhere(self, script):
        """records() of bpftrace attached to every process of PYTHON (no
        -c, which traces the command's process only, not its children)."""
        offset = usdt_module("stacks.offsets").Interpreter(PYTHON).co_version
        text = program() + (
            'interval:ms:20 /@ready == 0/ { @ready = 1; '
            'printf("ready\\n"); }\nEND { clear(@ready); }\n')
        bpftrace = subprocess.Popen(["bpftrace", "-q", "-e", text],
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        self.addCleanup(bpftrace.wait)
        try:
            # bpftrace 0.27 prints its warnings on stdout.
            for line in bpftrace.stdout:
                if line.strip() == "ready":
                    break
            else:
                self.fail("bpftrace did not attach: %s"
                          % bpftrace.stderr.read())
            env = dict(os.environ, CO_VERSION_OFFSET=str(offset))
            proc = run([PYTHON, script], env=env, timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stderr)
        finally:
            stdout, stderr = Bpftrace.interrupt(bpftrace)
        per_pid = collections.defaultdict(collections.Counter)
        counters = collections.Counter()
        for name, keys, value in Bpftrace.maps(stdout):
            if name == "n":
                pid, code, version, kind = map(int, keys)
                per_pid[pid][code, version, kind] += value
            else:
                counters[name] += value
        return per_pid, counters, proc.stdout.splitlines()

    def test_records_equal_setprofile(self):
        script = self.script(WORKLOAD)
        truth = run([PYTHON, script, "profile"], timeout=300)
        self.assertEqual(truth.returncode, 0, truth.stderr)
        expected = json.loads(truth.stdout.splitlines()[-1])
        per_pid, counters, lines = self.records(script)
        names = {(int(code), version): name
                 for code, (name, version) in json.loads(lines[-1]).items()}
        self.assertEqual(len(per_pid), 1, per_pid.keys())
        found = collections.Counter()
        for (code, version, kind), n in next(iter(per_pid.values())).items():
            self.assertIn(kind, KINDS)
            if (code, version) in names:
                found["%s %s" % (names[code, version], KINDS[kind])] += n
        self.assertEqual(dict(found), expected)
        self.assertEqual(counters["lost"], 0)
        self.assertEqual(counters["bad_layout"], 0)
        self.assertEqual(counters["too_many"], 0)
        # Several batches: full buffers, the threads' exits, the exit.
        self.assertGreater(counters["batches"], 5)

    def test_fork_child_starts_empty(self):
        # The parent's records made before fork() are in its buffer only:
        # the child's batches hold the child's calls and nothing of the
        # parent's (its exit flush would otherwise hand them over twice).
        script = self.script(textwrap.dedent("""\
            import ctypes, json, os, sys
            def before():
                pass
            def child():
                pass
            def key(f):
                code = f.__code__
                return [id(code), ctypes.c_uint32.from_address(
                    id(code) + int(os.environ["CO_VERSION_OFFSET"])).value]
            for _ in range(10):
                before()
            pid = os.fork()
            if pid == 0:
                for _ in range(7):
                    child()
                sys.exit(0)
            os.waitpid(pid, 0)
            print(json.dumps({"parent": os.getpid(), "child": pid,
                              "before": key(before),
                              "child_code": key(child)}))
            """))
        per_pid, counters, lines = self.records_everywhere(script)
        ids = json.loads(lines[-1])
        parent, child = per_pid[ids["parent"]], per_pid[ids["child"]]
        before, child_code = tuple(ids["before"]), tuple(ids["child_code"])
        self.assertEqual(parent[before + (1,)], 10)
        self.assertEqual(parent[child_code + (1,)], 0)
        self.assertEqual(child[before + (1,)], 0)
        self.assertEqual(child[before + (4,)], 0)
        self.assertEqual(child[child_code + (1,)], 7)
        self.assertEqual(child[child_code + (4,)], 7)
        self.assertEqual(counters["lost"], 0)

    def test_tracer_killed_mid_batch(self):
        # bpftrace killed with SIGKILL while batches flow: the process
        # goes on, and its result is the untraced one.
        script = self.script(textwrap.dedent("""\
            import sys, time
            def f(i):
                return i * 3 % 7
            print("ready", flush=True)
            total, end = 0, time.monotonic() + 4
            while time.monotonic() < end:
                for i in range(1000):
                    total += f(i)
            sys.stdout.write("%d\\n" % total)
            """))
        app = subprocess.Popen([PYTHON, script], stdout=subprocess.PIPE,
                               text=True)
        self.addCleanup(app.wait)
        self.addCleanup(app.stdout.close)
        self.assertEqual(app.stdout.readline(), "ready\n")
        text = program() + ('interval:ms:20 /@ready == 0/ { @ready = 1; '
                            'printf("ready\\n"); }\n')
        bpftrace = subprocess.Popen(["bpftrace", "-q", "-p", str(app.pid),
                                     "-e", text], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, text=True)
        self.addCleanup(bpftrace.wait)
        self.addCleanup(bpftrace.stdout.close)
        for line in bpftrace.stdout:
            if line.strip() == "ready":
                break
        # The watcher installs the events within a second; then batches.
        time.sleep(2)
        bpftrace.kill()
        out, _ = app.communicate(timeout=60)
        self.assertEqual(app.returncode, 0)
        # The loop's total is a multiple of the sum of f over 0..999.
        per_round = sum(i * 3 % 7 for i in range(1000))
        self.assertEqual(int(out) % per_round, 0)

    def test_calls_tool_equals_setprofile(self):
        # python -m usdt.tools calls --top 0 (calls-batch.bt): the calls of
        # each of the workload's functions, as setprofile counts them.
        if usdt_module("_batch").too_large_for(bpftrace_runner()):
            self.skipTest("calls-batch.bt does not load on bpftrace %s: "
                          "usdt.tools calls falls back to top-functions.bt"
                          % bpftrace_runner())
        script = self.script(WORKLOAD)
        truth = run([PYTHON, script, "profile"], timeout=300)
        self.assertEqual(truth.returncode, 0, truth.stderr)
        expected = {name.rpartition(" ")[0]: n for name, n in
                    json.loads(truth.stdout.splitlines()[-1]).items()
                    if name.endswith(" call")}
        output = os.path.join(self.tmp.name, "calls.txt")
        proc = run([PYTHON, "-m", "usdt.tools", "calls", "--top", "0",
                    "-o", output, "-c", "%s %s" % (PYTHON, script)],
                   timeout=300, env=bpftrace_env())
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(output) as f:
            text = f.read()
        found = {}
        for name, keys, value in Bpftrace.maps(text):
            self.assertEqual(name, "calls")
            # The module's body runs before setprofile is set.
            if keys[0] == script and keys[1] != "<module>":
                found[keys[1]] = found.get(keys[1], 0) + value
        # setprofile's names are qualnames; these are all top-level.
        self.assertEqual(found, expected)
        self.assertNotIn("lost", proc.stderr)
        self.assertNotIn("full", proc.stderr)


class ReportTest(unittest.TestCase):
    """What usdt.tools calls says of its counts (usdt._batch): no loss is
    silent.  Needs no tracer."""

    def test_losses_reported(self):
        import io
        batch = usdt_module("_batch")
        maps, counters = batch.parse(
            "@calls[1000, 7]: 5\n@calls[2000, 3]: 2\n"
            "@file[1000, 7]: /a.py\n@name[1000, 7]: f\n@line[1000, 7]: 3\n"
            "@lost: 4\n@gone: 1\n@stale: 0\n")
        self.assertEqual(batch.calls_by_function(maps),
                         {("/a.py", "f", 3): 5,
                          (batch.CODE_GONE, "?", 0): 2})
        self.assertEqual(batch.format_calls(
            batch.calls_by_function(maps), 1), "@calls[/a.py, f, 3]: 5\n")
        out = io.StringIO()
        batch.report("calls", counters, keys=2, maps=maps, out=out)
        text = out.getvalue()
        self.assertIn("4 events lost", text)
        self.assertIn("1 code objects freed", text)
        self.assertIn("map calls full (2 keys)", text)
        out = io.StringIO()
        batch.report("calls", collections.Counter(), keys=4096, maps=maps,
                     out=out)
        self.assertEqual(out.getvalue(), "")


if __name__ == "__main__":
    unittest.main()
