"""What usdt.stacks reads of an interpreter before tracing it: the layouts of
_Py_DebugOffsets per series (DEBUG_OFFSETS), the binary's offsets and
addresses (Interpreter, from its ELF file, read by usdt._elf), and the
object headers of the default and free-threaded builds (ObjectHeader)."""

import bisect
import os
import re
import struct

from .._bpftrace import Error
from .._elf import (DT_DEBUG, EM_X86_64, ET_DYN, ET_EXEC, PF_X, PT_LOAD,
                     PT_TLS, STT_FUNC, STT_TLS, ElfError, ElfFile)


# The layouts of _Py_DebugOffsets (Include/internal/pycore_runtime.h) that
# this tool reads, by the (major, minor) version its first field gives:
# after the 8-byte cookie, every field is a uint64_t, in this order.  The
# layout is the same in every 3.13 release (3.13.0 to 3.13.15 checked); a
# series whose layout differs needs its own entry, and the frame walk of
# its own (3.14's f_executable is a tagged _PyStackRef, for one).
DEBUG_OFFSETS = {(3, 13): [
    "version", "free_threaded",
    "runtime_state.size", "runtime_state.finalizing",
    "runtime_state.interpreters_head",
    "interpreter_state.size", "interpreter_state.id",
    "interpreter_state.next", "interpreter_state.threads_head",
    "interpreter_state.gc", "interpreter_state.imports_modules",
    "interpreter_state.sysdict", "interpreter_state.builtins",
    "interpreter_state.ceval_gil", "interpreter_state.gil_runtime_state",
    "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked",
    "interpreter_state.gil_runtime_state_holder",
    "thread_state.size", "thread_state.prev", "thread_state.next",
    "thread_state.interp", "thread_state.current_frame",
    "thread_state.thread_id", "thread_state.native_thread_id",
    "thread_state.datastack_chunk", "thread_state.status",
    "interpreter_frame.size", "interpreter_frame.previous",
    "interpreter_frame.executable", "interpreter_frame.instr_ptr",
    "interpreter_frame.localsplus", "interpreter_frame.owner",
    "code_object.size", "code_object.filename", "code_object.name",
    "code_object.qualname", "code_object.linetable",
    "code_object.firstlineno", "code_object.argcount",
    "code_object.localsplusnames", "code_object.localspluskinds",
    "code_object.co_code_adaptive",
    "pyobject.size", "pyobject.ob_type",
    "type_object.size", "type_object.tp_name", "type_object.tp_repr",
    "type_object.tp_flags",
    "tuple_object.size", "tuple_object.ob_item", "tuple_object.ob_size",
    "list_object.size", "list_object.ob_item", "list_object.ob_size",
    "dict_object.size", "dict_object.ma_keys", "dict_object.ma_values",
    "float_object.size", "float_object.ob_fval",
    "long_object.size", "long_object.lv_tag", "long_object.ob_digit",
    "bytes_object.size", "bytes_object.ob_size", "bytes_object.ob_sval",
    "unicode_object.size", "unicode_object.state", "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size", "gc.collecting",
]}
COOKIE = b"xdebugpy"
# What _Py_DebugOffsets gives where a frame's owner is, but not the values:
# the owner of the entry frame that each activation of the interpreter
# loop pushes first (FRAME_OWNED_BY_CSTACK, Include/internal/
# pycore_frame.h), by series.  3.14 renumbers it (4).
FRAME_OWNED_BY_CSTACK = {(3, 13): 3}
# Where co_version is (a number the interpreter gives each code object it
# creates, from a counter): this many bytes before co_localsplusnames.
CO_VERSION_BEFORE_LOCALSPLUSNAMES = {(3, 13): 4}
# _co_firsttraceable, an int, and co_extra, a pointer, come right before
# co_code_adaptive (Include/cpython/code.h): this many bytes before it.
FIRSTTRACEABLE_BEFORE_CODE_ADAPTIVE = {(3, 13): 16}

DEFAULT_MAX_DEPTH = 64
# Native frames per stack (--native), walked in BPF 8 at a time.
DEFAULT_MAX_NATIVE = 128
# The x86-64 kernel's stack size, at whose top the kernel saves the user
# registers (16 KiB; 32 KiB with KASAN, where the program finds no user
# code segment there and says so).
THREAD_SIZE = 16384
# Names and files keep their last STRLEN - 1 bytes, as when the program
# copied them with bpftrace's str() (BPFTRACE_STRLEN 128): --strlen.
DEFAULT_STRLEN = 128

