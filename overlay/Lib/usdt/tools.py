"""python -m usdt.tools TOOL ...: one command for the ready tracing tools.

Each tool answers one question about a Python process of this
interpreter, with the same options everywhere:

    -p PID        trace a running process (until Ctrl-C or -d)
    -c CMD        run CMD and trace it until it exits (CMD is split on
                  spaces, as bpftrace -c splits it)
    -d SECONDS    stop after SECONDS and print what was found
    -o FILE       write the results to FILE, not to standard output
    -f TEXT       calls, latency, lines, ccalls, exceptions: trace only
                  the code whose file name, name or qualified name
                  contains TEXT (a dotted module name selects its
                  files), selected in the interpreter before any trap
                  (usdt._select; ccalls: the C calls made from that
                  code); the other tools keep the entries whose key
                  contains TEXT (stacks: those with a frame that does)

calls, latency, lines, exceptions and ccalls show the 20 largest entries
of each map that -f left (--top N: N of them, --top 0: every one), and
say after a map they cut how many entries it left out.

The tools are the ready bpftrace scripts of usdt/scripts, and usdt.stacks
(usdt.stacks, run in this process) for stacks, alloc and profile, run
with the limits each one needs (its string length and map size, set the
way the bpftrace found takes them: see usdt._bpftrace, which also says
which versions are tested), warning of each update a
full map refuses (-k up to bpftrace 0.23): when a map is full anyway, the
number of events dropped is said on standard error.
bpftrace's known harmless warnings (RLIMIT_MEMLOCK, deprecations) are
not shown.  With -p, a line on
standard error says when the probes are attached; -d counts from then.
Ctrl-C, or the end of -d, stops tracing and prints the results: bpftrace
0.17 loses a SIGINT sent before it has attached, and can miss one after,
so it gets its first once attached, then one every second until it has
printed.  A PID that
does not run this interpreter is refused, with what it runs instead.
Needs root and bpftrace.
"""

import argparse
import collections
import io
import json
import os
import re
import resource
import signal
import sys
import sysconfig
import tempfile
import time

from usdt import _batch, _bpftrace, _elf, _select, profiles

HERE = os.path.dirname(os.path.abspath(__file__))


class Tool:
    """One question, and the script that answers it."""

    def __init__(self, name, question, script=None, strlen=None,
                 keys=None, watched=False, cuts=None):
        self.name = name
        self.question = question
        self.script = script
        self.strlen = strlen
        self.keys = keys
        # The maps that its --top cuts: {map: (what its entries are, the
        # entries kept if not --top's)}.  Its script prints every entry
        # (given 0 for N, where it takes N), so that -f filters them all.
        self.cuts = cuts or {}
        # Its markers (function, line, C function, exception) fire in a
        # running process only once the interpreter's watcher thread has
        # seen them armed: within a second.  True for the tools whose
        # script uses a probe of the registry's watched column
        # (series/SERIES/probes.tsv; test_registry checks both agree).
        self.watched = watched


# In the order --help lists them.  strlen and keys: what the script's
# header asks for (it loads with that BPFTRACE_STRLEN, and its maps hold
# that many keys).
TOOLS = [
    Tool("calls", "Which Python functions are called most often?",
         "calls-batch.bt", 160, 65536, watched=True,
         cuts={"@calls": ("function", None)}),
    Tool("latency", "Which Python functions are slow? Runs, inclusive "
         "and exclusive wall time, latency histograms; or (--svg) a flame "
         "graph of wall time by call path", "latency-batch.bt",
         160, 65536, watched=True,
         cuts={name: ("function", None) for name in (
             "@latency_ns", "@exclusive_ns", "@inclusive_ns")}),
    Tool("lines", "Which lines of Python code run, how often?",
         "lines.bt", 200, 131072, watched=True,
         cuts={"@lines": ("line", None)}),
    Tool("exceptions", "Which exceptions are raised, re-raised and "
         "handled, and where?", "exceptions.bt", 160, 16384, watched=True,
         cuts={**{name: ("site", None) for name in (
             "@raised", "@reraised", "@handled", "@sites")},
               "@types": ("total", None)}),
    Tool("ccalls", "Which C functions does Python code call, and how "
         "long do they take?", "ccalls.bt", 160, 16384, watched=True,
         # One histogram, of the callable called most often (or the one
         # --histogram names).
         cuts={"@total_ns": ("callable", None),
               "@latency_ns": ("histogram", 1)}),
    Tool("gc", "How often does the garbage collector run, and how long "
         "does it take?", "gc.bt"),
    Tool("imports", "Which imports are slow, and which fail?",
         "imports.bt", 160, 16384),
    Tool("gil", "How long do threads wait for the GIL, and hold it?",
         "gil.bt"),
    Tool("threads", "Which threads start and stop, and how long do they "
         "live?", "threads.bt"),
    Tool("tasks", "Which asyncio tasks run, and how long are their "
         "steps?", "tasks.bt", 128),
    Tool("stacks", "Which Python code hits this probe (any bpftrace "
         "probe: a syscall, a USDT marker)? Python stacks with counts"),
    Tool("alloc", "Which Python code allocates the most memory, or with "
         "--live holds the most? The sampled bytes (otel_memory) by line, "
         "function and file, per stack, or folded for flamegraph"),
    Tool("profile", "Where does the process spend its CPU time? Sampled "
         "Python stacks, folded, or as a flame graph (--svg)"),
    Tool("flamegraph", "What do these folded stacks look like? An "
         "interactive SVG flame graph, or a differential one of two"),
    Tool("list", "Which probes did the process define with the usdt "
         "module?"),
]
BY_NAME = {tool.name: tool for tool in TOOLS}

