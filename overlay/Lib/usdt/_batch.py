"""The tools that read python:batch (Python/pydtrace_batch.c): their
programs' parameters, and their maps turned into the output of the
per-event scripts they replace.

calls: scripts/calls-batch.bt counts the calls per code object (address
and co_version) and reads each code object's file, name and first line
the first time it meets it, while the code object is alive (its
co_version still the record's; else it counts under CODE_GONE, never
under the name of a later code object at the same address).  This module
adds up the counts per (file, name, line), as top-functions.bt keys them,
and prints the same lines."""

import collections
import re
import sys

# Keys of two numbers (code object address, co_version), bpftrace's print.
PAIR_LINE = re.compile(r"^@(calls|file|name|line)\[(\d+), (\d+)\]: (.*)$")
SCALAR_LINE = re.compile(r"^@(lost|gone|stale|unnamed|bad_layout): (\d+)$")
CODE_GONE = "[code object gone]"


def program_params(binary):
    """The positional parameters of calls-batch.bt after the binary: the
    offsets of co_filename, co_name, co_firstlineno and co_version in a
    code object, of the state in a str, and the size of an ASCII str's
    header (where its characters start)."""
    from usdt.stacks.offsets import Interpreter
    interp = Interpreter(binary)
    o = interp.offsets
    return [str(v) for v in (
        o["code_object.filename"], o["code_object.name"],
        o["code_object.firstlineno"], interp.co_version,
        o["unicode_object.state"], o["unicode_object.asciiobject_size"])]


def too_large_for(runner):
    """Whether bpftrace *runner* cannot load calls-batch.bt: 0.17 takes its
    while loops, and 0.24 and later its range loops (bpf_loop()), but the
    verifier gives up on the while loops of 0.18 to 0.23 (0.23 checked:
    "BPF program is too large", with 64 iterations of the naming loop
    and not 128)."""
    version = runner.version
    return version is not None and (0, 18) <= version[:2] < (0, 24)


def parse(text):
    """({field: {(code, version): value}}, {counter: n}) of the
    program's output."""
    maps = collections.defaultdict(dict)
    counters = collections.Counter()
    for line in text.splitlines():
        match = PAIR_LINE.match(line)
        if match:
            field, code, version, value = match.groups()
            key = (int(code), int(version))
            maps[field][key] = (int(value) if field in ("calls", "line")
                                else value)
            continue
        match = SCALAR_LINE.match(line)
        if match:
            counters[match.group(1)] += int(match.group(2))
    return maps, counters


def calls_by_function(maps):
    """Counter {(file, name, line): calls} of parse()'s maps."""
    calls = collections.Counter()
    for key, n in maps["calls"].items():
        if key in maps["line"]:
            where = (maps["file"].get(key, "?"), maps["name"].get(key, "?"),
                     maps["line"][key])
        else:
            where = (CODE_GONE, "?", 0)
        calls[where] += n
    return calls


def format_calls(calls, top):
    """The lines top-functions.bt prints: the *top* most frequent (all
    with 0), the most frequent last."""
    ranked = sorted(calls.items(), key=lambda item: (item[1], item[0]))
    if top:
        ranked = ranked[-top:]
    return "".join("@calls[%s, %s, %d]: %d\n" % (f, n, line, count)
                   for (f, n, line), count in ranked)


def report(tool, counters, keys, maps, out=sys.stderr):
    """Say on *out* what the counts lack: never silent.  The program runs
    without bpftrace's -k (its checks make the loops too large for the
    verifier), so a map that is full drops keys unreported: a map with
    *keys* keys is taken for full."""
    full = sorted(name for name, entries in maps.items()
                  if len(entries) >= keys)
    if full:
        out.write("usdt.tools %s: map %s full (%d keys): calls of code "
                  "objects met after it filled are not counted; give more "
                  "with --map-keys\n" % (tool, ", ".join(full), keys))
    if counters["bad_layout"]:
        out.write("usdt.tools %s: %d batches of a record layout this tool "
                  "does not know were skipped\n"
                  % (tool, counters["bad_layout"]))
    if counters["lost"]:
        out.write("usdt.tools %s: %d events lost (not recorded by the "
                  "interpreter, or past a batch's loop): the counts are "
                  "short\n" % (tool, counters["lost"]))
    if counters["gone"]:
        out.write("usdt.tools %s: %d code objects freed before their batch "
                  "was read: their calls count under %s\n"
                  % (tool, counters["gone"], CODE_GONE))
    if counters["unnamed"]:
        out.write("usdt.tools %s: %d names neither ASCII nor cached as "
                  "UTF-8 read as ?\n" % (tool, counters["unnamed"]))
