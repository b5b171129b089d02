"""Every program the toolkit loads stays under half of the kernel
verifier's limit on the instructions it walks, with the bpftrace on PATH
(make check runs this module with 0.17; tier 11 with 0.23 and 0.27).

A compiler or libbpf update on a user's machine moves these figures: a
program near the limit is refused there (E2BIG) while it loads here.
This fails first, at half the limit, so that the next drift is caught
here.  The figures come from the verifier itself (usdt._bpftrace's
verify(), `python -m usdt.stacks --verifier-stats`); docs/tools-cost.md
lists them.  The stack depth is held under three quarters of the 512
bytes of a BPF function: 0.27's whole-stack walk takes 360 (the
variables of its bpf_loop() calls)."""

import concurrent.futures
import os
import re
import subprocess
import sys
import unittest

from support import (PYTHON, USDT_PACKAGE, bpftrace_module,
                     bpftrace_runner, require_bpftrace, run, usdt_module)

TOOL = os.path.join(USDT_PACKAGE, "stacks")
SCRIPTS = os.path.join(USDT_PACKAGE, "scripts")

# Each script's positional parameters after PYTHON, where it needs some
# to load (pyprofile.bt's PID: any number loads it).
SCRIPT_PARAMS = {"pyprofile.bt": ["1"]}
# The scripts of python:batch (usdt._batch).
BATCH_SCRIPTS = ("calls-batch.bt", "latency-batch.bt")

# the stack tool's programs: at a timer, Python stacks, and whole stacks at
# the default depths and at twice the default native depth; whole stacks
# at a tracepoint and at a USDT marker (the walk is the same program at
# any probe; the probe's context is not); alloc's program (weights and
# releases).
CASES = ([["--probe", "profile:hz:99", *options]
          for options in ([], ["--native"],
                          ["--native", "--max-native", "256"])] +
         [["--probe", probe, "--native"]
          for probe in ("tracepoint:syscalls:sys_enter_write",
                        "usdt:PYTHON:python:gc__start")])
ALLOC = ["--probe", "usdt:PYTHON:otel_memory:alloc", "--weight", "arg2",
         "--size", "arg1", "--live", "arg0",
         "usdt:PYTHON:otel_memory:free", "arg0"]

# The programs are loaded two at a time: bpftrace's compiler and the
# verifier keep a CPU busy for seconds per program, and they are many.
WORKERS = max(1, min(2, os.cpu_count() or 1))

ROW = re.compile(r"^(.+?)\s+(\d+)\s+(\S+)$")


class MarginTest(unittest.TestCase):
    maxDiff = None

    def setUp(self):
        require_bpftrace(self)
        self.bpftrace = bpftrace_module()
        self.runner = bpftrace_runner()

    def assertMargin(self, what, stats):
        limit = self.bpftrace.VERIFIER_INSNS_LIMIT // 2
        stack = self.bpftrace.VERIFIER_STACK_LIMIT * 3 // 4
        self.assertTrue(stats, "%s: no verifier figures" % what)
        for name, insns, depth in stats:
            self.assertLess(
                insns, limit,
                "%s, %s (%s): the verifier walked %d instructions, more "
                "than half of its limit (%d)"
                % (what, name, self.runner, insns, 2 * limit))
            if depth is not None:
                self.assertLess(
                    depth, stack,
                    "%s, %s (%s): a function's stack takes %d bytes of %d"
                    % (what, name, self.runner, depth,
                       self.bpftrace.VERIFIER_STACK_LIMIT))

    def pystack_stats(self, options):
        proc = run([sys.executable, TOOL, "--verifier-stats", *options,
                    "-c", "%s -c pass" % PYTHON], timeout=900)
        out = proc.stdout
        self.assertEqual(proc.returncode, 0, out + proc.stderr)
        stats = []
        for line in out.splitlines()[2:]:
            match = ROW.match(line)
            self.assertIsNotNone(match, "not a row: %r" % line)
            name, insns, depth = match.groups()
            stats.append((name, int(insns), None if depth == "-" else
                          max(int(d) for d in depth.split("+"))))
        return stats

    def test_stack_tool_programs(self):
        # Two at a time, as test_scripts.
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            futures = [pool.submit(self.pystack_stats, args)
                       for args in CASES]
        for args, future in zip(CASES, futures):
            with self.subTest(args=" ".join(args)):
                self.assertMargin("usdt.stacks " + " ".join(args),
                                  future.result())

    def test_alloc_program(self):
        self.assertMargin("usdt.stacks " + " ".join(ALLOC),
                          self.pystack_stats(ALLOC))

    def script_program(self, name):
        """(text, params) of the script *name* as the toolkit loads it, or
        None where this bpftrace runs another script instead."""
        with open(os.path.join(SCRIPTS, name)) as f:
            text = f.read()
        params = [PYTHON] + SCRIPT_PARAMS.get(name, [])
        if name in BATCH_SCRIPTS:
            # As usdt.tools calls and latency load them: the interpreter's
            # offsets, the loops as this version takes them; none on
            # 0.18-0.23, where the tools run their per-event scripts.
            batch = usdt_module("_batch")
            if batch.too_large_for(self.runner):
                return None
            text = self.runner.stack_config() + self.runner.loops(
                text.partition("\n")[2])
            params += batch.program_params(PYTHON)
        return text, params

    def test_scripts(self):
        names = sorted(n for n in os.listdir(SCRIPTS) if n.endswith(".bt"))
        self.assertGreater(len(names), 10)
        programs = {name: self.script_program(name) for name in names}

        def verify(name):
            # Loaded as the tools load them by test_usdt_scripts.
            text, params = programs[name]
            return self.runner.verify(text, params,
                                      ["-c", "%s -c pass" % PYTHON],
                                      load=False)

        # Two at a time (WORKERS).
        loaded = [name for name in names if programs[name] is not None]
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            results = dict(zip(loaded, pool.map(verify, loaded)))
        for name in loaded:
            with self.subTest(script=name):
                stats, errors, status = results[name]
                self.assertEqual(status, 0, "%s: %s" % (name, errors))
                self.assertMargin(name, [(s.name, s.insns, s.max_stack)
                                         for s in stats])