# The count of the warnings bpftrace could not print as fast.
LOST = re.compile(r"^Lost (\d+) events$")


# Reported in one line, without a traceback.
Error = _bpftrace.Error


def traced_binary():
    """The file a tracer attaches to: libpython for a shared build, the
    executable otherwise."""
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        library = os.path.join(sysconfig.get_config_var("LIBDIR") or "",
                               sysconfig.get_config_var("INSTSONAME")
                               or "")
        if os.path.exists(library):
            return os.path.realpath(library)
        # Not installed: the library next to the build tree's executable.
        library = os.path.join(os.path.dirname(sys.executable),
                               sysconfig.get_config_var("INSTSONAME"))
        if os.path.exists(library):
            return os.path.realpath(library)
    return os.path.realpath(sys.executable)


def check_pid(pid, binary):
    """Error unless process pid runs *binary* (maps it)."""
    try:
        exe = os.readlink("/proc/%d/exe" % pid)
    except FileNotFoundError:
        raise Error("no process %d" % pid) from None
    except OSError as error:
        raise Error("cannot read /proc/%d/exe: %s%s" % (
            pid, error.strerror,
            "" if os.geteuid() == 0 else " (run as root)")) from None
    try:
        with open("/proc/%d/maps" % pid) as f:
            mapped = {line.split(None, 5)[5].rstrip("\n")
                      for line in f if len(line.split(None, 5)) == 6}
    except OSError as error:
        raise Error("cannot read /proc/%d/maps: %s" % (pid, error.strerror))
    target = os.stat(binary)
    for path in mapped:
        try:
            found = os.stat(path)
        except OSError:
            continue
        if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
            return
    raise Error("process %d runs %s, not this interpreter (%s): run the "
                "tools with the interpreter it runs" % (pid, exe, binary))


def script_path(name):
    """The path of the ready script *name*, in usdt/scripts."""
    path = os.path.join(HERE, "scripts", name)
    if not os.path.exists(path):
        raise Error("%s is not installed in %s"
                    % (name, os.path.dirname(path)))
    return path


def filter_output(text, needle):
    """The map entries of bpftrace's output whose key holds needle, with
    the lines that belong to them (a histogram's buckets)."""
    kept, keep = [], True
    for line in text.splitlines(keepends=True):
        if line.startswith("@"):
            key = line.split("]:", 1)[0]
            keep = needle in key
        if keep:
            kept.append(line)
    return "".join(kept)


def map_entries(text):
    """The maps that bpftrace printed in text, in order: [(name,
    [entry, ...])], each entry with the lines that belong to it (a
    histogram's buckets); name None for the lines before the first map."""
    maps = [(None, [""])]
    for line in text.splitlines(keepends=True):
        if line.startswith("@"):
            name = re.match(r"@\w*", line).group()
            if maps[-1][0] != name:
                maps.append((name, []))
            maps[-1][1].append(line)
        else:
            maps[-1][1][-1] += line
    return maps


def cut_maps(text, top, cuts):
    """text with each map of cuts ({map: (what its entries are, how many
    to keep if not top)}) cut to its largest entries, which bpftrace
    prints last, as print(@map, N) cuts; top 0 keeps every entry.  A line
    after a cut map says how many entries it left out."""
    out = []
    for name, entries in map_entries(text):
        what, keep = cuts.get(name, (None, None))
        keep = keep or top
        if what and top and len(entries) > keep:
            left = len(entries) - keep
            entries = entries[left:]
            # Before the blank line that ends a histogram.
            last = entries[-1].rstrip("\n") + "\n"
            entries[-1] = (last + "(%s more %s%s left out: --top 0 shows "
                           "every one)\n" % (format(left, ","), what,
                                              "s" if left > 1 else "")
                           + entries[-1][len(last):])
        out.extend(entries)
    return "".join(out)


def filter_stacks(text, needle):
    """The stacks of the stack tool's output that have a frame holding
    needle: folded lines, or blocks of a count and its frames."""
    blocks = re.split(r"(?<=\n)\n", text) if "\n\n" in text else None
    if blocks is None:
        return "".join(line for line in text.splitlines(keepends=True)
                       if needle in line.rpartition(" ")[0])
    return "\n".join(block for block in blocks
                     if needle in block.partition("\n")[2])


def drop_warnings(text):
    """(bpftrace's output without its warnings, events dropped): each
    version puts some of its warnings among the output."""
    noise = _bpftrace.NoiseFilter()
    out, dropped = [], 0
    for line in text.splitlines(keepends=True):
        lost = LOST.match(line.strip())
        if lost:
            dropped += int(lost.group(1))
            continue
        out.append(noise.keep(line))
    return "".join(out), dropped + noise.dropped


def collect_stdout(pipe, lines, attached):
    """Keep bpftrace's output lines in *lines*, and set the event
    *attached* when the line ATTACHED comes."""
    for line in iter(pipe.readline, b""):
        text = line.decode("utf-8", "replace")
        if text.rstrip("\n") == ATTACHED:
            attached.set()
        else:
            lines.append(text)


# Seconds from the watcher's poll until the interpreter's threads have
# applied what it found (the pending call runs at their next eval-breaker
# check).
WATCHER_MARGIN = 0.5
# The symbol by which the interpreter exports its watcher's poll interval
# (Python/pydtrace_arming.c): an int, in milliseconds.
WATCH_INTERVAL_SYMBOL = "_PyDTrace_WatchIntervalMs"


