"""Programs whose output must not change when a tracer arms the probes.

Each case prints what Python code can observe; tests/test_invisible.py runs
a case unarmed and with every probe armed and compares the two outputs.
usage: invisible_workload.py CASE, or the case in $INVISIBLE_CASE (bpftrace's
-c cannot pass a second argument from the tests' helper)
"""

import sys


def case_instance_eq():
    # type_module_name() must not call the __eq__ of a str subclass key of
    # the type dict (it could raise, or create instances recursively).
    calls = []

    class Key(str):
        armed = False

        def __eq__(self, other):
            if Key.armed:
                calls.append(other)
                Plain()             # re-enters the instance probes
                raise RuntimeError("__eq__ called")
            return str.__eq__(self, other)

        __hash__ = str.__hash__

    class Plain:
        pass

    cls = type("E", (), {Key("__module__"): "mod"})
    Key.armed = True
    objs = [cls() for _ in range(5)]
    del objs
    print("instances", len(calls))
    print("unrelated", len([1, 2, 3]))


def case_import_surrogate():
    for name in ("nonexistent_\udcff", "nonexistent_\udcff.sub"):
        try:
            __import__(name)
        except Exception as exc:
            print(type(exc).__name__)


def case_audit():
    print(sys.audit(123), sys.audit("\udcff", 1), sys.audit("ok", "x"))
    try:
        sys.audit()
    except TypeError as exc:
        print("TypeError", exc)


def case_all_events():
    print(sys.monitoring._all_events())
    sys.setprofile(lambda *args: None)
    profiled = sys.monitoring._all_events()
    sys.setprofile(None)
    print(sorted(profiled), sys.monitoring._all_events())


def case_pdb_opcodes():
    # What bdb.set_trace() does: f_trace_opcodes first, then sys.settrace().
    events = []

    def tracer(frame, event, arg):
        events.append(event)
        return tracer

    def traced():
        frame = sys._getframe()
        frame.f_trace = tracer
        frame.f_trace_opcodes = True
        sys.settrace(tracer)
        a = 1
        b = a + 1
        sys.settrace(None)
        return b

    traced()
    print(events)


def case_subinterpreter():
    import _interpreters
    interp = _interpreters.create()
    try:
        _interpreters.run_string(interp, (
            "def sub_func():\n"
            "    return 1\n"
            "for _ in range(7):\n"
            "    sub_func()\n"))
    finally:
        _interpreters.destroy(interp)
    print("subinterpreter done")


def case_modules():
    # The modules that ran Python code during start-up, with the file name
    # their <module> frame has (printed for the start-up test).
    seen = set()
    for name, mod in sorted(sys.modules.items()):
        if id(mod) in seen:     # os.path is posixpath: one <module> frame
            continue
        seen.add(id(mod))
        spec = getattr(mod, "__spec__", None)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "get_code"):
            continue
        try:
            code = loader.get_code(name)
        except Exception:
            continue
        if code is not None:
            print("module", name, code.co_filename)


def threads():
    """[(tid, name)] of this process's threads, by tid."""
    import os
    found = []
    for tid in sorted(os.listdir("/proc/self/task")):
        with open("/proc/self/task/%s/comm" % tid) as f:
            found.append((tid, f.read().strip()))
    return found


def case_threads():
    for _, name in threads():
        print("thread", name)


def watcher_tids():
    return [tid for tid, name in threads() if name == "py-usdt-watch"]


def case_fork():
    """Fork repeatedly, as a child too: the watcher thread stays the same
    across fork() in the parent, each child has its own, and os.fork()
    never counts it (run under -W error::DeprecationWarning)."""
    import os
    before = watcher_tids()
    for _ in range(100):
        pid = os.fork()
        if pid == 0:
            code = 0 if len(watcher_tids()) == 1 else 3
            if code == 0:
                grandchild = os.fork()
                if grandchild == 0:
                    os._exit(0)
                code = os.waitstatus_to_exitcode(
                    os.waitpid(grandchild, 0)[1])
            os._exit(code)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if status != 0:
            print("child exit", status)
    print("watchers", len(before), "same", watcher_tids() == before)


