"""Workloads for the GIL, thread and asyncio task probes, with their ground
truth printed (tests/test_runtime_probes.py).

threads: CPU-bound threads that switch the GIL, threads that block in
    time.sleep() and on a lock, a thread whose target raises, and one
    started with _thread rather than threading.  Each prints
    "THREAD <name> <get_ident()> <get_native_id()>" from its target; the main
    thread prints "MAIN <native id>", and "JOINED <ident>" after each join,
    right before calling joined() (a marker function for the probes).
asyncio: tasks whose number of steps is known.  Prints
    "STEPS <task name> <coroutine qualname> <starts> <dones>" for each, the
    steps that start and finish under each (name, qualname) pair,
    "RENAMED <old> <new>" for a task renamed during a step, and
    "EAGER <task name>" for the tasks whose first step runs eagerly (the
    name of that step).

usage: runtime_workload.py threads|asyncio, or the mode in $RUNTIME_MODE
(bpftrace's -c cannot pass a second argument from the tests' helper)
"""

import os
import sys
import threading
import time


def say(*fields):
    # One write per line: bpftrace prints to the same pipe, and print()
    # writes field by field when PYTHONUNBUFFERED is set.
    sys.stdout.write(" ".join(map(str, fields)) + "\n")
    sys.stdout.flush()


def spin(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def report(name):
    say("THREAD", name, threading.get_ident(), threading.get_native_id())


def cpu_bound(name):
    report(name)
    spin(200_000)


def sleeper(name):
    report(name)
    for _ in range(20):
        time.sleep(0.001)


def lock_waiter(name, lock, waiting):
    report(name)
    waiting.set()
    with lock:                  # blocks until the main thread releases it
        spin(1000)


def raiser(name):
    report(name)
    raise ValueError(name)


def joined():
    """Marker: the main thread calls it right after each join returns."""


def threads():
    import _thread
    sys.setswitchinterval(1e-4)     # many GIL switches between spinners
    threading.excepthook = lambda args: None
    say("MAIN", threading.get_native_id())
    lock = threading.Lock()
    lock.acquire()
    waiting = threading.Event()
    workers = [
        threading.Thread(target=cpu_bound, args=("cpu-1",)),
        threading.Thread(target=cpu_bound, args=("cpu-2",)),
        threading.Thread(target=sleeper, args=("sleeper",)),
        threading.Thread(target=lock_waiter,
                         args=("lock-waiter", lock, waiting)),
        threading.Thread(target=raiser, args=("raiser",)),
    ]
    for t in workers:
        t.start()
    waiting.wait()
    spin(100_000)
    lock.release()
    handle = _thread.start_joinable_thread(lambda: cpu_bound("_thread"))
    for t in workers:
        t.join()
        say("JOINED", t.ident)
        joined()
    ident = handle.ident
    handle.join()
    say("JOINED", ident)
    joined()


def run_asyncio():
    import asyncio
    import collections.abc

    starts = {}
    dones = {}
    eager = []

    def expect(name, qualname, start, done):
        key = (name, qualname)
        starts[key] = starts.get(key, 0) + start
        dones[key] = dones.get(key, 0) + done

    async def sleeps(n):
        for _ in range(n):
            await asyncio.sleep(0)

    async def named_after_first_step(n, first_names):
        first_names.append(asyncio.current_task().get_name())
        await sleeps(n)

    async def fails(n):
        await sleeps(n)
        raise ValueError("task fails")

    async def renames(before, after, new_name):
        await sleeps(before)
        task = asyncio.current_task()
        old_name = task.get_name()
        task.set_name(new_name)
        await sleeps(after)
        return old_name

    class Manual(collections.abc.Coroutine):
        """An awaitable that is not a coroutine object: a bare yield (None)
        per send(), `steps` sends in all."""

        def __init__(self, steps):
            self.left = steps

        def send(self, value):
            self.left -= 1
            if self.left == 0:
                raise StopIteration(None)

        def throw(self, *args):
            raise args[0]

        def close(self):
            pass

        def __await__(self):        # the ABC wants it; Task does not use it
            return iter(())

    async def main():
        loop = asyncio.get_running_loop()
        # N sleep(0)s: N + 1 steps.
        named = [asyncio.create_task(sleeps(n), name="sleeps-%d" % n)
                 for n in (0, 1, 3)]
        # Default names: the task keeps an int until get_name() is called,
        # so get_name() only once the task is done.
        default = [asyncio.create_task(sleeps(2)) for _ in range(2)]
        failing = asyncio.create_task(fails(1), name="fails")
        # Renamed at the start of its third step: that step starts under
        # its default name and finishes under the new one.
        renamed = asyncio.create_task(renames(2, 2, "renamed"))
        manual = asyncio.create_task(Manual(3), name="manual")
        number = asyncio.create_task(sleeps(1), name=42)    # stored as "42"
        await asyncio.gather(*named, *default, failing, renamed, manual,
                             number, return_exceptions=True)
        for task, n in zip(named + default + [number], (0, 1, 3, 2, 2, 1)):
            expect(task.get_name(), "run_asyncio.<locals>.sleeps", n + 1,
                   n + 1)
        expect("fails", "run_asyncio.<locals>.fails", 2, 2)
        say("RENAMED", renamed.result(), "renamed")
        expect(renamed.result(), "run_asyncio.<locals>.renames", 3, 2)
        expect("renamed", "run_asyncio.<locals>.renames", 2, 3)
        expect("manual", "<unknown>", 3, 3)

        # An eager task's first step runs inside create_task(), within this
        # task's step.  A task factory's task gets its name after that first
        # step (BaseEventLoop.create_task() calls set_name()), so the step
        # runs under the default name, which the coroutine reads.
        first_names = []
        loop.set_task_factory(asyncio.eager_task_factory)
        try:
            factory_sleeps = asyncio.create_task(
                named_after_first_step(2, first_names), name="factory-sleeps")
            factory_done = asyncio.create_task(
                named_after_first_step(0, first_names), name="factory-done")
        finally:
            loop.set_task_factory(None)
        direct = asyncio.Task(sleeps(1), loop=loop, name="eager-direct",
                              eager_start=True)
        await asyncio.gather(factory_sleeps, factory_done, direct)
        qualname = "run_asyncio.<locals>.named_after_first_step"
        for first_name, task, n in zip(first_names,
                                       (factory_sleeps, factory_done), (2, 0)):
            expect(first_name, qualname, 1, 1)
            expect(task.get_name(), qualname, n, n)
        expect("eager-direct", "run_asyncio.<locals>.sleeps", 2, 2)
        eager.extend(first_names + ["eager-direct"])

    asyncio.run(main())
    for name, qualname in sorted(starts):
        say("STEPS", name, qualname, starts[name, qualname],
            dones[name, qualname])
    for name in eager:
        say("EAGER", name)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else os.environ["RUNTIME_MODE"]
    {"threads": threads, "asyncio": run_asyncio}[mode]()
