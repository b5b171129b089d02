"""A CPU-bound workload for the python:stacks__enable tests (test_stacks.py).

usage: stacks_workload.py [SECONDS]

Three threads and the main thread each call outer() -> middle() -> leaf()
over and over; leaf() does arithmetic, and outer() returns after a few
milliseconds so that all three are entered again and again.  The function
each thread runs them from, spin(), is entered once, before any tracer.

It prints "ready <pid>" once the threads run, then answers commands read
from its standard input, one JSON value per line:

    call NAME    calls fresh function NAME (fresh_1, fresh_2, ...), which
                 nothing has called before: true
    new          compiles a new function, fresh_new_N (N counts up), and
                 calls it: its name
    calls        the CALL instructions of middle(), as specialized now
    active       sys.is_stack_trampoline_active()
    activate     sys.activate_stack_trampoline("perf"): null
    deactivate   sys.deactivate_stack_trampoline(): null

It stops when its standard input is closed, printing "done", and is killed
by SIGALRM after SECONDS (default 120) whatever happens to the test.
"""

import dis
import json
import os
import signal
import sys
import threading
import time

THREADS = 3
# outer() returns after this long.
OUTER_S = 0.005
# leaf() takes about a millisecond.
LEAF_LOOPS = 10000


def leaf(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x


def middle(n):
    return leaf(n) + leaf(n)


def outer():
    deadline = time.monotonic() + OUTER_S
    while time.monotonic() < deadline:
        middle(LEAF_LOOPS)


def spin(stopping):
    while not stopping:
        outer()


# Defined now, called only on request, each at most once: the first call of
# a function is when the trampoline, if on, lists it in the perf map.
def fresh_1():
    return 1


def fresh_2():
    return 2


def fresh_3():
    return 3


def fresh_4():
    return 4


def fresh_5():
    return 5


def fresh_6():
    return 6


FRESH = {f.__name__: f for f in (fresh_1, fresh_2, fresh_3, fresh_4,
                                  fresh_5, fresh_6)}


NEW = []


def new_function():
    name = "fresh_new_%d" % len(NEW)
    namespace = {}
    exec(compile("def %s():\n    return 1\n" % name, __file__, "exec"),
         namespace)
    NEW.append(namespace[name])
    NEW[-1]()
    return name


def answer(line):
    command, _, argument = line.partition(" ")
    if command == "call":
        FRESH.pop(argument)()
        return True
    if command == "new":
        return new_function()
    if command == "calls":
        return [i.opname for i in dis.get_instructions(middle, adaptive=True)
                if i.opname.startswith("CALL")]
    if command == "active":
        return sys.is_stack_trampoline_active()
    if command == "activate":
        return sys.activate_stack_trampoline("perf")
    if command == "deactivate":
        return sys.deactivate_stack_trampoline()
    raise ValueError("unknown command %r" % line)


def serve(stopping):
    for line in sys.stdin:
        sys.stdout.write(json.dumps(answer(line.strip())) + "\n")
        sys.stdout.flush()
    stopping.append(True)


def main():
    signal.alarm(int(sys.argv[1]) if len(sys.argv) > 1 else 120)
    # Appended to (never called) when it is time to stop.
    stopping = []
    threads = [threading.Thread(target=spin, args=(stopping,))
               for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    sys.stdout.write("ready %d\n" % os.getpid())
    sys.stdout.flush()
    threading.Thread(target=serve, args=(stopping,), daemon=True).start()
    spin(stopping)
    for thread in threads:
        thread.join()
    sys.stdout.write("done\n")


if __name__ == "__main__":
    main()
