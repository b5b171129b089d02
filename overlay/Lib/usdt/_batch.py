"""The tools that read python:batch (Python/pydtrace_batch.c): their
programs' parameters, and their maps turned into the output of the
per-event scripts they replace.

calls: scripts/calls-batch.bt counts the calls per code object (address
and co_version) and reads each code object's file, name and first line
the first time it meets it, while the code object is alive (its
co_version still the record's; else it counts under CODE_GONE, never
under the name of a later code object at the same address).  This module
adds up the counts per (file, name, line), as top-functions.bt keys them,
and prints the same lines.

latency: scripts/latency-batch.bt keeps a stack of start times per thread
and its maps per code object: @ns (stats), @latency_ns (hist),
@exclusive_ns and @inclusive_ns (sums).  This module adds up the entries
of one (file, name, line) and prints the maps as latency.bt prints them:
an entry alone as bpftrace printed it, entries added up (two code objects
of one function, as a function defined anew) in bpftrace 0.17's form."""

import collections
import re
import sys

# Keys of two numbers (code object address, co_version), bpftrace's print.
PAIR_LINE = re.compile(r"^@(\w+)\[(\d+), (\d+)\]:(?: (.*))?$")
STATS_VALUE = re.compile(r"^count (\d+), average -?\d+, total (-?\d+)$")
# A histogram's bucket: its label ([0], [1], [4K, 8K)) and count.
BUCKET_LINE = re.compile(r"^(\[[^\])]*[\])])\s+(\d+) \|")
SUFFIXES = "KMGTPE"
INT_MAPS = {"calls", "line", "exclusive_ns", "inclusive_ns"}
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
    program's output: numbers; file and name strings; (count, total) of
    stats; of a histogram, its lines as printed."""
    maps = collections.defaultdict(dict)
    counters = collections.Counter()
    lines = iter(text.splitlines())
    for line in lines:
        match = PAIR_LINE.match(line)
        if match:
            field, code, version, value = match.groups()
            key = (int(code), int(version))
            # bpftrace 0.27 ends a histogram's first line with ":", 0.17
            # with ": ".
            value = value or ""
            if field in INT_MAPS:
                value = int(value)
            elif field == "ns":
                stats = STATS_VALUE.match(value)
                if not stats:
                    raise ValueError("not stats: %r" % line)
                value = (int(stats.group(1)), int(stats.group(2)))
            elif field == "latency_ns":
                value = []
                for bucket in lines:
                    if not bucket.strip():
                        break
                    value.append(bucket)
            maps[field][key] = value
            continue
        match = SCALAR_LINE.match(line)
        if match:
            counters[match.group(1)] += int(match.group(2))
    return maps, counters


def function(maps, key):
    """The (file, name, line) of code object *key* (address, version),
    CODE_GONE's if the program could not read them."""
    if key in maps["line"]:
        return (maps["file"].get(key, "?"), maps["name"].get(key, "?"),
                maps["line"][key])
    return (CODE_GONE, "?", 0)


def calls_by_function(maps):
    """Counter {(file, name, line): calls} of parse()'s maps."""
    calls = collections.Counter()
    for key, n in maps["calls"].items():
        calls[function(maps, key)] += n
    return calls


def by_function(maps, field):
    """{(file, name, line): [values of its code objects]} of one map."""
    grouped = collections.defaultdict(list)
    for key, value in maps[field].items():
        grouped[function(maps, key)].append(value)
    return grouped


def bucket_low(label):
    """The lowest value of a histogram bucket, of its label."""
    number = label[1:].split(",")[0].rstrip("])")
    if number[-1:] in SUFFIXES:
        return int(number[:-1]) << (10 * (SUFFIXES.index(number[-1]) + 1))
    return int(number)


def bucket_label(low):
    """bpftrace's label of the bucket that starts at *low*."""
    if low < 2:
        return "[%d]" % low

    def unit(n):
        for power in range(len(SUFFIXES), 0, -1):
            if n % (1 << 10 * power) == 0:
                return "%d%s" % (n >> 10 * power, SUFFIXES[power - 1])
        return str(n)
    return "[%s, %s)" % (unit(low), unit(2 * low))


