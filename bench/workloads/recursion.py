"""Call-heavy: deep and wide recursion (fib, ackermann, tree building/walking)."""
import sys

from _harness import SCALE, bench_main


def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


def ack(m, n):
    if m == 0:
        return n + 1
    if n == 0:
        return ack(m - 1, 1)
    return ack(m - 1, ack(m, n - 1))


def make_tree(depth):
    if depth == 0:
        return None
    return (make_tree(depth - 1), make_tree(depth - 1))


def count_tree(t):
    if t is None:
        return 1
    return count_tree(t[0]) + count_tree(t[1])


def run(scale):
    reps = max(1, int(380 * scale))
    total = 0
    for _ in range(reps):
        total += fib(20)
        total += ack(2, 40)
        total += count_tree(make_tree(10))
    return total


if __name__ == "__main__":
    bench_main(run, setup=lambda: sys.setrecursionlimit(10000))
