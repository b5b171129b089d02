"""USDT probes defined by Python code at run time.

    import usdt
    start = usdt.Probe("myapp", "request__start", (str, int))
    if start:                   # true only while a tracer has armed it
        start(path, status)     # fires the probe with these arguments

    @usdt.traced("myapp")       # myapp:handle__entry, myapp:handle__return
    def handle(request): ...

Argument types are int (signed 64-bit), str (passed as UTF-8, a lone
surrogate as '?') and bytes (a pointer to the bytes), at most 6.  A call
with a wrong count or type raises TypeError, an int outside 64 bits
OverflowError.  A traced function fires NAME__entry() before each call and
NAME__return(raised) after it (raised: 1 if it raised, else 0).

Tracers see these probes as ordinary USDT markers with semaphores, in a
small ELF object this module writes and loads for them; Probe.path is the
file to attach to (with -p, bpftrace also accepts * for it):

    bpftrace -p PID -e 'usdt:PATH:myapp:request__start
        { printf("%s %d\\n", str(arg0), (int64)arg1); }'

``python -m usdt list [PID]`` prints the probes of a process with their
paths.  x86-64 Linux only; see docs/usdt-module.md in cpython-usdt.
"""

__all__ = ["Probe", "traced", "TracedFunction", "MAX_ARGS"]

try:
    from _usdt import MAX_ARGS, Probe, TracedFunction, traced
except ImportError as error:
    # Another Python, running the tracing tools of this package by their
    # path (python3 LIBDIR/usdt/stacks): they need none of this, and the
    # names say why they are missing when used.
    _missing = error

    def __getattr__(name):
        if name in __all__:
            raise ImportError("usdt.%s needs the _usdt module of "
                              "cpython-usdt's interpreter: %s"
                              % (name, _missing), name=name)
        raise AttributeError("module 'usdt' has no attribute %r" % name)
