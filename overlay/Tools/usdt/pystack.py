#!/usr/bin/env python3
"""pystack.py - the Python stacks of the threads that hit a bpftrace probe.

For any bpftrace probe (a tracepoint, a kprobe, a uprobe, one of the
interpreter's USDT markers), counts the Python stacks of the threads that
hit it: the qualified name (co_qualname), file and current line of every
frame.  The stack is walked in BPF from the thread's PyThreadState with the
offsets that the interpreter exports in _Py_DebugOffsets, at the start of
its _PyRuntime (section .PyRuntime, cookie "xdebugpy"); per frame, BPF
records only the code object's address, the instruction's offset and
three fields that tell the code object from a later one at the same
address.  This tool reads each code object's names and location table
from the process (/proc/PID/mem) once, while tracing, as the records
come, and decodes the lines as PyCode_Addr2Line does, without a
budget.  Nothing runs in the traced
process: no trampoline, no perf map, no helper thread.

    pystack.py --probe PROBE -c "PYTHON script.py"      # counts per stack
    pystack.py --probe PROBE -p PID --folded           # then Ctrl-C
    pystack.py --probe PROBE --python PYTHON --print-program > stacks.bt

PROBE is any bpftrace probe; a path field written PYTHON stands for the
interpreter, as in usdt:PYTHON:python:gc__start or uprobe:PYTHON:take_gil.
Needs root and bpftrace (0.17 tested); runs under any Python 3.

Output: counts per stack, most frequent first, innermost frame first
(like bpftrace's ustack); with --folded, one line per stack,
"root;...;innermost count", for python -m usdt.flamegraph.  See "Python
stacks" in Doc/howto/usdt-tools.rst.

With --native, whole stacks: the native frames, walked in BPF through
the frame pointers, with each activation of the interpreter loop
(_PyEval_EvalFrameDefault) replaced by the Python frames it runs, those
between two of the entry frames that the C stack owns; Python frames are
then py::qualname (file:line), native ones symbol (library).  See "Whole
stacks" in the same howto.
"""

import argparse
import bisect
import collections
import contextlib
import itertools
import json
import os
import queue
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

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


