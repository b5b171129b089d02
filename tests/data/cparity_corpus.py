"""A workload of C calls and exceptions, each from a warm call site.

tests/test_parity.py runs it once with a reference hook and once under
bpftrace with the cfunction__* or exception__* probes, and compares the
counts per thread and per site:

  --profile   sys.setprofile() in every thread: 'c_call', and 'c_return'
              or 'c_exception', per (calling line, callable), the callable
              named as the probes name it (c_name() below)
  --monitor   a sys.monitoring tool for RAISE, RERAISE and
              EXCEPTION_HANDLED, per (function, line, exception type), the
              line read from the frame as a callback sees it and the type
              named as a traceback prints it (type_name() below)

Without a mode it runs the corpus with no hook (the probe runs).  It runs
in three threads (corpus_threads.py), and prints "ROUNDS <n>" and
"UNCOUNTED <first> <last>" for the lines of the code that runs before a
hook is installed (the module, its class bodies, make_local_error),
straddles its installation, or is the hooks: both runs leave those lines
out.

usage: cparity_corpus.py [--profile|--monitor] [ROUNDS]
"""

import _json
import collections
import functools
import inspect
import io
import json
import math
import sys
import threading
import time
import types

from corpus_threads import run_in_three_threads

ROUNDS = 300


class Outer:
    class InnerError(Exception):
        pass


class Relocated(Exception):
    pass


Relocated.__module__ = "fake.place"


def make_local_error():
    class LocalError(Exception):
        pass
    return LocalError


LocalError = make_local_error()


class Mine(list):                       # inherits list's C methods
    pass


def plus(a, b):
    return a + b


def is_odd(n):
    return n % 2


def squares(n):                         # C calls inside a generator
    for i in range(n):
        yield abs(-i) * i


def builtin_functions(buf):
    total = len("abc") + abs(-2) + max(1, 2) + min((3, 4))
    print("x", 1, file=buf)
    total += isinstance(buf, io.StringIO) + len(buf.getvalue())
    total += hash("a") & 1
    return total + sum(squares(3))


def builtin_methods():
    items = []
    items.append(1)                     # method descriptor, self bound
    list.append(items, 2)               # method descriptor, unbound
    append = items.append               # builtin method object
    append(3)
    table = {"a": 1}
    total = table.get("a") + table.get("b", 0)
    total += len(",".join(["a", "b"])) + len(str.join("-", ["c", "d"]))
    keys = dict.fromkeys("ab")          # classmethod of a C type
    mine = Mine()
    mine.append(1)                      # the profiler gets mine.append,
    list.append(mine, 2)                # a method of Mine, both times
    mine_append = mine.append
    mine_append(3)
    try:
        list.append(5, 1)               # wrong-type self: no c_call
    except TypeError:
        total += 1
    try:
        list.append()                   # no self at all
    except TypeError:
        total += 1
    return total + len(items) + len(keys) + len(mine)


def extension_functions():
    total = math.sqrt(4.0) + math.floor(2.5)
    total += time.monotonic() > 0
    queue = collections.deque()
    queue.append(1)
    queue.appendleft(0)
    total += queue.popleft()
    total += len(json.dumps({"a": [1, 2]})) + len(json.loads("[1, 2]"))
    total += len(_json.encode_basestring_ascii("\xe9"))
    total += json.decoder.scanstring('"ab"', 1)[1]     # _json.scanstring
    return total


def higher_order():
    power = functools.partial(pow, 2)   # partial of a C function
    total = power(3) + functools.partial(plus, 1)(2)
    total += sum(map(abs, (-1, 2))) + sum(map(is_odd, (1, 2)))
    total += len(list(filter(None, (0, 1))))
    total += len(list(filter(callable, (len, 0))))
    total += len(list(filter(is_odd, (1, 2, 3))))
    total += sorted((3, -1, 2), key=abs)[0]
    total += len(sorted(("b", "A"), key=str.lower))
    total += sum(x * x for x in range(3))
    return total


def with_blocks(lock):
    total = 0
    with lock:                          # C context manager: __exit__ call
        total += 1
    with io.StringIO() as f:
        f.write("x")
    try:
        with lock:
            raise ValueError("in with")
    except ValueError:
        total += lock.locked() + 1
    return total


def c_exceptions():
    total = 0
    try:
        math.sqrt(-1)                   # c_exception
    except ValueError:
        total += 1
    try:
        divmod(1, 0)
    except ZeroDivisionError:
        total += 1
    try:
        [].pop()
    except IndexError:
        total += 1
    try:
        json.loads("{bad")
    except json.JSONDecodeError:
        total += 1
    return total


def raises(depth):                      # unwinds through several frames
    if depth == 0:
        raise KeyError(depth)
    return raises(depth - 1)


class Flaky:
    @property
    def missing(self):                  # hasattr() handles it in C
        raise AttributeError("missing")


def try_finally():
    total = 0
    try:
        try:
            raises(2)
        finally:
            total += abs(-1)            # finally re-raises: RERAISE
    except KeyError:
        total += 1
    try:
        pass
    finally:
        total += 1
    total += hasattr(Flaky(), "missing")
    return total


def reraise():
    total = 0
    try:
        try:
            raise Outer.InnerError()
        except Outer.InnerError:
            raise                       # bare raise: RERAISE
    except Exception:
        total += 1
    try:
        try:
            raise Relocated()
        except Relocated as exc:
            raise RuntimeError("chained") from exc
    except RuntimeError:
        total += 1
    try:
        try:
            raise LocalError()
        except LocalError as exc:
            raise exc                   # raise of the same object: RAISE
    except LocalError:
        total += 1
    return total


