"""Loop-heavy, few calls: integer while/for loops, sieve, matrix multiply in one frame."""

from _harness import SCALE, bench_main


def run(scale):
    reps = max(1, int(52 * scale))
    acc = 0
    for r in range(reps):
        n = 20000
        sieve = [True] * n
        sieve[0] = sieve[1] = False
        i = 2
        while i * i < n:
            if sieve[i]:
                j = i * i
                while j < n:
                    sieve[j] = False
                    j += i
            i += 1
        cnt = 0
        for k in range(n):
            if sieve[k]:
                cnt += 1
        acc += cnt
        m = 28
        a = [[(x * y + r) % 17 for y in range(m)] for x in range(m)]
        b = [[(x + y) % 13 for y in range(m)] for x in range(m)]
        c = [[0] * m for _ in range(m)]
        for x in range(m):
            for y in range(m):
                s = 0
                for z in range(m):
                    s += a[x][z] * b[z][y]
                c[x][y] = s
        acc += c[m - 1][m - 1]
        x = 0
        k = 0
        while k < 30000:
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            if x & 4:
                acc += 1
            k += 1
    return acc


if __name__ == "__main__":
    bench_main(run)
