"""Two allocation sites of known sizes for tests/test_alloc_probes.py:
big() keeps 600 bytearrays of 300000 bytes, small() 600 of 100000, and
churn() allocates 1000 of 200000 that it drops at once.
tracemalloc, exact in the same process, prints the bytes still allocated
at each site ("TRUTH FUNCTION BYTES"); the process leaves with os._exit(0)
so that nothing is freed after that."""

import os
import tracemalloc


def big(n):
    return [bytearray(300000) for _ in range(n)]


def small(n):
    return [bytearray(100000) for _ in range(n)]


def churn(n):
    for _ in range(n):
        temporary = bytearray(200000)
        del temporary


tracemalloc.start()
kept = (big(600), small(600))
churn(1000)
snapshot = tracemalloc.take_snapshot().filter_traces(
    [tracemalloc.Filter(True, __file__)])
by_line = {stat.traceback[0].lineno: stat.size
           for stat in snapshot.statistics("lineno")}
for function in (big, small):
    print("TRUTH", function.__name__,
          by_line.get(function.__code__.co_firstlineno + 1, 0), flush=True)
os._exit(0)