def _load_usdt(name):
    """usdt.<name>: already imported (by usdt.tools), or next to this
    file (installed in Lib/usdt), or in the source tree's Lib/usdt."""
    if "usdt." + name in sys.modules:
        return sys.modules["usdt." + name]
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, name + ".py"),
                 os.path.join(here, "..", "..", "Lib", "usdt",
                              name + ".py")):
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location(
                "usdt." + name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["usdt." + name] = module
            spec.loader.exec_module(module)
            return module
    raise ImportError("usdt/%s.py is not next to %s" % (name, __file__))


# usdt._bpftrace, the one place that knows how each bpftrace version
# differs; usdt._cfi, libc's call-frame information (--native).
_bpftrace = _load_usdt("_bpftrace")
_cfi = _load_usdt("_cfi")

# An error the tool reports in one line, without a traceback.
Error = _bpftrace.Error


# ---------------------------------------------------------------- ELF

class Elf:
    """The parts of an ELF64 little-endian file this tool needs."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            self.data = f.read()
        d = self.data
        if d[:4] != b"\x7fELF":
            raise Error("%s is not an ELF file" % path)
        if d[4] != 2 or d[5] != 1:
            raise Error("%s: only 64-bit little-endian ELF is supported"
                        % path)
        (self.type, self.machine, _, _, phoff, shoff, _, _, phentsize,
         phnum, shentsize, shnum, shstrndx) = struct.unpack_from(
            "<HHIQQQIHHHHHH", d, 16)
        self.segments = [struct.unpack_from("<IIQQQQQQ", d,
                                            phoff + i * phentsize)
                         for i in range(phnum)]
        self.sections = []
        for i in range(shnum):
            (name, stype, flags, addr, offset, size, link, info, align,
             entsize) = struct.unpack_from("<IIQQQQIIQQ", d,
                                           shoff + i * shentsize)
            self.sections.append(dict(name=name, type=stype, addr=addr,
                                      offset=offset, size=size, link=link,
                                      entsize=entsize))
        if shstrndx < len(self.sections):
            names = self.sections[shstrndx]
            for section in self.sections:
                section["name"] = self._cstring(names["offset"]
                                                + section["name"])

    def _cstring(self, offset):
        return self.data[offset:self.data.index(b"\0", offset)].decode(
            "utf-8", "replace")

    def section(self, name):
        for section in self.sections:
            if section["name"] == name:
                return section
        return None

    def symbols(self):
        """{name: (value, size, type)} from .symtab and .dynsym."""
        found = {}
        for section in self.sections:
            if section["type"] not in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
                continue
            strtab = self.sections[section["link"]]["offset"]
            for at in range(section["offset"],
                            section["offset"] + section["size"], 24):
                name, info, _, _, value, size = struct.unpack_from(
                    "<IBBHQQ", self.data, at)
                if name:
                    found.setdefault(self._cstring(strtab + name),
                                     (value, size, info & 0xf))
        return found

    def read_vaddr(self, vaddr, size):
        """size bytes of the file image at virtual address vaddr."""
        for ptype, _, offset, seg_vaddr, _, filesz, _, _ in self.segments:
            if ptype == 1 and seg_vaddr <= vaddr < seg_vaddr + filesz:
                start = offset + vaddr - seg_vaddr
                return self.data[start:start + size]
        raise Error("%s: address %#x is not in the file" % (self.path, vaddr))


PT_LOAD, PT_DYNAMIC, PT_TLS, PF_X, STT_TLS = 1, 2, 7, 1, 6


class Interpreter:
    """What the BPF program needs to know about one interpreter binary."""

    def __init__(self, path):
        self.path = os.path.realpath(path)
        elf = Elf(self.path)
        if elf.machine != 62:  # EM_X86_64: the thread pointer is fsbase
            raise Error("%s: only x86-64 is supported" % path)
        symbols = elf.symbols()
        section = elf.section(".PyRuntime")
        if section is not None:
            runtime = section["addr"]
        elif "_PyRuntime" in symbols:
            runtime = symbols["_PyRuntime"][0]
        else:
            hint = ""
            if any(re.match(r"libpython3\.\d+", os.path.basename(n))
                   for n in self._needed(elf)):
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
        texts = [vaddr for ptype, flags, _, vaddr, _, _, _, _ in elf.segments
                 if ptype == PT_LOAD and flags & PF_X]
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
        self.debug_slot = self._debug_slot(elf)

    @staticmethod
    def _return_sites(elf, symbols, callee):
        """Where the calls to the function *callee* return: (function,
        offset) of the instruction after each `call rel32` (e8) to it in
        the executable segments."""
        target = symbols[callee][0]
        functions = sorted((value, size, name)
                           for name, (value, size, kind) in symbols.items()
                           if kind == 2 and size)  # STT_FUNC
        sites = []
        for ptype, flags, offset, vaddr, _, filesz, _, _ in elf.segments:
            if ptype != PT_LOAD or not flags & PF_X:
                continue
            data = elf.data[offset:offset + filesz]
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
    def _needed(elf):
        dynamic = elf.section(".dynamic")
        dynstr = elf.section(".dynstr")
        if dynamic is None or dynstr is None:
            return []
        needed = []
        for at in range(dynamic["offset"],
                        dynamic["offset"] + dynamic["size"], 16):
            tag, value = struct.unpack_from("<qQ", elf.data, at)
            if tag == 1:  # DT_NEEDED
                needed.append(elf._cstring(dynstr["offset"] + value))
        return needed

    @staticmethod
    def _debug_slot(elf):
        """The address of the value of the DT_DEBUG entry in the dynamic
        section, where the dynamic loader puts its r_debug; None if
        there is none (a static executable)."""
        dynamic = elf.section(".dynamic")
        if dynamic is None:
            return None
        for i in range(dynamic["size"] // 16):
            tag = struct.unpack_from("<q", elf.data,
                                     dynamic["offset"] + 16 * i)[0]
            if tag == 21:  # DT_DEBUG
                return dynamic["addr"] + 16 * i + 8
            if tag == 0:  # DT_NULL
                break
        return None

    @staticmethod
    def _tstate_tls_offset(elf, symbols):
        """How far below the thread pointer _Py_tss_tstate is, or 0.

        In an executable, a thread-local variable lives in the static TLS
        block just below the thread pointer (x86-64 TLS variant II): at
        tp - roundup(p_memsz, p_align) + st_value, the formula of glibc's
        _dl_determine_tlsoffset for the first module.
        """
        tls = [seg for seg in elf.segments if seg[0] == PT_TLS]
        symbol = symbols.get("_Py_tss_tstate")
        if elf.type != 3 and elf.type != 2:
            return 0
        if not tls or symbol is None or symbol[2] != STT_TLS:
            return 0
        _, _, _, vaddr, _, _, memsz, align = tls[0]
        align = max(align, 1)
        firstbyte = -vaddr & (align - 1)
        block = -(-(memsz - firstbyte) // align) * align + firstbyte
        return block - symbol[0]


# ---------------------------------------------------------------- BPF

PROGRAM = r"""
/*
 * Python stacks at PROBES, generated by pystack.py for
 * INTERPRETER
 *
 * Prints records, which pystack.py --read FILE turns into counts; a hit
 * is identified by its thread id and the time it began ("event"):
 *   PYSTACK F tid event pid batch (code word) * 8  (frames 8 * batch
 *                                          to 8 * batch + 7, in hex:
 *                                          the code object's address,
 *                                          and the instruction's offset
 *                                          in bytes << 33 | entry << 32
 *                                          | co_version.  Code 0: no
 *                                          frame)
 *   PYSTACK D tid event max more top       (more: frames left out; the
 *                                          stack is the first max of
 *                                          the F records' frames)
 *   PYSTACK A tid event batch a0 ... a7           (--native: native
 *                                                  frames 8 * batch to
 *                                                  8 * batch + 7, their
 *                                                  addresses; 0: none)
 *   PYSTACK U tid event address                   (--native: the
 *                                                  caller of frame 0, a
 *                                                  system call's site in
 *                                                  libc, from its CFI)
 *   PYSTACK N tid event pid bias more regs        (--native: bias, the
 *                                                  interpreter's load
 *                                                  bias; more: frames
 *                                                  left out; regs 0: the
 *                                                  user registers were
 *                                                  not found)
 *   PYSTACK M tid time pid bias dynamic name      (--native, once per
 *                                                  process: a library of
 *                                                  the loader's list, its
 *                                                  load bias and dynamic
 *                                                  section; another
 *                                                  program, below)
 *   PYSTACK Z tid event status weight key size    (0; 1: not this Python,
 *                                                  2: no thread state;
 *                                                  weight: WEIGHT;
 *                                                  key: KEY;
 *                                                  size: SIZE)
 *   PYSTACK R tid event key                       (a release: RELEASE)
 *   PYSTACK Y tid event pid        (-c: the command ran its main module,
 *                                   and stops until pystack.py has read
 *                                   its code objects)
 * Depth 0 is the innermost frame.  Entry 1: the frame before this one
 * is an entry frame, owned by the C stack, which an activation of the
 * evaluator pushes first: this frame is the outermost that activation
 * runs.  Top 1: the thread's current frame is such an entry frame (an
 * activation that runs no frame yet).
 */
MACROS

STRUCTS
PROBES
FILTER
{
	$task = (struct task_struct *)curtask;
	$event = nsecs;
NATIVE
	/* _PyRuntime in this process; its cookie says it is this interpreter */
	$runtime = $task->mm->start_code - TEXT_VADDR + RUNTIME_VADDR;
	if (*uptr((uint64 *)$runtime) != COOKIE) {
		printf("PYSTACK Z %d %lu 1 %lu %lu %lu\n", tid, $event,
		       (uint64)(WEIGHT), (uint64)(KEY), (uint64)(SIZE));
		return;
	}

	/* The thread state: the thread-local _Py_tss_tstate, which is NULL
	 * while the thread does not hold the GIL, else the thread state of
	 * any interpreter whose native_thread_id is this thread's. */
	/* Typed constants are casts of uptr(): bpftrace 0.23 gives a cast
	 * of a constant the probe's address space (a tracepoint's: the
	 * kernel's), and warns "Addrspace mismatch" at each sum of it and a
	 * value read through uptr(), which is the user's. */
	$tstate = (uint64)uptr(0);
	if (TSTATE_TLS != 0) {
		$tstate = *uptr((uint64 *)($task->thread.fsbase - TSTATE_TLS));
		if ($tstate != 0 &&
		    *uptr((uint64 *)($tstate + TS_NATIVE_THREAD_ID)) != tid) {
			$tstate = 0;
		}
	}
	$interp = *uptr((uint64 *)($runtime + RT_INTERPRETERS_HEAD));
	for ($interps : 0..MAX_INTERPRETERS) {
		if ($tstate != 0 || $interp == 0) {
			break;
		}
		$t = *uptr((uint64 *)($interp + IS_THREADS_HEAD));
		for ($threads : 0..MAX_THREADS) {
			if ($t == 0) {
				break;
			}
			if (*uptr((uint64 *)($t + TS_NATIVE_THREAD_ID)) == tid) {
				$tstate = $t;
				break;
			}
			$t = *uptr((uint64 *)($t + TS_NEXT));
		}
		$interp = *uptr((uint64 *)($interp + IS_NEXT));
	}
	if ($tstate == 0) {
		printf("PYSTACK Z %d %lu 2 %lu %lu %lu\n", tid, $event,
		       (uint64)(WEIGHT), (uint64)(KEY), (uint64)(SIZE));
		return;
	}

	/* The frames, innermost first, skipping the frames that the C stack
	 * owns (the interpreter's entry frames; never two in a row): per
	 * frame its code object's address, the offset of its instruction in
	 * bytes (what PyCode_Addr2Line takes), whether the frame before it is
	 * an entry frame, and the code object's co_version.  The interpreter
	 * numbers the code objects it creates, so that pystack.py, which
	 * reads the code object at that address later, takes it only if its
	 * co_version is the record's: a code object freed since, and another
	 * created at its address, is never taken for it.  No strings and no
	 * location table here: pystack.py reads them once per code object
	 * and decodes the line itself.
	 *
	 * What it costs (bpf_stats, docs/whole-stacks.md): two reads per
	 * frame, its header in one (struct pystack_frame) and co_version;
	 * eight frames per record, for a record costs more than a frame's
	 * reads; and no read past the last frame, for a read that faults
	 * (at a NULL frame's fields) costs about 4 us, as much as 40 frames. */
	$frame = *uptr((uint64 *)($tstate + TS_CURRENT_FRAME));
	if ($frame == 0) {
		printf("PYSTACK D %d %lu %d 0 0\n", tid, $event, MAX_DEPTH);
		printf("PYSTACK Z %d %lu 0 %lu %lu %lu\n", tid, $event,
		       (uint64)(WEIGHT), (uint64)(KEY), (uint64)(SIZE));
		return;
	}
	$h = *uptr((struct pystack_frame *)$frame);
	$top = (uint64)uptr(0);
	if ($h.owner == FRAME_OWNED_BY_CSTACK) {
		$top = (uint64)uptr(1);
		$frame = $h.previous;
		if ($frame != 0) {
			$h = *uptr((struct pystack_frame *)$frame);
		}
	}
	for ($batch : 0..FRAME_BATCHES) {
PYTHON_FRAMES
		printf("PYSTACK F %d %lu %d %d %lx %lx %lx %lx %lx %lx %lx %lx %lx %lx %lx %lx %lx %lx %lx %lx\n",
		       tid, $event, pid, $batch, $f0, $w0, $f1, $w1, $f2, $w2, $f3,
		       $w3, $f4, $w4, $f5, $w5, $f6, $w6, $f7, $w7);
		if ($frame == 0) {
			break;
		}
	}
	$more = (($frame - 1) >> 63) ^ 1;
	printf("PYSTACK D %d %lu %d %d %d\n", tid, $event, MAX_DEPTH, $more,
	       $top);
	printf("PYSTACK Z %d %lu 0 %lu %lu %lu\n", tid, $event,
	       (uint64)(WEIGHT), (uint64)(KEY), (uint64)(SIZE));
}
"""


# One frame of PROGRAM's walk, eight times per record (PYTHON_FRAMES):
# $fK, $wK for K in 0-7.
PYTHON_FRAME = r"""		$f0 = (uint64)uptr(0);
		$w0 = (uint64)uptr(0);
		if ($frame != 0) {
			$code = $h.executable;
			$f0 = $code;
			$w0 = (($h.instr_ptr - ($code + CO_CODE_ADAPTIVE)) << 33) |
			    (uint64)*uptr((uint32 *)($code + CO_VERSION));
			$frame = $h.previous;
			if ($frame != 0) {
				$h = *uptr((struct pystack_frame *)$frame);
				if ($h.owner == FRAME_OWNED_BY_CSTACK) {
					$w0 = $w0 | 0x100000000;
					$frame = $h.previous;
					if ($frame != 0) {
						$h = *uptr((struct pystack_frame *)$frame);
					}
				}
			}
		}
"""

# One frame pointer of NATIVE_WALK, eight times per record
# (NATIVE_FRAMES): $aK for K in 0-7.
NATIVE_FRAME = r"""		$a0 = $ip;
		$ip = (uint64)uptr(0); $next = (uint64)uptr(0);
		if ($bp > 0xffff) {
			$ip = *uptr((uint64 *)($bp + 8));
			$next = *uptr((uint64 *)$bp);
		}
		$bp = $next * ((($bp - $next) >> 63) & 1);
"""


def unrolled(template, names):
    """*template* eight times, its variables (names ending in 0) renamed
    to end in 1 to 7: the frames of a record, written out (bpftrace's
    loops take no arrays)."""
    text = []
    for k in range(8):
        frame = template
        for name in names:
            frame = frame.replace(name + "0", name + str(k))
        text.append(frame)
    return "".join(text)

def macros(interp, args):
    """The #define lines of the program: every offset it uses, by name."""
    o = interp.offsets
    values = [
        ("COOKIE", "0x%x" % struct.unpack("<Q", COOKIE)[0],
         "\"xdebugpy\", the first 8 bytes of _PyRuntime"),
        ("TEXT_VADDR", "0x%x" % interp.text_vaddr,
         "lowest executable segment (mm->start_code minus the load bias)"),
        ("RUNTIME_VADDR", "0x%x" % interp.runtime_vaddr, "_PyRuntime"),
        ("TSTATE_TLS", "0x%x" % interp.tls_offset,
         "_Py_tss_tstate is at fsbase minus this (0: not used)"),
        ("RT_INTERPRETERS_HEAD", o["runtime_state.interpreters_head"], ""),
        ("IS_NEXT", o["interpreter_state.next"], ""),
        ("IS_THREADS_HEAD", o["interpreter_state.threads_head"], ""),
        ("TS_NEXT", o["thread_state.next"], ""),
        ("TS_CURRENT_FRAME", o["thread_state.current_frame"], ""),
        ("TS_NATIVE_THREAD_ID", o["thread_state.native_thread_id"], ""),
        ("FR_PREVIOUS", o["interpreter_frame.previous"], ""),
        ("FR_EXECUTABLE", o["interpreter_frame.executable"], ""),
        ("FR_INSTR_PTR", o["interpreter_frame.instr_ptr"], ""),
        ("FR_OWNER", o["interpreter_frame.owner"], ""),
        ("FRAME_OWNED_BY_CSTACK", FRAME_OWNED_BY_CSTACK[interp.series],
         "Include/internal/pycore_frame.h"),
        ("CO_VERSION", interp.co_version, "co_version (not in "
         "_Py_DebugOffsets)"),
        ("CO_CODE_ADAPTIVE", o["code_object.co_code_adaptive"], ""),
        ("MAX_DEPTH", args.max_depth, "frames printed"),
        ("FRAME_BATCHES", -(-args.max_depth // 8),
         "records of 8 frames, at most"),
        ("MAX_INTERPRETERS", 8, ""),
        ("MAX_THREADS", args.max_threads, "thread states per interpreter"),
    ]
    if getattr(args, "native", False):
        values.append(("NATIVE_BATCHES", -(-args.max_native // 8),
                       "records of 8 native frames, at most"))
        values.append(("THREAD_SIZE", THREAD_SIZE,
                       "the x86-64 kernel stack (without KASAN)"))
        if interp.debug_slot is not None:
            values.append(("DT_DEBUG_VADDR", "0x%x" % interp.debug_slot,
                           "the value of the DT_DEBUG entry: r_debug"))
            values.append(("MAX_LIBRARIES", MAX_LIBRARIES,
                           "libraries listed per process"))
    lines = []
    for name, value, comment in values:
        line = "#define %-22s %s" % (name, value)
        if comment:
            line = "%-44s /* %s */" % (line, comment)
        lines.append(line)
    return "\n".join(lines)


def structs(interp):
    """The C declaration of struct pystack_frame: the fields of an
    interpreter frame that the program reads, at their offsets
    (_Py_DebugOffsets), with padding between, so that one read takes the
    whole header."""
    o = interp.offsets
    fields = sorted([
        (o["interpreter_frame.executable"], 8, "unsigned long", "executable"),
        (o["interpreter_frame.previous"], 8, "unsigned long", "previous"),
        (o["interpreter_frame.instr_ptr"], 8, "unsigned long", "instr_ptr"),
        (o["interpreter_frame.owner"], 1, "unsigned char", "owner"),
    ])
    lines = ["/* the fields of _PyInterpreterFrame that the program reads */",
             "struct pystack_frame {"]
    at = 0
    for offset, size, ctype, name in fields:
        if offset < at:
            raise Error("%s: interpreter frame fields overlap" % interp.path)
        if offset > at:
            lines.append("\tchar _pad%d[%d];" % (at, offset - at))
        lines.append("\t%s %s;" % (ctype, name))
        at = offset + size
    lines.append("};")
    return "\n".join(lines) + "\n\n"

NATIVE_WALK = r"""
	/* The native stack, from the frame pointers: the user registers
	 * that the kernel saved on entry are at the top of the task's kernel
	 * stack (task_pt_regs(); user code segment 0x33, else they are not
	 * there); then the chain of saved frame pointers, each followed by
	 * its return address.  A frame pointer that does not grow ends the
	 * walk after its return address (a function without frame pointers
	 * left another value in rbp); a read that fails gives 0, which ends
	 * it too.  8 addresses per record.  No read at a frame pointer
	 * below 64 KiB (0 ends the walk; a small number is not an
	 * address): a read that faults costs about 4 us.  kptr(): kernel
	 * memory, which bpftrace 0.27 would otherwise read as the user's in
	 * a uprobe (a USDT marker), getting 0s. */
	$regs = kptr((struct pt_regs *)((uint64)$task->stack + THREAD_SIZE -
	    sizeof(struct pt_regs)));
	$user = (uint64)uptr($regs->cs == 0x33 ? 1 : 0);
	$ip = (uint64)uptr($regs->ip) * $user;
	$bp = (uint64)uptr($regs->bp) * $user;
LIBC_STEP
	for ($batch : 0..NATIVE_BATCHES) {
NATIVE_FRAMES
		printf("PYSTACK A %d %lu %d %lx %lx %lx %lx %lx %lx %lx %lx\n",
		       tid, $event, $batch, $a0, $a1, $a2, $a3, $a4, $a5, $a6,
		       $a7);
		if ($ip == 0) {
			break;
		}
	}
	printf("PYSTACK N %d %lu %d %lu %d %d\n", tid, $event, pid,
	       $task->mm->start_code - TEXT_VADDR, $ip != 0, $user);
"""


# With -c: the interpreter has run its main module (run_eval_code_obj
# returns, before run_mod releases the module's code and the interpreter
# finalizes, freeing every code object): stop it there, for follow() to
# read the code objects of its last records (ExitHold).  The probes are
# at the instructions where run_eval_code_obj's calls return (a bpftrace
# with offsets, hold_probes()), else a uretprobe: that one replaces the
# return address of every call of run_eval_code_obj that any process of
# this interpreter makes while it is attached, which their debuggers and
# profilers see (gdb: a frame "??").
HOLD_CLAUSE = r"""
HOLD_PROBES
/pid == cpid/
{
	printf("PYSTACK Y %d %lu %d\n", tid, nsecs, pid);
	signal("SIGSTOP");
}
"""


# With --native, where the tool read libc's call-frame information (Libc):
# a system call's site in libc, which has no frame pointers, where rbp may
# hold anything (the cancellable calls keep their cancellation state
# there), so that the frame pointers lead nowhere: its caller's return
# address and rbp, where libc's CFI says, at CFA = rsp + k.
# @pystack_cfi maps the site's offset in libc to k | o << 16, o: how far
# below the CFA rbp was saved (0: rbp is still the caller's; 0xffff: not
# known, the walk stops).  @pystack_libc: libc's load bias per process,
# from the loader's list (LINKED_CLAUSE), when its build ID is the one
# read; the first hit of a process comes before it.
LIBC_STEP = r"""
	$libc = @pystack_libc[pid];
	if ($libc != 0 && $ip > $libc) {
		$rule = @pystack_cfi[$ip - $libc];
		if ($rule != 0) {
			$cfa = (uint64)uptr($regs->sp) + ($rule & 0xffff);
			printf("PYSTACK U %d %lu %lx\n", tid, $event,
			       *uptr((uint64 *)($cfa - 8)));
			$saved = $rule >> 16;
			if ($saved == 0xffff) {
				$bp = (uint64)uptr(0);
			} else if ($saved != 0) {
				$bp = *uptr((uint64 *)($cfa - $saved));
			}
		}
	}
"""
LIBC_BEGIN = r"""
BEGIN
{
RULES}
"""
LIBC_FIND = r"""
			if (*uptr((uint64 *)(*uptr((uint64 *)$lm) +
			    LIBC_BUILD_ID_VADDR)) == LIBC_BUILD_ID) {
				@pystack_libc[pid] = *uptr((uint64 *)$lm);
			}
"""


class Libc:
    """libc's call-frame information at its system-call sites: the rules
    of LIBC_STEP, and where its build ID is (its first 8 bytes), by which
    the program knows it in a process's loader list."""

    def __init__(self, path):
        self.path = path
        elf = Elf(path)
        note = elf.section(".note.gnu.build-id")
        if note is None:
            raise Error("%s has no build ID" % path)
        # Elf64_Nhdr (namesz, descsz, type) and "GNU\0", then the ID.
        self.build_id_vaddr = note["addr"] + 16
        self.build_id, = struct.unpack_from("<Q", elf.data,
                                            note["offset"] + 16)
        frames = _cfi.EhFrame(elf)
        self.rules = {}
        for site in _cfi.syscall_sites(elf):
            row = frames.row(site)
            if (row is None or row.cfa is None or row.cfa[0] != _cfi.RSP
                    or row.saved(_cfi.RA) != -8
                    or not 8 <= row.cfa[1] < 0x10000):
                continue
            rbp = row.saved(_cfi.RBP)
            if rbp is _cfi.SAME:
                saved = 0
            elif rbp is None or not -0xfffe <= rbp < 0:
                saved = 0xffff
            else:
                saved = -rbp
            self.rules[site] = row.cfa[1] | saved << 16

    @staticmethod
    def find(args):
        """The Libc of the traced process (-p: the one it maps, in its
        root), or of this machine (-c, and --read); None if there is no
        such file or it cannot be read."""
        path = "/lib/x86_64-linux-gnu/libc.so.6"
        if args.pid is not None:
            try:
                with open("/proc/%d/maps" % args.pid) as f:
                    for line in f:
                        name = line.split(None, 5)[-1].strip()
                        if re.search(r"/libc\.so\.6$", name):
                            path = "/proc/%d/root%s" % (args.pid, name)
                            break
            except OSError:
                return None
        try:
            return Libc(path)
        except (OSError, Error, _cfi.CfiError):
            return None


# With --native: the libraries of each process, from the dynamic loader's
# list (what debuggers read: r_debug, which the loader puts in the
# interpreter's DT_DEBUG entry), once per process, at its first hit.
# The tool names native frames from each process's mappings, read while
# it runs; a short command (-c) may end before a read finds its
# libraries, and this list is then where their addresses are.  Its own
# program, so that the stack walk's verification is unchanged.
LINKED_CLAUSE = r"""
PROBES
FILTER
{
	$linked_runtime = ((struct task_struct *)curtask)->mm->start_code -
	    TEXT_VADDR + RUNTIME_VADDR;
	if (@pystack_linked[pid] == 0 &&
	    *uptr((uint64 *)$linked_runtime) == COOKIE) {
		@pystack_linked[pid] = 1;
		/* r_debug.r_map; each link_map: l_addr (the load bias), l_name,
		 * l_ld (its dynamic section), l_next */
		$lm = *uptr((uint64 *)(*uptr((uint64 *)($linked_runtime -
		    RUNTIME_VADDR + DT_DEBUG_VADDR)) + 8));
		for ($library : 0..MAX_LIBRARIES) {
			if ($lm == 0) {
				break;
			}
			printf("PYSTACK M %d %lu %d %lx %lx %s\n", tid, nsecs, pid,
			       *uptr((uint64 *)$lm), *uptr((uint64 *)($lm + 16)),
			       str(uptr(*uptr((uint64 *)($lm + 8)))));
LIBC_FIND
			$lm = *uptr((uint64 *)($lm + 24));
		}
	}
}
"""
MAX_LIBRARIES = 64


# Printed once bpftrace has attached the program's probes: it attaches
# them in the order of the program, so this last one comes after them
# (the time --duration counts from).
ATTACHED_CLAUSE = r"""
interval:ms:20
/@pystack_attached == 0/
{
	@pystack_attached = 1;
	printf("PYSTACK B 0 %lu\n", nsecs);
}
"""


# With --live: the hits of another probe that release a key.
RELEASE_CLAUSE = r"""
RELEASE_PROBE
FILTER
{
	printf("PYSTACK R %d %lu %lu\n", tid, nsecs, (uint64)(RELEASE_KEY));
}
"""


def program(interp, args, probes, runner=None):
    """The bpftrace program, with its loops as the bpftrace *runner*
    (a usdt._bpftrace.Bpftrace) takes them: range loops from 0.24, whose
    bodies the kernel checks once, while loops before (also for no
    runner: 0.24 to 0.27 still take them, with a warning)."""
    predicate = []
    if args.pid is not None:
        predicate.append("pid == %d" % args.pid)
    elif args.command is not None:
        predicate.append("pid == cpid")
    if args.filter:
        predicate.append("(%s)" % args.filter)
    # The probes and their predicate, for the stack walk's clause and
    # the loader list's.
    probe_lines = ",\n".join(probes) + "\n"
    where = "/%s/\n" % " && ".join(predicate) if predicate else ""
    text = PROGRAM.lstrip("\n")
    native = getattr(args, "native", False)
    libc = getattr(args, "libc", None) if native else None
    if native and interp.debug_slot is not None:
        # Before the stack walk's clause, whose programs the same hit runs
        # after it: the walk of a process's first hit finds its libc.
        linked = LINKED_CLAUSE.lstrip("\n").replace(
            "LIBC_FIND\n", LIBC_FIND.lstrip("\n") if libc else "", 1)
        text = text.replace("STRUCTS\nPROBES\n",
                            "STRUCTS\n" + linked + "\nPROBES\n", 1)
    text = text.replace("PROBES\n", probe_lines)
    text = text.replace("FILTER\n", where)
    text = text.replace("MACROS", macros(interp, args), 1)
    text = text.replace("STRUCTS\n", structs(interp), 1)
    text = text.replace(" * INTERPRETER\n", " * %s\n" % interp.path, 1)
    text = text.replace("at PROBES,", "at %s," % ", ".join(probes), 1)
    walk = ""
    if native:
        walk = NATIVE_WALK.replace(
            "LIBC_STEP\n", LIBC_STEP.lstrip("\n") if libc else "", 1)
    text = text.replace("NATIVE\n", walk, 1)
    text = text.replace("PYTHON_FRAMES\n",
                        unrolled(PYTHON_FRAME, ("$f", "$w")), 1)
    text = text.replace("NATIVE_FRAMES\n", unrolled(NATIVE_FRAME, ("$a",)),
                        1)
    if libc:
        text = text.replace(
            "LIBC_BUILD_ID_VADDR", "0x%x" % libc.build_id_vaddr).replace(
                "LIBC_BUILD_ID", "0x%x" % libc.build_id)
        text += LIBC_BEGIN.replace("RULES", "".join(
            "\t@pystack_cfi[(uint64)0x%x] = (uint64)0x%x;\n"
            % (site, rule) for site, rule in sorted(libc.rules.items())))
    text = text.replace("(WEIGHT)", "(%s)" % args.weight)
    size = getattr(args, "size", None) or "0"
    text = text.replace("(SIZE)", "(%s)" % size)
    text = text.replace("size: SIZE)", "size: %s)" % size, 1)
    text = text.replace("weight: WEIGHT;", "weight: %s;" % args.weight, 1)
    key = args.live[0] if args.live else "0"
    text = text.replace("(KEY)", "(%s)" % key)
    text = text.replace("key: KEY)", "key: %s)" % key, 1)
    release = "none"
    if args.live:
        release = "%s, key %s" % (args.live[1], args.live[2])
        # The process filter only: --filter is about the probe's hits.
        which = [p for p in predicate if p.startswith("pid ==")]
        text += RELEASE_CLAUSE.replace(
            "RELEASE_PROBE", args.live[1]).replace(
            "FILTER\n", "/%s/\n" % " && ".join(which)
            if which else "").replace("RELEASE_KEY", args.live[2])
    text = text.replace("(a release: RELEASE)", "(a release: %s)" % release,
                        1)
    if hold(interp, args):
        text += HOLD_CLAUSE.replace("HOLD_PROBES", ",\n".join(
            hold_probes(interp, runner)), 1)
    text += ATTACHED_CLAUSE
    # bpftrace prints every map when it exits; cleared, up to 0.23 as an
    # empty line (stdout_exit_newlines()).  0.17 takes one END probe.
    text += "\nEND\n{\n%s}\n" % "".join(
        "\tclear(%s);\n" % name
        for name in program_maps(text))
    if runner is None:
        return _bpftrace.while_loops(text)
    return runner.loops(text)


def program_maps(text):
    """The maps of the bpftrace program *text*, sorted: what its END
    block clears and bpftrace prints at exit (stdout_exit_newlines())."""
    return sorted(set(re.findall(r"@\w+", text)))

def hold(interp, args):
    """Whether the program stops the -c command before it finalizes."""
    return args.command is not None and interp.has_run_eval


def hold_probes(interp, runner):
    """The probes of HOLD_CLAUSE: where run_eval_code_obj's calls return,
    if the bpftrace *runner* places probes inside functions, else its
    uretprobe."""
    if (runner is not None and interp.run_eval_returns and
            runner.probe_offsets()):
        return ["uprobe:%s:%s+%d" % (interp.path, name, offset)
                for name, offset in interp.run_eval_returns]
    return ["uretprobe:%s:run_eval_code_obj" % interp.path]


# ------------------------------------------------------------- output

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
        self.native_more = False
        self.native_regs = True
        self.time = None


# ------------------------------------------------------------ code objects

# A frame whose code object pystack.py could not read: freed before it
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
        found = self.codes.get((pid,) + key)
        if found is None:
            return None
        name, filename, firstlineno, table, firsttraceable = found
        if offset < 2 * firsttraceable:
            return INCOMPLETE
        return Frame(self.cut(name), self.cut(filename),
                     addr2line(table, firstlineno, offset))

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


def parse(lines, codes, symbolizer=None, max_native=None,
          live=False, objects=None):
    """(Counter of stacks, {note: count}) from the program's records.

    A stack is a tuple of Frames, innermost first; a hit without one
    counts as a stack of one pseudo-frame that says why.  A frame's line
    is -1 when its instruction has no line.  *codes*, a CodeReader, names
    the frames: from what it read while the process ran, and from the C
    records of a saved run.
    The records of --native add the native stack, which merge() puts
    together with the Python frames.

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
        if line.startswith(RECORD + " C "):
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
            if line.startswith(RECORD + " M "):
                fields = line.rstrip("\n").split(" ", 7)
                symbolizer.linked(int(fields[4]), int(fields[5], 16),
                                  int(fields[6], 16), fields[7])
    for line in lines:
        if not line.startswith(RECORD + " "):
            lost = re.match(r"Lost (\d+) events", line)
            if lost:
                notes["records lost by bpftrace (the traced program went "
                      "too fast: set BPFTRACE_PERF_RB_PAGES higher than "
                      "64, or %d after bpftrace 0.17, %d from 0.25)"
                      % (_bpftrace.LATER_RB_PAGES,
                         _bpftrace.RINGBUF_RB_PAGES)] += int(lost.group(1))
            continue
        fields = line.rstrip("\n").split(" ", 8)
        kind, key = fields[1], (fields[2], fields[3])
        if kind in ("B", "C", "Y", "M"):
            continue
        if kind == "R":
            timeline.append((int(fields[3]), 1, int(fields[4])))
            continue
        event = events.get(key)
        if event is None:
            event = events[key] = Event()
            event.time = int(fields[3])
        if kind == "F":
            for depth, pid, code, offset, entry in frame_keys(line.split()):
                event.frames[depth] = (pid, code, offset)
                if entry:
                    event.entries.add(depth)
        elif kind == "D":
            # The F records' frames, up to the first max (they come in
            # fours).
            kept = int(fields[4])
            event.depth = min(len(event.frames), kept)
            event.more = int(fields[5]) or len(event.frames) > kept
            event.top = int(fields[6])
        elif kind == "A":
            batch = int(fields[4])
            words = line.split()[5:13]
            for k, word in enumerate(words):
                event.addresses[8 * batch + k] = int(word, 16)
        elif kind == "U":
            event.unwound = int(fields[4], 16)
        elif kind == "N":
            event.pid, event.bias = int(fields[4]), int(fields[5])
            event.native_more = fields[6] == "1"
            event.native_regs = fields[7].strip() == "1"
            event.native = True
        elif kind == "Z":
            del events[key]
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
                                             max_native),
                               segments, event.more, notes) + (
                    frames if not segments else [])
            count(tuple(frames), weight, fields)
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
            notes["frames whose code object was gone before pystack.py "
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


# --------------------------------------------------------- native frames

NativeFrame = collections.namedtuple("NativeFrame", "symbol library")

EVALUATOR = ("_PyEval_EvalFrameDefault", "_PyEval_EvalFrameDefault.cold")
NATIVE_TRUNCATED = "[more native frames]"
UNWIND_LOST = "[native frames lost]"
UNKNOWN = "[unknown]"
# The C library's functions where a thread's stack begins (glibc: the main
# thread's start code, and what runs a new thread).  Nothing of the
# program's is beyond them, but the frame pointers may lead on: glibc
# 2.43's __libc_start_main_impl keeps argv in rbp when it calls main, so
# the chain goes on into argv's strings.
THREAD_START = frozenset({
    "_start", "__libc_start_main", "__libc_start_main_impl",
    "__libc_start_call_main", "start_thread", "clone", "clone3",
    "__clone", "__clone3"})


def native_frames(event, symbolizer, notes, max_native):
    """The hit's native frames, innermost first, named from the process's
    mappings (read while it ran) and the symbol tables of their files,
    or, for the interpreter's own code, from its load bias.  A return
    address is named by the byte before it, the call (a call to a
    function that does not return may be a function's last
    instruction)."""
    if not event.native_regs:
        notes["hits without native frames: the user registers are not at "
              "the top of the kernel stack (a kernel with KASAN or FRED?)"] \
            += 1
    frames = []
    hidden = None
    addresses = [event.addresses.get(i, 0)
                 for i in range(len(event.addresses))]
    if event.unwound is not None and addresses:
        # Frame 0 is a system call's site in libc; its caller, which the
        # frame pointers do not give, from libc's CFI (LIBC_STEP).
        addresses.insert(1, event.unwound)
        notes["callers of system calls in libc found from its call-frame "
              "information"] += 1
    for i, address in enumerate(addresses):
        if address == 0 or (max_native and i >= max_native):
            break
        found = None
        if symbolizer is not None:
            found = symbolizer.lookup(event.pid, address - (i > 0),
                                      event.bias)
            if found is None and frames and (
                    frames[-1].symbol == "run_eval_code_obj"):
                # The return address that HOLD_CLAUSE's uretprobe put in
                # place of run_eval_code_obj's (the kernel's trampoline,
                # outside the mappings read): its caller, named below
                # from the frame above it.
                hidden = len(frames)
                found = RUN_EVAL_CALLER, symbolizer.interpreter
            if found is None and frames and (
                    frames[-1].symbol in THREAD_START):
                # Not code, past the thread's first frame: the stack's
                # end, not a loss.
                return frames
            if found is None and symbolizer.read_after(event.pid,
                                                       event.time):
                # Not code (the mappings were read after the hit): the
                # chain went through a function without frame
                # pointers, whose rbp held something else.
                frames.append(NativeFrame(UNWIND_LOST, ""))
                notes["native stacks cut where the frame pointers led "
                      "out of the process's code, marked %s"
                      % UNWIND_LOST] += 1
                return frames
        if found is None:
            found = UNKNOWN, UNKNOWN
            notes["native frames not named (in a library loaded after "
                  "the process's first hit and mapped after the tool last "
                  "read its mappings, or with --read, from another "
                  "root)"] += 1
        frames.append(NativeFrame(*found))
    if hidden is not None:
        older = (frames[hidden + 1].symbol if hidden + 1 < len(frames)
                 else None)
        name = symbolizer.run_eval_caller(older)
        frames[hidden] = NativeFrame(name or RUN_EVAL_CALLER,
                                     symbolizer.interpreter)
        notes["return addresses of run_eval_code_obj hidden by the -c "
              "hold's uretprobe, named by the caller that calls them%s"
              % ("" if name else "; %s where none or several could"
                 % RUN_EVAL_CALLER)] += 1
    cut = event.native_more or (
        max_native and event.addresses.get(max_native, 0) != 0)
    if cut:
        frames.append(NativeFrame(NATIVE_TRUNCATED, ""))
        notes["native stacks cut at --max-native frames"] += 1
    return frames


def is_trampoline(frame):
    """A frame of the perf trampoline (-X perf, stacks__enable): code in
    anonymous memory, named py:: from the perf map when there is one."""
    return frame.symbol.startswith("py::") or (
        frame.library == UNKNOWN or frame.library.startswith("["))


def merge(native, segments, python_cut, notes):
    """The native frames with each activation of the evaluator replaced by
    the Python frames it runs, innermost first.

    The activations pair with the segments from the outermost one, whose
    frames the unwinder never misses; when a stack was cut (native frames
    past --max-native, Python frames past --max-depth) they pair from
    the innermost one.  A trampoline frame, the caller of an activation,
    is left out: its Python frame is the segment's outermost.

    Frame pointers miss one frame when the sample is at a function's
    first or last instructions, or in a function without them (glibc's):
    the caller of the innermost function.  When that caller is an
    activation, its Python frames go there, after the innermost frame
    (or in place of its trampoline, which names it).
    """
    kept = []
    for i, frame in enumerate(native):
        if is_trampoline(frame) and frame.symbol not in EVALUATOR:
            if i > 0 and native[i - 1].symbol in EVALUATOR:
                notes["trampoline frames left out (-X perf or "
                      "stacks__enable): their Python frame is there"] += 1
                continue
            if frame.symbol.startswith("py::"):
                # A trampoline whose activation the unwinder missed.
                notes["evaluator frames missed by the frame pointers, "
                      "found from their trampoline"] += 1
                frame = NativeFrame(EVALUATOR[0], frame.library)
        kept.append(frame)
    activations = [i for i, frame in enumerate(kept)
                   if frame.symbol in EVALUATOR]
    native_cut = bool(kept) and kept[-1].symbol in (NATIVE_TRUNCATED,
                                                    UNWIND_LOST)
    pairs = {}
    n, m = len(activations), len(segments)
    inner = []
    if native_cut or python_cut:
        for k in range(min(n, m)):
            pairs[activations[k]] = segments[k]
        left = segments[n:]
    else:
        for k in range(1, min(n, m) + 1):
            pairs[activations[n - k]] = segments[m - k]
        inner = segments[:m - n] if m > n else []
        left = []
        if len(inner) == 1 and pairs and 0 not in pairs:
            notes["evaluator frames missed by the frame pointers (a "
                  "sample at a function's first instructions, or in one "
                  "without them): put after the innermost frame"] += 1
        elif inner:
            notes["stacks with more Python activations than the frame "
                  "pointers found, marked %s" % UNWIND_LOST] += 1
            if kept:
                # Where the chain broke: in glibc, which keeps no frame
                # pointers (malloc, say), and whose CFI the walk uses at
                # its system calls only (LIBC_STEP).
                library = os.path.basename(kept[0].library) or "?"
                notes["stacks marked %s sampled in %s (%s)%s" % (
                    UNWIND_LOST, kept[0].symbol, library,
                    ", built without frame pointers, whose call-frame "
                    "information is used at its system calls only"
                    if library.startswith("libc.so") else "")] += 1
            inner = inner + [[Frame(UNWIND_LOST, "", None)]]
    if n > m:
        notes["evaluator frames without Python frames (kept as native "
              "frames)"] += 1
    frames = []
    for i, frame in enumerate(kept):
        if i in pairs and pairs[i]:
            frames.extend(pairs[i])
        else:
            frames.append(frame)
        if i == 0 or not kept:
            for segment in inner:
                frames.extend(segment)
            inner = []
        if python_cut and activations and m and i == activations[
                min(n, m) - 1]:
            frames.append(Frame(TRUNCATED, "", None))
            python_cut = False
    for segment in inner + left:
        frames.extend(segment)
    if python_cut and m:
        frames.append(Frame(TRUNCATED, "", None))
    return frames


class Symbolizer:
    """Names native addresses from the mappings of the traced processes,
    read while they run, and the symbol tables of their files."""

    def __init__(self, interpreter=None):
        self.maps = {}
        # When each process's mappings were last read (CLOCK_MONOTONIC,
        # bpftrace's nsecs), taken before reading.
        self.read_at = {}
        self.tables = {}
        self.interpreter = interpreter
        # run_eval_caller()'s: the functions that call run_eval_code_obj,
        # and the functions that call each (read once).
        self.run_eval_callers = None
        # (pid, path) of each mapped file: ((device, inode), where this
        # process reads it), found while the process ran.
        self.files = {}
        # The root directory of each traced process whose root is not
        # this process's (a chroot, a container), held open: its own
        # /usr/lib/debug has its libraries' debug files.
        self.roots = {}
        # pid: [(start, end, offset, name)] of the executable segments of
        # its libraries, from the dynamic loader's list (M records), as
        # self.maps has them: for addresses that no read of its mappings
        # holds.  Where each file is read goes to self.files.
        self.libraries = {}

    def linked(self, pid, bias, dynamic, name):
        """Library *name* of process pid, loaded at *bias*, its dynamic
        section at *dynamic*, as the loader's list gives it.  Its file is
        read in the process's root (held open by a read of its mappings,
        else this process's root), and only if its dynamic section is at
        the same place: another file of the same name (another root's
        libc) is not taken for it."""
        if not name.startswith("/"):
            return  # the executable (""), the vDSO
        where = self.roots.get(pid, "") + name
        try:
            elf = Elf(where)
        except (OSError, Error):
            return
        if not any(ptype == PT_DYNAMIC and bias + vaddr == dynamic
                   for ptype, _, _, vaddr, _, _, _, _ in elf.segments):
            return
        # A read of the mappings that found the file knows it better.
        self.files.setdefault((pid, name), (None, where))
        for ptype, flags, offset, vaddr, _, _, memsz, _ in elf.segments:
            if ptype == PT_LOAD and flags & PF_X:
                self.libraries.setdefault(pid, []).append(
                    (bias + vaddr, bias + vaddr + memsz, offset, name))

    def run_eval_caller(self, older):
        """The function of the interpreter that called run_eval_code_obj,
        whose return address the -c hold's uretprobe hid, given the
        function of the frame above it (older, None if none): of the
        functions that call run_eval_code_obj, the one that older calls
        (run_mod, called by _PyRun_SimpleFile, in the default build; in
        the free-threaded one, _PyRun_SimpleFile itself, which has
        run_mod inlined); None unless exactly one."""
        if self.run_eval_callers is None:
            self.run_eval_callers = {}
            try:
                elf = Elf(self.interpreter)
            except (OSError, Error, TypeError):
                return None
            symbols = elf.symbols()
            if "run_eval_code_obj" in symbols:
                for name, _ in Interpreter._return_sites(
                        elf, symbols, "run_eval_code_obj"):
                    if name not in self.run_eval_callers:
                        self.run_eval_callers[name] = {
                            caller for caller, _ in
                            Interpreter._return_sites(elf, symbols, name)}
        callers = self.run_eval_callers
        if len(callers) == 1:
            return next(iter(callers))
        found = [name for name, theirs in callers.items() if older in theirs]
        return found[0] if len(found) == 1 else None

    def read_after(self, pid, time_ns):
        """Whether the mappings of pid were read after a hit at time_ns:
        an address they do not hold was then not code.  A hit after the
        last read may be in a library mapped since."""
        return time_ns is not None and self.read_at.get(pid, 0) > time_ns

    def snapshot(self, pid, must_map=None):
        read_at = time.monotonic_ns()
        try:
            with open("/proc/%d/maps" % pid) as f:
                text = f.read()
        except OSError:
            return
        if must_map and must_map not in text:
            return
        entries = []
        root = None
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 5 or "x" not in parts[1]:
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5] if len(parts) > 5 else ""
            if path.startswith("/"):
                if root is None:
                    root = self._root(pid)
                path = self._mapped_file(pid, root, parts, path)
            entries.append((start, end, int(parts[2], 16), path))
        self.maps[pid] = entries
        self.read_at[pid] = read_at

    def _root(self, pid):
        """The root directory of pid as this process sees it, and, when
        it is not this process's own, held open in self.roots."""
        try:
            root = os.readlink("/proc/%d/root" % pid)
            if pid not in self.roots:
                st, own = os.stat("/proc/%d/root" % pid), os.stat("/")
                if (st.st_dev, st.st_ino) != (own.st_dev, own.st_ino):
                    fd = os.open("/proc/%d/root" % pid,
                                 os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                    self.roots[pid] = "/proc/self/fd/%d" % fd
        except OSError:
            return "/"
        return root

    def _mapped_file(self, pid, root, parts, path):
        """The path by which pid knows the file of a mapping (its maps
        line's *parts*, *path* as this process reads it there), and where
        this process can read that file, which it notes in self.files.

        A process in another root (a chroot, a container: here, bpftrace
        -c in another release's root) shows its files to other roots at
        paths that they cannot open (the root's path, then the bind
        mount's path within it) or that are other files (its
        /usr/lib/x86_64-linux-gnu/libc.so.6 is not this root's).  The
        mapping's device and inode tell: the path as shown if it is that
        file, else the mapping itself, /proc/PID/map_files/START-END (as
        root), held open for after the process is gone."""
        name = path
        if root != "/" and path.startswith(root.rstrip("/") + "/"):
            name = path[len(root.rstrip("/")):]
        try:
            major, minor = (int(x, 16) for x in parts[3].split(":"))
            identity = (os.makedev(major, minor), int(parts[4]))
        except ValueError:
            return name
        known = self.files.get((pid, name))
        if known is not None and known[0] == identity:
            return name
        where = path
        try:
            st = os.stat(path)
            found = (st.st_dev, st.st_ino) == identity
        except OSError:
            found = False
        if not found:
            try:
                fd = os.open("/proc/%d/map_files/%s" % (pid, parts[0]),
                             os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass
            else:
                where = "/proc/self/fd/%d" % fd
        self.files[(pid, name)] = (identity, where)
        return name

    def loaded(self, pid):
        """Whether the last mappings read of pid hold a library (code of
        a file other than the interpreter and the dynamic loader)."""
        return any(path.startswith("/") and path != self.interpreter
                   and not os.path.basename(path).startswith("ld-")
                   for _, _, _, path in self.maps.get(pid, ()))

    def lookup(self, pid, address, bias=None):
        for start, end, offset, path in itertools.chain(
                self.maps.get(pid, ()), self.libraries.get(pid, ())):
            if start <= address < end:
                if not path.startswith("/"):
                    return self._perf_map(pid, address), path or "[anon]"
                where = self.files.get((pid, path), (None, path))[1]
                return self._symbol(where, address - start + offset,
                                    root=self.roots.get(pid)), path
        if self.interpreter and bias is not None:
            # Not mapped, or mapped too late: the interpreter's own code
            # is at its load bias, which the record gives.
            symbol = self._symbol(self.interpreter, address - bias,
                                  vaddr=True)
            if symbol != UNKNOWN:
                return symbol, self.interpreter
        return None

    def _perf_map(self, pid, address):
        """The name /tmp/perf-PID.map gives code in anonymous memory
        (the perf trampolines of -X perf and stacks__enable: py::...)."""
        entries = self.tables.get(("perf", pid))
        if entries is None or not any(start <= address < end
                                      for start, end, _ in entries):
            entries = []
            try:
                with open("/tmp/perf-%d.map" % pid) as f:
                    for line in f:
                        start, size, name = line.rstrip("\n").split(" ", 2)
                        start = int(start, 16)
                        entries.append((start, start + int(size, 16), name))
            except (OSError, ValueError):
                pass
            self.tables[("perf", pid)] = entries
        for start, end, name in entries:
            if start <= address < end:
                return name
        return UNKNOWN

    def _symbol(self, path, where, vaddr=False, root=None):
        """The function at file offset where (a virtual address if
        vaddr) of the ELF file path, mapped by a process whose root
        directory is root (None: this process's)."""
        table = self.tables.get(path)
        if table is None:
            table = self.tables[path] = self._table(path, root)
        segments, starts, symbols = table
        if not vaddr:
            for offset, start, size in segments:
                if offset <= where < offset + size:
                    where += start - offset
                    break
            else:
                return UNKNOWN
        vaddr = where
        import bisect
        i = bisect.bisect_right(starts, vaddr) - 1
        if i >= 0 and vaddr < symbols[i][0] + symbols[i][1]:
            return symbols[i][2]
        return UNKNOWN

    @staticmethod
    def _table(path, root=None):
        try:
            elf = Elf(path)
        except (OSError, Error):
            return [], [], []
        segments = [(offset, vaddr, filesz)
                    for ptype, _, offset, vaddr, _, filesz, _, _
                    in elf.segments if ptype == PT_LOAD]
        functions = {}
        symbols = elf.symbols()
        debug = Symbolizer._debug_file(elf, root)
        if debug is not None:
            # The separate debug file (libc6-dbg for glibc) names the
            # functions that the library's own .dynsym leaves out.
            symbols.update(debug.symbols())
        for name, (value, size, stype) in sorted(symbols.items()):
            if stype == 2 and size:  # STT_FUNC
                functions.setdefault(value, (value, size, name))
        symbols = sorted(functions.values())
        return segments, [symbol[0] for symbol in symbols], symbols

    @staticmethod
    def _debug_file(elf, root=None):
        """The ELF file that /usr/lib/debug has for elf's build id: that
        of the root directory root of the process that maps elf, else this
        process's (the build id names one build, wherever found)."""
        note = elf.section(".note.gnu.build-id")
        if note is None:
            return None
        namesz, descsz, _ = struct.unpack_from("<III", elf.data,
                                               note["offset"])
        start = note["offset"] + 12 + ((namesz + 3) & ~3)
        build_id = elf.data[start:start + descsz].hex()
        path = "/usr/lib/debug/.build-id/%s/%s.debug" % (build_id[:2],
                                                         build_id[2:])
        for base in ((root,) if root else ()) + ("",):
            try:
                return Elf(base + path)
            except (OSError, Error):
                pass
        return None


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


def print_json(stacks, out):
    """Python frames are {"name", "filename", "line"}, native ones
    {"symbol", "library"}."""
    rows = [{"count": count,
             "frames": [f._asdict() for f in stack]}
            for stack, count in sorted(stacks.items(), key=stack_order)]
    json.dump(rows, out, indent=1)
    out.write("\n")


def report(lines, args, out, codes, symbolizer=None):
    objects = (collections.Counter()
               if getattr(args, "also_folded_objects", None) else None)
    stacks, notes = parse(lines, codes, symbolizer,
                          getattr(args, "max_native", None),
                          live=bool(getattr(args, "live", None)),
                          objects=objects)
    native = getattr(args, "native", False) or any(
        isinstance(frame, NativeFrame) for stack in stacks for frame in stack)
    if args.folded:
        print_folded(stacks, out, native)
    elif args.json:
        print_json(stacks, out)
    else:
        print_counts(stacks, out, native)
    if getattr(args, "also_folded", None):
        with open(args.also_folded, "w", encoding="utf-8") as f:
            print_folded(stacks, f, native)
    if objects is not None:
        # Each stack's estimate, rounded, for every stack the counts have
        # (0 where its hits stand for less than half an object).
        with open(args.also_folded_objects, "w", encoding="utf-8") as f:
            print_folded({stack: round(objects[stack]) for stack in stacks},
                         f, native)
    for note, count in sorted(notes.items()):
        sys.stderr.write("pystack: %d %s\n" % (count, note))


# --------------------------------------------------------------- main

def counts_file(args):
    """Where the counts go: --output FILE, or stdout (left open)."""
    if args.output:
        return open(args.output, "w", encoding="utf-8")
    return contextlib.nullcontext(sys.stdout)


def resolve_python(args):
    if args.python:
        return args.python
    if args.pid is not None:
        path = "/proc/%d/exe" % args.pid
        try:
            os.readlink(path)
        except FileNotFoundError:
            raise Error("no process %d" % args.pid) from None
        except OSError as error:
            raise Error("cannot read %s: %s%s" % (
                path, error.strerror,
                "" if os.geteuid() == 0 else " (run as root)")) from None
        return path
    if args.command:
        word = args.command.split(" ")[0]
        path = shutil.which(word) if "/" not in word else word
        if path:
            return path
        raise Error("cannot find %r of -c: give --python" % word)
    raise Error("give -c CMD, -p PID or --python PATH")


def expand_probe(probe, python):
    """The probe with a path field PYTHON replaced by the interpreter."""
    fields = probe.split(":")
    return ":".join(python if field == "PYTHON" else field
                    for field in fields)


def forward_stderr(pipe, out, copy):
    """Copy bpftrace's stderr to out, but for its known harmless
    warnings, and keep what it copied in the list copy for error
    messages (filtered, and counted in left_out_note(), once)."""
    noise = _bpftrace.NoiseFilter()
    for line in iter(pipe.readline, b""):
        shown = noise.keep(line.decode("utf-8", "replace"))
        if shown:
            copy.append(shown)
            out.write(shown.encode("utf-8"))
            out.flush()


def run_threads(proc, threads, args, interp_path, attached=None):
    """Start *threads*, and with --native the reader of the traced
    process's mappings, and wait for bpftrace and them; its Symbolizer.
    With --duration, stop bpftrace that long after the event *attached*
    is set (and every second after: bpftrace 0.17 can lose a SIGINT)."""
    symbolizer = None
    if args.native:
        symbolizer = Symbolizer(interp_path)
        threads.append(threading.Thread(
            target=watch_mappings,
            args=(proc, args.pid, symbolizer, interp_path),
            daemon=True))
    for thread in threads:
        thread.start()
    duration = getattr(args, "duration", None)
    deadline = None
    while True:
        try:
            timeout = None
            if duration is not None:
                if deadline is None and attached is not None and (
                        attached.is_set()):
                    deadline = time.monotonic() + duration
                timeout = (0.05 if deadline is None
                           else max(0, deadline - time.monotonic()))
            proc.wait(timeout=timeout)
            for thread in threads:
                thread.join()
            break
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                proc.send_signal(signal.SIGINT)
                deadline += 1
        except KeyboardInterrupt:
            # Ctrl-C, or SIGINT or SIGTERM to this process: bpftrace
            # stops on SIGINT (twice does no harm), and prints.
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
    return symbolizer


# The empty lines bpftrace writes on its stdout when it ends, when its
# output is not an -o file (Bpftrace.exit_newlines: with one).
STDOUT_EXIT_NEWLINES = 2


def stdout_exit_newlines(text, runner):
    """The empty lines that bpftrace ends the stdout of program *text*
    with: STDOUT_EXIT_NEWLINES, and up to 0.23 one more per map, which it
    prints when it exits even if cleared (0.17 and 0.23 seen; 0.27 does
    not): @pystack_attached (ATTACHED_CLAUSE), and with --native
    @pystack_linked (LINKED_CLAUSE)."""
    maps = len(program_maps(text))
    if runner is not None and runner.version is not None and (
            runner.version[:2] >= (0, 24)):
        maps = 0
    return STDOUT_EXIT_NEWLINES + maps

# A record, or bpftrace's note of records it lost, in its stdout.
RECORD_LINE = re.compile(rb"(?:PYSTACK [A-Z] |Lost \d+ events)[^\n]*\n")


def split_records(pipe, command_fd, path, records, attached=None):
    """Copy bpftrace's stdout: its records to the file *path* (flushed as
    they come, for --save) and to the queue *records* (for follow()),
    the rest (the -c command's output, which shares bpftrace's stdout) to
    the file descriptor command_fd, which it closes at the end.  bpftrace
    writes each record with one write() of less than PIPE_BUF bytes, so a
    record is whole and lies between two of the command's writes: taken
    out, the command's bytes are left as it wrote them.  What may be the
    start of a record at the end of a read waits for the next read.  The
    event *attached* is set at ATTACHED_CLAUSE's record."""
    held = b""
    with open(path, "wb") as saved, open(command_fd, "wb",
                                         buffering=0) as command:
        while True:
            chunk = os.read(pipe.fileno(), 65536)
            data = held + chunk
            held = b""
            found = []
            rest = []
            at = 0
            for match in RECORD_LINE.finditer(data):
                rest.append(data[at:match.start()])
                found.append(match.group())
                at = match.end()
            tail = data[at:]
            if chunk:
                # A record begun but not ended, or the start of
                # "PYSTACK " / "Lost ": wait for more.
                for start in ("PYSTACK ", "Lost "):
                    cut = tail.rfind(start.encode())
                    if cut >= 0 and b"\n" not in tail[cut:]:
                        held, tail = tail[cut:], tail[:cut]
                        break
                else:
                    for size in range(min(len(tail), 7), 0, -1):
                        if (b"PYSTACK ".startswith(tail[-size:]) or
                                b"Lost ".startswith(tail[-size:])):
                            held, tail = tail[-size:], tail[:-size]
                            break
            rest.append(tail)
            if found:
                saved.writelines(found)
                saved.flush()
                for line in found:
                    records.put(line)
                    if attached is not None and line.startswith(
                            b"PYSTACK B "):
                        attached.set()
            text = b"".join(rest)
            if text:
                command.write(text)
            if not chunk:
                break
    records.put(None)


def run_bpftrace(text, args, runner, interp, probes=()):
    """Run the program *text* with the bpftrace *runner* (main()'s, which
    wrote the program for it), reading the code objects of its frames as
    their records come (follow())."""
    interp_path = interp.path
    sys.stderr.write(_bpftrace.untested_note(runner))
    bpftrace = runner.path
    env = runner.environ(strlen=DEFAULT_STRLEN)  # no strings in the program
    if args.save:
        output = args.save
    else:
        # Not in the temporary directory: kept should the counting fail,
        # for --read (main() removes it once the counts are printed).
        fd, output = tempfile.mkstemp(prefix="pystack-records-",
                                      suffix=".txt")
        os.close(fd)
    with tempfile.TemporaryDirectory(prefix="pystack") as tmp:
        script = os.path.join(tmp, "pystack.bt")
        with open(script, "w") as f:
            f.write(text)
        # The records on bpftrace's stdout, a line per write(): with -o,
        # bpftrace 0.17 keeps its output file's records buffered until it
        # ends, when the process whose code objects they name is gone.
        # split_records() takes them out of the -c command's output.
        cmd = [bpftrace, "-q", "-B", "line", script]
        if hold(interp, args):
            # signal() (HOLD_CLAUSE)
            cmd.insert(1, "--unsafe")
        target = []
        if args.pid is not None:
            # No -p for profile probes on 0.24 and later, where it would
            # sample the main thread alone: the program keeps to the
            # process (pid == PID), and stop_when_gone() ends bpftrace
            # with it, as -p does.
            target = runner.target_pid(args.pid, probes)
            cmd += target
        elif args.command is not None:
            cmd += ["-c", args.command]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        stderr = []
        if args.pid is not None and not target:
            threading.Thread(target=stop_when_gone, args=(proc, args.pid),
                             daemon=True).start()
        records = queue.SimpleQueue()
        command_out, command_in = os.pipe()
        codes = CodeReader(interp, args.co_name, args.strlen)
        attached = threading.Event()
        with open(command_out, "rb") as command_output:
            threads = [
                threading.Thread(target=split_records,
                                 args=(proc.stdout, command_in, output,
                                       records, attached)),
                # Without -o, bpftrace ends its stdout with two empty
                # lines (0.17, 0.23 and 0.27 seen; with -o, 0.27 does not).
                threading.Thread(target=_bpftrace.forward_stdout,
                                 args=(command_output, sys.stdout.buffer,
                                       stdout_exit_newlines(text, runner))),
                threading.Thread(target=forward_stderr,
                                 args=(proc.stderr, sys.stderr.buffer,
                                       stderr)),
                threading.Thread(target=follow,
                                 args=(proc, records, codes, interp_path,
                                       hold(interp, args)))]
            symbolizer = run_threads(proc, threads, args, interp_path,
                                     attached)
        proc.stdout.close()
        proc.stderr.close()
        codes.close()
        if args.save:
            # What was read of the code objects, for --read.
            with open(output, "a", encoding="utf-8") as f:
                f.writelines(codes.saved())
        lines = []
        if os.path.exists(output):
            with open(output, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        if proc.returncode != 0 and not any(line.startswith(RECORD)
                                            for line in lines):
            if not args.save:
                os.unlink(output)
            errors = "".join(stderr).strip()
            if _bpftrace.LOAD_REFUSED.search(errors):
                # The walker's loops are bounded by these, and the
                # verifier checks each iteration.
                errors += ("\n(the kernel refused the program, which grows "
                           "with --max-depth (%d; default %d) and "
                           "--max-native (%d; default %d): lower them)"
                           % (args.max_depth, DEFAULT_MAX_DEPTH,
                              args.max_native, DEFAULT_MAX_NATIVE))
            raise Error("bpftrace failed (exit %d): %s"
                        % (proc.returncode, errors or "no error message"))
        return lines, proc.returncode, output, symbolizer, codes


# ------------------------------------------------- reading while tracing

PTRACE_CONT, PTRACE_DETACH = 7, 17
PTRACE_SEIZE, PTRACE_LISTEN = 0x4206, 0x4208
PTRACE_EVENT_STOP = 128
WALL = 0x40000000
# After the command's stop: how long no record may come before its last
# records count as read (they are in the kernel's buffers until bpftrace
# polls them), and the longest hold.
HOLD_QUIET_S = 0.1
HOLD_MAX_S = 2.0


class ExitHold:
    """Holds a -c command once it has run its main module, while
    pystack.py reads the code objects of its last records.

    Why: a -c command may end a few milliseconds after its last hit,
    before pystack.py has even seen that hit's records, and the
    interpreter frees every code object as it finalizes.  The program
    sends the command SIGSTOP when run_eval_code_obj() returns
    (HOLD_CLAUSE), before run_mod() releases the main module's code and
    before finalization.  This process attached to the command with
    PTRACE_SEIZE as soon as bpftrace let it run, so the SIGSTOP stops it
    in a signal-delivery-stop that only this process sees; once the
    records are read, PTRACE_DETACH lets the command on without the
    signal.  (Holding it at PTRACE_EVENT_EXIT was tried first: by then
    finalization has freed the code objects.)

    What the command sees, while attached: its TracerPid in
    /proc/PID/status; each signal sent to it goes through this process
    and reaches it unchanged (a stop by SIGSTOP from elsewhere kept as a
    group stop, PTRACE_LISTEN); the end of its main module takes
    HOLD_QUIET_S longer (HOLD_MAX_S at most).  Only its main thread is
    attached.  Should the attach fail, the SIGSTOP does stop it, and
    follow() sends SIGCONT once the records are read: its parent, bpftrace,
    could then see the stop.  All ptrace requests come from the one
    thread that attached (the kernel's rule), follow()'s."""

    def __init__(self):
        import ctypes
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long,
                                     ctypes.c_void_p, ctypes.c_void_p]
        self.libc.ptrace.restype = ctypes.c_long
        self.pid = None
        self.done = False

    def _ptrace(self, request, pid, data=0):
        return self.libc.ptrace(request, pid, None, data)

    def seize(self, pid):
        """Whether pid is now attached (bpftrace traces its -c command
        itself until the probes are attached)."""
        if self._ptrace(PTRACE_SEIZE, pid, 0) != 0:
            return False
        self.pid = pid
        return True

    def poll(self):
        """True when the command is in the SIGSTOP's stop (read, then
        release()); lets it on from its other stops."""
        while self.pid is not None and not self.done:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG | WALL)
            except ChildProcessError:
                self.done = True
                return False
            if pid == 0:
                return False
            if not os.WIFSTOPPED(status):
                self.done = True
                return False
            if status >> 16 == PTRACE_EVENT_STOP:
                self._ptrace(PTRACE_LISTEN, self.pid)
            elif os.WSTOPSIG(status) == signal.SIGSTOP:
                return True
            else:
                self._ptrace(PTRACE_CONT, self.pid, os.WSTOPSIG(status))
        return False

    def release(self):
        """Detach, the SIGSTOP taken back."""
        self._ptrace(PTRACE_DETACH, self.pid, 0)
        self.done = True


def follow(bpftrace, records, codes, interpreter, hold_command):
    """Take the program's records from the queue *records* as bpftrace
    prints them (split_records()), and read the code objects of their
    frames at once, while the process still has them; with
    *hold_command*, attach to bpftrace's -c command and release it from
    its stop (ExitHold) once its last records are read.  Runs until the
    records end (None in the queue), trying again what it could not read
    while the process lives."""
    hold = ExitHold() if hold_command else None
    try:
        identity = os.stat(interpreter)
        identity = (identity.st_dev, identity.st_ino)
    except OSError:
        identity = None
    pending = set()
    ended = False
    stopped = set()

    def read_records(timeout):
        """Whether records came within *timeout* seconds."""
        nonlocal ended
        got = False
        while not ended:
            try:
                line = records.get(timeout=timeout if not got else 0)
            except queue.Empty:
                break
            if line is None:
                ended = True
                break
            got = True
            if line.startswith(b"PYSTACK F "):
                for _, pid, key, _, _ in frame_keys(line.decode().split()):
                    if not codes.resolve(pid, key):
                        pending.add((pid, key))
            elif line.startswith(b"PYSTACK Y "):
                stopped.add(int(line.split()[4]))
        return got

    def retry():
        for pid, key in list(pending):
            if codes.resolve(pid, key) or (pid,) + key in codes.codes:
                pending.discard((pid, key))

    def drain():
        start = time.monotonic()
        while time.monotonic() - start < HOLD_MAX_S:
            if not read_records(HOLD_QUIET_S):
                break
        retry()

    try:
        while not ended:
            waiting = hold is not None and hold.pid is None
            read_records(0.001 if waiting else 0.01)
            if pending:
                retry()
            if waiting and bpftrace.poll() is None:
                for child in children(bpftrace.pid):
                    try:
                        st = os.stat("/proc/%d/exe" % child)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) == identity and hold.seize(
                            child):
                        break
            if hold is not None and hold.pid is not None and not hold.done:
                if hold.poll():
                    drain()
                    hold.release()
            elif stopped:
                # Not attached: the SIGSTOP stopped the command.
                drain()
                for pid in stopped:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except OSError:
                        pass
                stopped.clear()
        retry()
    finally:
        if hold is not None and hold.pid is not None and not hold.done:
            hold.release()


def stop_when_gone(bpftrace, pid):
    """SIGINT bpftrace once process pid has ended (what -p does)."""
    while bpftrace.poll() is None:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            bpftrace.send_signal(signal.SIGINT)
            return
        except PermissionError:
            pass
        time.sleep(0.5)


def watch_mappings(bpftrace, pid, symbolizer, interpreter):
    """Read the mappings of the traced process while it runs (PID, or
    the command that bpftrace runs, once it is the interpreter), for the
    native addresses that bpftrace prints after the process is gone, and
    the libraries it maps as it goes.  For a command, which may be
    short-lived: every 5 ms until 200 ms after its dynamic loader has
    mapped a library, then every 50 ms.  bpftrace holds the command
    after its exec() while it attaches (46 ms for one probe here, more
    for many and on a busy machine): the interpreter is mapped, its
    libraries not yet, and the command has not run.  Every 500 ms for a
    process that runs already, and once more when bpftrace has ended."""
    polls = 0
    while bpftrace.poll() is None:
        pids = [pid] if pid is not None else children(bpftrace.pid)
        for child in pids:
            symbolizer.snapshot(child, None if pid is not None
                                else interpreter)
        if any(symbolizer.loaded(child) for child in pids):
            polls += 1
        time.sleep(0.5 if pid is not None else 0.005 if polls < 40
                   else 0.05)
    if pid is not None:
        # A last read, after every hit: an address it does not hold was
        # not code (the process runs on; a command has exited).
        symbolizer.snapshot(pid)


def children(pid):
    found = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                found.extend(int(word) for word in f.read().split())
    except OSError:
        pass
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Count the Python stacks of the threads that hit a "
        "bpftrace probe (see \"Python stacks\" in "
        "Doc/howto/usdt-tools.rst).",
        epilog="Cost (make bench-whole-stacks, docs/whole-stacks.md; "
        "2-core VM, quiet): BPF time per sample about 10 us at 30 Python "
        "frames and 15 us at 100, with or without --native (about 5 us of "
        "it is bpftrace waking its reader for the first record); "
        "pystack.py's own CPU about 0.2 ms per sample.")
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
                # --python names the interpreter's native frames that
                # bpftrace could not name.
                with counts_file(args) as out:
                    report(f.readlines(), args, out,
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
        lines, status, records, symbolizer, codes = run_bpftrace(
            text, args, runner, interp, probes)
        # bpftrace has stopped: a second Ctrl-C (python -m usdt.tools
        # sends SIGINT until the tool ends, as one sent before bpftrace
        # attached is lost) must not lose the counts being made.
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
    finally:
        sys.stderr.write(_bpftrace.left_out_note("pystack"))


def interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, interrupt)
    # SIGINT stops tracing and prints: python -m usdt.tools stops it so at
    # the end of -d.  Also in a process started with SIGINT ignored, as a
    # shell script starts its background jobs, where Python would leave it
    # ignored and -d would never end.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
