"""The selection block of a process of this interpreter: which code objects
fire the probes of functions, lines, C calls and exceptions.

The contract (docs/selection.md has it in full): the interpreter exports a
structure under the symbol _PyDTrace_Select (Python/pydtrace_select.c).  A
tracer writes a text into it through /proc/PID/mem; at its next poll (once
a second) the interpreter's watcher reads it, and while a selectable probe
is armed only the code objects whose file name, name or qualified name
contains the text (or, for a text with dots, whose file name contains it
with the dots as slashes) fire those probes.  The selection ends when the
probes are disarmed (the tracer detached or died).  Layout, version 1,
little-endian:

    offset  size  field
         0     8  magic "usdtsel\\0"
         8     4  version (1)
        12     4  size of the structure (296)
        16     4  seq: odd while a tracer writes, then a new even number
        20     4  length of the text in bytes (0: select everything)
        24   256  text (UTF-8, no NUL byte, at most 255 bytes)
       280     4  seen_seq: the seq the interpreter read last
       284     4  state of that text (STATES)
       288     4  applied_seq: the seq of the text last put in effect
       292     4  reserved
"""

import os
import struct
import time

from usdt.__main__ import mappings, writable_address
from usdt._elf import PT_LOAD, ElfError, ElfFile

SYMBOL = "_PyDTrace_Select"
MAGIC = b"usdtsel\0"
VERSION = 1
SIZE = 296
TEXT_MAX = 255
HEADER = struct.Struct("<8sIIII")       # magic, version, size, seq, length
SEQ_OFFSET = 16
LENGTH_OFFSET = 20
TEXT_OFFSET = 24
STATE = struct.Struct("<III")           # seen_seq, state, applied_seq
STATE_OFFSET = 280
STATES = ["none", "pending", "applied", "ended", "expired", "refused"]


class Error(Exception):
    """A selection that cannot be read or written: said in one line."""


def selects(text, filename, name, qualname=None):
    """Whether *text* selects a code object of *filename*, *name* and
    *qualname*, as the interpreter decides it."""
    if not text:
        return True
    if text in filename or text in name or (qualname and text in qualname):
        return True
    return "." in text and text.replace(".", "/") in filename


def check_text(text):
    """The bytes of a selection text, or Error."""
    data = text.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise Error("a selection cannot hold a NUL byte")
    if len(data) > TEXT_MAX:
        raise Error("a selection holds at most %d bytes (UTF-8), not %d"
                    % (TEXT_MAX, len(data)))
    return data


def locate(pid):
    """The address of the selection block in process pid, or Error."""
    try:
        maps = mappings(pid)
    except FileNotFoundError:
        raise Error("no process %d" % pid) from None
    except OSError as error:
        raise Error("cannot read the mappings of process %d: %s"
                    % (pid, error.strerror)) from None
    try:
        exe = os.readlink("/proc/%d/exe" % pid)
    except OSError:
        exe = None
    # The executable, then libpython: the files that can hold the block.
    candidates = []
    seen = set()
    for m in maps:
        if not m.path.startswith("/") or m.file in seen:
            continue
        seen.add(m.file)
        if m.path == exe or "libpython" in os.path.basename(m.path):
            candidates.append((m.path != exe, len(candidates), m))
    for _, _, m in sorted(candidates):
        path = "/proc/%d/map_files/%x-%x" % (pid, m.start, m.end)
        try:
            with open(path, "rb") as f:
                elf = ElfFile(path, f)
                symbol = elf.symbols().get(SYMBOL)
                segments = [(s.vaddr, s.offset, s.filesz)
                            for s in elf.segments if s.type == PT_LOAD]
        except (OSError, ElfError):
            continue
        if symbol is None:
            continue
        if symbol.size != SIZE:
            raise Error("process %d has a selection block of %d bytes, not "
                        "the %d of version %d: its interpreter is not the "
                        "one these tools know" % (pid, symbol.size, SIZE,
                                                  VERSION))
        address = writable_address(maps, m.file, segments, symbol.value)
        if address is not None:
            return address
    raise Error("process %d has no selection block (%s): it does not run "
                "an interpreter of cpython-usdt that can select code"
                % (pid, SYMBOL))


