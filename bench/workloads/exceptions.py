"""Exceptions: raise/catch across frames, custom classes, finally, context managers."""

from _harness import SCALE, bench_main


class AppError(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


class NotFound(AppError):
    pass


def lookup(d, k):
    try:
        return d[k]
    except KeyError:
        raise NotFound(k) from None


def deep(n):
    if n == 0:
        raise ValueError("bottom")
    try:
        return deep(n - 1)
    finally:
        pass


class Guard:
    def __init__(self):
        self.exits = 0

    def __enter__(self):
        return self

    def __exit__(self, et, ev, tb):
        self.exits += 1
        return et is ZeroDivisionError


def run(scale):
    reps = max(1, int(4100 * scale))
    d = {i: i for i in range(0, 100, 2)}
    g = Guard()
    acc = 0
    for _ in range(reps):
        for k in range(100):
            try:
                acc += lookup(d, k)
            except NotFound as e:
                acc += e.code
        for _ in range(20):
            try:
                deep(10)
            except ValueError:
                acc += 1
        for i in range(100):
            with g:
                acc += 10 // (i % 5)
        try:
            int("x")
        except ValueError:
            acc += 3
    return acc + g.exits


if __name__ == "__main__":
    bench_main(run)