def c_workload(rounds=1):
    """C calls, C calls that raise, re-raises and exception groups: what the
    cfunction__* and exception__* probes report."""
    import math
    items = []
    for _ in range(rounds):
        items.append(1)
        list.append(items, len(items))
        try:
            list.append(3, 4)           # a descriptor with a wrong self
        except TypeError:
            pass
        try:
            math.sqrt(-1)
        except ValueError:
            pass
        try:
            try:
                raise KeyError("k")
            except KeyError:
                raise
        except KeyError:
            pass
        try:
            raise ExceptionGroup("g", [ValueError(1), TypeError(2)])
        except* ValueError:
            pass
        except* TypeError:
            pass
    return len(items)


def case_profile_events():
    # A sys.setprofile() function gets exactly its own thread's events, C
    # calls included; a thread without one gets none.
    import threading
    events = []

    def profiler(frame, event, arg):
        if frame.f_code.co_filename == __file__:
            name = (arg.__qualname__ if event.startswith("c_")
                    else frame.f_code.co_name)
            events.append("%s %s %s" % (threading.current_thread().name,
                                        event, name))

    other = threading.Thread(target=c_workload, args=(3,), name="other")
    sys.setprofile(profiler)
    c_workload()
    other.start()
    other.join()
    sys.setprofile(None)
    print(*events, sep="\n")


def case_monitoring_events():
    # A sys.monitoring tool gets exactly its events, and a DISABLE returned
    # for one call site holds although the armed probes keep CALL
    # instrumented on the legacy profile slot.
    E = sys.monitoring.events
    tool = 3
    events = []

    def record(event):
        def callback(code, offset, *args):
            if code.co_filename != __file__:
                return None
            obj = args[0] if args else None
            name = getattr(obj, "__qualname__", type(obj).__name__)
            events.append("%s %s %s" % (event, code.co_name, name))
            if event == "CALL" and obj is len:
                return sys.monitoring.DISABLE
            return None
        return callback

    def work():
        for _ in range(3):
            len("abc")
        return c_workload()

    sys.monitoring.use_tool_id(tool, "invisible")
    names = ("CALL", "C_RETURN", "C_RAISE", "RAISE", "RERAISE",
             "EXCEPTION_HANDLED")
    for name in names:
        sys.monitoring.register_callback(tool, getattr(E, name), record(name))
    mask = 0
    for name in names:
        mask |= getattr(E, name)
    sys.monitoring.set_events(tool, mask)
    work()
    sys.monitoring.set_events(tool, 0)
    sys.monitoring.free_tool_id(tool)
    print(*events, sep="\n")


def case_all_events_tools():
    # The legacy slots show only for the events their profile/trace
    # function asked for, next to a tool's events, while the probes use
    # the profile slot for CALL and the exception events too.
    E = sys.monitoring.events
    sys.monitoring.use_tool_id(2, "tool")
    sys.monitoring.set_events(2, E.RAISE | E.CALL | E.EXCEPTION_HANDLED)
    print(sorted(sys.monitoring._all_events().items()))
    sys.setprofile(lambda *args: None)
    print(sorted(sys.monitoring._all_events().items()))
    sys.settrace(lambda *args: None)
    print(sorted(sys.monitoring._all_events().items()))
    sys.setprofile(None)
    sys.settrace(None)
    sys.monitoring.set_events(2, 0)
    sys.monitoring.free_tool_id(2)
    print(sys.monitoring._all_events())