class ParseTest(unittest.TestCase):
    """verifier_stats() on what each version prints (no bpftrace
    needed)."""

    def test_named_logs(self):
        stats = bpftrace_module().verifier_stats(
            "BPF verifier log for begin_3:\n---\nfunc#0 @0\n"
            "stack depth 40\nprocessed 46832 insns (limit 1000000) "
            "max_states_per_insn 1\n\n"
            "BPF verifier log for profile_hz_99_2:\n---\n"
            "stack depth 360+136+8\nprocessed 9484 insns (limit 1000000) "
            "max_states_per_insn 6\n")
        self.assertEqual([(s.name, s.insns, s.stack) for s in stats],
                         [("begin_3", 46832, [40]),
                          ("profile_hz_99_2", 9484, [360, 136, 8])])

    def test_logs_of_0_17(self):
        stats = bpftrace_module().verifier_stats(
            "Attaching 2 probes...\nProgram ID: 1912\nThe verifier log: \n"
            "0: (b7) r1 = 0\nprocessed 13 insns (limit 1000000) "
            "max_states_per_insn 0\nAttaching BEGIN\n"
            "Program ID: 1921\nThe verifier log: \n"
            "processed 31 insns (limit 1000000) max_states_per_insn 0\n"
            "Attaching profile:hz:99\n\nProgram ID: 4673\n\n"
            "The verifier log: \nprocessed 79 insns (limit 1000000) "
            "max_states_per_insn 0\n\n\n@live[os, _Environ]: 0\n")
        self.assertEqual([(s.name, s.insns, s.stack) for s in stats],
                         [("BEGIN", 13, None), ("profile:hz:99", 31, None),
                          ("program 4673", 79, None)])

    def test_refusal_says_which_limit(self):
        bpftrace = bpftrace_module()
        words = bpftrace.refusal(
            "ERROR: Error loading BPF program for profile_hz_99_2. Error "
            "code: -7 (Argument list too long). Use -v for full kernel "
            "error log.")
        self.assertIn("1,000,000 instructions", words)
        self.assertIn("E2BIG", words)
        self.assertIsNone(bpftrace.refusal("ERROR: something else"))


class AdviceTest(unittest.TestCase):
    """What usdt.stacks says when the kernel refuses its program (no bpftrace
    needed: a runner that refuses what is too deep)."""

    class Runner:
        def __init__(self, range_loops, loads):
            self.range_loops = range_loops
            self.loads = loads
            self.tried = []

        def loops(self, text):
            return bpftrace_module().while_loops(text)

        def stack_config(self):
            return ""

        def probe_offsets(self):
            return False

        def verify(self, text):
            depth = int(re.search(r"#define MAX_DEPTH +(\d+)", text)[1])
            native = 8 * int(re.search(r"#define NATIVE_BATCHES +(\d+)",
                                       text)[1])
            self.tried.append((depth, native))
            if self.loads(depth, native):
                return [], "", 0
            return [], ("ERROR: Error loading BPF program for x. Error "
                        "code: -7 (Argument list too long)."), 255

    def advice(self, runner):
        tracing = usdt_module("stacks.tracing")
        offsets = usdt_module("stacks.offsets")
        config = usdt_module("stacks.api").Config(
            probes=["profile:hz:99"], native=True, max_depth=64,
            max_native=128)
        return tracing.refusal_advice(offsets.Interpreter(PYTHON), config,
                                      ["profile:hz:99"], runner)

    def test_names_the_depths_that_load(self):
        runner = self.Runner(False, lambda depth, native: native <= 32)
        self.assertEqual(self.advice(runner), "it loads with --max-depth 64 "
                         "--max-native 32 (checked just now)")
        self.assertEqual(runner.tried, [(64, 64), (64, 32)])

    def test_none_loads(self):
        runner = self.Runner(False, lambda depth, native: False)
        self.assertIn("no lower --max-depth or --max-native loads",
                      self.advice(runner))
        self.assertEqual(runner.tried[-1], (8, 8))

    def test_range_loops_say_depth_does_not_help(self):
        runner = self.Runner(True, lambda depth, native: True)
        self.assertIn("would not help", self.advice(runner))
        self.assertEqual(runner.tried, [])


if __name__ == "__main__":
    unittest.main()