def merge_hists(hists):
    """The bucket lines of histograms *hists* (bucket lines each) added
    up, in bpftrace 0.17's form: every bucket from the lowest to the
    highest that holds a count, bars scaled to the largest."""
    counts = collections.Counter()
    for lines in hists:
        for line in lines:
            match = BUCKET_LINE.match(line)
            if not match:
                raise ValueError("not a histogram bucket: %r" % line)
            counts[bucket_low(match.group(1))] += int(match.group(2))
    lows = sorted(low for low, n in counts.items() if n)
    if not lows:
        return []
    buckets = [0, 1] + [1 << k for k in range(1, 64)]
    buckets = [b for b in buckets if lows[0] <= b <= lows[-1]]
    top = max(counts.values())
    return ["%s%8d |%s|" % (bucket_label(b).ljust(16), counts[b],
                            ("@" * (counts[b] * 52 // top)).ljust(52))
            for b in buckets]


def hist_total(lines):
    return sum(int(BUCKET_LINE.match(line).group(2)) for line in lines
               if BUCKET_LINE.match(line))


def format_key(where):
    return "%s, %s, %d" % where


def format_latency(maps, order):
    """The maps of latency-batch.bt per function, printed as latency.bt
    prints them (every entry; in bpftrace's order: stats by average,
    histograms by their count, sums by value, the largest last)."""
    stats = {where: (sum(c for c, _ in v), sum(t for _, t in v))
             for where, v in by_function(maps, "ns").items()}
    out = []
    for where, (count, total) in sorted(
            stats.items(), key=lambda item: (
                item[1][1] // item[1][0] if item[1][0] else 0, item[0])):
        out.append("@ns[%s]: count %d, average %d, total %d\n" % (
            format_key(where), count, total // count if count else 0,
            total))
    if out:
        out.append("\n")
    hists = {where: v[0] if len(v) == 1 else merge_hists(v)
             for where, v in by_function(maps, "latency_ns").items()}
    for where, lines in sorted(hists.items(), key=lambda item: (
            hist_total(item[1]), item[0])):
        out.append("@latency_ns[%s]: \n" % format_key(where))
        out.extend(line + "\n" for line in lines)
        out.append("\n")
    sums = ["inclusive_ns", "exclusive_ns"] if order == "exclusive" else [
        "exclusive_ns", "inclusive_ns"]
    for field in sums:
        totals = {where: sum(v)
                  for where, v in by_function(maps, field).items()}
        for where, total in sorted(totals.items(),
                                   key=lambda item: (item[1], item[0])):
            out.append("@%s[%s]: %d\n" % (field, format_key(where), total))
        if totals:
            out.append("\n")
    return "".join(out)


def format_calls(calls, top):
    """The lines top-functions.bt prints: the *top* most frequent (all
    with 0), the most frequent last."""
    ranked = sorted(calls.items(), key=lambda item: (item[1], item[0]))
    if top:
        ranked = ranked[-top:]
    return "".join("@calls[%s, %s, %d]: %d\n" % (f, n, line, count)
                   for (f, n, line), count in ranked)


def report(tool, counters, keys, maps, out=sys.stderr):
    what = "runs" if tool == "latency" else "calls"
    """Say on *out* what the counts lack: never silent.  The program runs
    without bpftrace's -k (its checks make the loops too large for the
    verifier), so a map that is full drops keys unreported: a map with
    *keys* keys is taken for full."""
    full = sorted(name for name, entries in maps.items()
                  if len(entries) >= keys)
    if full:
        out.write("usdt.tools %s: map %s full (%d keys): %s of code "
                  "objects met after it filled are not counted; give more "
                  "with --map-keys\n" % (tool, ", ".join(full), keys, what))
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
                  "was read: their %s count under %s\n"
                  % (tool, counters["gone"], what, CODE_GONE))
    if counters["unnamed"]:
        out.write("usdt.tools %s: %d names neither ASCII nor cached as "
                  "UTF-8 read as ?\n" % (tool, counters["unnamed"]))