class Block:
    """The selection block of process pid, open for reading and writing."""

    def __init__(self, pid):
        self.pid = pid
        self.address = locate(pid)
        try:
            self.mem = os.open("/proc/%d/mem" % pid, os.O_RDWR)
        except OSError as error:
            raise Error("cannot open the memory of process %d: %s%s" % (
                pid, error.strerror,
                "" if os.geteuid() == 0 else " (run as root)")) from None
        magic, version, size, _, _ = self._header()
        if magic != MAGIC or version != VERSION or size != SIZE:
            self.close()
            raise Error("process %d's selection block is not version %d "
                        "(magic %r, version %d, size %d)"
                        % (pid, VERSION, magic, version, size))

    def close(self):
        if self.mem is not None:
            os.close(self.mem)
            self.mem = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read(self, offset, size):
        try:
            data = os.pread(self.mem, size, self.address + offset)
        except OSError as error:
            raise Error("cannot read process %d's memory: %s"
                        % (self.pid, error.strerror)) from None
        if len(data) != size:
            raise Error("process %d has exited" % self.pid)
        return data

    def _write(self, offset, data):
        try:
            os.pwrite(self.mem, data, self.address + offset)
        except OSError as error:
            raise Error("cannot write process %d's memory: %s"
                        % (self.pid, error.strerror)) from None

    def _header(self):
        return HEADER.unpack(self._read(0, HEADER.size))

    def read(self):
        """{"text", "seq", "seen_seq", "state", "applied_seq"} now."""
        _, _, _, seq, length = self._header()
        text = self._read(TEXT_OFFSET, min(length, TEXT_MAX))
        seen, state, applied = STATE.unpack(
            self._read(STATE_OFFSET, STATE.size))
        return {"text": text.decode("utf-8", "replace"), "seq": seq,
                "seen_seq": seen, "applied_seq": applied,
                "state": STATES[state] if state < len(STATES)
                else "unknown (%d)" % state}

    def write(self, text):
        """Write *text* ("" selects everything): its sequence number."""
        data = check_text(text)
        seq = struct.unpack("<I", self._read(SEQ_OFFSET, 4))[0]
        writing = (seq | 1) + 2 if seq & 1 else seq + 1
        self._write(SEQ_OFFSET, struct.pack("<I", writing))
        self._write(LENGTH_OFFSET, struct.pack("<I", len(data)))
        self._write(TEXT_OFFSET, data + b"\0" * (TEXT_MAX + 1 - len(data)))
        done = (writing + 1) & 0xFFFFFFFF or 2
        self._write(SEQ_OFFSET, struct.pack("<I", done))
        return done

    def wait_seen(self, seq, seconds):
        """The state once the interpreter has read *seq*, or None after
        *seconds*."""
        deadline = time.monotonic() + seconds
        while True:
            now = self.read()
            if now["seen_seq"] == seq:
                return now
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


def in_effect(block_state):
    """The text of the selection in effect, or None."""
    if (block_state["state"] == "applied"
            and block_state["applied_seq"] == block_state["seen_seq"]):
        return block_state["text"]
    return None


def claim(pid, text):
    """Before tracing process pid: write *text* ("" for everything) as its
    selection, unless another tracer's selection is in effect with
    another text (Error, which says why).  Returns the sequence number
    written."""
    with Block(pid) as block:
        now = block.read()
        other = in_effect(now)
        if other is not None and other != text:
            raise Error(
                "process %d has the selection %r in effect, for another "
                "tracer: %s" % (pid, other,
                                "tracing it with -f %r would change what "
                                "that tracer sees" % text if text else
                                "tracing it without -f would see only "
                                "that code; wait until that tracer "
                                "detaches"))
        return block.write(text)
