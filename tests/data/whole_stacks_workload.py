"""A long-running workload for usdt.stacks --native -p (test_stack_tool_native).

usage: whole_stacks_workload.py [SECONDS]

Two threads each call outer() once, before any tracer can attach; outer()
never returns: it calls middle() -> leaf() over and over, and leaf() does
arithmetic.  It prints "ready <pid>" once both threads are in outer(),
stops when its standard input is closed, and is killed by SIGALRM after
SECONDS (default 120) whatever happens to the test.
"""

import os
import signal
import sys
import threading

THREADS = 2
LEAF_LOOPS = 10000


def leaf(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1000003
    return x


def middle(n):
    return leaf(n) + leaf(n)


def outer(entered):
    entered.release()
    while True:
        middle(LEAF_LOOPS)


def main():
    signal.alarm(int(sys.argv[1]) if len(sys.argv) > 1 else 120)
    entered = threading.Semaphore(0)
    for _ in range(THREADS):
        threading.Thread(target=outer, args=(entered,), daemon=True).start()
    for _ in range(THREADS):
        entered.acquire()
    sys.stdout.write("ready %d\n" % os.getpid())
    sys.stdout.flush()
    sys.stdin.read()


if __name__ == "__main__":
    main()