def watcher_delay(binary):
    """Seconds from attaching until the watched markers of binary (the
    interpreter, or libpython) fire: its watcher's poll interval, read
    from its ELF file, and WATCHER_MARGIN.  A binary without the symbol
    has no watcher to wait for: the margin only."""
    try:
        with open(binary, "rb") as f:
            elf = _elf.ElfFile(binary, f)
            symbol = elf.symbols().get(WATCH_INTERVAL_SYMBOL)
            if symbol is None or symbol.size != 4:
                return WATCHER_MARGIN
            interval = int.from_bytes(elf.read_vaddr(symbol.value, 4),
                                      "little", signed=True)
    except (OSError, _elf.ElfError) as error:
        raise Error("cannot read the watcher's interval: %s" % error) \
            from None
    return interval / 1000 + WATCHER_MARGIN


# Appended to a script: bpftrace attaches probes in the order of the
# program (BEGIN runs before any), so this one prints once the script's
# own are attached.
ATTACHED = "usdt.tools: attached"
ATTACHED_PROBE = """
interval:ms:20 /@usdt_tools_attached == 0/
{
	@usdt_tools_attached = 1;
	printf("%s\\n");
}
""" % ATTACHED


def target_args(args):
    if args.pid is not None:
        return ["-p", str(args.pid)]
    return ["-c", args.command]


# The tools whose markers a selection applies to (python -m usdt select):
# for them, -f selects the code in the interpreter, before any trap.
SELECTABLE = {"calls", "latency", "lines", "ccalls", "exceptions"}


def run_script(tool, args, extra):
    status, text = trace(tool, tool.script, args, extra,
                         select=tool.name in SELECTABLE)
    # -f before the cut: the entries asked for, even if few.  Filtered
    # here only when the selection did not take effect in the process.
    if args.filter and not args.selected:
        text = filter_output(text, args.filter)
    if tool.cuts:
        text = cut_maps(text, args.top, tool.cuts)
    write(args, text)
    return status


def trace(tool, script, args, extra, strlen=None, select=False,
          drop_flags=True, loops=False, batches=False):
    """Run the ready script *script* for *tool*: (bpftrace's status, its
    output without its warnings), after saying on stderr how many events
    a full map dropped.  strlen: what the script's header asks for, if
    not the tool's.  select: the script's markers take a selection, and
    -f (or its absence) is written as the process's selection
    (usdt._select); args.selected then says whether it took effect (an
    entry that -f does not select never fired).  select="everything":
    the markers take one, and the script needs every event.  drop_flags
    false: without the flags that make bpftrace report a full map (-k),
    whose checks make a program with long loops too large for the
    verifier; the caller checks its maps.  loops: the script's range
    loops are written as this version of bpftrace takes them
    (_bpftrace.Bpftrace.loops(), stack_config()).  batches: the script
    reads python:batch; when -d expires or at Ctrl-C, bpftrace stops
    after one more poll of the process's watcher, which hands over the
    partial buffers of every thread (a thread that blocks holds one)."""
    runner = _bpftrace.find()
    sys.stderr.write(_bpftrace.untested_note(runner))
    keys = args.map_keys or tool.keys
    env = runner.environ(strlen=strlen or tool.strlen, keys=keys)
    args.selected = False
    seq = None
    wanted = (args.filter or "") if select is True else ""
    if select and args.pid is not None:
        # Refused if another tracer's selection is in effect.
        try:
            seq = _select.claim(args.pid, wanted)
        except _select.Error as error:
            raise Error(str(error)) from None
    elif select and wanted:
        # bpftrace -c arms the markers before the command starts: the
        # interpreter takes the selection at start-up from its
        # environment (-X usdt_select's variable).
        try:
            _select.check_text(wanted)
        except _select.Error as error:
            raise Error(str(error)) from None
        env["PYTHONUSDTSELECT"] = wanted
        args.selected = True
    else:
        env.pop("PYTHONUSDTSELECT", None)
    with tempfile.TemporaryDirectory(prefix="usdt-tools") as tmp:
        output = os.path.join(tmp, "output")
        flags = runner.drop_flags() if drop_flags else []
        path = script_path(script)
        if loops:
            with open(path) as f:
                text = f.read()
            head, _, body = text.partition("\n")
            if not head.startswith("#!"):
                head, body = "", text
            path = os.path.join(tmp, "loops-" + script)
            with open(path, "w") as f:
                f.write(runner.stack_config() + runner.loops(body))
        if args.pid is not None:
            # Its output on a pipe, to see when it has attached.
            program = os.path.join(tmp, script)
            with open(path) as f:
                text = f.read()
            with open(program, "w") as f:
                f.write(text + ATTACHED_PROBE)
            cmd = [*flags, "-q", "-B", "none",
                   program, args.binary,
                   *extra, "-p", str(args.pid)]
        else:
            # Its output in a file: standard output is the command's.
            # bpftrace starts the command once it has attached.
            cmd = [*flags, "-q", "-o", output,
                   path, args.binary, *extra,
                   "-c", args.command]
        session = _bpftrace.Session(runner, cmd, env,
                                    detects_attach=args.pid is not None)
        traced_before = (_bpftrace.process_cpu(args.pid)
                         if batches and args.pid is not None else None)
        lines = []
        seen = {}
        if args.pid is not None:
            session.start(stdout=lambda pipe: collect_stdout(
                pipe, lines, session.attached), helpers=[
                    lambda session: watch_selection(
                        session, args.pid, seq, watcher_delay(args.binary),
                        seen)] if seq is not None and wanted else [])
        else:
            session.start(stdout=lambda pipe: _bpftrace.forward_stdout(
                pipe, sys.stdout.buffer, runner.exit_newlines))
        status = session.wait(
            args.duration,
            delay=watcher_delay(args.binary)
            if tool.watched and args.pid is not None else 0,
            announce="usdt.tools %s: tracing process %s; Ctrl-C prints "
            "the results\n" % (tool.name, args.pid)
            if args.pid is not None else None,
            drain=watcher_delay(args.binary) if batches else 0,
            drain_note="usdt.tools %s: %%g s more for the process's last "
            "batches (Ctrl-C again stops now)\n" % tool.name)
        if batches:
            report_cpu(tool, args, session, traced_before)
        text = "".join(lines)
        if args.pid is None and os.path.exists(output):
            with open(output, encoding="utf-8", errors="replace") as f:
                text = f.read()
    if seq is not None and wanted:
        args.selected = selection_took_effect(tool, args.pid, seq, seen)
    text = "".join(line for line in text.splitlines(keepends=True)
                   if line.rstrip("\n") != "@usdt_tools_attached: 1")
    text, dropped = drop_warnings(_bpftrace.normalize(text))
    dropped += session.noise.dropped
    # bpftrace 0.17 ends its output with empty lines.
    text = text.strip("\n") + "\n" if text.strip() else ""
    if dropped:
        sys.stderr.write("usdt.tools %s: %d events dropped: a map was full "
                         "(%s keys per map); give more with "
                         "--map-keys\n" % (tool.name, dropped, keys or 4096))
    return status, text