RECORD = "PYSTACK"
# The name of run_eval_code_obj's caller when the -c hold's uretprobe hid
# its return address and the caller could not be told (run_eval_caller()).
RUN_EVAL_CALLER = "[run_eval_code_obj's caller]"


class Interpreter:
    """What the BPF program needs to know about one interpreter binary."""

    def __init__(self, path):
        self.path = os.path.realpath(path)
        try:
            self._read(path, ElfFile(self.path))
        except ElfError as error:
            raise Error(str(error)) from None

    def _read(self, path, elf):
        if elf.machine != EM_X86_64:  # the thread pointer is fsbase
            raise Error("%s: only x86-64 is supported" % path)
        symbols = elf.symbols()
        section = elf.section(".PyRuntime")
        if section is not None:
            runtime = section.addr
        elif "_PyRuntime" in symbols:
            runtime = symbols["_PyRuntime"][0]
        else:
            hint = ""
            if any(re.match(r"libpython3\.\d+", os.path.basename(n))
                   for n in elf.needed()):
                hint = (" (it links libpython dynamically: shared builds "
                        "are not supported)")
            raise Error("%s has no .PyRuntime section nor _PyRuntime "
                        "symbol%s" % (path, hint))
        self.runtime_vaddr = runtime
        raw = elf.read_vaddr(runtime, 16)
        if raw[:8] != COOKIE:
            raise Error("%s: no _Py_DebugOffsets cookie %r at _PyRuntime"
                        % (path, COOKIE.decode()))
        version, = struct.unpack_from("<Q", raw, 8)
        series = (version >> 24, (version >> 16) & 0xff)
        layout = DEBUG_OFFSETS.get(series)
        if layout is None or series not in FRAME_OWNED_BY_CSTACK:
            raise Error("%s is Python %d.%d: this tool knows the "
                        "_Py_DebugOffsets layout of %s only"
                        % ((path,) + series + (", ".join(
                            "%d.%d" % known
                            for known in sorted(DEBUG_OFFSETS)),)))
        raw = elf.read_vaddr(runtime, 8 + 8 * len(layout))
        values = struct.unpack_from("<%dQ" % len(layout), raw, 8)
        self.offsets = dict(zip(layout, values))
        self.version = version
        self.series = series
        self.free_threaded = bool(self.offsets["free_threaded"])
        # The object header (Include/object.h), which CodeReader reads to
        # tell a live code object from a freed block: ob_type comes after
        # the reference count in the default build, and after the owning
        # thread, the lock, the GC bits and the two counts in the
        # free-threaded one.
        header = ObjectHeader.of(self.free_threaded)
        if self.offsets["pyobject.ob_type"] != header.ob_type:
            raise Error("%s: its objects' header is not the one this tool "
                        "knows for a %s build (ob_type at %d, not %d)"
                        % (path, header.build,
                           self.offsets["pyobject.ob_type"], header.ob_type))
        self.header = header
        # The kernel sets mm->start_code to the lowest address of the
        # executable segments plus the load bias (fs/binfmt_elf.c).
        texts = [segment.vaddr for segment in elf.segments
                 if segment.type == PT_LOAD and segment.flags & PF_X]
        if not texts:
            raise Error("%s has no executable segment" % path)
        self.text_vaddr = min(texts)
        # co_version, which _Py_DebugOffsets does not give: the uint32_t
        # right before co_localsplusnames, six ints after co_firstlineno
        # (Include/cpython/code.h), which this checks.
        before = CO_VERSION_BEFORE_LOCALSPLUSNAMES[series]
        self.co_version = self.offsets["code_object.localsplusnames"] - before
        if self.co_version != self.offsets["code_object.firstlineno"] + 24:
            raise Error("%s: its code objects' layout is not the one this "
                        "tool knows (co_version)" % path)
        self.firsttraceable = (
            self.offsets["code_object.co_code_adaptive"] -
            FIRSTTRACEABLE_BEFORE_CODE_ADAPTIVE[series])
        if "_Py_InitCleanup" in symbols:
            # Python/specialize.c gives this static code object a
            # _co_firsttraceable of 4.
            shim = symbols["_Py_InitCleanup"][0]
            if struct.unpack("<i", elf.read_vaddr(
                    shim + self.firsttraceable, 4))[0] != 4:
                raise Error("%s: its code objects' layout is not the one "
                            "this tool knows (_co_firsttraceable)" % path)
        self.tls_offset = self._tstate_tls_offset(elf, symbols)
        # Where a -c command is stopped before it finalizes (HOLD_CLAUSE).
        self.has_run_eval = "run_eval_code_obj" in symbols
        self.run_eval_returns = (self._return_sites(
            elf, symbols, "run_eval_code_obj") if self.has_run_eval else [])
        # Where the dynamic loader puts its r_debug: the value of the
        # DT_DEBUG entry; None in a static executable.
        self.debug_slot = next((entry.value_vaddr
                                for entry in elf.dynamic()
                                if entry.tag == DT_DEBUG), None)

    @staticmethod
    def _return_sites(elf, symbols, callee):
        """Where the calls to the function *callee* return: (function,
        offset) of the instruction after each `call rel32` (e8) to it in
        the executable segments."""
        target = symbols[callee][0]
        functions = sorted((value, size, name)
                           for name, (value, size, kind) in symbols.items()
                           if kind == STT_FUNC and size)
        sites = []
        for segment in elf.segments:
            if segment.type != PT_LOAD or not segment.flags & PF_X:
                continue
            vaddr = segment.vaddr
            data = elf.segment_data(segment)
            for match in re.finditer(b"\xe8", data):
                at = match.start()
                if at + 5 > len(data):
                    break
                rel, = struct.unpack_from("<i", data, at + 1)
                site = vaddr + at + 5
                if site + rel != target:
                    continue
                index = bisect.bisect_right(functions, (site, 1 << 64)) - 1
                if index >= 0:
                    value, size, name = functions[index]
                    if value <= site < value + size:
                        sites.append((name, site - value))
        return sites

    @staticmethod
    def _tstate_tls_offset(elf, symbols):
        """How far below the thread pointer _Py_tss_tstate is, or 0.

        In an executable, a thread-local variable lives in the static TLS
        block just below the thread pointer (x86-64 TLS variant II): at
        tp - roundup(p_memsz, p_align) + st_value, the formula of glibc's
        _dl_determine_tlsoffset for the first module.
        """
        tls = [seg for seg in elf.segments if seg.type == PT_TLS]
        symbol = symbols.get("_Py_tss_tstate")
        if elf.type != ET_DYN and elf.type != ET_EXEC:
            return 0
        if not tls or symbol is None or symbol.type != STT_TLS:
            return 0
        vaddr, memsz, align = tls[0].vaddr, tls[0].memsz, max(tls[0].align, 1)
        firstbyte = -vaddr & (align - 1)
        block = -(-(memsz - firstbyte) // align) * align + firstbyte
        return block - symbol[0]


class ObjectHeader:
    """What CodeReader reads of an object's header (Include/object.h), by
    build: whether the object is alive, and immortal, and which bytes of
    it change while it lives (its counts, and in the free-threaded build
    its owning thread, lock and GC bits)."""

    def __init__(self, build, ob_type):
        self.build = build
        self.ob_type = ob_type

    @staticmethod
    def of(free_threaded):
        return FREE_THREADED_HEADER if free_threaded else DEFAULT_HEADER


class DefaultHeader(ObjectHeader):
    """ob_refcnt, ob_type."""

    def alive(self, raw):
        """A freed block has pymalloc's pointer to the next free block in
        its first word, ob_refcnt: 0 or an address.  A live object's count
        is at least 1 and at most the immortal one (0xffffffff)."""
        refcnt, = struct.unpack_from("<Q", raw, 0)
        return 0 < refcnt <= 0xffffffff

    def immortal(self, raw):
        refcnt, = struct.unpack_from("<Q", raw, 0)
        return bool(refcnt & 0x80000000)


class FreeThreadedHeader(ObjectHeader):
    """ob_tid (8 bytes), padding (2), ob_mutex (1), ob_gc_bits (1),
    ob_ref_local (uint32 at 12), ob_ref_shared (ssize_t at 16, the count
    shifted left by 2 over two flag bits), ob_type (24)."""

    def alive(self, raw):
        """The interpreter frees an object once both counts are 0 (the
        shared one may be negative while the object lives); mimalloc then
        writes its free list's pointer over ob_tid only, and leaves the
        counts."""
        local, = struct.unpack_from("<I", raw, 12)
        shared, = struct.unpack_from("<q", raw, 16)
        return local != 0 or (shared >> 2) != 0

    def immortal(self, raw):
        local, = struct.unpack_from("<I", raw, 12)
        return local == 0xffffffff


DEFAULT_HEADER = DefaultHeader("default", 8)
FREE_THREADED_HEADER = FreeThreadedHeader("free-threaded", 24)
