"""From records to counts per stack (parse()) and to what usdt.stacks prints:
counts, folded stacks, JSON (the write_*() functions)."""

import collections
import json
import os
import re

from .. import _bpftrace
from .offsets import RECORD
from .records import (Event, Frame, Kind, NOT_PYTHON, NO_TSTATE,
                      frame_keys, python_frames)
from .native import NativeFrame, merge, native_frames


def parse(lines, codes, symbolizer=None, max_native=None,
          live=False, objects=None, libc=None):
    """(Counter of stacks, {note: count}) from the program's records.

    A stack is a tuple of Frames, innermost first; a hit without one
    counts as a stack of one pseudo-frame that says why.  A frame's line
    is -1 when its instruction has no line.  *codes*, a CodeReader, names
    the frames: from what it read while the process ran, and from the C
    records of a saved run.
    The records of --native add the native stack, which merge() puts
    together with the Python frames; *libc* (a program.Libc) unwinds the
    windows of the stack copied at hits in libc.

    With *live*, only the hits whose key no release (R record) took since
    count: the records are replayed in the order of their times, which
    bpftrace's per-CPU buffers do not keep.

    With *objects* (a Counter), the objects that each stack's hits stand
    for are added to it: a hit of weight W and size S (--size) stands
    for W / S objects (otel_memory:alloc: W bytes estimated of
    allocations of S bytes, so W / S allocations; a size of 0 counts as
    1 byte), a float.
    """
    events = {}
    stacks = collections.Counter()
    notes = collections.Counter()
    # With live: (time, 0, key, stack, weight) of the hits and
    # (time, 1, key) of the releases.
    timeline = []
    # What a saved run read of its code objects (C records, after the
    # others), before the frames that name them.
    for line in lines:
        if line.startswith("%s %s " % (RECORD, Kind.CODE)):
            codes.load(line.rstrip("\n").split(" ", 5))

    def count(stack, weight, fields):
        # Records of a program without a size (older, saved) have none.
        number = (weight / max(int(fields[7]), 1) if len(fields) > 7
                  else 0)
        if not live:
            stacks[stack] += weight
            if objects is not None:
                objects[stack] += number
            return
        key = int(fields[6]) if len(fields) > 6 else 0
        timeline.append((int(fields[3]), 0, key, stack, weight, number))

    if symbolizer is not None:
        for line in lines:
            if line.startswith("%s %s " % (RECORD, Kind.MAPPING)):
                fields = line.rstrip("\n").split(" ", 7)
                symbolizer.linked(int(fields[4]), int(fields[5], 16),
                                  int(fields[6], 16), fields[7])

    # One function per kind of a hit's records: (event, fields, line).
    def frames_record(event, fields, line):
        for depth, pid, code, offset, entry in frame_keys(line.split()):
            event.frames[depth] = (pid, code, offset)
            if entry:
                event.entries.add(depth)

    def depth_record(event, fields, line):
        # The F records' frames, up to the first max (they come in
        # fours).
        kept = int(fields[4])
        event.depth = min(len(event.frames), kept)
        event.more = int(fields[5]) or len(event.frames) > kept
        event.top = int(fields[6])

    def words_record(into):
        # Eight words of a list: native addresses, the stack's words from
        # rsp, or the walk's frame pointers.
        def record(event, fields, line):
            batch = int(fields[4])
            target = getattr(event, into)
            for k, word in enumerate(line.split()[5:13]):
                target[8 * batch + k] = int(word, 16)
        return record

    def unwound_record(event, fields, line):
        event.unwound = int(fields[4], 16)

    def window_regs_record(event, fields, line):
        event.window_regs = tuple(int(word, 16)
                                  for word in line.split()[4:9])

    def native_record(event, fields, line):
        event.pid, event.bias = int(fields[4]), int(fields[5])
        event.native_more = fields[6] == "1"
        event.native_regs = fields[7].strip() == "1"
        event.native = True

    def end_record(event, fields, line):
        del events[(fields[2], fields[3])]
        status = int(fields[4])
        # Records of a program without a weight count 1.
        weight = int(fields[5]) if len(fields) > 5 else 1
        if status != 0 or event.depth is None:
            reason = {1: NOT_PYTHON, 2: NO_TSTATE}.get(status, "?")
            frames = [Frame(reason, "", None)]
            segments = []
        else:
            frames, segments = python_frames(event, codes, notes)
        if event.native is not None:
            frames = merge(native_frames(event, symbolizer, notes,
                                         max_native, libc),
                           segments, event.more, notes) + (
                frames if not segments else [])
        count(tuple(frames), weight, fields)

    of_hits = {
        Kind.FRAMES: frames_record,
        Kind.DEPTH: depth_record,
        Kind.ADDRESSES: words_record("addresses"),
        Kind.WINDOW: words_record("window"),
        Kind.POINTERS: words_record("pointers"),
        Kind.UNWOUND: unwound_record,
        Kind.WINDOW_REGS: window_regs_record,
        Kind.NATIVE: native_record,
        Kind.END: end_record,
    }
    # Read before (CODE, MAPPING) or not about a hit.
    elsewhere = {Kind.BEGIN, Kind.CODE, Kind.MAIN_DONE, Kind.MAPPING}
    for line in lines:
        if not line.startswith(RECORD + " "):
            lost = re.match(r"Lost (\d+) events", line)
            if lost:
                notes["records lost by bpftrace (the traced program went "
                      "too fast: %s)" % _bpftrace.buffer_advice()
                      ] += int(lost.group(1))
            continue
        fields = line.rstrip("\n").split(" ", 8)
        kind, key = fields[1], (fields[2], fields[3])
        if kind == Kind.RELEASE:
            timeline.append((int(fields[3]), 1, int(fields[4])))
            continue
        handler = of_hits.get(kind)
        if handler is None:
            if kind not in elsewhere:
                notes["records of an unknown kind %r (another version of "
                      "the program?)" % kind] += 1
            continue
        event = events.get(key)
        if event is None:
            event = events[key] = Event()
            event.time = int(fields[3])
        handler(event, fields, line)
    if events:
        notes["hits whose records are incomplete (lost?)"] += len(events)
    if live:
        held = {}
        for item in sorted(timeline, key=lambda item: item[:2]):
            if item[1] == 0:
                held[item[2]] = item[3:]
            else:
                held.pop(item[2], None)
        for stack, weight, number in held.values():
            stacks[stack] += weight
            if objects is not None:
                objects[stack] += number
    return stacks, notes