def report_cpu(tool, args, session, traced_before):
    """Say on stderr the CPU time that tracing took outside the traced
    process (bpftrace's, and this process's) beside the traced process's
    (of the -c command; with -p, while traced).  The BPF programs run in
    the traced process: their time is in its own."""
    if session.cpu is None:
        return
    own = resource.getrusage(resource.RUSAGE_SELF)
    mine = own.ru_utime + own.ru_stime
    bpftrace, children = session.cpu
    traced = None
    if args.pid is None:
        traced = children
    elif traced_before is not None:
        after = _bpftrace.process_cpu(args.pid)
        if after is not None:
            traced = after[0] - traced_before[0]
    sys.stderr.write(
        "usdt.tools %s: CPU time: the traced process %s; the tool %.2f s "
        "(bpftrace %.2f s, usdt.tools %.2f s)\n" % (
            tool.name, "%.2f s" % traced if traced is not None
            else "unknown (it has exited)", bpftrace + mine, bpftrace, mine))


def watch_selection(session, pid, seq, delay, seen):
    """A helper of *session*: once it has attached, wait until process pid
    has put the selection *seq* in effect (within *delay* seconds and
    one more), and keep its last state read in seen["state"]."""
    session.attached.wait()
    deadline = time.monotonic() + delay + 1
    try:
        with _select.Block(pid) as block:
            while True:
                seen["state"] = block.read()
                if (seen["state"]["applied_seq"] == seq
                        or time.monotonic() >= deadline):
                    return
                time.sleep(0.05)
    except _select.Error:
        return


def selection_took_effect(tool, pid, seq, seen):
    """Whether the selection *seq* written into process pid was put in
    effect (as watch_selection() saw it, or as the process says now); if
    not, says on stderr that -f filters the output instead."""
    state = seen.get("state")
    if state is None or state["applied_seq"] != seq:
        try:
            with _select.Block(pid) as block:
                state = block.read()
        except _select.Error as error:
            state = state or {"state": str(error), "applied_seq": None}
    if state["applied_seq"] == seq:
        return True
    sys.stderr.write("usdt.tools %s: -f did not select the code in the "
                     "process (its selection: %s): every event fired, and "
                     "-f kept the entries whose key contains the text\n"
                     % (tool.name, state["state"]))
    return False


# A line of callpaths.bt's maps: @map[path hash]: value.
CALLPATH_LINE = re.compile(r"^@(parent|file|name|line|own_ns)\[(-?\d+)\]: "
                           r"(.*)$")
COUNTER_LINE = re.compile(r"^@(collisions|too_deep): (\d+)$")


def fold_callpaths(text):
    """Folded stacks of callpaths.bt's output, weighted by own time in
    nanoseconds, frames as usdt.stacks names them ("name (file:line)",
    the line of the def); and its counters (collisions, too_deep)."""
    maps = collections.defaultdict(dict)
    counters = collections.Counter()
    for line in text.splitlines():
        match = CALLPATH_LINE.match(line)
        if match:
            name, key, value = match.groups()
            # bpftrace prints the 64-bit hashes as signed integers.
            key = int(key) & 0xffffffffffffffff
            if name in ("parent", "line", "own_ns"):
                value = int(value)
                if name == "parent":
                    value &= 0xffffffffffffffff
            maps[name][key] = value
            continue
        match = COUNTER_LINE.match(line)
        if match:
            counters[match.group(1)] += int(match.group(2))
    folded = collections.Counter()
    for path, ns in maps["own_ns"].items():
        if ns <= 0:
            continue
        frames = []
        while path and len(frames) <= 128:
            if path not in maps["parent"]:
                frames.append("[callers lost: a map was full]")
                break
            frames.append("%s (%s:%s)" % (
                maps["name"].get(path, "?"),
                maps["file"].get(path, "?"),
                maps["line"].get(path, "?")))
            path = maps["parent"][path]
        folded[";".join(frame.replace(";", ":")
                        for frame in reversed(frames))] += ns
    text = "".join("%s %d\n" % item for item in sorted(folded.items()))
    return text, counters


