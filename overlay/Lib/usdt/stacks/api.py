"""The stack tool as a library: Config says what to trace, trace() runs
bpftrace and returns a Result, read() counts a saved run; the writers of
output.py (write_counts(), write_folded(), write_json()) print a Result.
The command line (cli.py) and python -m usdt.tools are thin layers over
it.

    from usdt.stacks import Config, trace, write_folded
    result = trace(Config(probes=["profile:hz:99"], pid=1234,
                          duration=5))
    write_folded(result, sys.stdout)
"""

import collections
import dataclasses
import os
import signal
import sys
import typing

from .. import _bpftrace
from .._bpftrace import Error
from .offsets import (DEFAULT_MAX_DEPTH, DEFAULT_MAX_NATIVE, DEFAULT_STRLEN,
                      RECORD, Interpreter)
from .program import Libc, program
from .records import CodeReader
from .native import NativeFrame, Symbolizer
from .output import parse
from .tracing import expand_probe, resolve_python, run_bpftrace


@dataclasses.dataclass
class Config:
    """What to trace and how.  The fields are those of the command line's
    options (python -m usdt.stacks --help says what each one does):
    probes are bpftrace probes, where a path field PYTHON stands for the
    interpreter; command (-c) or pid (-p) is the target; live is
    (KEY, RELEASE, RELEASE_KEY) or None."""

    probes: typing.List[str] = dataclasses.field(default_factory=list)
    command: typing.Optional[str] = None
    pid: typing.Optional[int] = None
    python: typing.Optional[str] = None
    weight: str = "1"
    size: typing.Optional[str] = None
    live: typing.Optional[typing.Tuple[str, str, str]] = None
    filter: typing.Optional[str] = None
    co_name: bool = False
    native: bool = False
    max_native: int = DEFAULT_MAX_NATIVE
    max_depth: int = DEFAULT_MAX_DEPTH
    max_threads: int = 64
    strlen: int = DEFAULT_STRLEN
    duration: typing.Optional[float] = None
    save: typing.Optional[str] = None
    # Whether the program stops a -c command at the end of its main
    # module, until the code objects of its last records are read
    # (tracing.ExitHold): false for a program that is only loaded
    # (--verifier-stats), whose command nothing would resume.
    hold: bool = True
    # Set by prepare() on its copy, never by a caller: libc's call-frame
    # rules with native (program.Libc), read before tracing.
    libc: typing.Any = dataclasses.field(default=None, repr=False)

    def check(self):
        """Error saying what is wrong with this configuration, if
        anything."""
        if not self.probes:
            raise Error("give a probe to trace (--probe)")
        if self.command is not None and self.pid is not None:
            raise Error("give -c CMD or -p PID, not both")
        if not 1 <= self.max_depth <= 512:
            raise Error("--max-depth must be 1 to 512")
        if not 1 <= self.max_native <= 1024:
            raise Error("--max-native must be 1 to 1024")
        if self.strlen < 2:
            raise Error("--strlen must be 2 or more")
        if self.duration is not None and not self.duration > 0:
            raise Error("--duration must be more than 0 seconds")
        if self.live is not None and len(self.live) != 3:
            raise Error("live is (KEY, RELEASE, RELEASE_KEY)")


@dataclasses.dataclass
class Result:
    """The stacks counted: stacks, a Counter of stacks (tuples of frames,
    innermost first: records.Frame, and native.NativeFrame with
    --native) by weight; objects, with Config.size, the objects that each
    stack's hits stand for; notes, {what was lost or could not be read:
    how many}; status, bpftrace's exit status; records, the file of the
    run's records, kept with Config.save, else None."""

    stacks: collections.Counter
    objects: typing.Optional[collections.Counter]
    notes: collections.Counter
    native: bool
    status: int = 0
    records: typing.Optional[str] = None


@dataclasses.dataclass
class Prepared:
    """What trace() reads of the interpreter and the machine before it
    traces: the Config with the interpreter's path put in its probes,
    the interpreter, the bpftrace runner, and the program."""

    config: Config
    interp: Interpreter
    probes: typing.List[str]
    runner: typing.Any
    text: str


def prepare(config, runner=None, tracefs=True):
    """A Prepared of *config*, which is left unchanged: the program for
    *runner* (the bpftrace on PATH by default; None for the program of no
    particular version, when none is found and tracefs is false)."""
    config.check()
    interp = Interpreter(resolve_python(config))
    probes = [expand_probe(p, interp.path) for p in config.probes]
    live = config.live
    if live:
        live = (live[0], expand_probe(live[1], interp.path), live[2])
    config = dataclasses.replace(config, probes=probes, live=live)
    if runner is None:
        try:
            runner = _bpftrace.find(tracefs=tracefs)
        except Error:
            if tracefs:
                raise
    config.libc = Libc.find(config) if config.native else None
    return Prepared(config, interp, probes, runner,
                    program(interp, config, probes, runner))


def trace(config, runner=None):
    """Run the program of *config* with bpftrace until the command ends,
    the process ends, Config.duration passes or Ctrl-C (KeyboardInterrupt,
    raised by SIGINT or SIGTERM); the Result.  Error when bpftrace
    fails (with its message and, if the kernel refused the program, what
    would help)."""
    prepared = config if isinstance(config, Prepared) else prepare(
        config, runner)
    config = prepared.config
    lines, status, records, symbolizer, codes = run_bpftrace(
        prepared.text, config, prepared.runner, prepared.interp,
        prepared.probes)
    # bpftrace has stopped: a second Ctrl-C must not lose the counts
    # being made.
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = count(lines, config, codes, symbolizer)
    except BaseException:
        sys.stderr.write("usdt.stacks: the records of this run are in %s: "
                         "count them again with --read %s\n"
                         % (records, records))
        raise
    finally:
        signal.signal(signal.SIGINT, handler)
    result.status = status
    if config.save:
        result.records = records
    else:
        os.unlink(records)
    return result


def read(path, config=None):
    """The Result of the records of a saved run (Config.save, bpftrace -o
    FILE); *config* gives how to name them (co_name, strlen, python for
    the interpreter's native frames, live, size, max_native)."""
    config = dataclasses.replace(config or Config())
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    # This machine's libc, for the windows of the stack copied at hits in
    # libc, if there are any (unwind_window() takes it only if its build
    # ID is the one recorded).
    config.libc = Libc.find(config) if any(
        line.startswith(RECORD + " W ") for line in lines) else None
    return count(lines, config, CodeReader(None, config.co_name,
                                           config.strlen),
                 Symbolizer(os.path.realpath(config.python))
                 if config.python else None)


def count(lines, config, codes, symbolizer):
    objects = collections.Counter() if config.size else None
    stacks, notes = parse(lines, codes, symbolizer, config.max_native,
                          live=bool(config.live), objects=objects,
                          libc=config.libc)
    native = config.native or any(
        isinstance(frame, NativeFrame) for stack in stacks for frame in stack)
    return Result(stacks, objects, notes, native)
