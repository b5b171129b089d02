"""Allocations of known sizes for tests/test_alloc_probes.py.

ALLOC_MODE picks the workload; sys.audit("usdt.alloc.begin") and
sys.audit("usdt.alloc.end") bracket its measured phase (the bpftrace program
counts only what happens between them).  tracemalloc traces all of it, and
the workload prints its exact ground truth as "TRUTH NAME BYTES" lines:

  large:   4000 bytearrays of 1 MiB, each dropped at once; TRUTH total.
  small:   200000 bytearrays of 10000 bytes, each dropped; TRUTH total.
  live:    8000 bytearrays of 16 KiB kept, then every other one dropped;
           TRUTH live (tracemalloc's growth over the phase).
  realloc: bytearrays grown by += (realloc) and shrunk; TRUTH live.
  restart: as live, with tracemalloc stopped and started again in the
           middle of the phase (the probes' wrapper stays on top).
  threads: 4 threads at once, each keeps 2000 bytearrays of 16 KiB and
           drops every other one; TRUTH live.

It leaves with os._exit(0), so that finalization frees nothing after the
phase.
"""

import os
import sys
import threading
import tracemalloc

MODE = os.environ["ALLOC_MODE"]
traced = tracemalloc.get_traced_memory


def dropped(count, size):
    total = 0
    sys.audit("usdt.alloc.begin")
    for _ in range(count):
        before = traced()[0]
        x = bytearray(size)
        total += traced()[0] - before
        del x
    sys.audit("usdt.alloc.end")
    print("TRUTH total", total)


def kept(count, size, restart=False):
    keep = [None] * count
    before = traced()[0]
    sys.audit("usdt.alloc.begin")
    for i in range(count):
        keep[i] = bytearray(size)
        if restart and i == count // 2:
            # The truth so far, then tracemalloc anew (it traces only
            # what is allocated from now on).
            first = traced()[0] - before
            tracemalloc.stop()
            tracemalloc.start()
            before = traced()[0]
    for i in range(0, count, 2):
        keep[i] = None
    sys.audit("usdt.alloc.end")
    live = traced()[0] - before
    if restart:
        # The traces of the first tracemalloc are gone: add what it saw of
        # the objects 0 to count // 2 that are still kept (the odd ones).
        made = count // 2 + 1
        live += first * (made // 2) // made
    print("TRUTH live", live)
    return keep


def grown(count):
    keep = [None] * count
    before = traced()[0]
    sys.audit("usdt.alloc.begin")
    for i in range(count):
        b = bytearray()
        for _ in range(64):
            b += b"x" * 1000
        del b[20000:]
        keep[i] = b
    sys.audit("usdt.alloc.end")
    print("TRUTH live", traced()[0] - before)
    return keep


def threaded(count, size, nthreads=4):
    keep = [None] * nthreads

    def work(index):
        mine = [bytearray(size) for _ in range(count)]
        for i in range(0, count, 2):
            mine[i] = None
        keep[index] = mine

    threads = [threading.Thread(target=work, args=(index,))
               for index in range(nthreads)]
    before = traced()[0]
    sys.audit("usdt.alloc.begin")
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sys.audit("usdt.alloc.end")
    print("TRUTH live", traced()[0] - before)
    return keep


tracemalloc.start()
if MODE == "large":
    dropped(4000, 1 << 20)
elif MODE == "small":
    dropped(200000, 10000)
elif MODE == "live":
    kept(8000, 16384)
elif MODE == "restart":
    kept(8000, 16384, restart=True)
elif MODE == "threads":
    threaded(2000, 16384)
elif MODE == "realloc":
    grown(4000)
else:
    raise SystemExit("unknown ALLOC_MODE %r" % MODE)
print("DONE", flush=True)
os._exit(0)
