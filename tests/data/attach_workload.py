"""A long-running workload for attach/detach tests.

usage: attach_workload.py threaded|loop|forked SECONDS|-

threaded: three threads call small functions in a loop.
forked:   the same in a child made by os.fork() first thing; the parent
          only waits for it, so a tracer must attach to the child.
loop:     the main thread sits in one long loop of plain statements (no
          calls), so only line events can show that tracing began.
It prints "ready" once it is running, and "done <n>" when it ends: after
SECONDS, or with "-" when its standard input is closed, so that a test
decides how long it runs.
"""

import sys
import threading
import time


def leaf(x):
    return x + 1


def middle(x):
    return leaf(x) * 2


def spin(deadline, stopped, results, slot):
    n = 0
    while not stopped and time.monotonic() < deadline:
        for _ in range(1000):
            n = middle(n) % 1000003
    results[slot] = n


def threaded(deadline, stopped):
    results = [0] * 3
    threads = [threading.Thread(target=spin,
                                args=(deadline, stopped, results, i))
               for i in range(3)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    for t in threads:
        t.join()
    return sum(results)


def loop(deadline, stopped):
    print("ready", flush=True)
    n = 0
    clock = time.monotonic
    while True:
        n += 1
        n %= 1000003
        if n % 4096 == 0 and (stopped or clock() > deadline):
            break
    return n


def stop_at_eof(stopped):
    sys.stdin.read()
    stopped.append(True)


if __name__ == "__main__":
    mode, seconds = sys.argv[1], sys.argv[2]
    if mode == "forked":
        import os
        child = os.fork()
        if child != 0:
            sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
        mode = "threaded"
    # Appended to (never called) when it is time to stop.
    stopped = []
    if seconds == "-":
        deadline = float("inf")
        threading.Thread(target=stop_at_eof, args=(stopped,),
                         daemon=True).start()
    else:
        deadline = time.monotonic() + float(seconds)
    print("done", {"threaded": threaded, "loop": loop}[mode](deadline,
                                                             stopped),
          flush=True)
