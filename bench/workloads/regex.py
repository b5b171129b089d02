"""re matching: compiled patterns, findall/sub/split, callbacks, groups."""
import re

from _harness import SCALE, bench_main

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
    bench_main(run)
