"""Profiles in the formats fleets keep: pprof and speedscope.

    python -m usdt.profiles stacks.folded --pprof cpu.pb.gz \\
        --sample-type samples/count --period-type cpu/nanoseconds \\
        --period 10101010
    python -m usdt.profiles stacks.folded --speedscope cpu.speedscope.json

The input is folded stacks, as the tools print them ("root;...;leaf N",
python -m usdt.flamegraph's format).  A frame written "NAME (FILE:LINE)"
(a Python frame: usdt.stacks, latency's call paths, py:: frames of native
stacks) keeps its function name, file and line; "SYMBOL (LIBRARY)" (a
native frame of --native stacks) its symbol and library, which becomes a
pprof mapping; any other frame is a name alone.

pprof: a gzipped protocol buffer of perftools.profiles.Profile
(github.com/google/pprof, proto/profile.proto), which `go tool pprof`,
Grafana Pyroscope, Parca and Google Cloud Profiler read.  The encoder
below writes the few wire types that message needs (varints and
length-delimited fields); the standard library has no protobuf.  One
location per distinct frame, one function per distinct (name, file);
the samples' values are the folded counts, of each sample type given.

speedscope: the JSON file format of https://www.speedscope.app
(file-format-schema.json): one "sampled" profile, each folded stack one
sample whose weight is its count, in the unit given.

Runs under any Python 3 (no module outside the standard library).
"""

import argparse
import collections
import gzip
import json
import os
import re
import sys

# A Python frame: "name (file:line)", the line a number, "?" or "-1".
PYTHON_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>.*):(?P<line>-?\d+|\?)\)$")
# A native frame: "symbol (library)".
NATIVE_FRAME = re.compile(r"^(?P<name>.*) \((?P<library>[^():]+)\)$")
# The units pprof's readers know (pprof's measurement package), and
# speedscope's (its ValueUnit).
PPROF_UNITS = ("count", "bytes", "nanoseconds", "microseconds",
               "milliseconds", "seconds")
SPEEDSCOPE_UNITS = {"count": "none", "bytes": "bytes",
                    "nanoseconds": "nanoseconds",
                    "microseconds": "microseconds",
                    "milliseconds": "milliseconds", "seconds": "seconds"}


class Error(Exception):
    """A malformed input or argument, reported in one line."""


# ------------------------------------------------------------ the wire

def _varint(value):
    if value < 0:
        value &= (1 << 64) - 1  # int64 fields: two's complement, 10 bytes
    out = bytearray()
    while True:
        byte = value & 0x7f
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field, wire_type):
    return _varint(field << 3 | wire_type)


def _int_field(field, value):
    """A varint field (wire type 0); 0, the default, is left out."""
    if not value:
        return b""
    return _key(field, 0) + _varint(value)


def _bytes_field(field, data):
    """A length-delimited field (wire type 2)."""
    return _key(field, 2) + _varint(len(data)) + data


def _packed_field(field, values):
    """A packed repeated varint field; none is left out."""
    if not values:
        return b""
    return _bytes_field(field, b"".join(_varint(v) for v in values))


# ---------------------------------------------------------- the model

def parse_frame(text):
    """(name, file, line, library) of a frame of folded stacks: file and
    library "" and line 0 where the frame does not say them."""
    match = PYTHON_FRAME.match(text)
    if match:
        line = match.group("line")
        return (match.group("name"), match.group("file"),
                int(line) if line not in ("?", "-1") else 0, "")
    match = NATIVE_FRAME.match(text)
    if match:
        return match.group("name"), "", 0, match.group("library")
    return text, "", 0, ""


