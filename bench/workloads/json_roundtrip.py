"""json round-trips: dumps/loads of nested documents, with and without indent/sort_keys."""
import json

from _harness import SCALE, bench_main


def make_doc(seed):
    return {
        "id": seed,
        "name": f"item-{seed}",
        "tags": [f"t{(seed + i) % 17}" for i in range(8)],
        "price": seed * 1.25,
        "active": seed % 2 == 0,
        "nested": {"a": [1, 2, {"b": None, "c": "x" * (seed % 9)}], "d": {"e": seed}},
        "text": "unicode \u00e9\u00e8 \u2603 \"quoted\" \\ back",
    }


def run(scale):
    reps = max(1, int(275 * scale))
    docs = [make_doc(i) for i in range(200)]
    acc = 0
    enc_obj = json.JSONEncoder(separators=(",", ":"))
    for r in range(reps):
        s = json.dumps(docs)
        back = json.loads(s)
        acc += len(s) + len(back)
        s2 = json.dumps(docs[:40], indent=2, sort_keys=True)
        acc += len(json.loads(s2))
        for d in docs[:60]:
            acc += len(enc_obj.encode(d))
            acc += json.loads(json.dumps(d))["id"]
    return acc


if __name__ == "__main__":
    bench_main(run)
