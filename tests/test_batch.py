"""python:batch (Python/pydtrace_batch.c) against sys.setprofile().

The records of the batches a tracer receives, counted per code object and
kind, equal the 'call' and 'return' events that a sys.setprofile()
function (threading.setprofile_all_threads()) receives in a run of the
same deterministic workload: generators, coroutines that suspend,
exceptions that unwind several frames, threads; and code run in a
subinterpreter.  A forked child's batches hold the child's events only.
python -m usdt.tools calls, which reads the batches, counts as
sys.setprofile() does, and python -m usdt.tools latency (latency-batch.bt)
times as many runs of each function.  With -p, the calls of a thread that
then blocks, with its buffer partly filled, reach the tool at Ctrl-C.
"""

import collections
import json
import os
import signal
import subprocess
import tempfile
import textwrap
import time
import unittest

from support import (CPU_NOTE, PYTHON, Bpftrace, bpftrace_env,
                     bpftrace_runner,
                     readline, require_bpftrace, run, start, usdt_module)

# The workload: deterministic calls of its own functions.  With argv[1]
# "profile", it counts its functions' setprofile events in every thread
# and prints them as JSON; otherwise, given the offset of co_version in a
# code object in CO_VERSION_OFFSET, it prints {address of each code object: [its
# qualname, its co_version]} at the end, for the records to be named
# (an address alone may have been another code object's before, such as
# a module body's that ran at start-up).
WORKLOAD = textwrap.dedent("""\
    import ctypes, json, sys, threading, types

    def leaf(i):
        return i + 1

    @types.coroutine
    def suspend():
        yield

    async def coro_leaf(i):
        return i + 1

    async def coro(n):
        total = 0
        for i in range(n):
            await suspend()
            total += await coro_leaf(i)
        return total

    def run_coro(n):
        c = coro(n)
        try:
            while True:
                c.send(None)
        except StopIteration as stop:
            return stop.value

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
            if i % 10 == 0:
                total += run_coro(3)
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

    FUNCS = [leaf, gen, deep, catcher, closer, work, threaded, main,
             suspend, coro_leaf, coro, run_coro]
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

# Code run in a subinterpreter: a generator and its calls; with argv[1]
# "profile", a sys.setprofile function set in the subinterpreter counts
# their 'call' events, printed as JSON.
SUBINTERPRETER = textwrap.dedent("""\
    import _interpreters, sys
    CODE = '''
    import json, os, sys
    def sub_f(i):
        return i
    def sub_gen(n):
        for i in range(n):
            yield sub_f(i)
    counts = {}
    def prof(frame, event, arg):
        name = frame.f_code.co_name
        if event == "call" and name in ("sub_f", "sub_gen"):
            counts[name] = counts.get(name, 0) + 1
    if PROFILE:
        sys.setprofile(prof)
    for i in range(70):
        sum(sub_gen(3))
    sys.setprofile(None)
    if PROFILE:
        os.write(1, (json.dumps(counts) + "\\\\n").encode())
    '''
    interp = _interpreters.create()
    _interpreters.run_string(interp, "PROFILE = %r\\n" % (
        sys.argv[1:] == ["profile"]) + CODE)
    _interpreters.destroy(interp)
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
	for ($i : 0..256) {
		if ($i >= arg1) {
			break;
		}
		$r = (uint64)arg0 + (uint64)$i * 24;
		@n[pid, *(uint64 *)uptr($r), *(uint32 *)uptr($r + 20),
		   *(uint32 *)uptr($r + 16)] = count();
	}
	if (arg1 > 256) {
		@too_many = count();
	}
}
"""

def program():
    runner = bpftrace_runner()
    return runner.stack_config() + runner.loops(RECORDS % PYTHON)


def record_counts(text):
    """({pid: Counter {(code, co_version, kind): records}}, Counter of the
    other maps) of RECORDS's printed maps."""
    per_pid = collections.defaultdict(collections.Counter)
    counters = collections.Counter()
    for name, keys, value in Bpftrace.maps(text):
        if name == "n":
            pid, code, version, kind = map(int, keys)
            per_pid[pid][code, version, kind] += value
        else:
            counters[name] += value
    return per_pid, counters


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
        return (*record_counts(proc.stdout),
                [line for line in proc.stdout.splitlines()
                 if line.startswith("{")])

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
        return (*record_counts(stdout), proc.stdout.splitlines())

    def calls_top_0(self, script):
        """python -m usdt.tools calls --top 0 -c "PYTHON script": its
        process, and the maps it wrote (-o)."""
        output = os.path.join(self.tmp.name, "calls.txt")
        proc = run([PYTHON, "-m", "usdt.tools", "calls", "--top", "0",
                    "-o", output, "-c", "%s %s" % (PYTHON, script)],
                   timeout=300, env=bpftrace_env())
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(output) as f:
            return proc, f.read()

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
        # Where calls-batch.bt does not load (bpftrace 0.18-0.23), the tool
        # runs top-functions.bt, says so, and counts the same.
        fallback = usdt_module("_batch").too_large_for(bpftrace_runner())
        script = self.script(WORKLOAD)
        truth = run([PYTHON, script, "profile"], timeout=300)
        self.assertEqual(truth.returncode, 0, truth.stderr)
        expected = {name.rpartition(" ")[0]: n for name, n in
                    json.loads(truth.stdout.splitlines()[-1]).items()
                    if name.endswith(" call")}
        proc, text = self.calls_top_0(script)
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
        if fallback:
            self.assertIn("cannot load calls-batch.bt", proc.stderr)
            return
        # The CPU time of the command, and of the tool beside it.
        said = [line for line in proc.stderr.splitlines()
                if CPU_NOTE.match(line)]
        self.assertEqual(len(said), 1, proc.stderr)
        self.assertNotIn("unknown", said[0])

    def test_subinterpreter_calls_equal_setprofile(self):
        # Code run in a subinterpreter (_interpreters, 3.13) writes its
        # records as the main interpreter's does: calls --top 0 counts
        # them as a sys.setprofile function set in that subinterpreter.
        script = self.script(SUBINTERPRETER)
        truth = run([PYTHON, script, "profile"], timeout=300)
        self.assertEqual(truth.returncode, 0, truth.stderr)
        expected = json.loads(truth.stdout.splitlines()[-1])
        self.assertEqual(expected["sub_f"], 210)
        proc, text = self.calls_top_0(script)
        found = {}
        for name, keys, value in Bpftrace.maps(text):
            if keys[0] == "<string>" and keys[1] in expected:
                found[keys[1]] = found.get(keys[1], 0) + value
        self.assertEqual(found, expected)
        self.assertNotIn("lost", proc.stderr)

    def setprofile_calls(self, script):
        """{function: calls} of the workload as setprofile counts them."""
        truth = run([PYTHON, script, "profile"], timeout=300)
        self.assertEqual(truth.returncode, 0, truth.stderr)
        return {name.rpartition(" ")[0]: n for name, n in
                json.loads(truth.stdout.splitlines()[-1]).items()
                if name.endswith(" call")}

    def test_latency_tool_equals_setprofile(self):
        # python -m usdt.tools latency --top 0 (latency-batch.bt): the runs
        # of each function (calls, resumptions, throws into a generator)
        # are setprofile's 'call' events, each timed to its 'return'.
        # Where latency-batch.bt does not load (bpftrace 0.18-0.23), the
        # tool runs latency.bt, says so, and counts the same.
        fallback = usdt_module("_batch").too_large_for(bpftrace_runner())
        script = self.script(WORKLOAD)
        expected = self.setprofile_calls(script)
        output = os.path.join(self.tmp.name, "latency.txt")
        proc = run([PYTHON, "-m", "usdt.tools", "latency", "--top", "0",
                    "-o", output, "-c", "%s %s" % (PYTHON, script)],
                   timeout=300, env=bpftrace_env())
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("lost", proc.stderr)
        self.assertNotIn("full", proc.stderr)
        with open(output) as f:
            text = f.read()
        runs = {}
        sums = collections.defaultdict(dict)
        module = None
        for line in text.splitlines():
            if line.startswith("@ns["):
                key, _, value = line[4:].partition("]: ")
                path, name, _ = key.split(", ")
                count = int(value.split(",")[0].split()[1])
                if path == script and name == "<module>":
                    module = count
                elif path == script:
                    runs[name] = count
            for field in ("exclusive_ns", "inclusive_ns"):
                if line.startswith("@%s[%s, " % (field, script)):
                    key, _, value = line.partition("]: ")
                    sums[field][key.split(", ")[1]] = int(value)
        self.assertEqual(runs, expected)
        # The module's body is named too (one run: it ran before
        # setprofile was set).
        self.assertEqual(module, 1)
        self.assertNotIn(usdt_module("_batch").CODE_GONE, text)
        # leaf calls no Python function: its own time is all of it; main's
        # includes its callees'.
        self.assertEqual(sums["exclusive_ns"]["leaf"],
                         sums["inclusive_ns"]["leaf"])
        self.assertGreater(sums["inclusive_ns"]["main"],
                           sums["exclusive_ns"]["main"])
        self.assertIn("@latency_ns[%s, leaf, " % script, text)
        self.assertEqual("cannot load latency-batch.bt" in proc.stderr,
                         fallback, proc.stderr)

    def test_partial_buffer_delivered_at_ctrl_c(self):
        # A process makes 300 calls (less than a buffer) and blocks; the
        # tool gets Ctrl-C as soon as it has: it waits for a poll of the
        # process's watcher, which hands over the partial buffer.
        if usdt_module("_batch").too_large_for(bpftrace_runner()):
            self.skipTest("calls-batch.bt does not load on bpftrace %s: "
                          "no batches to hand over (each call traps)"
                          % bpftrace_runner())
        script = self.script(textwrap.dedent("""\
            import sys

            def f(i):
                return i

            print("ready", flush=True)
            for line in sys.stdin:
                for i in range(300):
                    f(i)
                print("done", flush=True)
            """), name="blocks.py")
        app = start(self, [PYTHON, script], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE)
        self.assertEqual(readline(app.stdout, 60, "no 'ready'"), "ready\n")
        output = os.path.join(self.tmp.name, "calls.txt")
        tool = start(self, [PYTHON, "-m", "usdt.tools", "calls", "-p",
                            str(app.pid), "-o", output, "--top", "0"],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     env=bpftrace_env())
        said = readline(tool.stderr, 120, "usdt.tools calls -p did not say "
                        "it traces")
        self.assertIn("tracing process %d" % app.pid, said)
        app.stdin.write("go\n")
        app.stdin.flush()
        self.assertEqual(readline(app.stdout, 60, "no 'done'"), "done\n")
        tool.send_signal(signal.SIGINT)
        stdout, stderr = tool.communicate(timeout=120)
        self.assertEqual(tool.returncode, 0, stderr)
        self.assertIn("last batches", stderr)
        # With -p, the process's CPU time while traced.
        self.assertTrue(any(CPU_NOTE.match(line) and "unknown" not in line
                            for line in stderr.splitlines()), stderr)
        with open(output) as f:
            calls = {keys[1]: value
                     for _, keys, value in Bpftrace.maps(f.read())
                     if keys[0] == script}
        self.assertEqual(calls, {"f": 300})
        self.assertIsNone(app.poll())


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

    def test_latency_entries_added_up(self):
        # Two code objects of one function (a module run twice, a def run
        # anew): one entry of each map, their runs and times added up, the
        # histograms bucket by bucket; a code object alone as printed.
        batch = usdt_module("_batch")
        hist_a = ("[16, 32)              3 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@"
                  "@@@@@@@@@@@@@@@@@@@@@@|\n")
        hist_b = ("[64, 128)             1 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@"
                  "@@@@@@@@@@@@@@@@@@@@@@|\n")
        maps, _ = batch.parse(
            "@ns[1, 1]: count 3, average 20, total 60\n"
            "@ns[2, 1]: count 1, average 100, total 100\n"
            "@ns[3, 4]: count 1, average 7, total 7\n\n"
            "@latency_ns[1, 1]: \n" + hist_a + "\n"
            # bpftrace 0.27's first line of a histogram.
            "@latency_ns[2, 1]:\n" + hist_b + "\n"
            "@exclusive_ns[1, 1]: 60\n@exclusive_ns[2, 1]: 90\n\n"
            "@inclusive_ns[1, 1]: 60\n@inclusive_ns[2, 1]: 100\n\n"
            "@file[1, 1]: /a.py\n@name[1, 1]: f\n@line[1, 1]: 3\n"
            "@file[2, 1]: /a.py\n@name[2, 1]: f\n@line[2, 1]: 3\n"
            "@file[3, 4]: /b.py\n@name[3, 4]: g\n@line[3, 4]: 9\n")
        self.assertEqual(batch.format_latency(maps, "inclusive"), (
            "@ns[/b.py, g, 9]: count 1, average 7, total 7\n"
            "@ns[/a.py, f, 3]: count 4, average 40, total 160\n\n"
            "@latency_ns[/a.py, f, 3]: \n"
            "[16, 32)               3 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@"
            "@@@@@@@@@@@@@@@@|\n"
            "[32, 64)               0 |                                    "
            "                |\n"
            "[64, 128)              1 |@@@@@@@@@@@@@@@@@                   "
            "                |\n\n"
            "@exclusive_ns[/a.py, f, 3]: 150\n\n"
            "@inclusive_ns[/a.py, f, 3]: 160\n\n"))
        self.assertEqual(batch.bucket_label(batch.bucket_low("[4K, 8K)")),
                         "[4K, 8K)")
        self.assertEqual(batch.bucket_label(batch.bucket_low("[1]")), "[1]")
        self.assertEqual(batch.bucket_label(1 << 20), "[1M, 2M)")
        self.assertEqual(batch.bucket_label(512), "[512, 1K)")


if __name__ == "__main__":
    unittest.main()