def _flamegraph():
    """usdt.flamegraph, whose reader of folded stacks this module uses:
    imported, or loaded from next to this file (run as a script, under
    any Python 3, where the usdt package may not import)."""
    try:
        from usdt import flamegraph
        return flamegraph
    except ImportError:
        import importlib.util
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "flamegraph.py")
        spec = importlib.util.spec_from_file_location("_usdt_flamegraph",
                                                      path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


def parse_folded(text, where="<input>"):
    """[(frames root first, count)] of folded text (usdt.flamegraph's
    reader; its errors as this module's)."""
    flamegraph = _flamegraph()
    try:
        return flamegraph.parse_folded(text.splitlines(), where)
    except flamegraph.Error as error:
        raise Error(str(error)) from None


def check_type(text, what):
    """(type, unit) of "type/unit", as pprof's -sample_index names it."""
    kind, slash, unit = text.partition("/")
    if not slash or not kind or unit not in PPROF_UNITS:
        raise Error("%s %r: write TYPE/UNIT, UNIT one of %s"
                    % (what, text, ", ".join(PPROF_UNITS)))
    return kind, unit


def pprof(samples, sample_types, period_type=None, period=0,
          duration_ns=0, time_ns=0, comments=(), start_lines=False,
          main_mapping="python", default_type=None):
    """The gzipped bytes of a pprof Profile.

    samples: [(frames root first, [value per sample type])], frames as
    the tools print them; sample_types: [(type, unit)]; period_type:
    (type, unit) or None.  With start_lines, a frame's line is its
    function's first line (latency's call paths), which becomes the
    function's start line; otherwise it is the line running, and the
    start line is left unknown (0).  default_type: the sample type that
    readers show unless told otherwise (pprof: the last one)."""
    strings = {"": 0}

    def string(text):
        index = strings.get(text)
        if index is None:
            index = strings[text] = len(strings)
        return index

    main = main_mapping
    functions = {}   # (name, file) -> (id, start line)
    locations = {}   # frame text -> id
    mappings = {main: 1}    # library -> id
    body = []
    for kind, unit in sample_types:
        body.append(_bytes_field(1, _int_field(1, string(kind)) +
                                 _int_field(2, string(unit))))
    location_messages = []
    for frames, values in samples:
        if len(values) != len(sample_types):
            raise Error("a sample has %d values for %d sample types"
                        % (len(values), len(sample_types)))
        ids = []
        # pprof lists a sample's locations leaf first.
        for frame in reversed(frames):
            location = locations.get(frame)
            if location is None:
                name, filename, line, library = parse_frame(frame)
                function = functions.get((name, filename))
                if function is None:
                    function = functions[name, filename] = (
                        len(functions) + 1, line if start_lines else 0)
                # Every location has a mapping that says its frames are
                # symbolized.  Python frames and pseudo-frames go to the
                # first mapping, the interpreter's.
                mapping = mappings.get(library or main)
                if mapping is None:
                    mapping = mappings[library or main] = len(mappings) + 1
                location = locations[frame] = len(locations) + 1
                line_message = (_int_field(1, function[0]) +
                                _int_field(2, line))
                location_messages.append(
                    _int_field(1, location) + _int_field(2, mapping) +
                    _bytes_field(4, line_message))
            ids.append(location)
        body.append(_bytes_field(2, _packed_field(1, ids) +
                                 _packed_field(2, values)))
    for library, mapping in mappings.items():
        # No addresses: the frames are already symbolized
        # (has_functions, has_filenames, has_line_numbers).
        body.append(_bytes_field(3, _int_field(1, mapping) +
                                 _int_field(5, string(library)) +
                                 _int_field(7, 1) + _int_field(8, 1) +
                                 _int_field(9, 1)))
    for message in location_messages:
        body.append(_bytes_field(4, message))
    for (name, filename), (function, line) in functions.items():
        # A Python function's system name is FILE:NAME: its identity,
        # and not its name, which pprof would otherwise take for a C++
        # name to simplify (<module> to "", f.<locals>.g to "f..g").
        system = "%s:%s" % (filename, name) if filename else name
        body.append(_bytes_field(5, _int_field(1, function) +
                                 _int_field(2, string(name)) +
                                 _int_field(3, string(system)) +
                                 _int_field(4, string(filename)) +
                                 _int_field(5, line)))
    comment_ids = [string(text) for text in comments]
    tail = [_int_field(9, time_ns), _int_field(10, duration_ns)]
    if period_type is not None:
        tail.append(_bytes_field(11, _int_field(1, string(period_type[0])) +
                                 _int_field(2, string(period_type[1]))))
        tail.append(_int_field(12, period))
    tail.append(_packed_field(13, comment_ids))
    if default_type is not None:
        if default_type not in [kind for kind, _ in sample_types]:
            raise Error("default sample type %r is not one of the "
                        "sample types" % default_type)
        tail.append(_int_field(14, string(default_type)))
    # The string table last: every string is known by now; it is field 6,
    # and readers take fields in any order.
    table = b"".join(_bytes_field(6, text.encode("utf-8"))
                     for text in strings)
    data = b"".join(body) + table + b"".join(tail)
    return gzip.compress(data, mtime=0)


def speedscope(samples, unit, name, exporter="usdt.profiles"):
    """The speedscope JSON document (a dict) of samples
    [(frames root first, weight)], weights in unit (a pprof unit)."""
    frames = []
    index = {}
    stacks = []
    weights = []
    for stack, weight in samples:
        ids = []
        for frame in stack:
            at = index.get(frame)
            if at is None:
                at = index[frame] = len(frames)
                fname, filename, line, library = parse_frame(frame)
                entry = {"name": fname}
                if filename:
                    entry["file"] = filename
                    if line:
                        entry["line"] = line
                elif library:
                    entry["file"] = library
                frames.append(entry)
            ids.append(at)
        stacks.append(ids)
        weights.append(weight)
    total = sum(weights)
    return {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": [{"type": "sampled", "name": name,
                      "unit": SPEEDSCOPE_UNITS[unit], "startValue": 0,
                      "endValue": total, "samples": stacks,
                      "weights": weights}],
        "name": name,
        "activeProfileIndex": 0,
        "exporter": exporter,
    }


