"""pystack's command line: run() parses the options, writes the program,
runs it and prints the counts; main() also says what bpftrace warnings it
left out."""

import argparse
import os
import signal
import sys

from .. import _bpftrace
from .._bpftrace import Error
from .offsets import (DEFAULT_MAX_DEPTH, DEFAULT_MAX_NATIVE, DEFAULT_STRLEN,
                      RECORD, Interpreter)
from .program import Libc, program
from .records import CodeReader
from .native import Symbolizer
from .output import counts_file, report
from .tracing import expand_probe, resolve_python, run_bpftrace


def main(argv=None):
    """pystack's exit status for the options argv (default: sys.argv),
    with a line on stderr for the known harmless bpftrace warnings it
    left out, if any."""
    try:
        return run(argv)
    finally:
        sys.stderr.write(_bpftrace.left_out_note("pystack"))


def run(argv=None):
    """main() without its note: python -m usdt.tools, which runs pystack
    in its own process, says that itself, of all it ran."""
    parser = argparse.ArgumentParser(
        prog="pystack",
        description="Count the Python stacks of the threads that hit a "
        "bpftrace probe (see \"Python stacks\" in "
        "Doc/howto/usdt-tools.rst).",
        epilog="Cost (make bench-whole-stacks, docs/whole-stacks.md; "
        "2-core VM, quiet): BPF time per sample about 10 us at 30 Python "
        "frames and 15 us at 100 of a synthetic workload, with or without "
        "--native; 33 to 46 us on a real application (docutils and "
        "pygments: its frames cost about 1 us each, and the first record "
        "about 10 us, which wakes bpftrace's reader); pystack's own CPU "
        "about 0.2 to 0.4 ms per sample.")
    parser.add_argument("--probe", action="append", metavar="PROBE",
                        help="a bpftrace probe; repeat for several.  A "
                        "field PYTHON stands for the interpreter's path "
                        "(usdt:PYTHON:python:gc__start)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("-c", dest="command", metavar="CMD",
                        help="run CMD and trace it (split on spaces, like "
                        "bpftrace -c)")
    target.add_argument("-p", dest="pid", type=int, metavar="PID",
                        help="trace process PID until Ctrl-C")
    parser.add_argument("--python", metavar="PATH",
                        help="the interpreter binary (default: /proc/PID/"
                        "exe, or CMD's first word)")
    parser.add_argument("--weight", metavar="EXPR", default="1",
                        help="what a hit adds to its stack's count: a "
                             "bpftrace expression of the probe, e.g. arg2 "
                             "(the weight of otel_memory:alloc, bytes); "
                             "default 1")
    parser.add_argument("--size", metavar="EXPR",
                        help="the size in bytes of what a hit samples, a "
                             "bpftrace expression of the probe (arg1 of "
                             "otel_memory:alloc): with --weight in bytes, "
                             "a hit stands for weight / size objects, "
                             "which --also-folded-objects writes")
    parser.add_argument("--live", nargs=3,
                        metavar=("KEY", "RELEASE", "RELEASE_KEY"),
                        help="count only the hits still held at the end: "
                             "a hit holds KEY (a bpftrace expression of the "
                             "probe) until RELEASE (a probe) hits with "
                             "RELEASE_KEY equal to it; e.g. arg0 "
                             "usdt:PYTHON:otel_memory:free arg0 with "
                             "--weight arg2 gives the bytes live per stack")
    parser.add_argument("--filter", metavar="PREDICATE",
                        help="a bpftrace predicate the hit must satisfy, "
                        "e.g. 'args->fd == 1'")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--folded", action="store_true",
                        help="print folded stacks, for a flame graph "
                        "(python -m usdt.flamegraph)")
    output.add_argument("--json", action="store_true",
                        help="print the counts as JSON")
    parser.add_argument("--co-name", action="store_true",
                        help="name frames by co_name, as tracebacks do "
                        "(default: co_qualname)")
    parser.add_argument("--native", action="store_true",
                        help="whole stacks: the native frames (frame "
                        "pointers), each activation of the evaluator "
                        "replaced by the Python frames it runs")
    parser.add_argument("--max-native", type=int, default=DEFAULT_MAX_NATIVE,
                        help="native frames kept per stack with --native, "
                        "innermost first (default %(default)s)")
    parser.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH,
                        help="frames kept per stack, innermost first "
                        "(default %(default)s)")
    parser.add_argument("--max-entries", type=int, metavar="N",
                        help="no effect, accepted for the scripts that "
                        "give it: lines are decoded in user space now, "
                        "without a budget")
    parser.add_argument("--max-threads", type=int, default=64,
                        help="thread states searched per interpreter "
                        "(default %(default)s)")
    parser.add_argument("--strlen", type=int, default=DEFAULT_STRLEN,
                        help="names and files keep their last STRLEN - 1 "
                        "bytes (default %(default)s, as when bpftrace "
                        "copied them)")
    parser.add_argument("-v", dest="verbose", action="store_true",
                        help="name the bpftrace used and its version, and "
                        "show the warnings of it that are known to be "
                        "harmless (left out, and counted, without -v)")
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="stop tracing SECONDS after bpftrace has "
                        "attached its probes (as Ctrl-C would): the time "
                        "bpftrace takes to compile and attach, seconds "
                        "on a loaded machine, is not taken from it")
    parser.add_argument("--print-program", action="store_true",
                        help="print the bpftrace program and exit")
    parser.add_argument("--verifier-stats", action="store_true",
                        help="load the program with the bpftrace on PATH "
                        "and print what the kernel's verifier reports of "
                        "each of its programs (instructions processed, of "
                        "1,000,000 at most; stack depth of each function, "
                        "of 512 bytes at most), then exit: 1 if the kernel "
                        "refused one")
    parser.add_argument("--save", metavar="FILE",
                        help="write bpftrace's records to FILE as they "
                        "come, unbuffered (for --read later), and keep "
                        "it; without --save they go to a temporary file, "
                        "removed once counted, kept and named should the "
                        "counting fail")
    parser.add_argument("--read", metavar="FILE",
                        help="count the records of a saved run of the "
                        "program (bpftrace -o FILE) instead of running it")
    parser.add_argument("--output", metavar="FILE",
                        help="write the counts to FILE (the output of the "
                        "-c command stays on stdout)")
    parser.add_argument("--also-folded-objects", metavar="FILE",
                        help="with --size: also write each stack's "
                        "estimated objects (the sum of weight / size of "
                        "its hits, rounded), folded, to FILE")
    parser.add_argument("--also-folded", metavar="FILE",
                        help="also write the same stacks, folded, to FILE "
                        "(what usdt.tools makes pprof and speedscope "
                        "files of)")
    args = parser.parse_args(argv)
    if args.verbose:
        _bpftrace.set_verbose()
    try:
        if args.read:
            with open(args.read, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            # This machine's libc, for the windows of the stack copied at
            # hits in libc, if there are any (unwind_window() takes it
            # only if its build ID is the one recorded).
            args.libc = Libc.find(args) if any(
                line.startswith(RECORD + " W ") for line in lines) else None
            # --python names the interpreter's native frames that
            # bpftrace could not name.
            with counts_file(args) as out:
                report(lines, args, out,
                       CodeReader(None, args.co_name, args.strlen),
                       Symbolizer(os.path.realpath(args.python))
                       if args.python else None)
            return 0
        if not args.probe:
            parser.error("--probe is required")
        if args.also_folded_objects and not args.size:
            parser.error("--also-folded-objects needs --size")
        if not 1 <= args.max_depth <= 512:
            parser.error("--max-depth must be 1 to 512")
        if not 1 <= args.max_native <= 1024:
            parser.error("--max-native must be 1 to 1024")
        if args.strlen < 2:
            parser.error("--strlen must be 2 or more")
        if args.duration is not None and not args.duration > 0:
            parser.error("--duration must be more than 0 seconds")
        python = resolve_python(args)
        interp = Interpreter(python)
        probes = [expand_probe(p, interp.path) for p in args.probe]
        if args.live:
            args.live[1] = expand_probe(args.live[1], interp.path)
        if args.print_program:
            # For the bpftrace on PATH, if any; tracefs is not needed.
            try:
                runner = _bpftrace.find(tracefs=False)
            except Error:
                runner = None
        else:
            runner = _bpftrace.find()
        args.libc = Libc.find(args) if args.native else None
        text = program(interp, args, probes, runner)
        if args.print_program:
            sys.stdout.write(text)
            return 0
        if args.verifier_stats:
            # With -p, a short run of the same interpreter, which ends
            # (bpftrace -p would run until PID ends).
            command = args.command or "%s -c pass" % interp.path
            return print_verifier_stats(runner, text, ["-c", command])
        lines, status, records, symbolizer, codes = run_bpftrace(
            text, args, runner, interp, probes)
        # bpftrace has stopped: a second Ctrl-C must not lose the counts
        # being made (python -m usdt.tools puts its own handler back).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            with counts_file(args) as out:
                report(lines, args, out, codes, symbolizer)
        except BaseException:
            sys.stderr.write("pystack: the records of this run are in %s: "
                             "count them again with --read %s\n"
                             % (records, records))
            raise
        if not args.save:
            os.unlink(records)
        return status
    except Error as error:
        sys.stderr.write("pystack: %s\n" % error)
        return 2


def print_verifier_stats(runner, text, target=None):
    """Load *text* with *runner* (and *target*, the -c option of a
    command that ends) and print the verifier's figures of
    each program: its name, instructions processed and stack depths
    (function by function; "-" where the version does not report them).
    Returns 1 if the kernel refused a program, else 0."""
    stats, errors, status = runner.verify(text, target=target)
    out = sys.stdout
    out.write("# %s\n" % runner)
    out.write("%-48s %9s %s\n" % ("program", "insns", "stack depth"))
    for s in stats:
        out.write("%-48s %9d %s\n" % (
            s.name, s.insns,
            "+".join(map(str, s.stack)) if s.stack else "-"))
    if status != 0:
        out.write("refused: %s\n%s\n" % (
            _bpftrace.refusal(errors) or "bpftrace failed (exit %d)" % status,
            errors))
        return 1
    return 0


def interrupt(signum, frame):
    """SIGTERM's handler: stop tracing and print, as Ctrl-C does."""
    raise KeyboardInterrupt
