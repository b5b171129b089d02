"""The program's records and the code objects they name: Event, a hit as
its records give it; CodeReader, which reads each code object's names and
location table from the traced process once and decodes lines as
PyCode_Addr2Line does (addr2line); python_frames(), a hit's Python
frames."""

import collections
import json
import os
import struct
import time

from .offsets import DEFAULT_STRLEN, RECORD


# ------------------------------------------------------------- output

class Kind:
    """The kinds of the program's records: the letter after RECORD that
    starts each (program.bt's header says what each one holds)."""

    BEGIN = "B"         # the probes are attached
    CODE = "C"          # a code object read while tracing (saved runs)
    FRAMES = "F"        # eight Python frames of a hit
    DEPTH = "D"         # how many of them, and whether more were left
    ADDRESSES = "A"     # eight native return addresses (--native)
    UNWOUND = "U"       # the return address of a hit in libc
    WINDOW = "X"        # eight words of the stack from rsp, in libc
    WINDOW_REGS = "W"   # libc's load bias and the registers there
    POINTERS = "P"      # eight frame pointers of the walk
    NATIVE = "N"        # a hit's pid, load bias and native flags
    MAPPING = "M"       # a library that the process mapped
    END = "Z"           # the hit's last record: status and weight
    RELEASE = "R"       # a release of live's key
    MAIN_DONE = "Y"     # the -c command ran its main module


Frame = collections.namedtuple("Frame", "name filename line")

# Pseudo-frames for the hits without a Python stack.
NOT_PYTHON = "[not this Python]"
NO_TSTATE = "[no Python thread state]"
NO_FRAMES = "[no Python frame]"
TRUNCATED = "[more frames]"


class Event:
    """The records of one hit."""

    def __init__(self):
        # depth: (pid, code key, offset)
        self.frames = {}
        self.entries = set()
        self.depth = None
        self.more = 0
        self.top = 0
        self.pid = None
        self.bias = None
        self.native = None
        self.addresses = {}
        # The caller of native frame 0, from libc's CFI (U record).
        self.unwound = None
        # Frame 0 elsewhere in libc: the stack's words from rsp, by index
        # (X records), and (libc's bias, rsp, rbp, where the A records'
        # walk starts, libc's build ID) (W record).
        self.window = {}
        self.window_regs = None
        # With them: the frame pointer at which the A records' walk read
        # the address after each (P records).
        self.pointers = {}
        self.native_more = False
        self.native_regs = True
        self.time = None


# ------------------------------------------------------------ code objects

# A frame whose code object usdt.stacks could not read: freed before it
# read it (a module's body once imported, the code of an exec() string, or
# everything of a process that ended), or the address holds another code
# object by then, which must not lend it its name.
CODE_GONE = "[code object gone]"
# A frame left out, as traceback leaves it out (CodeReader.frame()).
INCOMPLETE = object()


def addr2line(table, firstlineno, offset):
    """The line of the instruction at *offset* bytes into a code object
    whose location table (co_linetable) is *table*: what PyCode_Addr2Line
    gives (Objects/codeobject.c, the format in Objects/locations.md of
    CPython 3.13).  Each entry starts with a byte whose bit 7 is set: bits
    3-6 its kind, bits 0-2 the code units it covers minus 1; varints
    follow (6 bits a byte, bit 6: more), in bytes whose bit 7 is clear.
    Kinds 10-12 add kind - 10 to the line, 13 and 14 the signed varint
    that follows, 15 has no line; the line goes on from entry to entry,
    from co_firstlineno.  -1: no line (kind 15, or past the table)."""
    if offset < 0:
        return firstlineno
    line = firstlineno
    end = 0
    i = 0
    n = len(table)
    while i < n:
        byte = table[i]
        kind = (byte >> 3) & 15
        if kind in (13, 14):
            j = i + 1
            value = table[j] & 63
            shift = 0
            while table[j] & 64:
                j += 1
                shift += 6
                value |= (table[j] & 63) << shift
            line += -(value >> 1) if value & 1 else value >> 1
        elif 10 <= kind <= 12:
            line += kind - 10
        end += ((byte & 7) + 1) * 2
        if offset < end:
            return -1 if kind == 15 else line
        i += 1
        while i < n and not table[i] & 128:
            i += 1
    return -1



