"""python -m usdt list [--all] [PID ...]: the USDT probes of processes.

For each process, the probes in the ELF files it has mapped (read from
/proc/PID/maps and the files' .note.stapsdt sections), one per line,
after a header line that names the fields:

    PID PROVIDER:NAME SEMAPHORE PATH ARGUMENTS

SEMAPHORE is the probe's semaphore in the process (how many tracers arm
it; "-" for a probe without one, "?" when the process's memory cannot be
read).  PATH is the file a tracer attaches to, as in

    bpftrace -p PID -e 'usdt:PATH:PROVIDER:NAME { ... }'

For a file that is gone (a forked child's probes, once the parent that
made them has exited), PATH is /proc/PID/map_files/..., which bpftrace
0.17 resolves only without -p:

    bpftrace -e 'usdt:PATH:PROVIDER:NAME /pid == PID/ { ... }'

ARGUMENTS is the note's argument string (-8@%rdi: a signed 64-bit int in
rdi; 8@%rsi: a pointer).  By default only the probes that Python code
defined with the usdt module are listed; --all adds every other probe of
the mapped files (the interpreter's python:*, libc's...).  Without a PID,
every process that has usdt module probes is listed.
"""

import argparse
import os
import re
import sys

from ._elf import PT_LOAD, ElfError, ElfFile

# The files the usdt module writes: see Modules/_usdt/sites.c.
MODULE_FILE = re.compile(r"/python-usdt-\d+-[^/]+/\d+-[^/]+\.so$")


class Probe:
    __slots__ = ("provider", "name", "arguments", "semaphore", "path")

    def __init__(self, provider, name, arguments, semaphore, path):
        self.provider = provider
        self.name = name
        self.arguments = arguments
        self.semaphore = semaphore      # its address in the file, or 0
        self.path = path


def read_notes(f, path):
    """The stapsdt probes of the ELF file open as f, and its PT_LOAD
    segments as (vaddr, offset, filesz); ([], []) for anything but a
    64-bit little-endian ELF file, or a damaged one."""
    try:
        elf = ElfFile(path, f)
        probes = [Probe(probe.provider, probe.name, probe.arguments,
                        probe.semaphore, path)
                  for probe in elf.stapsdt_probes()]
    except ElfError:
        return [], []
    segments = [(segment.vaddr, segment.offset, segment.filesz)
                for segment in elf.segments if segment.type == PT_LOAD]
    return probes, segments


class Mapping:
    __slots__ = ("start", "end", "perms", "offset", "file", "path")

    def __init__(self, line):
        fields = line.split(None, 5)
        start, end = fields[0].split("-")
        self.start = int(start, 16)
        self.end = int(end, 16)
        self.perms = fields[1]
        self.offset = int(fields[2], 16)
        # A file is its device and inode: inode numbers repeat across
        # file systems.
        self.file = (fields[3], int(fields[4]))
        self.path = fields[5].rstrip("\n") if len(fields) == 6 else ""


def mappings(pid):
    with open("/proc/%d/maps" % pid) as f:
        return [Mapping(line) for line in f]


def attach_path(pid, mapping):
    """The path of a mapped file that a tracer can open: its own, or, for a
    deleted file (one whose creator has exited, as seen from a forked
    child), the process's /proc/PID/map_files/ link to it."""
    if mapping.path.endswith(" (deleted)"):
        return "/proc/%d/map_files/%x-%x" % (pid, mapping.start, mapping.end)
    return mapping.path


def writable_address(maps, file, segments, address):
    """Where the data at *address* (an address in the file *file*, of
    PT_LOAD segments *segments*) is in the process, in a writable mapping
    of the file; None if it is not mapped so."""
    for vaddr, offset, filesz in segments:
        if vaddr <= address < vaddr + filesz:
            file_offset = address - vaddr + offset
            break
    else:
        return None
    for m in maps:
        if (m.file == file and "w" in m.perms
                and m.offset <= file_offset < m.offset + m.end - m.start):
            return m.start + file_offset - m.offset
    return None


def semaphore_value(mem, maps, file, segments, semaphore):
    """The semaphore at *semaphore* (an address in the file) in the process,
    or "?" if it cannot be read."""
    address = writable_address(maps, file, segments, semaphore)
    if address is None or mem is None:
        return "?"
    try:
        mem.seek(address)
        return str(int.from_bytes(mem.read(2), sys.byteorder))
    except OSError:
        return "?"