def draw(path, folded, where, empty, title):
    """The flame graph of the folded stacks *folded* in *path*; Error
    "EMPTY: nothing to draw" when there is no stack."""
    from usdt import flamegraph
    stacks = flamegraph.parse_folded(folded.splitlines(), where)
    if not stacks:
        raise Error("%s: nothing to draw" % empty)
    with open(path, "w") as f:
        f.write(flamegraph.render(flamegraph.build(stacks), title))


def callpaths_command(tool, args):
    """latency --folded/--svg: own wall time per call path."""
    # Every function, so that a path through the code that -f names keeps
    # its callers: no selection (and none of another tracer's).
    status, text = trace(tool, "callpaths.bt", args, [], strlen=200,
                         select="everything")
    folded, counters = fold_callpaths(text)
    if counters["collisions"]:
        raise Error("%d function entries had a call path hash that another "
                    "path has: the result would merge them; nothing drawn"
                    % counters["collisions"])
    if counters["too_deep"]:
        sys.stderr.write("usdt.tools latency: %d runs deeper than 128 levels "
                         "of nesting: their time counts as their caller's "
                         "own, at level 128\n" % counters["too_deep"])
    if status and not folded:
        return status
    if args.filter:
        folded = filter_stacks(folded, args.filter)
    if args.svg:
        draw(args.svg, folded, "<latency>", "no Python function returned "
             "while tracing", "Wall time by call path (ns)")
    # The frames' lines are the functions' first lines.
    write_profiles(args, folded, sample_types=(("wall", "nanoseconds"),),
                   start_lines=True)
    if args.folded or args.output:
        write(args, folded)
    return status


def calls_command(tool, args):
    """calls: the batches of python:batch (usdt._batch), or with
    --per-event top-functions.bt's function__entry hits."""
    return batch_command(
        tool, args, "one trap per call", "top-functions.bt", ["0"],
        lambda maps: _batch.format_calls(_batch.calls_by_function(maps), 0))


def latency_command(tool, args):
    """latency: the batches of python:batch (latency-batch.bt), or with
    --per-event latency.bt's function__entry and __return hits, printed
    alike.  latency.bt's keys hold two strings: 128 bytes (its header)."""
    return batch_command(
        tool, args, "two traps per call", "latency.bt", [args.order, "0"],
        lambda maps: _batch.format_latency(maps, args.order), strlen=128)


def batch_command(tool, args, traps, script, extra, output, strlen=None):
    """A tool that reads python:batch (tool.script, usdt._batch): its maps
    turned into text by output(maps); or with --per-event, or on a
    bpftrace that cannot load it (said on stderr, with *traps*), the
    per-event *script* with its parameters *extra* (N 0: it prints every
    entry, cut below after -f).  Either way -f is written as the
    process's selection (trace()): the interpreter records, and fires,
    only the selected code's events."""
    runner = _bpftrace.find()
    if not args.per_event and _batch.too_large_for(runner):
        sys.stderr.write("usdt.tools %s: bpftrace %s cannot load %s (the "
                         "verifier's limit): %s instead (--per-event)\n"
                         % (tool.name, runner, tool.script, traps))
        args.per_event = True
    if args.per_event:
        status, text = trace(tool, script, args, extra, strlen=strlen,
                             select=True)
    else:
        status, text = trace(tool, tool.script, args,
                             _batch.program_params(args.binary),
                             select=True, drop_flags=False, loops=True,
                             batches=True)
        maps, counters = _batch.parse(text)
        _batch.report(tool.name, counters,
                      keys=args.map_keys or tool.keys or 4096, maps=maps)
        text = output(maps)
    # -f before the cut, as run_script(): filtered here only when the
    # selection did not take effect in the process.
    if args.filter and not args.selected:
        text = filter_output(text, args.filter)
    text = cut_maps(text, args.top, tool.cuts)
    write(args, text)
    return status


# What --pprof and --speedscope write, by tool.
PROFILE_KINDS = {
    "profile": "CPU samples",
    "stacks": "stack counts",
    "alloc": "allocation samples (bytes)",
    "latency": "wall time by call path (with --folded or --svg)",
}


def write_profiles(args, folded, **kinds):
    """The --pprof and --speedscope files of args, of folded stacks."""
    if not (getattr(args, "pprof", None) or
            getattr(args, "speedscope", None)):
        return
    if not folded.strip():
        sys.stderr.write("usdt.tools %s: no stacks: --pprof and "
                         "--speedscope files not written\n" % args.tool)
        return
    profiles.write_profiles(folded, args.pprof, args.speedscope,
                            name="usdt.tools %s" % args.tool,
                            main_mapping=args.binary, **kinds)


def profile_kinds(args):
    """write_profiles()'s sample types for profile, stacks and alloc."""
    if args.tool == "profile":
        period = 10 ** 9 // args.hz
        return dict(sample_types=(("samples", "count"),
                                  ("cpu", "nanoseconds")),
                    scale=(1, period), period_type=("cpu", "nanoseconds"),
                    period=period)
    if args.tool == "alloc":
        # The bytes first: pprof's default (default_sample_type) and
        # speedscope's weights; then the objects (extra: the stack tool's
        # --also-folded-objects).
        prefix = "inuse" if args.live else "alloc"
        return dict(sample_types=((prefix + "_space", "bytes"),
                                  (prefix + "_objects", "count")),
                    default_type=prefix + "_space")
    return dict(sample_types=(("hits", "count"),))


