"""The call-heavy loop that bench/stacks.py times with and without a tracer.

usage: stacks_workload.py [ROUND_CALLS] [LIMIT_S] [DEPTH]

The main thread runs rounds of ROUND_CALLS (default 20000) calls of
outer(), which calls plain Python functions three levels deep and methods
of a small class: about ten Python-to-Python calls per outer(), the calls
that the perf-map trampoline slows down (each goes through the trampoline,
and none is inlined).  After each round it writes one line

    round END_NS DURATION_NS

END_NS is time.monotonic_ns() (CLOCK_MONOTONIC, the clock of the driver's
time.monotonic_ns() too) at the end of the round.  Before the first round
it writes "ready PID".

Its standard input takes one command per line, read by a second thread:

    mark NAME    calls the function NAME, defined on first use from fresh
                 source, so that its first call while the trampoline is on
                 lists "py::NAME:<stacks-mark>" in /tmp/perf-PID.map; then
                 writes "marked NAME"
    spec         writes "spec OPNAME=COUNT ...": how many instructions of
                 the workload's own functions are, at this moment, each
                 (specialized) instruction; CALL sites that the trampoline
                 left unspecialized show up as CALL, for instance

The driver uses marks to see whether the trampoline is on: the workload's
own functions are listed once, at the first arming, and never again.
With DEPTH, the rounds run under DEPTH frames of nest() (whole_stacks.py
--depth: a sample's stack is then about DEPTH + 5 frames deep).
When its standard input closes, it finishes the round and exits; SIGALRM
ends it after LIMIT_S seconds (default 600) whatever the driver does.
"""

import dis
import os
import signal
import sys
import threading
import time
import types


class Vec:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def add(self, other):
        return Vec(self.x + other.x, self.y + other.y)

    def dot(self, other):
        return self.x * other.x + self.y * other.y


def leaf(a, b):
    return a * 3 + b


def inner(i):
    return leaf(i, 1) + leaf(i, 2)


def middle(i):
    return inner(i) - inner(i + 1)


def outer(i, v, w):
    u = v.add(w)
    return middle(i) + u.dot(w)


def one_round(calls):
    v = Vec(1, 2)
    w = Vec(3, 4)
    total = 0
    for i in range(calls):
        total += outer(i, v, w)
    return total


# The functions whose specialization "spec" reports, as stacks.py's
# FUNCTIONS names them.
TIMED = (one_round, outer, middle, inner, leaf,
         Vec.__init__, Vec.add, Vec.dot)


def specialization():
    counts = {}
    for function in TIMED:
        for ins in dis.get_instructions(function, adaptive=True):
            counts[ins.opname] = counts.get(ins.opname, 0) + 1
    return " ".join("%s=%d" % kv for kv in sorted(counts.items()))


def say(line):
    # One write(2) per line: below PIPE_BUF, so lines from the two threads
    # never mix.
    os.write(1, (line + "\n").encode())


def commands(stop):
    marks = {}
    for line in sys.stdin:
        verb, _, name = line.strip().partition(" ")
        if verb == "mark" and name.isidentifier():
            if name not in marks:
                # Only the function's code runs: a module body run by
                # exec() would be listed in the perf map as well.
                module = compile("def %s():\n    return 1\n" % name,
                                 "<stacks-mark>", "exec")
                code = [c for c in module.co_consts
                        if isinstance(c, types.CodeType)][0]
                marks[name] = types.FunctionType(code, {})
            marks[name]()
            say("marked %s" % name)
        elif verb == "spec" and not name:
            say("spec " + specialization())
    stop.set()


def nest(depth, function, *args):
    if depth > 0:
        return nest(depth - 1, function, *args)
    return function(*args)


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 600
    depth = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    signal.alarm(limit)
    stop = threading.Event()
    threading.Thread(target=commands, args=(stop,), daemon=True).start()
    say("ready %d" % os.getpid())
    nest(depth, run, calls, stop)


def run(calls, stop):
    while not stop.is_set():
        t0 = time.monotonic_ns()
        one_round(calls)
        t1 = time.monotonic_ns()
        say("round %d %d" % (t1, t1 - t0))


if __name__ == "__main__":
    main()
