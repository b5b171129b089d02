"""C calls from Python: builtins, methods of builtin types, extension modules.

Tight loops whose every iteration makes several calls that a sys.setprofile()
function would see as 'c_call' (the cfunction probes' sites): builtin
functions (len, abs, min, isinstance, divmod, ...), methods of builtin types
(list.append, dict.get, str.startswith, int.bit_length, ...), classmethods
(dict.fromkeys, int.from_bytes) and functions or methods of extension
modules (math, _struct, _bisect, _heapq, _collections, binascii, zlib).
"""
import binascii
import bisect
import heapq
import math
import struct
import zlib
from collections import deque

from _harness import SCALE, bench_main

PACKER = struct.Struct("<iH")


def builtins_loop(n):
    acc = 0
    items = list(range(16))
    for i in range(n):
        acc += len(items) + abs(i - 500) + min(i, 77) + max(i & 15, 3)
        if isinstance(i, int):
            q, r = divmod(i, 7)
            acc += q + r
        acc += ord(chr(65 + i % 26)) + hash(i) % 3
        acc += getattr(items, "__len__")()
    return acc


def methods_loop(n):
    acc = 0
    lst = []
    d = {}
    s = set()
    words = ("alpha", "beta", "gamma", "delta")
    for i in range(n):
        lst.append(i)
        d[i & 255] = d.get(i & 127, 0) + 1
        s.add(i & 511)
        w = words[i & 3]
        if w.startswith("ga"):
            acc += 1
        acc += w.upper().count("A") + w.find("t")
        acc += (i * 2654435761).bit_length()
        if len(lst) > 1000:
            lst.clear()
    d2 = dict.fromkeys(words, 0)
    acc += len(d) + len(s) + len(d2)
    acc += int.from_bytes(b"\x01\x02", "little")
    return acc


def extensions_loop(n):
    acc = 0
    sorted_keys = list(range(0, 4000, 4))
    heap = []
    dq = deque()
    buf = b"cpython-usdt"
    for i in range(n):
        acc += int(math.sqrt(i)) + math.floor(i / 3)
        packed = PACKER.pack(i, i & 0xFFFF)
        a, b = PACKER.unpack(packed)
        acc += a - b
        acc += bisect.bisect_left(sorted_keys, i % 4000)
        heapq.heappush(heap, (i * 7919) % 1009)
        if len(heap) > 64:
            acc += heapq.heappop(heap)
        dq.append(i)
        if len(dq) > 32:
            acc += dq.popleft()
        if i % 16 == 0:
            acc += binascii.crc32(buf) & 0xFF
            acc += zlib.adler32(buf) & 0xFF
    return acc


def run(scale):
    reps = max(1, int(50 * scale))
    acc = 0
    for _ in range(reps):
        acc += builtins_loop(3000)
        acc += methods_loop(3000)
        acc += extensions_loop(3000)
    return acc


if __name__ == "__main__":
    bench_main(run)
