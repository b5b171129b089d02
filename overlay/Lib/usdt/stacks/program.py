"""The bpftrace program: the fragments of program.bt, next to this file,
filled with the interpreter's offsets and the tool's options (program()),
and with --native libc's call-frame rules at its system calls (Libc)."""

import os
import re
import struct

from .. import _bpftrace, _cfi
from .._bpftrace import Error
from .._elf import PF_X, PT_LOAD, ElfError, ElfFile
from .offsets import COOKIE, THREAD_SIZE


def _templates():
    """{NAME: text} of program.bt: each fragment begins after a line
    "// @@ NAME ..." and ends before the next one (or at the end); what
    comes before the first is the file's comment."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "program.bt")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    parts = re.split(r"^// @@ (\w+)[^\n]*\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


TEMPLATES = _templates()


# ---------------------------------------------------------------- BPF

PROGRAM = TEMPLATES["PROGRAM"]


# One frame of PROGRAM's walk, eight times per record (PYTHON_FRAMES):
# $fK, $wK for K in 0-7.
PYTHON_FRAME = TEMPLATES["PYTHON_FRAME"]

# One frame pointer of NATIVE_WALK, eight times per record
# (NATIVE_FRAMES): $aK, and the frame pointer $pK that the next address
# is read at, for K in 0-7.
NATIVE_FRAME = TEMPLATES["NATIVE_FRAME"]


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
        ("FRAME_OWNED_BY_CSTACK", interp.frame_owned_by_cstack,
         "Include/internal/pycore_frame.h, as _PyDTrace_ToolOffsets gives "
         "it"),
        ("CO_VERSION", interp.co_version, "co_version (not in "
         "_Py_DebugOffsets; _PyDTrace_ToolOffsets)"),
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

NATIVE_WALK = TEMPLATES["NATIVE_WALK"]


# With -c: the interpreter has run its main module (run_eval_code_obj
# returns, before run_mod releases the module's code and the interpreter
# finalizes, freeing every code object): stop it there, for follow() to
# read the code objects of its last records (ExitHold).  The probes are
# at the instructions where run_eval_code_obj's calls return (a bpftrace
# with offsets, hold_probes()), else a uretprobe: that one replaces the
# return address of every call of run_eval_code_obj that any process of
# this interpreter makes while it is attached, which their debuggers and
# profilers see (gdb: a frame "??").
HOLD_CLAUSE = TEMPLATES["HOLD_CLAUSE"]


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
LIBC_STEP = TEMPLATES["LIBC_STEP"]
LIBC_BEGIN = TEMPLATES["LIBC_BEGIN"]
LIBC_FIND = TEMPLATES["LIBC_FIND"]
# Elsewhere in libc's code, or at a system call's site that libc called
# (LIBC_STEP's window): the stack from
# rsp, eight words a record, up to the frame pointer where the walk goes
# on and its return address, at most WINDOW_BATCHES * 64 bytes, which
# usdt.stacks unwinds with libc's CFI (native.unwind_window()): the
# allocator's and the string functions' frames take one or two records,
# pthread_create()'s nine.  Twelve (768 bytes), chosen when sixteen made
# 0.27 refuse the program for profile (E2BIG; since then the record's
# address comes from the loop's turn, which the verifier walks once).
WINDOW_WORD = TEMPLATES["WINDOW_WORD"]
# Whether $x0, at $slot, may be the frame pointer where the walk starts.
WINDOW_CHECK = TEMPLATES["WINDOW_CHECK"]
WINDOW_BATCHES = 12


class Libc:
    """libc's call-frame information at its system-call sites: the rules
    of LIBC_STEP, and where its build ID is (its first 8 bytes), by which
    the program knows it in a process's loader list."""

    def __init__(self, path):
        self.path = path
        try:
            elf = ElfFile(path)
        except ElfError as error:
            raise Error(str(error)) from None
        note = elf.build_id()
        if note is None or len(note.desc) < 8:
            raise Error("%s has no build ID" % path)
        # The program knows libc by the first 8 bytes of its ID.
        self.build_id_vaddr = note.desc_vaddr
        self.build_id, = struct.unpack_from("<Q", note.desc)
        frames = _cfi.EhFrame(elf)
        # Its code (the executable segment), where a sample's window is
        # taken, and its CFI, with which usdt.stacks unwinds the window.
        texts = [(segment.vaddr, segment.vaddr + segment.memsz)
                 for segment in elf.segments
                 if segment.type == PT_LOAD and segment.flags & PF_X]
        if len(texts) != 1:
            raise Error("%s has %d executable segments, not 1"
                        % (path, len(texts)))
        self.text = texts[0]
        self.frames = frames
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
LINKED_CLAUSE = TEMPLATES["LINKED_CLAUSE"]
MAX_LIBRARIES = 64


# Printed once bpftrace has attached the program's probes: it attaches
# them in the order of the program, so this last one comes after them
# (the time --duration counts from).
ATTACHED_CLAUSE = TEMPLATES["ATTACHED_CLAUSE"]


# With --live: the hits of another probe that release a key.
RELEASE_CLAUSE = TEMPLATES["RELEASE_CLAUSE"]


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
    # After the C definitions, before the first probe.
    config = runner.stack_config() if runner is not None else ""
    text = text.replace("STRUCTS\n", structs(interp) + config, 1)
    text = text.replace(" * INTERPRETER\n", " * %s\n" % interp.path, 1)
    text = text.replace("at PROBES,", "at %s," % ", ".join(probes), 1)
    walk = ""
    if native:
        walk = NATIVE_WALK.replace(
            "LIBC_STEP\n", LIBC_STEP.lstrip("\n") if libc else "", 1)
    text = text.replace("NATIVE\n", walk, 1)
    text = text.replace("PYTHON_FRAMES\n",
                        unrolled(PYTHON_FRAME, ("$f", "$w")), 1)
    text = text.replace("NATIVE_FRAMES\n",
                        unrolled(NATIVE_FRAME, ("$a", "$p")), 1)
    if libc:
        check = WINDOW_CHECK.lstrip("\n")
        word = WINDOW_WORD.lstrip("\n").replace(
            "WINDOW_CHECK\n", re.sub("(?m)^(?=.)", "\t", check), 1)
        words = "".join(
            word.replace("$x0", "$x%d" % k).replace("WORD_OFFSET", str(8 * k))
            for k in range(8))
        text = text.replace("WINDOW_CHECK\n", check, 1)
        text = text.replace("WINDOW_WORDS\n", words, 1).replace(
            "WINDOW_BATCHES", str(WINDOW_BATCHES), 1).replace(
            "LIBC_TEXT_START", "0x%x" % libc.text[0]).replace(
            "LIBC_TEXT_END", "0x%x" % libc.text[1])
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
    """Whether the program stops the -c command before it finalizes:
    not when args.hold is false (--verifier-stats, whose command nothing
    would resume)."""
    return (args.command is not None and interp.has_run_eval and
            getattr(args, "hold", True))


def hold_probes(interp, runner):
    """The probes of HOLD_CLAUSE: where run_eval_code_obj's calls return,
    if the bpftrace *runner* places probes inside functions, else its
    uretprobe."""
    if (runner is not None and interp.run_eval_returns and
            runner.probe_offsets()):
        return ["uprobe:%s:%s+%d" % (interp.path, name, offset)
                for name, offset in interp.run_eval_returns]
    return ["uretprobe:%s:run_eval_code_obj" % interp.path]
