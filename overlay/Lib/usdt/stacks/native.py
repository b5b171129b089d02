"""Native frames (--native): their names (Symbolizer, from the ELF files
that a process maps) and their merge with the Python frames, each
activation of the evaluator replaced by the Python frames it runs."""

import collections
import itertools
import os
import re
import time

from .. import _cfi
from .._elf import PF_X, PT_DYNAMIC, PT_LOAD, STT_FUNC, ElfError, ElfFile
from .offsets import Interpreter, RUN_EVAL_CALLER
from .records import Frame, TRUNCATED


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


# How far unwind_window() follows libc's frames, and then the frame
# pointers inside the window, before it gives up.
MAX_WINDOW_FRAMES = 64


# What a function without CFI is taken to be at the site of clone3()
# (glibc ends its FDE before the system call): a leaf, its return address
# at rsp.
LEAF = _cfi.Row((_cfi.RSP, 8), {_cfi.RA: -8})
UNWOUND = ("stacks in libc unwound from a window of the stack with its "
           "call-frame information")


def unwind_window(event, libc, notes, thread_start=lambda pc: False):
    """The return addresses of a hit in libc (frame 0 there, the W and X
    records: anywhere but a system call's site that the program unwound
    itself), found by unwinding the window of the stack that BPF copied
    with libc's call-frame information, then by the frame pointers inside
    the window up to where BPF's walk began: the addresses that go
    between frame 0 and the rest of the A records' walk, and how many of
    the walk's first addresses to leave out: the walk may start at a
    frame pointer that a call which has returned left below the live
    frames, and then joins them at a later frame pointer (the P
    records').  None, and a note that says why, where the CFI does not
    lead to the walk: then the walk is not this stack's.  A 0 at the
    end: the stack ends there.

    *thread_start*(pc) says whether pc is in a function where a thread's
    stack begins: at clone3()'s system call, which has no CFI, the
    parent returns to its caller (a leaf's return address, which must
    lead to the walk's start) and the new thread's stack ends."""
    if libc is None or libc.build_id != event.window_regs[4]:
        _lost(notes, "the tool has no call-frame information of this "
              "libc, build ID %016x" % event.window_regs[4])
        return None
    at_start = thread_start(event.addresses.get(0, 0))
    found, skip, why = _unwind(event, libc, at_start)
    if found is None and at_start and not event.frames:
        # clone3()'s new thread, which runs no Python code yet: nothing
        # before it.
        found, skip = [0], 0
    if found is None:
        _lost(notes, why)
        return None
    notes[UNWOUND] += 1
    if skip:
        notes["stacks in libc whose walk of the frame pointers began at "
              "a returned call's, below the live frames, and joined them "
              "later (its first addresses left out)"] += 1
    return found, skip


def _lost(notes, why):
    notes["stacks in libc whose callers its call-frame information did "
          "not find (%s), marked %s" % (why, UNWIND_LOST)] += 1