class CodeReader:
    """The names, files and location tables of the code objects that the
    program's F records name, read from the traced processes' memory
    (/proc/PID/mem, as root) once per code object and cached per (pid,
    address, co_version).  A code object is read only if it is alive and
    its co_version is the record's: the interpreter numbers the code
    objects it creates (from 1; 0 once 2**32 have been created, which
    this never takes), so that an address freed and reused by another
    code object since the sample (whose name and table may well be at
    the same addresses as the first one's, for the allocator reuses a
    freed block first) reads as CODE_GONE, never as the other one's
    name."""

    # Past these, a field read is not a name or a table (a bad address).
    MAX_STRING = 1 << 20
    MAX_TABLE = 1 << 24

    def __init__(self, interp=None, co_name=False, strlen=DEFAULT_STRLEN):
        # Without interp (--read without --python): the C records only.
        o = interp.offsets if interp is not None else {}
        self.co_version = interp.co_version if interp is not None else None
        self.firsttraceable = (interp.firsttraceable if interp is not None
                               else None)
        self.o = o
        self.header = interp.header if interp is not None else None
        self.name_field = "code_object.name" if co_name else (
            "code_object.qualname")
        self.strlen = strlen
        # (pid, code, version): (name, filename, firstlineno, table), or
        # None: not that object.
        self.codes = {}
        # (pid, code, version, offset): the Frame, once decoded
        self.frames = {}
        self.files = {}
        self.reads = 0
        self.cpu_ns = 0

    def _mem(self, pid):
        f = self.files.get(pid)
        if f is None:
            try:
                f = open("/proc/%d/mem" % pid, "rb", buffering=0)
            except OSError:
                return None
            self.files[pid] = f
        return f

    def close(self):
        for f in self.files.values():
            f.close()
        self.files.clear()

    def forget(self, pid):
        """Close the memory of pid (the process has ended)."""
        f = self.files.pop(pid, None)
        if f is not None:
            f.close()

    def _read(self, f, address, size):
        data = os.pread(f.fileno(), size, address)
        if len(data) != size:
            raise OSError("short read at %#x" % address)
        return data

    def _string(self, f, address):
        o = self.o
        header = self._read(f, address, o["unicode_object.asciiobject_size"]
                            + 16)
        state, = struct.unpack_from("<I", header, o["unicode_object.state"])
        length, = struct.unpack_from("<q", header, o["unicode_object.length"])
        kind, compact, ascii = (state >> 2) & 7, (state >> 5) & 1, (
            state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not (
                0 <= length <= self.MAX_STRING):
            raise OSError("not a compact str at %#x" % address)
        if ascii:
            data = o["unicode_object.asciiobject_size"]
        else:
            data = o["unicode_object.asciiobject_size"] + 16
        raw = self._read(f, address + data, length * kind)
        return raw.decode({1: "latin-1", 2: "utf-16-le",
                           4: "utf-32-le"}[kind], "replace")

    def _bytes(self, f, address):
        o = self.o
        size, = struct.unpack("<q", self._read(
            f, address + o["bytes_object.ob_size"], 8))
        if not 0 <= size <= self.MAX_TABLE:
            raise OSError("not a bytes object at %#x" % address)
        return self._read(f, address + o["bytes_object.ob_sval"], size)

    def alive(self, raw):
        """Whether the object whose first bytes are raw is alive: a freed
        object keeps its other fields (the allocator writes its free
        list's pointer in the first word and leaves the rest), so that the
        check fields of a code object freed since the sample still match
        while its strings and table are gone (ObjectHeader.alive())."""
        return self.header.alive(raw)

    def cut(self, text):
        """What the tool shows of a name: its last strlen - 1 bytes (what
        it showed when the program copied names, and --strlen still
        sets)."""
        raw = text.encode("utf-8", "surrogatepass")
        if len(raw) <= self.strlen - 1:
            return text
        return "..." + raw[-(self.strlen - 1):].decode("utf-8", "replace")

    def resolve(self, pid, key):
        """Read the code object of *key* (code, version) in process pid
        unless known.  False when the process's memory could not be read
        (try again while it lives)."""
        full = (pid,) + key
        if full in self.codes:
            return True
        f = self._mem(pid) if self.o else None
        if f is None:
            return False
        start = time.thread_time_ns()
        code, version = key
        o = self.o
        try:
            raw = self._read(f, code, max(
                at + 8 for at in (o["code_object.linetable"],
                                  o["code_object.filename"],
                                  o["code_object.firstlineno"],
                                  o[self.name_field], self.firsttraceable)))
            found = None
            if (self.alive(raw) and struct.unpack_from(
                    "<I", raw, self.co_version)[0] == version and (
                        version != 0 or self.immortal(raw))):
                name, filename, linetable = (
                    struct.unpack_from("<Q", raw, o[field])[0]
                    for field in (self.name_field, "code_object.filename",
                                  "code_object.linetable"))
                firstlineno, = struct.unpack_from(
                    "<i", raw, o["code_object.firstlineno"])
                firsttraceable, = struct.unpack_from(
                    "<i", raw, self.firsttraceable)
                found = (self._string(f, name), self._string(f, filename),
                         firstlineno, self._bytes(f, linetable),
                         firsttraceable)
                # Read again: the object must not have been freed while
                # its parts were read (its reference count changes with
                # every frame that runs it).
                again = self._read(f, code, len(raw))
                after = self.header.ob_type
                if not self.alive(again) or again[after:] != raw[after:]:
                    found = None
        except OSError:
            # The process is gone (or the address unmapped): retry while
            # the process lives; forget a process that ended.
            self.cpu_ns += time.thread_time_ns() - start
            if not os.path.exists("/proc/%d" % pid):
                self.forget(pid)
                self.codes[full] = None
            return False
        self.codes[full] = found
        self.reads += 1
        self.cpu_ns += time.thread_time_ns() - start
        return True

    def immortal(self, raw):
        """Whether the object whose first bytes are raw is immortal
        (never freed: its address is never another object's): a static
        object, such as _Py_InitCleanup, the code object that runs after
        a class's __init__, whose co_version is 0."""
        return self.header.immortal(raw)

    def frame(self, pid, key, offset):
        """The Frame of a record; None: its code object is gone;
        INCOMPLETE: a frame that has not reached its first traceable
        instruction (_PyFrame_IsIncomplete(), whose frames traceback and
        sys._getframe() leave out: a function's prologue, and the
        _Py_InitCleanup frame under every running __init__ of a class
        called from Python)."""
        full = (pid,) + key + (offset,)
        frame = self.frames.get(full)
        if frame is not None:
            return frame
        found = self.codes.get(full[:3])
        if found is None:
            return None
        name, filename, firstlineno, table, firsttraceable = found
        if offset < 2 * firsttraceable:
            frame = INCOMPLETE
        else:
            frame = Frame(self.cut(name), self.cut(filename),
                          addr2line(table, firstlineno, offset))
        # A code object's line at an offset never changes: decoded once
        # (a sample's frames are mostly the last sample's; decoding each
        # one from the table's start was most of the stack tool's CPU time).
        self.frames[full] = frame
        return frame

    def saved(self):
        """The C records that --save appends to its file: what was read
        of each code object, for --read (the process is gone by then)."""
        for full, found in sorted(self.codes.items()):
            if found is not None:
                name, filename, firstlineno, table, firsttraceable = found
                yield "%s C %d %x %d %s\n" % (
                    RECORD, full[0], full[1], full[2],
                    json.dumps([name, filename, firstlineno, table.hex(),
                                firsttraceable]))

    def load(self, fields):
        """A C record (PYSTACK C pid code version [name, filename,
        firstlineno, table, firsttraceable], split in 6 fields) back into
        the cache."""
        key = (int(fields[2]), int(fields[3], 16), int(fields[4]))
        text_name, text_file, firstlineno, table, firsttraceable = (
            json.loads(fields[5]))
        self.codes[key] = (text_name, text_file, firstlineno,
                           bytes.fromhex(table), firsttraceable)


def frame_keys(fields):
    """(depth, pid, key, offset, entry) of each frame of an F record split
    on spaces; key: (code, version)."""
    pid, batch = int(fields[4]), int(fields[5])
    for k in range(8):
        code, word = (int(w, 16) for w in fields[6 + 2 * k:8 + 2 * k])
        if code:
            offset = word >> 33
            # 31 bits, signed
            offset -= (offset & 0x40000000) << 1
            yield (8 * batch + k, pid, (code, word & 0xffffffff), offset,
                   (word >> 32) & 1)


def python_frames(event, codes, notes):
    """The hit's Python frames, innermost first, and the same frames cut
    into segments, one per activation of the evaluator, innermost first."""
    if event.depth == 0:
        return [Frame(NO_FRAMES, "", None)], []
    frames = []
    segments = [[]] if event.top else []
    segment = []
    for depth in range(event.depth):
        frame = None
        if depth in event.frames:
            pid, code, offset = event.frames[depth]
            frame = codes.frame(pid, code, offset)
        if frame is None:
            frame = Frame(CODE_GONE, "", None)
            notes["frames whose code object was gone before usdt.stacks "
                  "read it (the process ended, or the address holds "
                  "another code object by then), named %s" % CODE_GONE] += 1
        if frame is not INCOMPLETE:
            frames.append(frame)
            segment.append(frame)
        if depth in event.entries:
            segments.append(segment)
            segment = []
    if segment:
        segments.append(segment)
    if event.more:
        frames.append(Frame(TRUNCATED, "", None))
        notes["stacks cut at --max-depth frames"] += 1
    return frames, segments
