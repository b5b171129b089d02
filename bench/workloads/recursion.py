"""Call-heavy: deep and wide recursion (fib, ackermann, tree building/walking)."""
import os, sys, time

SCALE = float(os.environ.get("BENCH_SCALE", "1.0"))


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
    if os.environ.get("BENCH_DRYRUN"):  # startup + module body only (armed-probe baseline)
        sys.exit(0)
    sys.setrecursionlimit(10000)
    t0 = time.perf_counter_ns()
    chk = run(SCALE)
    t1 = time.perf_counter_ns()
    if os.environ.get("BENCH_TIMING"):
        print(f"elapsed_ns={t1 - t0}", file=sys.stderr)
    print(chk)