def groups():
    total = 0
    try:
        raise ExceptionGroup("g", [ValueError(1), TypeError(2),
                                   LocalError()])
    except* ValueError:
        total += 1
    except* (TypeError, LocalError):
        total += 1
    try:
        try:
            raise ExceptionGroup("h", [ValueError(1), KeyError(2)])
        except* ValueError:
            total += 1                  # the KeyError part is re-raised
    except ExceptionGroup as group:
        total += len(group.exceptions)
    return total


def echo():
    while True:
        try:
            yield
        except ValueError:
            pass


def generators():
    gen = echo()
    next(gen)
    gen.throw(ValueError)               # handled in the generator
    gen.close()                         # GeneratorExit
    return 1


def corpus(rounds):
    lock = threading.Lock()
    buf = io.StringIO()
    total = 0
    for _ in range(rounds):
        total += builtin_functions(buf)
        total += builtin_methods()
        total += extension_functions()
        total += higher_order()
        total += with_blocks(lock)
        total += c_exceptions()
        total += try_finally()
        total += reraise()
        total += groups()
        total += generators()
        buf.seek(0)
        buf.truncate()
    return total


def c_name(func):
    """(module, name) of a C callable that sys.setprofile() reports, by
    the rule of Python/pydtrace_cfunction.c: __qualname__ is the owner
    type's __qualname__ and the function's __name__ (the owner: __self__
    if it is a type, else its type, unless it is a module); the module is
    __module__ if it is a str, else the owner's __module__, else "".

    A method descriptor called with its self (mine.append(1),
    list.append(mine, 1)) reaches the profiler bound to that self, as
    mine.append: its owner is type(mine), a subclass of the descriptor's
    type, and the same callable stored and called later has that owner."""
    owner = getattr(func, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType):
        owner = None
    elif not isinstance(owner, type):
        owner = type(owner)
    name = func.__name__
    if owner is not None:
        name = owner.__qualname__ + "." + name
    module = getattr(func, "__module__", None)
    if not isinstance(module, str):
        module = owner.__module__ if owner is not None else ""
    return module, name


def type_name(exc):
    """The exception's type as a traceback prints it."""
    cls = type(exc)
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return cls.__module__ + "." + cls.__qualname__


COUNTS = {}                             # {native thread id: {key: count}}


def count(key):
    # One dict per thread: only its own thread updates it.
    counts = COUNTS.setdefault(threading.get_native_id(), {})
    counts[key] = counts.get(key, 0) + 1


def profiler(frame, event, arg):
    if event.startswith("c_") and frame.f_code.co_filename == __file__:
        count((event, frame.f_code.co_filename, frame.f_lineno,
               *c_name(arg)))


def monitor(event):
    def callback(code, offset, exc):
        if code.co_filename == __file__:
            # f_lineno is None where the frame is at an instruction of no
            # line (except* does that): the probes' int argument says -1.
            lineno = sys._getframe(1).f_lineno
            count((event, code.co_filename, code.co_name,
                   -1 if lineno is None else lineno, type_name(exc)))
    return callback


TOOL = 4
E = sys.monitoring.events
MONITORED = {E.RAISE: "raise", E.RERAISE: "reraise",
             E.EXCEPTION_HANDLED: "handled"}


def install_monitor():
    sys.monitoring.use_tool_id(TOOL, "cparity")
    for event, name in MONITORED.items():
        sys.monitoring.register_callback(TOOL, event, monitor(name))
    sys.monitoring.set_events(TOOL, E.RAISE | E.RERAISE | E.EXCEPTION_HANDLED)


def remove_monitor():
    sys.monitoring.set_events(TOOL, 0)
    sys.monitoring.free_tool_id(TOOL)


def main():
    args = sys.argv[1:]
    mode = args.pop(0) if args and args[0].startswith("--") else None
    rounds = int(args[0]) if args else ROUNDS
    if mode == "--profile":
        threading.setprofile_all_threads(profiler)
    elif mode == "--monitor":
        install_monitor()
    elif mode is not None:
        sys.exit("usage: cparity_corpus.py [--profile|--monitor] [ROUNDS]")
    run_in_three_threads(corpus, rounds)
    if mode == "--profile":
        threading.setprofile_all_threads(None)
    elif mode == "--monitor":
        remove_monitor()
    report(rounds)


def import_time_code(code):
    """The module's code and its class bodies (code that is not a
    function's): they run once, when the module is executed."""
    yield code
    for const in code.co_consts:
        if (isinstance(const, types.CodeType)
                and not const.co_flags & inspect.CO_OPTIMIZED):
            yield from import_time_code(const)


def report(rounds):
    print("ROUNDS", rounds)
    for func in (make_local_error, c_name, type_name, count, profiler,
                 monitor, install_monitor, remove_monitor, main,
                 import_time_code, report):
        # From its first line to its last: the code nested in it included.
        lines = [line for _, _, line in func.__code__.co_lines() if line]
        print("UNCOUNTED", min(lines), max(lines))
    for code in import_time_code(MODULE_CODE):
        for line in sorted({line for _, _, line in code.co_lines() if line}):
            print("UNCOUNTED", line, line)
    for tid, counts in sorted(COUNTS.items()):
        for key, n in sorted(counts.items(), key=repr):
            print("COUNT", tid, *key, n, sep="\t")


MODULE_CODE = sys._getframe().f_code
main()
