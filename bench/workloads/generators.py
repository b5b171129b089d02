"""Generators: pipelines of generators, yield from, genexps, send()."""

from _harness import SCALE, bench_main


def count_up(n):
    i = 0
    while i < n:
        yield i
        i += 1


def evens(src):
    for x in src:
        if x % 2 == 0:
            yield x


def squares(src):
    for x in src:
        yield x * x


def chunks(src, k):
    buf = []
    for x in src:
        buf.append(x)
        if len(buf) == k:
            yield buf
            buf = []
    if buf:
        yield buf


def flatten(nested):
    for item in nested:
        if isinstance(item, list):
            yield from flatten(item)
        else:
            yield item


def averager():
    total = 0
    n = 0
    avg = None
    while True:
        v = yield avg
        total += v
        n += 1
        avg = total // n


def run(scale):
    reps = max(1, int(380 * scale))
    acc = 0
    nested = [[i, [i + 1, [i + 2, i + 3]]] for i in range(300)]
    for _ in range(reps):
        for ch in chunks(squares(evens(count_up(6000))), 7):
            acc += ch[-1]
        acc += sum(flatten(nested))
        acc += sum(x for x in range(3000) if x & 1)
        a = averager()
        next(a)
        for v in range(2000):
            acc += a.send(v)
    return acc


if __name__ == "__main__":
    bench_main(run)
