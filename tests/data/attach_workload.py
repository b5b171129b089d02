"""A long-running workload for attach/detach tests.

usage: attach_workload.py threaded|loop SECONDS

threaded: three threads call small functions in a loop.
loop:     the main thread sits in one long loop of plain statements (no
          calls), so only line events can show that tracing began.
It prints "ready" once it is running, and "done <n>" when it ends.
"""

import sys
import threading
import time


def leaf(x):
    return x + 1


def middle(x):
    return leaf(x) * 2


def spin(deadline, results, slot):
    n = 0
    while time.monotonic() < deadline:
        for _ in range(1000):
            n = middle(n) % 1000003
    results[slot] = n


def threaded(seconds):
    deadline = time.monotonic() + seconds
    results = [0] * 3
    threads = [threading.Thread(target=spin, args=(deadline, results, i))
               for i in range(3)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    for t in threads:
        t.join()
    return sum(results)


def loop(seconds):
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    n = 0
    clock = time.monotonic
    while True:
        n += 1
        n %= 1000003
        if n % 4096 == 0 and clock() > deadline:
            break
    return n


if __name__ == "__main__":
    mode, seconds = sys.argv[1], float(sys.argv[2])
    print("done", {"threaded": threaded, "loop": loop}[mode](seconds),
          flush=True)
