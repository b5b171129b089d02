"""String building and formatting: f-strings, %-format, str.format, join, split, methods."""
import os, sys, time

SCALE = float(os.environ.get("BENCH_SCALE", "1.0"))

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def run(scale):
    reps = max(1, int(590 * scale))
    acc = 0
    for r in range(reps):
        parts = []
        for i in range(400):
            w = WORDS[i % 8]
            parts.append(f"{w}:{i:05d}:{i * 1.5:.2f}")
            parts.append("%s-%d-%x" % (w.upper(), i, i * 7))
            parts.append("{0}/{1!r}/{2:>8}".format(w, i, w[::-1]))
        text = ",".join(parts)
        acc += len(text)
        fields = text.split(",")
        acc += sum(1 for f in fields if f.startswith("ALPHA"))
        s = ""
        for f in fields[:300]:
            s += f.replace(":", ";").title()
        acc += len(s) + s.count("Beta")
        acc += len(" ".join(w.center(12, "*") for w in WORDS * 20))
    return acc


if __name__ == "__main__":
    if os.environ.get("BENCH_DRYRUN"):  # startup + module body only (armed-probe baseline)
        sys.exit(0)
    t0 = time.perf_counter_ns()
    chk = run(SCALE)
    t1 = time.perf_counter_ns()
    if os.environ.get("BENCH_TIMING"):
        print(f"elapsed_ns={t1 - t0}", file=sys.stderr)
    print(chk)
