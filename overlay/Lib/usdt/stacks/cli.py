"""the stack tool's command line: run() parses the options, writes the program,
runs it and prints the counts; main() also says what bpftrace warnings it
left out."""

import argparse
import sys

from .. import _bpftrace
from .._bpftrace import Error
from .api import Config, prepare, read, trace
from .offsets import DEFAULT_MAX_DEPTH, DEFAULT_MAX_NATIVE, DEFAULT_STRLEN
from .output import (write_counts, write_folded, write_folded_objects,
                     write_json, write_notes)

# The command's name in its messages.
PROG = "usdt.stacks"


def main(argv=None):
    """the stack tool's exit status for the options argv (default: sys.argv),
    with a line on stderr for the known harmless bpftrace warnings it
    left out, if any."""
    try:
        return run(argv)
    finally:
        sys.stderr.write(_bpftrace.left_out_note(PROG))


def run(argv=None):
    """main() without its note: python -m usdt.tools, which runs usdt.stacks
    in its own process, says that itself, of all it ran."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Count the Python stacks of the threads that hit a "
        "bpftrace probe (see \"Python stacks\" in "
        "Doc/howto/usdt-tools.rst).",
        epilog="Cost (make bench-whole-stacks, docs/whole-stacks.md; "
        "2-core VM, quiet): BPF time per sample about 10 us at 30 Python "
        "frames and 15 us at 100 of a synthetic workload, with or without "
        "--native; 33 to 46 us on a real application (docutils and "
        "pygments: its frames cost about 1 us each, and the first record "
        "about 10 us, which wakes bpftrace's reader); the stack tool's own CPU "
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
    if not args.read and not args.probe:
        parser.error("--probe is required")
    if args.also_folded_objects and not args.size:
        parser.error("--also-folded-objects needs --size")
    config = Config(
        probes=args.probe or [], command=args.command, pid=args.pid,
        python=args.python, weight=args.weight, size=args.size,
        live=tuple(args.live) if args.live else None, filter=args.filter,
        co_name=args.co_name, native=args.native,
        max_native=args.max_native, max_depth=args.max_depth,
        max_threads=args.max_threads, strlen=args.strlen,
        duration=args.duration, save=args.save,
        hold=not args.verifier_stats)
    try:
        if args.read:
            result = read(args.read, config)
        else:
            try:
                config.check()
            except Error as error:
                parser.error(str(error))
            # --print-program is for the bpftrace on PATH, if any;
            # tracefs is not needed.
            prepared = prepare(config,
                               tracefs=not args.print_program)
            if args.print_program:
                sys.stdout.write(prepared.text)
                return 0
            if args.verifier_stats:
                # With -p, a short run of the same interpreter, which
                # ends (bpftrace -p would run until PID ends).
                command = (args.command
                           or "%s -c pass" % prepared.interp.path)
                return print_verifier_stats(prepared.runner, prepared.text,
                                            ["-c", command])
            result = trace(prepared)
        write(args, result)
        return result.status
    except Error as error:
        sys.stderr.write("%s: %s\n" % (PROG, error))
        return 2


def write(args, result):
    """The counts as the options ask, to --output or stdout; the folded
    copies of --also-folded and --also-folded-objects; the notes."""
    writer = (write_folded if args.folded else write_json if args.json
              else write_counts)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as out:
            writer(result, out)
    else:
        writer(result, sys.stdout)
    if args.also_folded:
        with open(args.also_folded, "w", encoding="utf-8") as out:
            write_folded(result, out)
    if args.also_folded_objects:
        with open(args.also_folded_objects, "w", encoding="utf-8") as out:
            write_folded_objects(result, out)
    write_notes(result, sys.stderr, PROG)


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