def frame_text(frame, native=False):
    """A frame as printed: NAME (FILE:LINE), py::NAME (FILE:LINE) among
    native frames, and a native one SYMBOL (LIBRARY'S FILE NAME)."""
    if isinstance(frame, NativeFrame):
        if not frame.library:
            return frame.symbol
        return "%s (%s)" % (frame.symbol, os.path.basename(frame.library))
    if not frame.filename:
        return frame.name
    line = {None: "?", -1: "-"}.get(frame.line, frame.line)
    return "%s%s (%s:%s)" % ("py::" if native else "", frame.name,
                             frame.filename, line)


def stack_order(item):
    """Sort key of a (stack, count) item: the most frequent first, then by
    frames.  A frame's line is None when it was not decoded: it sorts
    before every line, as -2, for None and int do not compare; a native
    frame has none, -3."""
    stack, count = item
    return (-count, [(frame[0], frame[1],
                      -3 if isinstance(frame, NativeFrame)
                      else -2 if frame.line is None else frame.line)
                     for frame in stack])


def print_counts(stacks, out, native=False):
    for stack, count in sorted(stacks.items(), key=stack_order):
        out.write("%d\n" % count)
        for frame in stack:
            out.write("    %s\n" % frame_text(frame, native))
        out.write("\n")


def print_folded(stacks, out, native=False):
    folded = collections.Counter()
    for stack, count in stacks.items():
        names = [frame_text(frame, native).replace(";", ":")
                 for frame in stack]
        folded[";".join(reversed(names))] += count
    for line, count in sorted(folded.items()):
        out.write("%s %d\n" % (line, count))


def json_rows(stacks):
    """The rows of the JSON output: {"count", "frames"}, the most frequent
    first."""
    return [{"count": count,
             "frames": [f._asdict() for f in stack]}
            for stack, count in sorted(stacks.items(), key=stack_order)]


def print_json(stacks, out):
    """Python frames are {"name", "filename", "line"}, native ones
    {"symbol", "library"}."""
    json.dump(json_rows(stacks), out, indent=1)
    out.write("\n")


def write_counts(result, out):
    """Each stack of *result* (an api.Result) and its count, the most
    frequent first, innermost frame first."""
    print_counts(result.stacks, out, result.native)


def write_folded(result, out):
    """One line per stack, "root;...;innermost count", for a flame
    graph."""
    print_folded(result.stacks, out, result.native)


def write_json(result, out):
    print_json(result.stacks, out)


def write_folded_objects(result, out):
    """Each stack's estimated objects (Config.size), rounded, folded, for
    every stack the counts have (0 where its hits stand for less than
    half an object)."""
    print_folded({stack: round(result.objects[stack])
                  for stack in result.stacks}, out, result.native)


def write_notes(result, out, who="usdt.stacks"):
    """What was lost or could not be read, a line each."""
    for note, count in sorted(result.notes.items()):
        out.write("%s: %d %s\n" % (who, count, note))
