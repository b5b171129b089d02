"""Many short asyncio Tasks (the C Task), each run in several steps.

Every step of a Task is one task__step__start/done pair: its first step, one
more after each `await asyncio.sleep(0)` and after each wake-up by a Future
another task resolves.  create_task + gather, TaskGroup, a pipeline of tasks
handing values on through Futures, and eager tasks (eager_task_factory; the
ones that suspend go on with ordinary steps).  No timers: deterministic.
"""
import asyncio

from _harness import SCALE, bench_main


async def stepper(i, steps):
    acc = i
    for k in range(steps):
        await asyncio.sleep(0)
        acc += k * i
    return acc & 0xFFFF


async def gather_phase(n):
    tasks = [asyncio.create_task(stepper(i, 3)) for i in range(n)]
    return sum(await asyncio.gather(*tasks))


async def taskgroup_phase(n):
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(stepper(i, 2), name=f"tg-{i}") for i in range(n)]
    return sum(t.result() for t in tasks)


async def stage(inbox, outbox, add):
    total = 0
    while True:
        fut = await inbox.get()
        if fut is None:
            await outbox.put(None)
            return total
        value = await fut
        total += value
        nxt = asyncio.get_running_loop().create_future()
        await outbox.put(nxt)
        nxt.set_result(value + add)


async def drain_queue(inbox):
    out = 0
    while (fut := await inbox.get()) is not None:
        out += await fut
    return out


async def pipeline_phase(n):
    loop = asyncio.get_running_loop()
    queues = [asyncio.Queue(maxsize=4) for _ in range(4)]
    stages = [asyncio.create_task(stage(queues[k], queues[k + 1], k + 1))
              for k in range(3)]
    drain = asyncio.create_task(drain_queue(queues[3]))
    for i in range(n):
        fut = loop.create_future()
        await queues[0].put(fut)
        fut.set_result(i)
    await queues[0].put(None)
    return await drain + sum(await asyncio.gather(*stages))


async def quick(i):
    return i * 3


async def eager_phase(n):
    # half of them finish in their eager first step, half suspend once
    loop = asyncio.get_running_loop()
    old = loop.get_task_factory()
    loop.set_task_factory(asyncio.eager_task_factory)
    try:
        tasks = [asyncio.create_task(quick(i) if i & 1 else stepper(i, 1))
                 for i in range(n)]
        return sum(await asyncio.gather(*tasks))
    finally:
        loop.set_task_factory(old)


async def main(reps):
    acc = 0
    for _ in range(reps):
        acc += await gather_phase(200)
        acc += await taskgroup_phase(150)
        acc += await pipeline_phase(150)
        acc += await eager_phase(200)
    return acc


def run(scale):
    reps = max(1, int(60 * scale))
    return asyncio.run(main(reps))


if __name__ == "__main__":
    bench_main(run)
