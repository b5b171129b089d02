"""GIL hand-offs between threads: a token ring through locks, CPU-bound contention.

The GIL probes' sites are take_gil() and drop_gil().  In the ring, each of 4
threads blocks in lock.acquire() (which drops the GIL) until the previous one
releases its lock, so every pass of the token is one drop_gil() and one
take_gil(), whatever the OS scheduler does.  In the contention phase 4
threads run pure-Python loops and hand the GIL over every switch interval:
1 ms here, so that each thread's run of a few ms is cut several times
(bench/run.py sets BENCH_SWITCH_INTERVAL=30 s under cachegrind, where the
threads then run one after the other, for repeatable counts).
"""
import os
import sys
import threading

from _harness import SCALE, bench_main


def token_ring(nthreads, passes):
    # lock k is released when thread k may run; all start held
    locks = [threading.Lock() for _ in range(nthreads)]
    for lock in locks:
        lock.acquire()
    counts = [0] * nthreads

    def member(k):
        mine, nxt = locks[k], locks[(k + 1) % nthreads]
        for _ in range(passes):
            mine.acquire()
            counts[k] += k + 1
            nxt.release()

    ts = [threading.Thread(target=member, args=(k,)) for k in range(1, nthreads)]
    for t in ts:
        t.start()
    for _ in range(passes):
        locks[1].release()
        locks[0].acquire()
        counts[0] += 1
    for t in ts:
        t.join()
    return sum(counts)


def contention(nthreads, n):
    results = [0] * nthreads

    def spin(k):
        s = 0
        for i in range(n):
            s += (i ^ k) & 7
        results[k] = s

    ts = [threading.Thread(target=spin, args=(k,)) for k in range(nthreads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(results)


def run(scale):
    reps = max(1, int(40 * scale))
    acc = 0
    for _ in range(reps):
        acc += token_ring(4, 150)
        acc += contention(4, 25000)
    return acc


def set_switch_interval():
    # bench/run.py sets BENCH_SWITCH_INTERVAL for cachegrind runs, for
    # repeatable counts.
    sys.setswitchinterval(float(os.environ.get("BENCH_SWITCH_INTERVAL", "0.001")))


if __name__ == "__main__":
    bench_main(run, setup=set_switch_interval)
