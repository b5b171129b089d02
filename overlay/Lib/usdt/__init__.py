"""USDT probes defined by Python code at run time.

    import usdt
    start = usdt.Probe("myapp", "request__start", (str, int))
    if start:                   # true only while a tracer has armed it
        start(path, status)     # fires the probe with these arguments

    @usdt.traced("myapp")       # myapp:handle__entry, myapp:handle__return
    def handle(request): ...

Tracers see these probes as ordinary USDT markers with semaphores, in a
small ELF object this module writes and loads for them; Probe.path is the
file to attach to:

    bpftrace -p PID -e 'usdt:PATH:myapp:request__start
        { printf("%s %d\\n", str(arg0), arg1); }'

``python -m usdt list [PID]`` prints the probes of a process with their
paths.  x86-64 Linux only.
"""

from _usdt import MAX_ARGS, Probe, TracedFunction, traced

__all__ = ["Probe", "traced", "TracedFunction", "MAX_ARGS"]
