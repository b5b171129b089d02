"""re matching: compiled patterns, findall/sub/split, callbacks, groups."""
import re
import os, sys, time

SCALE = float(os.environ.get("BENCH_SCALE", "1.0"))

LINE = ("2024-03-{d:02d} 12:{m:02d}:07 host{h}.example.org GET /api/v{v}/items/{i}?q=abc{i} "
        "status={s} bytes={b} user=<user{i}@mail.example.com> ref=https://x.example/{h}/{m}")


def run(scale):
    reps = max(1, int(290 * scale))
    lines = [LINE.format(d=i % 28 + 1, m=i % 60, h=i % 7, v=i % 3, i=i, s=200 + (i % 5) * 100,
                         b=i * 37) for i in range(400)]
    text = "\n".join(lines)
    p_req = re.compile(r"(\S+) (\S+) (\S+) (GET|POST) (/\S+) status=(\d+) bytes=(\d+)")
    p_mail = re.compile(r"<([\w.]+)@([\w.]+)>")
    p_num = re.compile(r"\d+")
    acc = 0
    for r in range(reps):
        for ln in lines:
            m = p_req.match(ln)
            if m:
                acc += int(m.group(6)) + len(m.group(5))
        acc += len(p_mail.findall(text))
        acc += len(p_num.sub(lambda mm: str(len(mm.group())), text[:20000]))
        acc += len(re.split(r"[\s=/]+", text[:10000]))
        acc += sum(1 for _ in re.finditer(r"host(\d)\.example", text))
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
