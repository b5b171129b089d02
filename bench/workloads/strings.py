"""String building and formatting: f-strings, %-format, str.format, join, split, methods."""

from _harness import SCALE, bench_main

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
    bench_main(run)