def case_exception_chaining():
    # What a traceback shows: causes, contexts, groups, notes, re-raises.
    import traceback

    def inner():
        raise KeyError("inner")

    def middle():
        try:
            inner()
        except KeyError as exc:
            raise ValueError("middle") from exc

    def outer():
        try:
            middle()
        except ValueError:
            try:
                {}["missing"]
            except KeyError as exc:
                exc.add_note("a note")
                raise
        return None

    def group():
        try:
            raise ExceptionGroup("g", [ValueError(1), TypeError(2)])
        except* ValueError as eg:
            raise RuntimeError("from group") from eg

    def suppressed():
        try:
            inner()
        except KeyError:
            raise LookupError("no context") from None

    for func in (outer, group, suppressed):
        try:
            func()
        except BaseException as exc:
            caught = exc
        text = "".join(traceback.format_exception(caught))
        print(text.replace(__file__, "W"), end="")
        print("context", type(caught.__context__).__name__,
              "cause", type(caught.__cause__).__name__,
              "suppress", caught.__suppress_context__)
    try:
        try:
            raise OSError("handled")
        except OSError:
            print("in handler", repr(sys.exception()))
        print("after handler", repr(sys.exception()))
    finally:
        pass


def case_asyncio_names():
    # The task probes read a default name (kept as an int until get_name())
    # without changing it.
    import asyncio

    async def steps(n):
        for _ in range(n):
            await asyncio.sleep(0)
        return asyncio.current_task().get_name()

    async def main():
        tasks = [asyncio.create_task(steps(2)) for _ in range(2)]
        tasks.append(asyncio.create_task(steps(1), name="named"))
        renamed = asyncio.create_task(steps(2))
        await asyncio.sleep(0)
        renamed.set_name(7)
        tasks.append(renamed)
        loop = asyncio.get_running_loop()
        loop.set_task_factory(asyncio.eager_task_factory)
        tasks.append(asyncio.create_task(steps(0), name="eager"))
        tasks.append(asyncio.create_task(steps(1)))
        loop.set_task_factory(None)
        results = await asyncio.gather(*tasks)
        return results, [task.get_name() for task in tasks]

    results, names = asyncio.run(main())
    print(results)
    print(names)


def case_thread_exit():
    # A thread's end runs threading.excepthook and its thread-local
    # destructors, all before join() returns.
    import threading
    said = []

    class Goodbye:
        def __init__(self, name):
            self.name = name

        def __del__(self):
            said.append("del %s" % self.name)

    local = threading.local()

    def target(name, fail):
        local.value = Goodbye(name)
        if fail:
            raise ValueError(name)

    def excepthook(args):
        said.append("excepthook %s %s %s" % (
            args.thread.name, args.exc_type.__name__, args.exc_value))

    threading.excepthook = excepthook
    for name, fail in (("quiet", False), ("failing", True)):
        thread = threading.Thread(target=target, args=(name, fail), name=name)
        thread.start()
        thread.join()
        said.append("joined %s alive %s" % (name, thread.is_alive()))
    said.append("threads %d" % threading.active_count())
    print(*said, sep="\n")


