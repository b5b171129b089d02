"""A process that tests/test_alloc_probes.py drives through stdin, one
command a line, while it arms and disarms the otel_memory probes from
outside: "tm_start" and "tm_stop" (tracemalloc), "alloc" (16 MiB in small
and large blocks, freed), "check" (tracemalloc traces this file's
allocations exactly), "keep" (40000 small objects, kept), "churn_start"
(four threads that allocate, check and free without pause, so that the
wrapper goes on and off while other threads are inside the allocators:
in the free-threaded build, at the same time), "churn_stop" (stop them:
how many rounds they ran, and whether every round found its data
intact), "quit".  Each command is answered with one line.
Between commands it runs Python code every 50 ms, so that the probe
watcher's pending call runs soon after the semaphores change.
"""

import select
import sys
import threading
import tracemalloc


class Churn:
    """Threads that allocate in all three domains (small objects, large
    buffers, a growing bytearray: realloc) and check what they built."""

    def __init__(self, count=4):
        self.stop = threading.Event()
        self.rounds = [0] * count
        self.intact = [True] * count
        self.threads = [threading.Thread(target=self.run, args=(i,))
                        for i in range(count)]
        for thread in self.threads:
            thread.start()

    def run(self, index):
        n = 0
        while not self.stop.is_set():
            n += 1
            small = [str(n + i) * 3 for i in range(500)]
            big = bytes([n % 251]) * (64 * 1024 + n % 4096)
            grown = bytearray()
            for i in range(200):
                grown += bytes([i % 256]) * 37
            if (small[7] != str(n + 7) * 3 or big[-1] != n % 251
                    or len(grown) != 200 * 37 or grown[37 * 199] != 199):
                self.intact[index] = False
            self.rounds[index] = n

    def join(self):
        self.stop.set()
        for thread in self.threads:
            thread.join()
        return "churned %s intact %s" % (min(self.rounds) > 0,
                                         all(self.intact))


def alloc():
    for _ in range(16):
        blocks = [bytes(1000) for _ in range(1000)]
        del blocks
        big = bytearray(1 << 20)
        del big


def check():
    data = [bytes(5000 + i) for i in range(200)]
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(True, __file__)])
    (stat,) = [s for s in snapshot.statistics("lineno")
               if s.traceback[0].lineno == check.__code__.co_firstlineno + 1]
    # The 200 bytes objects and the list that holds them.
    return "check exact %s" % (
        stat.count == len(data) + 1
        and stat.size >= sum(len(d) for d in data))


print("ready", flush=True)
while True:
    readable, _, _ = select.select([sys.stdin], [], [], 0.05)
    if not readable:
        continue
    command = sys.stdin.readline().strip()
    if command == "tm_start":
        tracemalloc.start()
        print("tracing", tracemalloc.is_tracing(), flush=True)
    elif command == "tm_stop":
        tracemalloc.stop()
        print("tracing", tracemalloc.is_tracing(), flush=True)
    elif command == "alloc":
        alloc()
        print("allocated", flush=True)
    elif command == "keep":
        kept = [bytes(100 + i % 100) for i in range(40000)]
        print("kept", len(kept), flush=True)
    elif command == "churn_start":
        churn = Churn()
        print("churning", flush=True)
    elif command == "churn_stop":
        print(churn.join(), flush=True)
    elif command == "check":
        print(check(), flush=True)
    elif command in ("quit", ""):
        print("bye", flush=True)
        break
    else:
        print("unknown", command, flush=True)