def write(args, text):
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def stack_config(args, probe, **options):
    """The stack tool's Config for the tool that args name: *probe* in the
    process that args target, with the walker's limits that args give,
    and *options* (fields of Config)."""
    from usdt.stacks import Config
    for option in ("max_depth", "max_native"):
        if getattr(args, option, None) is not None:
            options[option] = getattr(args, option)
    return Config(probes=[probe], python=args.binary, pid=args.pid,
                  command=args.command, duration=args.duration, **options)


def run_stacks(args, config):
    """The stack tool's Result for *config*, traced in this process, or
    None when it failed (said why on stderr).  Ctrl-C (SIGINT) and
    SIGTERM stop its tracing, which it then counts; the handlers of this
    process are put back after it.  Imported here: the script tools and
    --help need none of the stack tool (nor its program.bt read).  With
    --pprof or --speedscope in args, their files are written of the same
    stacks."""
    from usdt.stacks import Error as StacksError, trace, output
    handlers = {signum: signal.getsignal(signum)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupt)
    try:
        result = trace(config)
    except StacksError as error:
        sys.stderr.write("usdt.stacks: %s\n" % error)
        return None
    except KeyboardInterrupt:
        # Before bpftrace started: nothing traced, nothing to count.
        return None
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    output.write_notes(result, sys.stderr, "usdt.stacks")
    if getattr(args, "pprof", None) or getattr(args, "speedscope", None):
        text = folded_text(result)
        if args.filter:
            text = filter_stacks(text, args.filter)
        kinds = profile_kinds(args)
        if result.objects is not None:
            counted = folded_text(result, objects=True)
            if args.filter:
                counted = filter_stacks(counted, args.filter)
            kinds["extra"] = counted
        elif "default_type" in kinds:
            # No objects counted: the bytes.
            kinds["sample_types"] = kinds["sample_types"][:1]
        write_profiles(args, text, **kinds)
    return result


def folded_text(result, objects=False):
    """The stacks of *result* folded (with *objects*, the objects each
    stack stands for)."""
    from usdt.stacks import output
    out = io.StringIO()
    if objects:
        output.write_folded_objects(result, out)
    else:
        output.write_folded(result, out)
    return out.getvalue()


def interrupt(signum, frame):
    """SIGTERM's handler while stacks are traced: stop tracing and print,
    as Ctrl-C does."""
    raise KeyboardInterrupt


def add_walker_limits(parser):
    """The options of the stack tool's limits, for a tool that runs it."""
    parser.add_argument("--max-depth", type=int, metavar="N",
                        help="Python frames kept per stack (default 64)")
    parser.add_argument("--max-entries", type=int, metavar="N",
                        help="no effect (usdt.stacks decodes the frames' "
                        "lines in user space, without a budget); "
                        "accepted for the scripts that give it")


def stacks_command(args):
    from usdt.stacks import output
    result = run_stacks(args, stack_config(args, args.probe,
                                           native=args.native))
    if result is None:
        return 2
    if args.json:
        rows = output.json_rows(result.stacks)
        if args.filter:
            rows = [row for row in rows
                    if any(args.filter in str(value)
                           for frame in row["frames"]
                           for value in frame.values())]
        text = json.dumps(rows, indent=1) + "\n"
    else:
        text = (folded_text(result) if args.folded
                else writer_text(output.write_counts, result))
        if args.filter:
            text = filter_stacks(text, args.filter)
    write(args, text)
    return result.status


def writer_text(writer, result):
    out = io.StringIO()
    writer(result, out)
    return out.getvalue()


def alloc_command(args):
    """Stacks of the sampled allocations, each weighted by its weight:
    the estimated bytes allocated there (alloc_space), or with --live
    those not freed when tracing stops (inuse_space; of the memory
    allocated since the tracer attached).  Printed as tables by line,
    function and file of the innermost Python frame, or per stack
    (--stacks), or folded."""
    from usdt.stacks import output
    config = stack_config(
        args, "usdt:PYTHON:otel_memory:alloc", weight="arg2", size="arg1",
        live=("arg0", "usdt:PYTHON:otel_memory:free", "arg0")
        if args.live else None)
    result = run_stacks(args, config)
    if result is None:
        return 2
    if args.folded or args.stacks:
        text = (folded_text(result) if args.folded
                else writer_text(output.write_counts, result))
        if args.filter:
            text = filter_stacks(text, args.filter)
        write(args, text)
        return result.status
    status = result.status
    rows = output.json_rows(result.stacks)
    text = ""
    tables = alloc_tables(rows, args.live, args.by, args.top, args.filter)
    write(args, text + tables)
    if args.live and args.command and not rows:
        sys.stderr.write("usdt.tools alloc: nothing was live when tracing "
                         "stopped: a -c command that exits frees what it "
                         "held; stop earlier with -d, or trace a running "
                         "process with -p\n")
    return status


ALLOC_KEYS = {
    "line": lambda frame: "%s:%s (%s)" % (
        frame["filename"], "?" if frame["line"] in (None, -1)
        else frame["line"], frame["name"]) if frame["filename"]
    else frame["name"],
    "function": lambda frame: "%s (%s)" % (frame["name"], frame["filename"])
    if frame["filename"] else frame["name"],
    "file": lambda frame: frame["filename"] or frame["name"],
}


