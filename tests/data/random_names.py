"""Random names through every probe that converts a str (seeded; see
tests/test_random_names.py).

Functions, classes, modules and audit events get names built from random
code points (lone surrogates included), very long names, str subclasses
whose methods record any call, and non-str values.  The program prints
what it observes, which must be the same armed and unarmed, the names it
used (as the probes should render them), and "calls N": how many times
Python code of the str subclasses ran (must be 0).
usage: random_names.py SEED [OUTPUT]: what it observes goes to OUTPUT (a
file, so that a tracer's output on stdout cannot interleave with it) or to
stdout
"""

import random
import sys

calls = []


class Spy(str):
    """A str whose Python-level methods record that they ran."""

    def _record(name):
        def method(self, *args):
            calls.append(name)
            return getattr(str, name)(self, *args)
        return method

    for _name in ("__eq__", "__hash__", "__str__", "__len__", "__repr__",
                  "__format__", "encode", "__getitem__", "__iter__"):
        locals()[_name] = _record(_name)
    del _name, _record


def random_name(rng):
    size = rng.choice((1, 5, 40, 300, 1000))
    points = []
    for _ in range(size):
        kind = rng.random()
        if kind < 0.4:
            points.append(rng.randrange(0x61, 0x7b))
        elif kind < 0.6:
            points.append(rng.randrange(0x80, 0x800))
        elif kind < 0.75:
            points.append(rng.randrange(0xd800, 0xe000))    # surrogates
        elif kind < 0.9:
            points.append(rng.randrange(0x800, 0xd800))
        else:
            points.append(rng.randrange(0x10000, 0x110000))
    return "".join(map(chr, points))


def rendered(name):
    """What the probe helpers pass for *name*: UTF-8, '?' for surrogates,
    cut at a character boundary below 256 bytes (printed as hex)."""
    out = b""
    for ch in name:
        piece = b"?" if 0xd800 <= ord(ch) < 0xe000 else ch.encode()
        if len(out) + len(piece) >= 256:
            break
        out += piece
    return out.hex()


def main(seed, out):
    rng = random.Random(seed)
    observed = []
    for i in range(40):
        name = random_name(rng)
        choice = i % 4
        if choice == 0:
            def f():
                return 1
            f.__code__ = f.__code__.replace(co_name=name,
                                            co_filename="<random>")
            observed.append(f())
            print("function", rendered(name), file=out)
        elif choice == 1:
            module = rng.choice((Spy(name), name, 42, None, b"bytes"))
            cls = type("C%d" % i, (), {"__module__": module})
            observed.append(type(cls()).__name__)
        elif choice == 2:
            try:
                __import__(name)
            except Exception as exc:
                observed.append(type(exc).__name__)
            else:
                observed.append("imported")
        else:
            observed.append(sys.audit(rng.choice((name, Spy(name), 7)), i))
    calls_before = len(calls)
    print("observed", observed, file=out)
    print("calls", calls_before, file=out)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as out:
            main(int(sys.argv[1]), out)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 0, sys.stdout)
