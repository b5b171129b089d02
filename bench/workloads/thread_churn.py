"""Many short-lived threads: started in batches, each doing a little work, joined.

Every thread started through threading.Thread fires thread__start before its
first Python code and thread__stop after its last; the work of each thread
is small, so starting and ending threads is most of the run.
"""
import threading

from _harness import SCALE, bench_main


def job(k, results, local):
    local.value = k * k
    s = 0
    for i in range(20):
        s += (i * k) % 11
    results[k & 7] = s + local.value


def run(scale):
    reps = max(1, int(500 * scale))
    results = [0] * 8
    local = threading.local()
    acc = 0
    for r in range(reps):
        ts = [threading.Thread(target=job, args=(r * 8 + k, results, local),
                               name=f"churn-{k}", daemon=bool(k & 1))
              for k in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
            acc += len(t.name)
        acc += sum(results)
    return acc


if __name__ == "__main__":
    bench_main(run)
