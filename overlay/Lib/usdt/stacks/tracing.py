"""Running bpftrace: its records split from the -c command's output as
they come, the code objects they name read while it traces (follow()), and
the hold that keeps a -c command's code objects readable at its exit
(ExitHold)."""

import dataclasses
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import time

from .. import _bpftrace
from .._bpftrace import Error
from .offsets import DEFAULT_STRLEN, RECORD
from .program import hold, program, program_maps
from .records import CodeReader, Kind, frame_keys
from .native import Symbolizer


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

# The start of the records that split_records() and follow() look for.
BEGIN_RECORD, FRAMES_RECORD, MAIN_DONE_RECORD = (
    ("%s %s " % (RECORD, kind)).encode()
    for kind in (Kind.BEGIN, Kind.FRAMES, Kind.MAIN_DONE))

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
                            BEGIN_RECORD):
                        attached.set()
            text = b"".join(rest)
            if text:
                command.write(text)
            if not chunk:
                break
    records.put(None)


def refusal_advice(interp, args, probes, runner):
    """What to do when the kernel refused the program: with while loops
    (bpftrace before 0.24), whose every turn the verifier walks, the
    largest lower depths that load, found by loading the program with
    them; with range loops (bpf_loop(), whose body the verifier walks
    once whatever the bound), lower depths change nothing."""
    report = ("the program and the verifier's figures are printed by "
              "python -m usdt.stacks with the same options and "
              "--print-program, or --verifier-stats")
    if runner.range_loops:
        return ("lower --max-depth or --max-native would not help: this "
                "bpftrace's loops are bpf_loop() calls, which the "
                "verifier walks once whatever their bounds; %s" % report)
    native = getattr(args, "native", False)
    tries = []
    depth, frames = args.max_depth, args.max_native
    while depth > 8 or (native and frames > 8):
        if native and frames > 8:
            frames //= 2
        else:
            depth //= 2
        tries.append((depth, frames))
    for depth, frames in tries:
        lower = dataclasses.replace(args, max_depth=depth,
                                    max_native=frames, hold=False)
        stats, errors, status = runner.verify(
            program(interp, lower, probes, runner))
        if status == 0 and not _bpftrace.refusal(errors):
            options = "--max-depth %d" % depth
            if native:
                options += " --max-native %d" % frames
            return "it loads with %s (checked just now)" % options
    return ("no lower --max-depth or --max-native loads either; %s"
            % report)


def run_bpftrace(text, args, runner, interp, probes=()):
    """Run the program *text* with the bpftrace *runner* (main()'s, which
    wrote the program for it), reading the code objects of its frames as
    their records come (follow())."""
    interp_path = interp.path
    sys.stderr.write(_bpftrace.untested_note(runner))
    env = runner.environ(strlen=DEFAULT_STRLEN)  # no strings in the program
    if args.save:
        output = args.save
    else:
        # Not in the temporary directory: kept should the counting fail,
        # for --read (main() removes it once the counts are printed).
        fd, output = tempfile.mkstemp(prefix="usdt-stacks-records-",
                                      suffix=".txt")
        os.close(fd)
    with tempfile.TemporaryDirectory(prefix="usdt-stacks") as tmp:
        script = os.path.join(tmp, "stacks.bt")
        with open(script, "w") as f:
            f.write(text)
        # The records on bpftrace's stdout, a line per write(): with -o,
        # bpftrace 0.17 keeps its output file's records buffered until it
        # ends, when the process whose code objects they name is gone.
        # split_records() takes them out of the -c command's output.
        cmd = ["-q", "-B", "line", script]
        if hold(interp, args):
            # signal() (HOLD_CLAUSE)
            cmd.insert(0, "--unsafe")
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
        session = _bpftrace.Session(runner, cmd, env)
        helpers = []
        if args.pid is not None and not target:
            helpers.append(lambda session: session.stop_when_gone(args.pid))
        symbolizer = None
        if args.native:
            symbolizer = Symbolizer(interp_path)
            helpers.append(lambda session: watch_mappings(
                session, args.pid, symbolizer, interp_path))
        records = queue.SimpleQueue()
        command_out, command_in = os.pipe()
        codes = CodeReader(interp, args.co_name, args.strlen)
        with open(command_out, "rb") as command_output:
            session.start(
                stdout=lambda pipe: split_records(
                    pipe, command_in, output, records, session.attached),
                workers=[
                    # Without -o, bpftrace ends its stdout with two empty
                    # lines (0.17, 0.23 and 0.27 seen; with -o, 0.27 does
                    # not).
                    lambda: _bpftrace.forward_stdout(
                        command_output, sys.stdout.buffer,
                        stdout_exit_newlines(text, runner)),
                    # ptrace's requests all come from its thread.
                    lambda: follow(session, records, codes, interp_path,
                                   hold(interp, args))],
                helpers=helpers)
            status = session.wait(getattr(args, "duration", None))
        codes.close()
        if args.save:
            # What was read of the code objects, for --read.
            with open(output, "a", encoding="utf-8") as f:
                f.writelines(codes.saved())
        lines = []
        if os.path.exists(output):
            with open(output, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        if status != 0 and not any(line.startswith(RECORD)
                                   for line in lines):
            if not args.save:
                os.unlink(output)
            errors = "".join(session.errors).strip()
            refused = _bpftrace.refusal(errors)
            if refused:
                errors += "\n(%s; %s)" % (refused, refusal_advice(
                    interp, args, probes, runner))
            raise Error("bpftrace failed (exit %d): %s"
                        % (status, errors or "no error message"))
        return lines, status, output, symbolizer, codes


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
    usdt.stacks reads the code objects of its last records.

    Why: a -c command may end a few milliseconds after its last hit,
    before usdt.stacks has even seen that hit's records, and the
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
            if line.startswith(FRAMES_RECORD):
                for _, pid, key, _, _ in frame_keys(line.decode().split()):
                    if not codes.resolve(pid, key):
                        pending.add((pid, key))
            elif line.startswith(MAIN_DONE_RECORD):
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
