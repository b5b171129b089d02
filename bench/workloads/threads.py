"""Threaded workload: worker threads fed through queue.Queue, locks, Condition handoff.

The checksum is order-independent, so the result is deterministic even though
thread interleaving is not.
"""
import queue
import threading
import os
import sys

from _harness import SCALE, bench_main


def work(n):
    s = 0
    for i in range(n):
        s += (i * i) % 7
    return s


def worker(inq, outq):
    while True:
        item = inq.get()
        if item is None:
            outq.put(None)
            return
        outq.put(work(item))


class Box:
    def __init__(self):
        self.lock = threading.Lock()
        self.total = 0

    def add(self, v):
        with self.lock:
            self.total += v


def run(scale):
    reps = max(1, int(60 * scale))
    nthreads = 4
    acc = 0
    for _ in range(reps):
        inq = queue.Queue()
        outq = queue.Queue()
        ts = [threading.Thread(target=worker, args=(inq, outq)) for _ in range(nthreads)]
        for t in ts:
            t.start()
        for i in range(600):
            inq.put(200 + i % 50)
        for _ in ts:
            inq.put(None)
        done = 0
        while done < nthreads:
            v = outq.get()
            if v is None:
                done += 1
            else:
                acc += v
        for t in ts:
            t.join()
        box = Box()
        adders = [threading.Thread(target=lambda k=k: [box.add(k) for _ in range(3000)])
                  for k in range(4)]
        for t in adders:
            t.start()
        for t in adders:
            t.join()
        acc += box.total
    return acc


def set_switch_interval():
    # bench/run.py sets it for cachegrind runs, for repeatable counts.
    interval = os.environ.get("BENCH_SWITCH_INTERVAL")
    if interval:
        sys.setswitchinterval(float(interval))


if __name__ == "__main__":
    bench_main(run, setup=set_switch_interval)
