"""The one place that knows how each bpftrace version differs.

usdt.tools and usdt.stacks run bpftrace through this module: it finds
bpftrace on PATH, reads its version once, gives it its string and map
limits the way that version takes them, and tells its known harmless
noise from what a person must see.

Tested: bpftrace 0.17 (Debian 12), 0.23 (Debian 13) and 0.27 (Debian
forky).  Another version is still tried, with both names of each limit.

    version     limits read from the environment
    0.17        BPFTRACE_STRLEN, BPFTRACE_MAP_KEYS_MAX
    0.23        BPFTRACE_MAX_STRLEN, BPFTRACE_MAX_MAP_KEYS (the old names
                still work, with a WARNING each)
    0.27        BPFTRACE_MAX_STRLEN, BPFTRACE_MAX_MAP_KEYS (the old names
                are ignored: maps stay at 4,096 keys)
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

TESTED = ((0, 17), (0, 23), (0, 27))
# The BPFTRACE_PERF_RB_PAGES that environ() gives bpftrace, unless one is
# set.  Up to 0.24 it sizes a buffer per CPU, 64 pages by default, which
# lost records under load: 864 of test_stack_tool's GIL waits with 0.23,
# and 3,495 of alloc's records with 0.17 on the free-threaded build.
# 1024 pages per CPU lost none; on a machine of many CPUs, the tools
# give each CPU less (per_cpu_pages()), so that the buffers take no more
# than 0.25's one ring buffer.
LATER_RB_PAGES = 1024
# From 0.25 the variable sizes the one ring buffer of all CPUs, whose
# default grows with the memory available, up to 4096 pages (16 MiB;
# bpftrace's "Make default ring/perf buf size dynamic", #4461): 1024
# would shrink it, and lost 3,673 of test_gil_waits' records on 0.27
# with both CPUs busy.
RINGBUF_RB_PAGES = 4096
DEFAULT_RB_PAGES = 64


def per_cpu_pages(cpus=None):
    """The pages per CPU that environ() gives a bpftrace before 0.25 on
    a machine of *cpus* CPUs (this one's by default): LATER_RB_PAGES,
    halved (perf wants a power of two) while the buffers of all CPUs
    would take more than RINGBUF_RB_PAGES, but never under bpftrace's
    own default."""
    if cpus is None:
        cpus = os.cpu_count() or 1
    pages = LATER_RB_PAGES
    while pages > DEFAULT_RB_PAGES and pages * cpus > RINGBUF_RB_PAGES:
        pages //= 2
    return pages


def buffer_advice(environ=None):
    """What to do about records that bpftrace lost, in words: a larger
    BPFTRACE_PERF_RB_PAGES than the one set in *environ* (os.environ),
    or than the one environ() gives."""
    given = (os.environ if environ is None else environ).get(
        "BPFTRACE_PERF_RB_PAGES")
    if given:
        return "set BPFTRACE_PERF_RB_PAGES higher than its %s" % given
    return ("set BPFTRACE_PERF_RB_PAGES higher than the tools' %d pages "
            "per CPU here (bpftrace before 0.25), or %d from 0.25"
            % (per_cpu_pages(), RINGBUF_RB_PAGES))


class Error(Exception):
    """Reported in one line, without a traceback."""


class Bpftrace:
    """A bpftrace executable and its version, (major, minor, patch), or
    None when `bpftrace --version` does not say."""

    def __init__(self, path, version, text):
        self.path = path
        self.version = version
        self.text = text

    def __str__(self):
        return "%s (%s)" % (self.path, self.text)

    @property
    def tested(self):
        return self.version is not None and self.version[:2] in TESTED

    def probe_offsets(self):
        """Whether this bpftrace places a uprobe inside a function
        (uprobe:PATH:FUNCTION+OFFSET): only if it was built with libbfd,
        which checks that the offset starts an instruction ("bfd: yes" in
        --info: Debian 13's 0.23 and forky's 0.27; Debian 12's 0.17 is
        not, and refuses such a probe even with --unsafe)."""
        if not hasattr(self, "_probe_offsets"):
            try:
                text = subprocess.run(
                    [self.path, "--info"], stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, timeout=120,
                    check=False).stdout.decode("utf-8", "replace")
            except (OSError, subprocess.TimeoutExpired):
                text = ""
            self._probe_offsets = re.search(r"^\s*bfd: yes\s*$", text,
                                            re.M) is not None
        return self._probe_offsets

    def environ(self, strlen=None, keys=None, base=None):
        """*base* (os.environ) with the limits set the way this version
        reads them: names and strings cut to strlen - 1 bytes, keys
        entries per map; and, after 0.17, no trailer on a string cut and
        a larger output buffer."""
        env = dict(os.environ if base is None else base)
        for value, old, new in ((strlen, "BPFTRACE_STRLEN",
                                 "BPFTRACE_MAX_STRLEN"),
                                (keys, "BPFTRACE_MAP_KEYS_MAX",
                                 "BPFTRACE_MAX_MAP_KEYS")):
            if not value:
                continue
            if self.version is None or (0, 17) < self.version[:2] < (0, 23):
                # Untested: the name it reads is one of the two.
                names = (old, new)
            elif self.version[:2] <= (0, 17):
                names = (old,)
            else:
                names = (new,)
            for name in names:
                env[name] = str(value)
        if self.version is None or self.version[:2] > (0, 17):
            # 0.23 ends a string cut at the limit with "..", which reads as
            # part of it (a file name): the tools mark their own cuts.
            env["BPFTRACE_STR_TRUNC_TRAILER"] = ""
        # Its buffer for printf()'s records (LATER_RB_PAGES says why).
        env.setdefault("BPFTRACE_PERF_RB_PAGES", str(self.rb_pages))
        return env

    @property
    def rb_pages(self):
        """The BPFTRACE_PERF_RB_PAGES that environ() gives this version:
        before 0.25, per_cpu_pages() of this machine's CPUs; from 0.25,
        RINGBUF_RB_PAGES."""
        if self.version is not None and self.version[:2] < (0, 25):
            return per_cpu_pages()
        return RINGBUF_RB_PAGES

    @property
    def default_strlen(self):
        """The string limit this version takes when none is given: 64
        up to 0.17, 1024 from 0.23 (and, untested, in between)."""
        if self.version is not None and self.version[:2] <= (0, 17):
            return 64
        return 1024

    def kept(self, strlen):
        """The bytes of a string that a limit of *strlen* keeps: strlen -
        1 up to 0.23, strlen from 0.27 (sizeof(str()) is strlen in
        both)."""
        if self.version is not None and self.version[:2] >= (0, 27):
            return strlen
        return strlen - 1

    @property
    def exit_newlines(self):
        """The empty lines this version writes on its stdout when it
        ends, even with -o: two up to 0.23 (its run_bpftrace.cpp wrote
        two newlines before printing the maps), none from 0.24, whose
        output drivers dropped them.  Unknown versions: none, so that no
        newline of the traced command's output is taken for them."""
        if self.version is not None and self.version[:2] <= (0, 23):
            return 2
        return 0

    @property
    def range_loops(self):
        """Whether this version has range loops, for ($i : A..B): from
        0.24, which makes each a bpf_loop() call, whose body the kernel
        checks once, not once per iteration as it does a while loop's;
        0.25 deprecates while loops (a warning for each)."""
        return self.version is None or self.version[:2] >= (0, 24)

    def stack_config(self):
        """A config block that keeps a program's variables off the BPF
        stack, for a program with range loops: from 0.24, which passes
        their variables to each bpf_loop() callback on the caller's
        stack.  the stack tool's whole-stack walk, with 0.27 and LLVM 21, was
        refused by bpftrace itself ("Stack size is too large") at a
        tracepoint; on_stack_limit = 0 puts every variable in a per-CPU
        scratch map instead, which the verifier also walks in 9,484
        instructions instead of 244,886 (docs/tools-cost.md).  Empty
        before 0.24, whose while loops need no such help (0.17 has no
        config block)."""
        if self.range_loops:
            return "config = { on_stack_limit = 0 }\n"
        return ""

    def loops(self, text):
        """The program *text*, written with range loops, with its loops
        as this version takes them (while_loops() before 0.24)."""
        return text if self.range_loops else while_loops(text)

    def verifier_options(self):
        """(options, environment) that make this version print what the
        kernel's verifier reports of each program it loads: "-d
        verifier" from 0.21 (the whole log, "stack depth" and "processed
        N insns" last), "-v" before (the log at level 1: "processed"
        only, no stack depth), with a log buffer large enough for the
        whole log (bpftrace's default of 1 MB is not, for the stack tool's)."""
        env = {"BPFTRACE_LOG_SIZE": str(VERIFIER_LOG_SIZE)}
        if self.version is None or self.version[:2] >= (0, 21):
            return ["-d", "verifier"], env
        return ["-v"], env

    def verify(self, text, params=(), target=None, load=True, timeout=600):
        """Load the bpftrace program *text* and report what the kernel's
        verifier said of each of its programs: ([ProgramStats], bpftrace's
        errors, its exit status).  It runs with --unsafe and *target*,
        bpftrace's options of the process traced (by default "-c
        /bin/true": a program that names cpid needs a command; 0.17
        finds a USDT marker only in the command's process), which ends
        it once loaded and attached, with *params*, the program's
        positional parameters, after its file; twice: with
        verifier_options() for the figures, and as the tools run it,
        for the errors and status, since 0.27 with "-d verifier" loaded
        a program that it refused without ("Stack size is too large");
        once with -v (before 0.21), which changes nothing else, or
        without *load* (a program that the caller loads elsewhere)."""
        options, extra = self.verifier_options()
        env = self.environ()
        env.update(extra)
        runs = []
        with tempfile.NamedTemporaryFile("w", suffix=".bt",
                                         prefix="usdt-verify-") as f:
            f.write(text)
            f.flush()
            passes = [options]
            if load and options != ["-v"]:
                passes.append(["-q"])
            for flags in passes:
                proc = subprocess.run(
                    [self.path, "--unsafe"] + flags + [f.name] +
                    [str(p) for p in params] +
                    (target or ["-c", "/bin/true"]),
                    env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, timeout=timeout, check=False)
                runs.append((proc.stdout.decode("utf-8", "replace"),
                             proc.returncode))
        logged, (output, status) = runs[0][0], runs[-1]
        errors = "\n".join(
            line for line in output.splitlines()
            if line.startswith("ERROR") and not any(
                pattern.search(line) for pattern in NOISE))
        return verifier_stats(logged), errors, status

    def drop_flags(self):
        """The options that make this version warn of each update that a
        full map refuses: -k up to 0.23 (0.27 always warns, and its -k
        warns of failed reads instead)."""
        if self.version is not None and self.version[:2] >= (0, 27):
            return []
        return ["-k"]

    @property
    def pid_samples_main_thread(self):
        """Whether -p PID keeps the perf events of profile:, hardware:
        and software: probes to PID's main thread: from 0.24, whose -p
        applies to every probe (bpftrace #3800) and opens such a probe's
        event for PID alone, which samples its main thread and the
        threads that it starts afterwards, not those already running
        (0.27: no sample of a process whose main thread waits while two
        threads compute; 0.17 and 0.23 sample every CPU and leave the
        process to the program's filter).  Unknown versions: as the
        newest."""
        return self.version is None or self.version[:2] >= (0, 24)

    @property
    def probe_filter(self):
        """Whether this version has --probe-filter REGEX, which runs
        only the probes of a program whose names match: from 0.25."""
        return self.version is None or self.version[:2] >= (0, 25)

    def target_pid(self, pid, probes):
        """The options that trace the running process *pid* with the
        probes *probes* (their bpftrace names): -p PID, but none for a
        program of perf-event probes alone on a version where -p would
        sample only its main thread.  The program must then keep to pid
        itself (a /pid == PID/ filter), and bpftrace does not end with
        the process."""
        if self.pid_samples_main_thread and probes and all(
                PERF_EVENT_PROBE.match(probe) for probe in probes):
            return []
        return ["-p", str(pid)]


# A probe of a perf event, which -p PID opens for PID alone from 0.24:
# profile:, hardware:, software: and their short names.
PERF_EVENT_PROBE = re.compile(r"^\s*(profile|hardware|software|p|h|s):")

# A range loop, alone on its line: "for ($v : START..END) {".
RANGE_LOOP = re.compile(r"^(\s*)for \((\$\w+) : (.+?)\.\.(.+)\) \{\s*$")


def while_loops(text):
    """*text* with each range loop, "for ($v : START..END) {" alone on
    its line, written as the while loop of 0.17 to 0.23: "$v = START;
    while ($v < END) {", with "$v++;" at the end of its body and before
    each "continue;" of the loop.  A loop's closing brace must begin its
    line; braces in strings and comments are not counted."""
    out = []
    blocks = []  # per open brace: the variable of a loop to step, or ""
    comment = False
    for line in text.splitlines(keepends=True):
        match = RANGE_LOOP.match(line)
        if match and not comment:
            indent, var, start, end = match.groups()
            out.append("%s%s = %s;\n%swhile (%s < %s) {\n"
                       % (indent, var, start, indent, var, end))
            blocks.append(var)
            continue
        code, comment = _code(line, comment)
        if re.match(r"\s*while\b", code):
            loop = "while"
        else:
            loop = None
        for at, char in enumerate(code):
            if char == "{":
                blocks.append(loop or "")
                loop = None
            elif char == "}":
                if not blocks:
                    raise ValueError("unbalanced }: %r" % line)
                var = blocks.pop()
                if var and var != "while":
                    if code[:at].strip():
                        raise ValueError("a loop's } must begin its "
                                         "line: %r" % line)
                    indent = line[:len(line) - len(line.lstrip())]
                    out.append("%s\t%s++;\n" % (indent, var))
        if re.search(r"\bcontinue\s*;", code):
            loops = [var for var in blocks if var]
            if loops and loops[-1] != "while":
                line = re.sub(r"\bcontinue\s*;",
                              "%s++; continue;" % loops[-1], line)
        out.append(line)
    if blocks:
        raise ValueError("unbalanced {: %d left open" % len(blocks))
    return "".join(out)


def _code(line, comment):
    """(the code of *line*, without its strings and comments, blanked
    out; whether a /* comment is open after it), *comment* saying
    whether one is open before it."""
    code = []
    at = 0
    while at < len(line):
        if comment:
            end = line.find("*/", at)
            if end < 0:
                return "".join(code), True
            code.append(" " * (end + 2 - at))
            at = end + 2
            comment = False
        elif line.startswith("/*", at):
            code.append("  ")
            at += 2
            comment = True
        elif line.startswith("//", at):
            break
        elif line[at] == '"':
            end = at + 1
            while end < len(line) and line[end] != '"':
                end += 2 if line[end] == "\\" else 1
            code.append(" " * (end + 1 - at))
            at = end + 1
        else:
            code.append(line[at])
            at += 1
    return "".join(code), comment


_FOUND = {}

# Where bpftrace finds the kernel's uprobe_events and tracepoints.  A fresh
# machine, and most containers, have it unmounted: bpftrace then still
# attaches USDT probes, but says "open(.../uprobe_events): No such file"
# and "failed to detach probe" for each, and finds no tracepoint.
TRACEFS = "/sys/kernel/tracing"


def ensure_tracefs(path=TRACEFS):
    """Mount tracefs on *path* where it is not mounted, as root, and say
    so on stderr; not root, Error with the command that mounts it."""
    if os.path.exists(os.path.join(path, "uprobe_events")):
        return
    command = "mount -t tracefs nodev %s" % path
    if os.geteuid() != 0:
        raise Error("tracefs is not mounted on %s, and bpftrace needs it; "
                    "as root, run: %s" % (path, command))
    try:
        proc = subprocess.run(command.split(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=60,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise Error("tracefs is not mounted on %s, and %s failed: %s"
                    % (path, command, error)) from None
    if proc.returncode != 0 or not os.path.exists(
            os.path.join(path, "uprobe_events")):
        raise Error("tracefs is not mounted on %s, and %s failed: %s"
                    % (path, command,
                       proc.stdout.decode("utf-8", "replace").strip()
                       or "exit %d" % proc.returncode))
    sys.stderr.write("usdt: mounted tracefs on %s (bpftrace needs it)\n"
                     % path)


def find(tracefs=True):
    """The bpftrace on PATH, or Error saying how to get one; tracefs
    mounted first (ensure_tracefs) unless *tracefs* is false (to write
    a program for it, not run one)."""
    path = shutil.which("bpftrace")
    if path is None:
        raise Error("bpftrace not found (apt-get install bpftrace)")
    if tracefs:
        ensure_tracefs()
    if path not in _FOUND:
        try:
            text = subprocess.run([path, "--version"],
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=120,
                                  check=False).stdout.decode(
                                      "utf-8", "replace").strip()
        except (OSError, subprocess.TimeoutExpired) as error:
            raise Error("%s --version failed: %s" % (path, error)) from None
        match = re.search(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text)
        version = (tuple(int(part or 0) for part in match.groups())
                   if match else None)
        _FOUND[path] = Bpftrace(path, version, text or "no version")
    return _FOUND[path]


# Set (to 1) by usdt.tools -v and usdt.stacks -v, and so seen by the
# usdt.stacks that usdt.tools runs: name the bpftrace used, and show the
# warnings that NoiseFilter would leave out.
VERBOSE = "USDT_TOOLS_VERBOSE"


def verbose():
    return os.environ.get(VERBOSE, "") not in ("", "0")


def set_verbose():
    os.environ[VERBOSE] = "1"


def untested_note(bpftrace):
    """A line for stderr when *bpftrace* is not a tested version, or
    verbose() (then it names the version used), else ""."""
    tested = ", ".join("%d.%d" % v for v in TESTED)
    if bpftrace.tested:
        if verbose():
            return "usdt: using %s (tested: %s)\n" % (bpftrace, tested)
        return ""
    return ("note: %s is not a tested bpftrace version (tested: %s); "
            "trying it\n" % (bpftrace, tested))


# The warnings that every NoiseFilter of this process left out.
LEFT_OUT = [0]


def left_out_note(who):
    """A line for stderr that says how many known harmless warnings were
    left out, if any, and how to see them; else ""."""
    if not LEFT_OUT[0]:
        return ""
    return ("%s: %d known harmless bpftrace warning%s not shown (-v shows "
            "%s)\n" % (who, LEFT_OUT[0], "s" if LEFT_OUT[0] > 1 else "",
                       "them" if LEFT_OUT[0] > 1 else "it"))


# A warning at a place in the program: "FILE:LINE:COL-COL: WARNING: ...",
# followed by 0.23's and 0.27's "Additional Info - ..." line, the
# program's line, and a ~~~ line under it (which 0.27 does not always end
# with a newline: the next output follows on the same line).
LOCATED = re.compile(r"^\S+:\d+:\d+(?:-\d+)?: WARNING: ")
TILDES = re.compile(r"^\s*~+")
# 0.27's note after a warning on a macro's expansion, in the same form:
# "FILE:LINE:COL-COL: WARNING: expanded from", the line, the ~~~ line.
EXPANSION = re.compile(r"^\S+:\d+:\d+(?:-\d+)?: WARNING: expanded from$")
# 0.27's warning about lines FIRST to LAST (a while loop):
# "FILE:FIRST-LAST: WARNING: ...", those lines of the program, and a
# "HINT: ..." line.
RANGED = re.compile(r"^\S+:(\d+)-(\d+): WARNING: ")

# A map was full, so an update was refused: an event dropped.  0.17 says
# so with -k; 0.23 with -k; 0.27 always.
DROPPED = re.compile(r"WARNING: (Failed to map_update_elem: Argument list "
                     r"too long|Map full; can't update element)")

# The kernel refused to load a program (too large, too complex): 0.17
# says "Error loading program", 0.23 and 0.27 "Error loading BPF program
# for PROBE".
LOAD_REFUSED = re.compile(r"Error loading (?:BPF )?program")

# The kernel's verifier limits (include/linux/bpf.h): the instructions it
# walks through a program, all its paths together
# (BPF_COMPLEXITY_LIMIT_INSNS), and the stack of one function
# (MAX_BPF_STACK).  The toolkit keeps its programs under half of each
# (tests/test_verifier_margin.py, docs/tools-cost.md).
VERIFIER_INSNS_LIMIT = 1000000
VERIFIER_STACK_LIMIT = 512
# Bytes of verifier log asked for with verifier_options(): the stack tool's
# programs write tens of MB at level 2; the kernel takes at most 1 GiB - 1
# (a larger size is EINVAL).
VERIFIER_LOG_SIZE = 1 << 29

# bpftrace's load error and its errno: "Error code: -7 (Argument list too
# long)" (0.23, 0.27); 0.17 says only "Error loading program".
LOAD_ERRNO = re.compile(r"Error loading (?:BPF )?program[^\n]*?"
                        r"Error code: -?(\d+)")
E2BIG = 7


def refusal(errors):
    """What the kernel's refusal of a program means, from bpftrace's
    *errors*, in words: which limit was hit, where bpftrace says.  None
    if *errors* is not a refusal."""
    if not LOAD_REFUSED.search(errors):
        return None
    match = LOAD_ERRNO.search(errors)
    if match and int(match.group(1)) == E2BIG:
        return ("the kernel's verifier gave up on the program: it walks "
                "at most %s instructions through all of a program's "
                "paths, and this one has more (E2BIG)"
                % format(VERIFIER_INSNS_LIMIT, ","))
    if match:
        return ("the kernel refused the program (%s)"
                % os.strerror(int(match.group(1))))
    return "the kernel refused the program"


class ProgramStats:
    """What the verifier reported of one program: its name (bpftrace's,
    e.g. profile_hz_99_2, or the probe 0.17 attaches it to), the
    instructions it processed, and the stack depth of each of its
    functions, the main one first (None where the version does not
    report it: 0.17)."""

    def __init__(self, name, insns, stack):
        self.name = name
        self.insns = insns
        self.stack = stack

    def __repr__(self):
        return "ProgramStats(%r, %r, %r)" % (self.name, self.insns,
                                             self.stack)

    @property
    def max_stack(self):
        """The deepest of its functions' stacks, or None."""
        return max(self.stack) if self.stack else None


_PROCESSED = re.compile(r"^processed (\d+) insns \(limit \d+\)", re.M)


def verifier_stats(output):
    """[ProgramStats] of bpftrace's *output* with verifier_options():
    0.21 and later head each program's log with "BPF verifier log for
    NAME:", and end it with "stack depth A+B+..." (one figure per
    function) and "processed N insns"; 0.17 prints "Program ID: N",
    the log, and then "Attaching PROBE" (not for USDT markers)."""
    stats = []
    heads = list(re.finditer(r"^BPF verifier log for ([^\n:]+):$", output,
                             re.M))
    if heads:
        for at, head in enumerate(heads):
            end = heads[at + 1].start() if at + 1 < len(heads) else None
            log = output[head.end():end]
            processed = _PROCESSED.search(log)
            if processed is None:
                continue
            depth = re.search(r"^stack depth ([\d+]+)$", log, re.M)
            stack = ([int(d) for d in depth.group(1).split("+")]
                     if depth else None)
            stats.append(ProgramStats(head.group(1).strip(),
                                      int(processed.group(1)), stack))
        return stats
    blocks = re.split(r"^Program ID: (\d+)$", output, flags=re.M)
    for number, block in zip(blocks[1::2], blocks[2::2]):
        processed = list(_PROCESSED.finditer(block))
        if not processed:
            continue
        # "Attaching PROBE" after the log, except at USDT markers.
        name = re.search(r"^Attaching ([^\n]+)$", block[processed[-1]
                                                      .end():], re.M)
        stats.append(ProgramStats(name.group(1).strip() if name else
                                  "program %s" % number,
                                  int(processed[-1].group(1)), None))
    return stats

# Warnings that say nothing about the results.
NOISE = (
    # Every version, where the memlock limit cannot be raised (a
    # container); BPF memory is not counted against it on this kernel.
    re.compile(r"couldn't set RLIMIT_MEMLOCK"),
    # 0.23 and later, when the old names are given (environ() gives the new).
    re.compile(r"WARNING: BPFTRACE_\w+ is deprecated\. Use BPFTRACE_\w+ "
               r"instead\."),
    # 0.23 and 0.27 with -k: a read of a map key not set yet, which the
    # scripts do on purpose (it reads as 0).
    re.compile(r"WARNING: Can't lookup map element because it does not "
               r"exist"),
    # 0.23 and 0.27: a sum or comparison of a kernel and a user value,
    # which the stack tool's programs make in a kernel probe (a tracepoint):
    # the values they read through uptr() are the user's, 0.27's
    # constants there the kernel's (0.23's casts of constants, which the
    # programs avoid).  Nothing depends on it: every read is uptr()'s.
    re.compile(r"WARNING: Addrspace mismatch"),
    # 0.27's new compile-time advice, on constructs that 0.17 needs.
    re.compile(r"WARNING: While loops are deprecated"),
    re.compile(r"WARNING: Return value discarded"),
    re.compile(r"WARNING: Unnecessary cast"),
    re.compile(r"WARNING: Expression of type: \w+ being cast to type"),
    re.compile(r"WARNING: signed operands for '[^']+' can lead to "
               r"undefined behavior"),
    # 0.27, where a script's optional argument (latency.bt's $3) is left
    # out.
    re.compile(r"WARNING: Positional parameter \$\d+ is empty or not "
               r"provided"),
    # 0.27 reads it for kprobes, which the toolkit does not use.
    re.compile(r"WARNING: Could not read functions from "
               r"\S*available_filter_functions"),
)


class NoiseFilter:
    """Reads bpftrace's output or stderr a line at a time: keep(line) is
    what of it to show ("" for none).  dropped counts the events that a
    full map refused, noise the known harmless warnings left out."""

    def __init__(self):
        self.dropped = 0
        self.noise = 0
        self._block = 0     # lines of a warning's block still to come
        self._lines = 0     # program lines of a RANGED warning to come
        self._hint = False  # a RANGED warning's HINT line may come
        self._expansion = False  # the last warning was left out

    def keep(self, line):
        raw = isinstance(line, bytes)
        text = line.decode("utf-8", "replace") if raw else line
        noise = self.noise
        shown = self._keep(text)
        if verbose() and not shown:
            # Counted all the same (the events dropped), but shown.
            shown = text
        elif self.noise > noise:
            LEFT_OUT[0] += 1
        return shown.encode("utf-8") if raw else shown

    def _keep(self, text):
        if EXPANSION.match(text):
            if self._expansion:
                self._block = 2
                self._lines = 0
                self._hint = False
                return ""
            return text
        if self._lines:
            self._lines -= 1
            self._hint = self._lines == 0
            return ""
        if self._hint:
            self._hint = False
            if text.startswith("HINT: "):
                return ""
        if not self._block:
            self._expansion = False
        if self._block:
            if text.startswith("Additional Info"):
                return ""
            self._block -= 1
            if self._block == 0:
                # The ~~~ line, and what came after it on the same line.
                rest = TILDES.sub("", text, count=1)
                return self._keep(rest) if rest.strip() else ""
            return ""
        if DROPPED.search(text):
            self.dropped += 1
        elif any(pattern.search(text) for pattern in NOISE):
            self.noise += 1
        else:
            return text
        ranged = RANGED.match(text)
        if LOCATED.match(text):
            # 0.27 follows a warning on a macro's expansion with a
            # located "WARNING: expanded from" note of its own block:
            # shown with its warning, so left out with it.
            self._expansion = True
            self._block = 2
        elif ranged:
            # 0.27's warning on lines FIRST to LAST (a while loop, an
            # expression over two lines), which an expansion note may
            # follow too.
            self._expansion = True
            self._lines = int(ranged.group(2)) - int(ranged.group(1)) + 1
        return ""


# What bpftrace 0.17 says on stderr of a sample whose stack its stack map
# lost (the sample counts in "@[]: N", which the profile tool reports).
LOST_STACK = "failed to look up stack id"


def process_cpu(pid):
    """(own, children's) CPU seconds (user and system) of process *pid*,
    from /proc/PID/stat; None if it cannot be read."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    # utime, stime, cutime, cstime: fields 14 to 17 (the 12th to 15th
    # after the name).
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return (utime + stime) / tick, (cutime + cstime) / tick


class Session:
    """One bpftrace process, from its start to its exit: the one place
    where the toolkit starts bpftrace and stops it.

        session = Session(runner, [*options, program, *params], env)
        session.start(stdout=reader)      # reader(pipe), in a thread
        status = session.wait(seconds)    # Ctrl-C, or *seconds* after
                                          # attached: SIGINT until it exits

    Its stderr is copied to *stderr* (ours; None keeps it only) as it
    comes, without bpftrace's known harmless warnings (noise, a
    NoiseFilter, whose dropped counts the events that full maps refused)
    and without 0.17's lost-stack lines; errors keeps what was shown, for
    messages.  attached is an event that the stdout reader sets when the
    program says it has attached; with detects_attach false the session
    counts as attached from its start (a -c command, which bpftrace starts
    once attached).  bpftrace 0.17 loses a SIGINT sent before it has
    attached, and can miss one after: so the first goes once attached, and
    another every second until it has exited."""

    def __init__(self, runner, arguments, env=None, stderr=True,
                 detects_attach=True):
        self.runner = runner
        self.command = [runner.path, *arguments]
        self.env = env
        self.stderr = sys.stderr.buffer if stderr is True else stderr
        self.noise = NoiseFilter()
        self.errors = []
        self.attached = threading.Event()
        if not detects_attach:
            self.attached.set()
        self.proc = None
        self._threads = []
        # After wait(): bpftrace's CPU seconds (user and system), its own
        # and its children's (a -c command), read when it had exited and
        # before it was reaped; None if they could not be read.
        self.cpu = None

    @property
    def pid(self):
        return self.proc.pid

    def poll(self):
        return self.proc.poll()

    def start(self, stdout=None, workers=(), helpers=()):
        """Start bpftrace, its stdout read by *stdout* (a function of the
        pipe; None: to /dev/null); then the functions *workers*, each in
        a thread that close() waits for, and the functions *helpers* of
        this session, each in a daemon thread."""
        self.proc = subprocess.Popen(
            self.command, env=self.env,
            stdout=subprocess.DEVNULL if stdout is None else subprocess.PIPE,
            stderr=subprocess.PIPE)
        self._threads.append(threading.Thread(target=self._copy_stderr,
                                              args=(self.proc.stderr,)))
        if stdout is not None:
            self._threads.append(threading.Thread(target=stdout,
                                                  args=(self.proc.stdout,)))
        self._threads += [threading.Thread(target=worker)
                          for worker in workers]
        for thread in self._threads:
            thread.start()
        for helper in helpers:
            threading.Thread(target=helper, args=(self,),
                             daemon=True).start()
        return self

    def _copy_stderr(self, pipe):
        for line in iter(pipe.readline, b""):
            shown = self.noise.keep(line.decode("utf-8", "replace"))
            if not shown or LOST_STACK in shown:
                continue
            self.errors.append(shown)
            if self.stderr is not None:
                self.stderr.write(shown.encode("utf-8"))
                self.stderr.flush()

    def interrupt(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def wait(self, seconds=None, delay=0, announce=None, drain=0,
             drain_note=None):
        """Wait for bpftrace to exit; its exit status.  It gets SIGINT
        *seconds* (None: never) after it has attached and *delay* more
        seconds have passed (when the markers that a watcher arms fire),
        or at Ctrl-C (KeyboardInterrupt: SIGINT or SIGTERM to this
        process), and again every second until it exits.  *announce*, a
        text, goes to stderr once attached and *delay* has passed.
        *drain*: seconds more between the decision to stop and the first
        SIGINT (the traced process hands over what it holds meanwhile),
        said on stderr with *drain_note* (a text with %g for them); a
        second Ctrl-C stops at once."""
        proc = self.proc
        since = deadline = stop_at = None
        ready = stopping = interrupted = False

        def stop():
            nonlocal stop_at, stopping
            if drain and stop_at is None:
                stop_at = time.monotonic() + drain
                if drain_note:
                    sys.stderr.write(drain_note % drain)
                    sys.stderr.flush()
            else:
                stopping = True
                self.interrupt()
        try:
            while True:
                try:
                    if not ready and self.attached.is_set():
                        if since is None:
                            since = time.monotonic()
                        if time.monotonic() >= since + delay:
                            ready = True
                            if announce:
                                sys.stderr.write(announce)
                                sys.stderr.flush()
                            if seconds is not None:
                                deadline = time.monotonic() + seconds
                            if interrupted:
                                stop()
                    if not ready:
                        timeout = 0.05
                    elif stopping:
                        timeout = 1
                    elif stop_at is not None:
                        timeout = max(0, stop_at - time.monotonic())
                    elif deadline is None:
                        timeout = None
                    else:
                        timeout = max(0, deadline - time.monotonic())
                    self._wait(timeout)
                    break
                except subprocess.TimeoutExpired:
                    now = time.monotonic()
                    if not ready:
                        continue
                    if stopping or (stop_at is not None and now >= stop_at):
                        stopping = True
                        self.interrupt()
                    elif (stop_at is None and deadline is not None
                          and now >= deadline):
                        stop()
                except KeyboardInterrupt:
                    interrupted = True
                    if ready and proc.poll() is None:
                        if stopping or stop_at is not None:
                            stopping = True
                            self.interrupt()
                        else:
                            stop()
        finally:
            self.close()
        return proc.returncode

    def _wait(self, timeout):
        """proc.wait(timeout), which first reads bpftrace's CPU times
        (self.cpu) from /proc while it is a zombie: once reaped, its
        children's times are gone."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                exited = os.waitid(os.P_PID, self.proc.pid, os.WEXITED
                                   | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                exited = True
            if exited is not None:
                self.cpu = process_cpu(self.proc.pid)
                self.proc.wait()
                return
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.command, timeout)
            time.sleep(0.05 if left is None else min(0.05, left))

    def stop(self, timeout=60):
        """SIGINT now, and every second, until bpftrace exits (killed
        after *timeout* seconds); its exit status."""
        end = time.monotonic() + timeout
        try:
            while self.proc.poll() is None and time.monotonic() < end:
                self.interrupt()
                try:
                    self.proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            self.close()
        return self.proc.returncode

    def stop_when_gone(self, pid):
        """SIGINT bpftrace once process *pid* has ended (what -p does),
        as a helper of start(): lambda session: session.stop_when_gone(
        PID)."""
        while self.proc.poll() is None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                self.interrupt()
                return
            except PermissionError:
                pass
            time.sleep(0.5)

    def close(self):
        """Kill bpftrace if it still runs, and wait for its readers."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for thread in self._threads:
            thread.join()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


def forward_stdout(pipe, out, newlines):
    """Copy bpftrace's stdout (the -c command's output) to out, but for
    the *newlines* empty lines that bpftrace prints there when it exits
    (Bpftrace.exit_newlines: two up to 0.23, none from 0.24, so that the
    command's own last newline is kept), and the warnings that bpftrace
    0.27 prints there while it compiles, before the command starts."""
    held = b""
    noise = NoiseFilter()
    compiling = True
    while True:
        chunk = os.read(pipe.fileno(), 65536)
        if not chunk:
            break
        data = held + chunk
        if compiling:
            # Whole lines only, until one is not a warning's.
            lines = data.splitlines(keepends=True)
            held = b"" if data.endswith(b"\n") else lines.pop()
            data = b""
            for index, line in enumerate(lines):
                shown = noise.keep(line)
                if shown and not noise._block:
                    compiling = False
                    data = shown + b"".join(lines[index + 1:]) + held
                    held = b""
                    break
            if compiling:
                continue
        keep = len(data) - min(newlines,
                               len(data) - len(data.rstrip(b"\n")))
        out.write(data[:keep])
        out.flush()
        held = data[keep:]
    if compiling:
        # Nothing but warnings, and the last line without its newline.
        held = noise.keep(held)
        if newlines and held.endswith(b"\n" * newlines):
            held = held[:-newlines]
        out.write(held)
    # Otherwise what is held is the empty lines bpftrace printed at exit.
    out.flush()


# 0.27 prints a stats() value as "{ .count = N, .average = N, .total = N }",
# 0.17 and 0.23 as "count N, average N, total N": the tools show the one
# form, which is also what their readers parse.
STATS = re.compile(r"\{ \.count = (-?\d+), \.average = (-?\d+), "
                   r"\.total = (-?\d+) \}")


def normalize(text):
    """bpftrace's printed maps in the form of 0.17, whatever the
    version."""
    return STATS.sub(r"count \1, average \2, total \3", text)
