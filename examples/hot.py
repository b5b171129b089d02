# Two threads and the main thread spend their time in leaf(), called from
# middle(), called from outer(), which run() calls again and again for
# SECONDS (default 30).
import sys
import threading
import time


def leaf(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def middle():
    return [leaf(3000) for _ in range(5)]


def outer():
    for _ in range(10):
        middle()


def run(until):
    while time.monotonic() < until:
        outer()


until = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 30)
threads = [threading.Thread(target=run, args=(until,)) for _ in range(2)]
for t in threads:
    t.start()
run(until)
for t in threads:
    t.join()