def alloc_tables(rows, live, by, top, needle):
    """The tables of usdt.tools alloc: the stack tool's JSON rows (count =
    the weights of the stack's samples) summed by the innermost frame's
    line, function and file, the largest first."""
    what = ("Bytes still allocated when tracing stopped, of those "
            "allocated since it began" if live else "Bytes allocated")
    total = sum(row["count"] for row in rows)
    out = ["%s: %s (estimated from the otel_memory samples, in %d "
           "stacks).\n" % (what, format(total, ","), len(rows))]
    for name in (by,) if by else ("line", "function", "file"):
        sums = collections.Counter()
        for row in rows:
            key = ALLOC_KEYS[name](row["frames"][0]) if row["frames"] \
                else "[no frame]"
            sums[key] += row["count"]
        if needle:
            sums = collections.Counter(
                {key: value for key, value in sums.items() if needle in key})
        ranked = sorted(sums.items(), key=lambda item: (-item[1], item[0]))
        out.append("\nBy %s (innermost Python frame; %d of %d shown):\n"
                   % (name, min(top, len(ranked)), len(ranked)))
        out.append("%15s %7s  %s\n" % ("BYTES", "%", name.upper()))
        for key, value in ranked[:top]:
            out.append("%15s %6.1f%%  %s\n"
                       % (format(value, ","),
                          100.0 * value / total if total else 0.0, key))
    return "".join(out)


def profile_command(args):
    if args.pid is not None:
        where = "pid == %d" % args.pid
    else:
        where = "pid == cpid"
    result = run_stacks(args, stack_config(
        args, "profile:hz:%d" % args.hz, filter=where, native=args.native))
    if result is None:
        return 2
    status, text = result.status, folded_text(result)
    if args.filter:
        text = filter_stacks(text, args.filter)
    if args.svg:
        draw(args.svg, text, "<profile>", "no samples", "CPU profile")
    write(args, text)
    return status


EPILOG = """\
Every tool but flamegraph and list takes -p PID or -c CMD, and -d SECONDS,
-o FILE, -f TEXT: python -m usdt.tools TOOL --help.  [traced, CPU ×F on W]:
the traced process's CPU time over the same untraced, on bench workload W
(bench/tools.py; docs/tools-cost.md)."""


def measured_costs():
    """{tool: "CPU ×F on WORKLOAD, ..."} of usdt._tool_costs, which
    bench/tools.py writes from its measures: what tracing costs the
    process, by tool; {} without the module."""
    try:
        from usdt._tool_costs import COSTS
    except ImportError:
        return {}
    costs = collections.defaultdict(list)
    for tool, workload, slowdown in COSTS:
        name, _, option = tool.partition(" ")
        costs[name].append("%s×%.2f on %s" % (option + " " if option else "",
                                               slowdown, workload))
    return {name: "traced, CPU " + ", ".join(texts)
            for name, texts in costs.items()}


# What --top cuts, by tool, in its --help.
TOP_MAPS = {
    "calls": "the most called",
    "latency": "the largest; @ns shows every function",
    "lines": "the most run",
    "exceptions": "the most frequent",
    "ccalls": "the largest; @ns shows every callable, @latency_ns one "
    "histogram",
}