def case_stack_trampoline():
    # Armed, python:stacks__enable turns the perf-map trampoline on at the
    # watcher's first poll (within a second): keep entering functions past
    # it.  $INVISIBLE_PIDFILE receives the pid, so that the test can check
    # /tmp/perf-PID.map.
    import os
    import time
    import traceback
    with open(os.environ["INVISIBLE_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))

    def work(n):
        return work(n - 1) + 1 if n else 0

    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        work(20)

    def names():
        return [sys._getframe(i).f_code.co_name for i in range(3)]

    def gen():
        yield names()
        yield work(900)

    def fail():
        raise KeyError("deep")

    said = ["active %s" % sys.is_stack_trampoline_active(),
            "recursion %s" % work(950),
            "frames %s" % names(),
            "generator %s" % list(gen())]
    try:
        fail()
    except KeyError:
        said.append(traceback.format_exc().splitlines()[-2].strip())
    # A tool's C_RETURN events: none for Python functions, which the
    # trampoline keeps from being inlined.
    mon = sys.monitoring
    seen = []
    mon.use_tool_id(3, "invisible")
    mon.register_callback(3, mon.events.C_RETURN,
                          lambda code, offset, func, arg: seen.append(
                              getattr(func, "__name__", "?")))
    mon.set_events(3, mon.events.CALL)
    work(2)
    len(said)
    mon.set_events(3, 0)
    mon.free_tool_id(3)
    said.append("c_return %s" % seen)

    # A tracer's events when an awaited coroutine returns (SEND).
    async def inner():
        return 1

    async def awaiting():
        return await inner()

    events = []

    def tracer(frame, event, arg):
        if frame.f_code.co_name in ("inner", "awaiting"):
            events.append((frame.f_code.co_name, event))
        return tracer

    coro = awaiting()
    sys.settrace(tracer)
    try:
        coro.send(None)
    except StopIteration as stop:
        events.append(("value", stop.value))
    sys.settrace(None)
    said.append("settrace %s" % events)
    # The program's own calls: activate, then deactivate twice.
    sys.activate_stack_trampoline("perf")
    said.append("activated %s" % sys.is_stack_trampoline_active())
    sys.deactivate_stack_trampoline()
    said.append("deactivated %s" % sys.is_stack_trampoline_active())
    sys.deactivate_stack_trampoline()
    said.append("deactivated again %s" % sys.is_stack_trampoline_active())
    print(*said, sep="\n")


def case_profile_toggles():
    # A profiler switched on and off while calls are in progress: armed,
    # cfunction__* instrument every CALL, and the calls that were running
    # when the profiler came on must not show it their c_return (and the
    # later calls at the same frame and instruction must).
    import os
    events = []

    def prof(frame, event, arg):
        name = getattr(arg, "__name__", "?")
        if event.startswith("c_") and name != "setprofile":
            events.append((event, name))

    def toggle(x):
        sys.setprofile(prof)
        sys.setprofile(None)
        return x

    def ident(x):
        return x

    def g(func):
        return sum(map(func, range(4)))

    said = []
    for rounds in (1, 3):
        for _ in range(rounds):
            g(toggle)
        sys.setprofile(prof)
        g(ident)
        sys.setprofile(None)
        said.append("rounds %d %s" % (rounds, events))
        events.clear()

    # A profiler that comes on in every thread while more calls are in
    # progress than the 4,096 records the hidden-call table once held:
    # four threads, each 1,200 sum() calls deep (C recursion allows about
    # 3,000 while armed: unspecialized builtin calls count once more).
    import threading
    depth, workers = 1200, 4
    barrier = threading.Barrier(workers + 1)

    def nest(n):
        if n == 0:
            barrier.wait()      # all in progress
            barrier.wait()      # the profiler is on
            return 0
        return sum(map(nest, (n - 1,)))

    sys.setrecursionlimit(depth + 100)
    threading.stack_size(64 << 20)
    threads = [threading.Thread(target=nest, args=(depth,))
               for _ in range(workers)]
    for thread in threads:
        thread.start()
    threading.stack_size(0)
    barrier.wait()
    threading.setprofile_all_threads(prof)
    barrier.wait()
    for thread in threads:
        thread.join()
    threading.setprofile_all_threads(None)
    sys.setrecursionlimit(1000)
    events[:] = [e for e in events if e[1] == "sum"]
    counts = {}
    for event in events:
        counts[event] = counts.get(event, 0) + 1
    said.append("nested %s" % sorted(counts.items()))
    print(*said, sep="\n")


def deactivate_writes(work):
    """Whether the perf map grows after the program's own activate and
    deactivate of the trampoline."""
    import os
    path = "/tmp/perf-%d.map" % os.getpid()
    sys.activate_stack_trampoline("perf")
    sys.deactivate_stack_trampoline()
    size = os.path.getsize(path) if os.path.exists(path) else 0
    for i in range(10):
        eval("lambda: work(3)", {"work": work})()
    after = os.path.getsize(path) if os.path.exists(path) else 0
    return "grew" if after > size else "kept"


def case_trampoline_effects():
    # What the perf trampoline would change, were it on: run past the
    # watcher's first poll (within a second of start-up), then look.
    import ctypes
    import gc
    import os
    import re
    import threading
    import time

    if "INVISIBLE_PIDFILE" in os.environ:
        with open(os.environ["INVISIBLE_PIDFILE"], "w") as f:
            f.write(str(os.getpid()))
    # INVISIBLE_EFFECTS=safe: not the parts that crash or fail under the
    # trampoline (for a run where the owner allowed it).
    safe = os.environ.get("INVISIBLE_EFFECTS") == "safe"
    freefunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    nulls = []
    free = freefunc(lambda extra: nulls.append(extra) if not extra else None)
    request = ctypes.pythonapi.PyUnstable_Eval_RequestCodeExtraIndex
    request.restype = ctypes.c_ssize_t
    request.argtypes = [freefunc]
    index = request(free)

    def work(n):
        return work(n - 1) + 1 if n else 0

    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        work(20)
    said = ["code extra index %d" % index]
    # Code objects the trampoline would touch: freed with NULL extras.
    for i in range(100):
        f = eval("lambda: %d" % i)
        f()
        del f
    gc.collect()
    said.append("free(NULL) calls %d" % len(nulls))
    if safe:
        said.append("deactivated %s" % deactivate_writes(work))
        print(*said, sep="\n")
        return
    # A thread with a small C stack, recursing.
    sys.setrecursionlimit(100000)
    result = []
    threading.stack_size(256 * 1024)
    thread = threading.Thread(target=lambda: result.append(work(2000)))
    thread.start()
    thread.join()
    threading.stack_size(0)
    said.append("small stack %s" % result)
    # Deep recursion: the C recursion limit counts trampoline frames.
    try:
        said.append("deep %d" % work(20000))
    except RecursionError as e:
        said.append("deep RecursionError %s" % e)
    sys.setrecursionlimit(1000)
    # Pipes and sockets by kind, not inode.
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(re.sub(r"\[\d+\]$", "",
                              os.readlink("/proc/self/fd/" + fd)))
        except FileNotFoundError:
            pass            # listdir()'s own
    said.append("fds %s" % sorted(fds))
    said.append("perf map %s" % os.path.exists(
        "/tmp/perf-%d.map" % os.getpid()))
    said.append("active %s" % sys.is_stack_trampoline_active())
    print(*said, sep="\n")


def case_allocators():
    # The otel_memory probes put a wrapper on the PyMem allocators while
    # armed: PyMem_GetAllocator()/SetAllocator() users (tracemalloc, a C
    # extension's hooks, the allocator's name) must see what they would
    # without it.
    import _testcapi
    import _testinternalcapi
    import tracemalloc
    print("name", _testinternalcapi.pymem_getallocatorsname())
    big = bytearray(16 << 20)       # sampled: the probes fire
    for round in range(2):
        tracemalloc.start()
        data = [bytes(1000 + i) for i in range(100)]
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, __file__)])
        stats = snapshot.statistics("lineno")
        print("round", round, "traced", tracemalloc.is_tracing(),
              "count", stats[0].count,
              "sized", stats[0].size >= sum(len(d) for d in data))
        tracemalloc.stop()
        del data
    print("traced after stop", tracemalloc.is_tracing())
    # A C extension's own allocator: _testcapi's failing hooks.
    _testcapi.set_nomemory(0)
    try:
        bytearray(1 << 20)
    except MemoryError:
        failed = True
    else:
        failed = False
    finally:
        _testcapi.remove_mem_hooks()
    print("nomemory raised", failed)
    print("name", _testinternalcapi.pymem_getallocatorsname())
    del big


if __name__ == "__main__":
    import os
    case = sys.argv[1] if len(sys.argv) > 1 else os.environ["INVISIBLE_CASE"]
    globals()["case_" + case]()
