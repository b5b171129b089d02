"""Coroutines: asyncio tasks, gather, queues, nested awaits (no timers: deterministic)."""
import asyncio

from _harness import SCALE, bench_main


async def leaf(x):
    return x * 2 + 1


async def middle(x):
    a = await leaf(x)
    b = await leaf(a)
    return a + b


async def producer(q, n):
    for i in range(n):
        await q.put(i)
        if i % 16 == 0:
            await asyncio.sleep(0)
    await q.put(None)


async def consumer(q):
    total = 0
    while True:
        item = await q.get()
        if item is None:
            return total
        total += await middle(item)


async def fanout(n):
    res = await asyncio.gather(*(middle(i) for i in range(n)))
    return sum(res)


async def main(reps):
    acc = 0
    for _ in range(reps):
        q = asyncio.Queue(maxsize=64)
        p = asyncio.ensure_future(producer(q, 1500))
        acc += await consumer(q)
        await p
        acc += await fanout(300)
        for i in range(1500):
            acc += await middle(i)
    return acc


def run(scale):
    reps = max(1, int(100 * scale))
    return asyncio.run(main(reps))


if __name__ == "__main__":
    bench_main(run)