def _unwind(event, libc, leaf):
    """unwind_window()'s (addresses, skip, None), or (None, 0, why
    not); *leaf*: take frame 0 for a leaf if libc has no CFI there."""
    bias, sp, bp, start, _ = event.window_regs
    # The walk's frame pointers: where it read the address after its
    # Kth, K (records without P records: its start).
    joins = {}
    for k, pointer in sorted((event.pointers or {0: start}).items()):
        if pointer > 0xffff:
            joins.setdefault(pointer, k)
    words, base = event.window, sp

    def word(address):
        if address % 8 or not base <= address < base + 8 * len(words):
            return None
        return words.get((address - base) // 8)

    found = []
    pc = event.addresses.get(0, 0)
    for depth in range(MAX_WINDOW_FRAMES):
        vaddr = pc - bias - (depth > 0)
        if not libc.text[0] <= vaddr < libc.text[1]:
            break
        row = libc.frames.row(vaddr)
        if row is None and leaf and depth == 0:
            row = LEAF
        if row is not None and row.registers.get(_cfi.RA) is _cfi.UNDEFINED:
            # The thread's first frame (clone3()'s child, _start): the end.
            return found + [0], 0, None
        if row is None or row.cfa is None or row.saved(_cfi.RA) != -8 or (
                row.cfa[0] not in (_cfi.RSP, _cfi.RBP)):
            return (None, 0,
                    "no rule for the return address at libc+%#x" % vaddr)
        cfa = (sp if row.cfa[0] == _cfi.RSP else bp) + row.cfa[1]
        pc = word(cfa - 8)
        saved = row.saved(_cfi.RBP)
        if saved is None:
            return None, 0, "rbp not known at libc+%#x" % vaddr
        if saved is not _cfi.SAME and cfa + saved >= sp:
            # (Below rsp, in an epilogue: popped already, rbp holds it.)
            bp = word(cfa + saved)
        if pc is None or bp is None:
            return None, 0, ("libc's frames go past the %d bytes copied"
                             % (8 * len(words)))
        sp = cfa
        found.append(pc)
    else:
        return None, 0, "more than %d frames in libc" % MAX_WINDOW_FRAMES
    # Out of libc, in code with frame pointers: rbp is its frame's.
    for _ in range(MAX_WINDOW_FRAMES):
        if bp in joins:
            return found, joins[bp], None
        older, address = word(bp), word(bp + 8)
        if not address or older is None:
            break
        found.append(address)
        if older == 0:
            # The chain's end, inside the window (a thread's first
            # function, called by start_thread() with rbp 0).
            return found + [0], 0, None
        if older <= bp:
            break
        bp = older
    return None, 0, ("its frame pointers do not lead to the walk's"
                     if start else "no frame pointer of the interpreter's "
                     "code in the bytes copied")


def native_frames(event, symbolizer, notes, max_native, libc=None):
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
    if event.unwound is not None and addresses and (
            event.window_regs is None):
        # Frame 0 is a system call's site in libc; its caller, which the
        # frame pointers do not give, from libc's CFI (LIBC_STEP).
        addresses.insert(1, event.unwound)
        notes["callers of system calls in libc found from its call-frame "
              "information"] += 1
    if event.window_regs is not None and addresses:
        # Frame 0 is elsewhere in libc, or at a system call's site that
        # libc called: its callers from the window.
        def thread_start(pc):
            found = symbolizer is not None and symbolizer.lookup(
                event.pid, pc, event.bias)
            # glibc's debug symbols name clone3() __GI___clone3.
            return bool(found) and re.sub(r"^__GI_", "", found[0]) in (
                THREAD_START)

        found = unwind_window(event, libc, notes, thread_start)
        if found is None:
            addresses = [addresses[0], -1]
        else:
            addresses = addresses[:1] + found[0] + addresses[1 + found[1]:]
    for i, address in enumerate(addresses):
        if address == 0 or (max_native and i >= max_native):
            break
        if address == -1:
            frames.append(NativeFrame(UNWIND_LOST, ""))
            return frames
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
                # pointers (malloc, say), when its CFI was not used (the
                # program did not know this libc: LIBC_STEP).
                library = os.path.basename(kept[0].library) or "?"
                notes["stacks marked %s sampled in %s (%s)%s" % (
                    UNWIND_LOST, kept[0].symbol, library,
                    ", built without frame pointers, whose call-frame "
                    "information was not used (not the libc the tool read)"
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
            elf = ElfFile(where)
        except (OSError, ElfError):
            return
        if not any(segment.type == PT_DYNAMIC
                   and bias + segment.vaddr == dynamic
                   for segment in elf.segments):
            return
        # A read of the mappings that found the file knows it better.
        self.files.setdefault((pid, name), (None, where))
        for segment in elf.segments:
            if segment.type == PT_LOAD and segment.flags & PF_X:
                start = bias + segment.vaddr
                self.libraries.setdefault(pid, []).append(
                    (start, start + segment.memsz, segment.offset, name))

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
                elf = ElfFile(self.interpreter)
            except (OSError, ElfError, TypeError):
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
            elf = ElfFile(path)
        except (OSError, ElfError):
            return [], [], []
        segments = [(segment.offset, segment.vaddr, segment.filesz)
                    for segment in elf.segments if segment.type == PT_LOAD]
        functions = {}
        symbols = elf.symbols()
        debug = Symbolizer._debug_file(elf, root)
        if debug is not None:
            # The separate debug file (libc6-dbg for glibc) names the
            # functions that the library's own .dynsym leaves out.
            symbols.update(debug.symbols())
        for name, (value, size, stype) in sorted(symbols.items()):
            if stype == STT_FUNC and size:
                functions.setdefault(value, (value, size, name))
        symbols = sorted(functions.values())
        return segments, [symbol[0] for symbol in symbols], symbols

    @staticmethod
    def _debug_file(elf, root=None):
        """The ELF file that /usr/lib/debug has for elf's build id: that
        of the root directory root of the process that maps elf, else this
        process's (the build id names one build, wherever found)."""
        note = elf.build_id()
        if note is None:
            return None
        build_id = note.desc.hex()
        path = "/usr/lib/debug/.build-id/%s/%s.debug" % (build_id[:2],
                                                         build_id[2:])
        for base in ((root,) if root else ()) + ("",):
            try:
                return ElfFile(base + path)
            except (OSError, ElfError):
                pass
        return None