# ------------------------------------------------------------ outputs

def check_writable(path, option):
    """Error now, before tracing, if path cannot be written."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise Error("%s %s: is a directory" % (option, path))
    if not os.path.isdir(directory):
        raise Error("%s %s: no directory %s" % (option, path, directory))
    if not os.access(directory, os.W_OK) or (
            os.path.exists(path) and not os.access(path, os.W_OK)):
        raise Error("%s %s: not writable" % (option, path))


def write_pprof(path, folded, sample_type, period_type=None, period=0,
                duration_ns=0, time_ns=0, comments=(), start_lines=False):
    """A pprof file of folded text, one sample type."""
    samples = [(frames, [count]) for frames, count
               in parse_folded(folded)]
    with open(path, "wb") as f:
        f.write(pprof(samples, [sample_type], period_type, period,
                      duration_ns, time_ns, comments, start_lines))


def write_speedscope(path, folded, unit, name):
    """A speedscope file of folded text."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(speedscope(parse_folded(folded), unit, name), f)
        f.write("\n")


def write_profiles(folded, pprof_path=None, speedscope_path=None,
                   sample_types=(("samples", "count"),), scale=(1,),
                   period_type=None, period=0, name="profile",
                   start_lines=False, duration_ns=0, main_mapping="python",
                   extra=None, default_type=None):
    """The files of folded text that the paths ask for: in pprof, one
    value per sample type, the count times that type's scale (profile:
    samples/count, and cpu/nanoseconds at the period), then, with extra
    (folded text of the same stacks), its count of each stack as the
    last type's (alloc: the objects); in speedscope, the first type's
    values (profile: samples; alloc: bytes)."""
    stacks = parse_folded(folded)
    samples = [(frames, [count * factor for factor in scale])
               for frames, count in stacks]
    if extra is not None:
        counted = collections.Counter()
        for frames, count in parse_folded(extra):
            counted[tuple(frames)] += count
        wanted = set(tuple(frames) for frames, _ in stacks)
        if set(counted) - wanted:
            raise Error("%d stacks of the extra values are not among the "
                        "profile's" % len(set(counted) - wanted))
        # A stack that parse_folded gives twice (never, from usdt.stacks)
        # would have its extra value twice.
        samples = [(frames, values + [counted[tuple(frames)]])
                   for frames, values in samples]
    if pprof_path:
        with open(pprof_path, "wb") as f:
            f.write(pprof(samples, list(sample_types), period_type, period,
                          duration_ns=duration_ns, start_lines=start_lines,
                          main_mapping=main_mapping,
                          default_type=default_type))
    if speedscope_path:
        weighted = [(frames, values[0]) for frames, values in samples]
        with open(speedscope_path, "w", encoding="utf-8") as f:
            json.dump(speedscope(weighted, sample_types[0][1], name), f)
            f.write("\n")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m usdt.profiles",
        description="Write folded stacks as a pprof or speedscope "
        "profile.")
    parser.add_argument("folded", help="folded stacks ('-': stdin)")
    parser.add_argument("--pprof", metavar="FILE",
                        help="write a gzipped pprof profile")
    parser.add_argument("--speedscope", metavar="FILE",
                        help="write a speedscope JSON file")
    parser.add_argument("--sample-type", default="samples/count",
                        metavar="TYPE/UNIT",
                        help="what the counts are (default samples/count;"
                        " e.g. alloc_space/bytes, wall/nanoseconds)")
    parser.add_argument("--period-type", metavar="TYPE/UNIT",
                        help="pprof: what one sample stands for, e.g. "
                        "cpu/nanoseconds")
    parser.add_argument("--period", type=int, default=0,
                        help="pprof: the period, in the period type's unit")
    parser.add_argument("--name", default="profile",
                        help="speedscope: the profile's name")
    args = parser.parse_args(argv)
    try:
        if not args.pprof and not args.speedscope:
            raise Error("nothing to write: give --pprof FILE or "
                        "--speedscope FILE")
        sample_type = check_type(args.sample_type, "--sample-type")
        period_type = (check_type(args.period_type, "--period-type")
                       if args.period_type else None)
        for option, path in (("--pprof", args.pprof),
                             ("--speedscope", args.speedscope)):
            if path:
                check_writable(path, option)
        if args.folded == "-":
            text = sys.stdin.read()
        else:
            with open(args.folded, encoding="utf-8") as f:
                text = f.read()
        if not parse_folded(text, args.folded):
            raise Error("%s: no stacks" % args.folded)
        if args.pprof:
            write_pprof(args.pprof, text, sample_type, period_type,
                        args.period)
        if args.speedscope:
            write_speedscope(args.speedscope, text, sample_type[1],
                             args.name)
    except (Error, OSError) as error:
        sys.stderr.write("usdt.profiles: %s\n" % error)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