def process_probes(pid, everything):
    """[(probe, semaphore value, path)] of process pid."""
    maps = mappings(pid)
    try:
        mem = open("/proc/%d/mem" % pid, "rb", buffering=0)
    except OSError:
        mem = None
    found = []
    seen = set()
    try:
        for m in maps:
            if not m.path.startswith("/") or m.file in seen:
                continue
            if not everything and not MODULE_FILE.search(
                    m.path.removesuffix(" (deleted)")):
                continue
            seen.add(m.file)
            path = attach_path(pid, m)
            try:
                with open("/proc/%d/map_files/%x-%x" % (pid, m.start, m.end),
                          "rb") as f:
                    probes, segments = read_notes(f, path)
            except OSError:
                try:
                    with open(path, "rb") as f:
                        probes, segments = read_notes(f, path)
                except OSError:
                    continue
            for probe in probes:
                value = ("-" if not probe.semaphore else
                         semaphore_value(mem, maps, m.file, segments,
                                         probe.semaphore))
                found.append((probe, value))
    finally:
        if mem is not None:
            mem.close()
    return found


def module_pids():
    """The processes whose maps name a usdt module file."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/maps" % entry) as f:
                if any(MODULE_FILE.search(line.rstrip("\n").removesuffix(
                        " (deleted)")) for line in f):
                    pids.append(int(entry))
        except OSError:
            continue
    return sorted(pids)


HEADER = "PID PROVIDER:NAME SEMAPHORE PATH ARGUMENTS"


def list_command(args):
    status = 0
    if args.pid:
        pids = args.pid
    else:
        pids = module_pids()
        if not pids:
            print("usdt list: no process has probes defined with the usdt "
                  "module", file=sys.stderr)
    header = HEADER
    for pid in pids:
        try:
            probes = process_probes(pid, args.all)
        except FileNotFoundError:
            print("usdt list: no process %d" % pid, file=sys.stderr)
            status = 1
            continue
        except PermissionError as e:
            print("usdt list: cannot read the mappings of process %d (%s): "
                  "run as its user or as root" % (pid, e.strerror),
                  file=sys.stderr)
            status = 1
            continue
        probes.sort(key=lambda found: (found[0].provider, found[0].name,
                                       found[0].path))
        if not probes:
            print("usdt list: process %d has no %s" % (
                pid, "probes" if args.all else "probes defined with the "
                "usdt module (--all lists the others)"), file=sys.stderr)
            continue
        if header:
            print(header)
            header = None
        for probe, value in probes:
            fields = [str(pid), "%s:%s" % (probe.provider, probe.name), value,
                      probe.path]
            if probe.arguments:
                fields.append(probe.arguments)
            print(" ".join(fields))
    return status


SELECT_HELP = """\
Select which code fires the probes of functions, lines, C calls and
exceptions in process PID (python:function__entry/return, line,
cfunction__entry/return, exception__*): only the code objects whose file
name, name or qualified name contains TEXT, or for a TEXT with dots, whose
file name contains it with the dots as slashes (a dotted module name).
Every other code object then runs as if nothing were attached.

The selection takes effect when those probes are armed (attach your
bpftrace or DTrace script within a minute), and ends when they are
disarmed.  Without TEXT, prints the process's selection and its state;
--clear selects everything.  A selection in effect for another tracer is
refused with a different TEXT.  docs/selection.md has the contract.
"""


def select_command(args):
    from . import _select
    try:
        if args.text is None and not args.clear:
            with _select.Block(args.pid) as block:
                now = block.read()
            print("process %d: %s%s" % (
                args.pid, now["state"],
                " %r" % now["text"] if now["text"] else ""))
            return 0
        text = "" if args.clear else args.text
        seq = _select.claim(args.pid, text)
        with _select.Block(args.pid) as block:
            now = block.wait_seen(seq, args.wait)
    except _select.Error as error:
        print("usdt select: %s" % error, file=sys.stderr)
        return 2
    if now is None:
        print("usdt select: process %d has not read the selection within "
              "%g s (is its watcher off, -X dtrace_watch=0?)"
              % (args.pid, args.wait), file=sys.stderr)
        return 1
    print("process %d: %s%s" % (args.pid, now["state"],
                                " %r" % text if text else ""))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m usdt",
        description="Inspect the USDT probes of running processes.")
    commands = parser.add_subparsers(dest="command", required=True)
    lister = commands.add_parser(
        "list", help="print the probes of processes",
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    lister.add_argument("pid", nargs="*", type=int,
                        help="processes (default: every process with probes "
                             "defined by the usdt module)")
    lister.add_argument("--all", action="store_true",
                        help="also the probes of the other mapped files "
                             "(the interpreter's, libc's...)")
    selector = commands.add_parser(
        "select", help="select the code whose events fire the probes",
        description=SELECT_HELP,
        formatter_class=argparse.RawTextHelpFormatter)
    selector.add_argument("-p", dest="pid", type=int, required=True,
                          metavar="PID", help="the process")
    what = selector.add_mutually_exclusive_group()
    what.add_argument("text", nargs="?", metavar="TEXT",
                      help="the text that selects code")
    what.add_argument("--clear", action="store_true",
                      help="select everything")
    selector.add_argument("--wait", type=float, default=3.0,
                          metavar="SECONDS",
                          help="how long to wait for the process to read "
                               "it (default %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "select":
        return select_command(args)
    return list_command(args)


if __name__ == "__main__":
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (| head): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 0
    sys.exit(status)