def add_target(parser, required=True):
    target = parser.add_mutually_exclusive_group(required=required)
    target.add_argument("-p", dest="pid", type=int, metavar="PID",
                        help="trace process PID (until Ctrl-C, or -d)")
    target.add_argument("-c", dest="command", metavar="CMD",
                        help="run CMD and trace it (split on spaces)")
    parser.add_argument("-d", dest="duration", type=float,
                        metavar="SECONDS",
                        help="stop after SECONDS, and print the results")
    parser.add_argument("-o", dest="output", metavar="FILE",
                        help="write the results to FILE")
    parser.add_argument("-f", dest="filter", metavar="TEXT",
                        help="calls, latency, lines, ccalls, exceptions: "
                        "only the code whose file name, name or qualified "
                        "name contains TEXT (a dotted module name selects "
                        "its files), selected in the process before any "
                        "trap (ccalls: the C calls it makes; latency "
                        "--folded/--svg: the call paths through it, "
                        "filtered after); the other tools: the entries "
                        "whose key contains TEXT (stacks: a frame)")
    parser.add_argument("-v", dest="verbose", action="store_true",
                        help="name the bpftrace used and its version, and "
                        "show the warnings of it that are known to be "
                        "harmless (left out, and counted, without -v)")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m usdt.tools",
        description="Trace a Python process of this interpreter: one tool "
        "per question, the same options for all.",
        epilog=EPILOG, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="tool", metavar="TOOL",
                                     required=True)
    costs = measured_costs()
    for tool in TOOLS:
        question = tool.question
        if tool.name in costs:
            question += " [%s]" % costs[tool.name]
        sub = commands.add_parser(tool.name, help=question,
                                  description=question)
        if tool.name == "flamegraph":
            sub.add_argument("rest", nargs=argparse.REMAINDER,
                             help="the options of python -m usdt.flamegraph")
            continue
        if tool.name == "list":
            sub.add_argument("rest", nargs=argparse.REMAINDER,
                             help="the options of python -m usdt list")
            continue
        add_target(sub)
        if tool.script:
            sub.add_argument("--map-keys", type=int, metavar="N",
                             help="keys per map (default %d)"
                             % (tool.keys or 4096))
        if tool.cuts:
            sub.add_argument("--top", type=int, default=20, metavar="N",
                             help="entries shown per map, %s; 0: every one "
                             "(default %%(default)s)" % TOP_MAPS[tool.name])
        if tool.name == "latency":
            sub.add_argument("--order", choices=["inclusive", "exclusive"],
                             default="inclusive",
                             help="which time comes last (default "
                             "%(default)s)")
            sub.add_argument("--folded", action="store_true",
                             help="instead, the own wall time (ns) of each "
                             "function per call path, folded, for "
                             "flamegraph (callpaths.bt)")
            sub.add_argument("--svg", metavar="FILE",
                             help="instead, draw that time as a flame "
                             "graph in FILE (-o also writes the folded "
                             "stacks)")
            sub.add_argument("--per-event", action="store_true",
                             help="two traps per call (latency.bt, "
                             "function__entry and __return) instead of one "
                             "per batch of calls (latency-batch.bt, "
                             "python:batch)")
        elif tool.name == "calls":
            sub.add_argument("--per-event", action="store_true",
                             help="one trap per call (top-functions.bt, "
                             "function__entry) instead of one per batch "
                             "of calls (calls-batch.bt, python:batch)")
        elif tool.name == "ccalls":
            sub.add_argument("--histogram", nargs=2,
                             metavar=("MODULE", "FUNCNAME"),
                             help="the histogram of this C function")
        elif tool.name == "stacks":
            sub.add_argument("--probe", required=True,
                             help="the bpftrace probe; PYTHON stands for "
                             "the interpreter (usdt:PYTHON:python:"
                             "gc__start)")
            form = sub.add_mutually_exclusive_group()
            form.add_argument("--folded", action="store_true",
                              help="folded stacks, for flamegraph")
            form.add_argument("--json", action="store_true",
                              help="the counts as JSON")
            sub.add_argument("--native", action="store_true",
                             help="whole stacks: the native frames, each "
                             "activation of the evaluator replaced by the "
                             "Python frames it runs")
            add_walker_limits(sub)
            sub.add_argument("--max-native", type=int, metavar="N",
                             help="native frames kept per stack with "
                             "--native (default 128)")
        elif tool.name == "alloc":
            sub.add_argument("--live", action="store_true",
                             help="the bytes still allocated when tracing "
                             "stops (of those allocated since it began)")
            sub.add_argument("--by", choices=["line", "function", "file"],
                             help="only this table (default: all three)")
            sub.add_argument("--top", type=int, default=20, metavar="N",
                             help="rows per table (default %(default)s)")
            add_walker_limits(sub)
            form = sub.add_mutually_exclusive_group()
            form.add_argument("--stacks", action="store_true",
                              help="instead, the bytes per Python stack")
            form.add_argument("--folded", action="store_true",
                              help="instead, folded stacks, for flamegraph")
        elif tool.name == "profile":
            sub.add_argument("--hz", type=int, default=49,
                             help="samples per second and CPU (default "
                             "%(default)s)")
            sub.add_argument("--svg", metavar="FILE",
                             help="also draw the flame graph in FILE")
            add_walker_limits(sub)
            sub.add_argument("--native", action="store_true",
                             help="whole stacks: the native frames, each "
                             "activation of the evaluator replaced by the "
                             "Python frames it runs (as stacks --native)")
            sub.add_argument("--max-native", type=int, metavar="N",
                             help="native frames kept per stack with "
                             "--native (default 128)")
        if tool.name in PROFILE_KINDS:
            sub.add_argument("--pprof", metavar="FILE",
                             help="also write the %s as a gzipped pprof "
                             "profile (go tool pprof, Pyroscope, Parca)"
                             % PROFILE_KINDS[tool.name])
            sub.add_argument("--speedscope", metavar="FILE",
                             help="also write it as a speedscope file "
                             "(https://www.speedscope.app)")
    args = parser.parse_args(argv)
    tool = BY_NAME[args.tool]
    if getattr(args, "verbose", False):
        _bpftrace.set_verbose()
    try:
        return run_tool(tool, args)
    except Error as error:
        sys.stderr.write("usdt.tools %s: %s\n" % (tool.name, error))
        return 2
    finally:
        sys.stderr.write(_bpftrace.left_out_note("usdt.tools " + tool.name))


def run_tool(tool, args):
    """Run the tool that args name; its status."""
    if tool.name == "flamegraph":
        from usdt import flamegraph
        return flamegraph.main(args.rest)
    if tool.name == "list":
        from usdt import __main__ as lister
        return lister.main(["list", *args.rest])
    for option in ("pprof", "speedscope"):
        path = getattr(args, option, None)
        if path:
            # Refused now, not after the tracing.
            try:
                profiles.check_writable(path, "--" + option)
            except profiles.Error as error:
                raise Error(str(error)) from None
    if tool.name == "latency" and (args.pprof or args.speedscope) and not (
            args.folded or args.svg):
        raise Error("--pprof and --speedscope write the wall time by call "
                    "path: give them with --folded or --svg")
    args.binary = traced_binary()
    if args.pid is not None:
        check_pid(args.pid, args.binary)
    if tool.name == "stacks":
        return stacks_command(args)
    if tool.name == "alloc":
        return alloc_command(args)
    if tool.name == "profile":
        return profile_command(args)
    if getattr(args, "top", 0) < 0:
        raise Error("--top takes 0 (every entry) or more")
    if tool.name == "calls":
        return calls_command(tool, args)
    # N 0: the script prints every entry, which run_script cuts after -f.
    extra = []
    if tool.name == "latency":
        if args.folded or args.svg:
            return callpaths_command(tool, args)
        return latency_command(tool, args)
    elif tool.name == "ccalls":
        # An empty MODULE and FUNCNAME: the histogram of every callable.
        extra = [*(args.histogram or ["", ""]), "0"]
    return run_script(tool, args, extra)


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # SIGINT stops tracing and prints (Ctrl-C, kill -INT): also in a
    # process that was started with it ignored, as a shell script starts
    # its background jobs, where Python would leave it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
