"""A workload that takes every path by which the 3.13 interpreter starts
and stops a Python frame, each from a warm (specialised) call site.

tests/test_parity.py runs it once under sys.setprofile and once under
bpftrace's function__entry/function__return probes, and compares the
per-thread, per-function counts.  It runs in three threads
(corpus_threads.py).

usage: parity_corpus.py [--profile|--trace] [ROUNDS]

--trace counts sys.settrace's line events per thread, function and line
instead, for the line probe.
"""

import sys
import threading

from corpus_threads import run_in_three_threads

ROUNDS = 2000


def plain(a, b):                        # CALL_PY_EXACT_ARGS
    return a + b


def with_defaults(a, b=2, *args, **kw):  # CALL_PY_GENERAL
    return a + b + len(args) + len(kw)


def returns_const():                    # RETURN_CONST
    pass


class Widget:
    def __init__(self, value):          # CALL_ALLOC_AND_ENTER_INIT
        self.value = value

    def method(self, x):                # CALL_BOUND_METHOD_EXACT_ARGS
        return self.value + x

    def method_general(self, x, *rest):  # CALL_BOUND_METHOD_GENERAL
        return x

    def __getitem__(self, index):       # BINARY_SUBSCR_GETITEM
        return index

    @property
    def prop(self):                     # LOAD_ATTR_PROPERTY
        return self.value


class Intercepting:
    def __getattribute__(self, name):   # LOAD_ATTR_GETATTRIBUTE_OVERRIDDEN
        return name


def counter(n):                         # FOR_ITER_GEN, YIELD_VALUE
    for i in range(n):
        yield i


def relay(n):                           # SEND_GEN (yield from)
    total = yield from counter(n)
    return total


def echo():                             # gen.send/throw/close
    while True:
        try:
            received = yield
        except ValueError:
            received = None
        if received == "stop":
            return


def raises(depth):                      # exception unwinding
    if depth == 0:
        raise KeyError(depth)
    return raises(depth - 1)


def catches():
    try:
        raises(2)
    except KeyError:
        return 1


def key_function(item):                 # frame entered from C: sorted()
    return -item


def mapped(item):                       # frame entered from C: map()
    return item * 2


async def leaf_coroutine(x):            # coroutine, driven by send()
    return x


async def outer_coroutine(x):
    return await leaf_coroutine(x)


def drive(coroutine):
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value


EXEC_FILENAME = "<parity-exec>"
EXEC_SOURCE = compile("def executed():\n    return 1\nexecuted()\n",
                      EXEC_FILENAME, "exec")
# Frames that run before profiling starts (the module and class bodies),
# straddle its start and end (main), or are the hooks themselves.
UNCOUNTED = {(__file__, name) for name in
             ("<module>", "Widget", "Intercepting", "main", "profiler",
              "tracer", "counted")}


def corpus(rounds):
    widget = Widget(1)
    intercepting = Intercepting()
    total = 0
    for i in range(rounds):
        total += plain(i, 1)
        total += with_defaults(i)
        total += with_defaults(i, 3, 4, k=5)
        returns_const()
        total += Widget(i).value
        total += widget.method(i)
        total += widget.method_general(i, 1)
        total += widget[i]
        total += widget.prop
        total += len(intercepting.anything)
        for j in counter(3):
            total += j
        for j in relay(2):
            total += j
        gen = echo()
        next(gen)
        gen.send(1)
        gen.throw(ValueError)
        gen.close()
        total += catches()
        total += sum(sorted((3, 1, 2), key=key_function))
        total += sum(map(mapped, (1, 2)))
        # A generator expression: its loop is on the line of its RESUME.
        total += sum(j for j in range(2))
        total += drive(outer_coroutine(i))
        exec(EXEC_SOURCE, {})
    return total


def main():
    args = sys.argv[1:]
    mode = args.pop(0) if args and args[0].startswith("--") else None
    rounds = int(args[0]) if args else ROUNDS
    counts = {}

    def counted(code):
        return (code.co_filename in (__file__, EXEC_FILENAME)
                and (code.co_filename, code.co_name) not in UNCOUNTED)

    def profiler(frame, event, arg):
        code = frame.f_code
        if event in ("call", "return") and counted(code):
            key = (event, threading.get_native_id(), code.co_filename,
                   code.co_name)
            counts[key] = counts.get(key, 0) + 1

    def tracer(frame, event, arg):
        code = frame.f_code
        if event == "line" and counted(code):
            key = ("line", threading.get_native_id(), code.co_filename,
                   code.co_name, frame.f_lineno)
            counts[key] = counts.get(key, 0) + 1
        return tracer

    hooks = {"--profile": threading.setprofile_all_threads,
             "--trace": threading.settrace_all_threads, None: None}
    if mode not in hooks:
        sys.exit("usage: parity_corpus.py [--profile|--trace] [ROUNDS]")
    install = hooks[mode]
    if install:
        install(profiler if mode == "--profile" else tracer)
    run_in_three_threads(corpus, rounds)
    if install:
        install(None)
        for key, count in sorted(counts.items()):
            print("COUNT", *key, count)


main()
