"""Closures and decorators: nested functions, nonlocal state, stacked wrappers, functools."""
import functools

from _harness import SCALE, bench_main


def counting(fn):
    calls = 0

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal calls
        calls += 1
        return fn(*args, **kwargs)

    wrapper.count = lambda: calls
    return wrapper


def clamp(lo, hi):
    def deco(fn):
        def wrapper(x):
            r = fn(x)
            return lo if r < lo else hi if r > hi else r
        return wrapper
    return deco


def make_adder(n):
    def add(x):
        return x + n
    return add


def compose(*fns):
    def composed(x):
        for f in fns:
            x = f(x)
        return x
    return composed


@counting
@clamp(-1000, 1000)
def poly(x):
    return x * x - 3 * x + 1


def accumulator():
    total = 0

    def acc(v):
        nonlocal total
        total += v
        return total
    return acc


def run(scale):
    reps = max(1, int(2640 * scale))
    out = 0
    for r in range(reps):
        adders = [make_adder(i) for i in range(20)]
        pipeline = compose(*adders)
        acc = accumulator()
        for i in range(100):
            acc(pipeline(i))
            out += poly(i - 50)
        out += acc(0)
        part = functools.partial(lambda a, b, c: a * b + c, 3, c=1)
        out += sum(map(part, range(50)))
    return out + poly.count()


if __name__ == "__main__":
    bench_main(run)
