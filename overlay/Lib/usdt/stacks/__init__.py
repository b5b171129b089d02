"""usdt.stacks: the Python stacks of the threads that hit a bpftrace probe.

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

    python -m usdt.stacks --probe PROBE -c "PYTHON script.py"  # counts
    python -m usdt.stacks --probe PROBE -p PID --folded   # then Ctrl-C
    python -m usdt.stacks --probe PROBE --python PYTHON --print-program

PROBE is any bpftrace probe; a path field written PYTHON stands for the
interpreter, as in usdt:PYTHON:python:gc__start or uprobe:PYTHON:take_gil.
Needs root and bpftrace (0.17, 0.23 and 0.27 tested).  It runs under any
Python 3 too, by its path: python3 LIBDIR/usdt/stacks (in the source
tree, Lib/usdt/stacks).  python -m usdt.tools stacks, profile and alloc
run it in their own process.

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

The library (api): Config says what to trace, trace() returns a Result,
read() counts a saved run, and output's write_counts(), write_folded()
and write_json() print a Result.  The modules, in the order each uses the
ones before it: offsets (what is read of the interpreter before
tracing), program (the bpftrace program of program.bt), records (the
records and the code objects they name), native (--native), output
(counts and their printing), tracing (running bpftrace), api (the
library), cli (the options).
"""

from .._bpftrace import Error
from .api import Config, Prepared, Result, prepare, read, trace
from .output import (write_counts, write_folded, write_folded_objects,
                     write_json, write_notes)

__all__ = ["Config", "Error", "Prepared", "Result", "prepare", "read",
           "trace", "write_counts", "write_folded", "write_folded_objects",
           "write_json", "write_notes"]

