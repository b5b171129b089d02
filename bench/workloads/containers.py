"""dict/list/set churn: inserts, deletes, comprehensions, sorting, membership."""

from _harness import SCALE, bench_main


def run(scale):
    reps = max(1, int(135 * scale))
    acc = 0
    for r in range(reps):
        d = {}
        for i in range(5000):
            d[i * 7 % 5003] = i
            d[f"k{i % 500}"] = i
        for i in range(0, 5000, 3):
            d.pop(i, None)
        acc += len(d) + sum(v for v in d.values() if v & 1)
        lst = [i * 31 % 1009 for i in range(5000)]
        lst.sort()
        lst.reverse()
        while len(lst) > 2500:
            lst.pop()
        lst[100:200] = [0] * 50
        acc += lst[0] + len(lst)
        s = set(range(0, 3000, 2))
        t = {i for i in range(0, 3000, 3)}
        acc += len(s & t) + len(s | t) + len(s - t)
        for i in range(3000):
            if i in s:
                s.discard(i)
            else:
                s.add(i)
        acc += len(s)
        inv = {v: k for k, v in d.items() if isinstance(k, int)}
        acc += len(inv)
        nested = [[j for j in range(i % 10)] for i in range(500)]
        acc += sum(map(len, nested))
    return acc


if __name__ == "__main__":
    bench_main(run)
