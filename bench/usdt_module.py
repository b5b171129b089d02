"""What the usdt module's probes cost while no tracer is attached.

On the interpreter PYTHON, with timeit in a child process:

  if probe: pass      bool() of an unarmed usdt.Probe (its semaphore)
  obj.attr            an instance attribute read, for comparison
  if flag: pass       a plain bool, for comparison
  probe(1, "s")       firing an unarmed probe anyway (type checks + stub)
  traced(1)           a @usdt.traced function, against plain(1), the same
                      function undecorated
  obj.traced(1)       the same for methods, against obj.plain(1)

Each statement runs REPEAT times NUMBER loops; the table gives the median
and the minimum ns per loop, and the median minus that of `pass` (the
loop's own cost) or of the undecorated call.  Targets (issue 11): `if
probe:` at most 30 ns, a traced call at most 50 ns over a plain one; the
verdicts are computed from the medians.

--out-json FILE writes the raw samples, the machine and the targets;
bench/render.py renders docs/performance.md's section "The usdt module
(unarmed)" from bench/recorded/usdt-module-bench.json, the file next
to bench/recorded/performance.json (bench/README.md, "Standalone benchmarks").

usage: python3 bench/usdt_module.py PYTHON [--repeat N] [--number N]
                                           [--out-md FILE] [--out-json FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from measure import machine_info  # noqa: E402

CHILD = r"""
import json, sys, timeit, usdt

probe = usdt.Probe("bench", "probe", (int, str))

class Obj:
    def plain(self, x):
        return x

    @usdt.traced("bench", "method")
    def traced(self, x):
        return x

def plain(x):
    return x

@usdt.traced("bench")
def traced(x):
    return x

obj = Obj()
obj.attr = 1
flag = False
assert not probe and not traced.entry_probe and not traced.return_probe
statements = sys.argv[1:-2]
repeat, number = int(sys.argv[-2]), int(sys.argv[-1])
results = {}
# Interleaved, so that a busy moment of the machine hits all statements.
for _ in range(repeat):
    for stmt in statements:
        t = timeit.timeit(stmt, globals=globals(), number=number)
        results.setdefault(stmt, []).append(t / number * 1e9)
print(json.dumps(results))
"""

STATEMENTS = ["pass", "if probe: pass", "obj.attr", "if flag: pass",
              'probe(1, "s")', "plain(1)", "traced(1)", "obj.plain(1)",
              "obj.traced(1)"]
# (statement, baseline, target in ns over the baseline or None)
ROWS = [
    ("if probe: pass", "pass", 30),
    ("obj.attr", "pass", None),
    ("if flag: pass", "pass", None),
    ('probe(1, "s")', "pass", None),
    ("traced(1)", "plain(1)", 50),
    ("obj.traced(1)", "obj.plain(1)", 50),
    ("plain(1)", "pass", None),
    ("obj.plain(1)", "pass", None),
]


def measure(python, repeat, number):
    proc = subprocess.run([python, "-c", CHILD, *STATEMENTS, str(repeat),
                           str(number)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s" % (python, proc.stderr))
    return json.loads(proc.stdout)


def summarize(bench):
    """The rows and verdicts of a result (the --out-json data): [{stmt,
    median, min, base, extra, target, met}], met None without a target."""
    samples = bench["samples_ns"]
    median = {stmt: statistics.median(ns) for stmt, ns in samples.items()}
    rows = []
    for stmt, base, target in bench["rows"]:
        extra = median[stmt] - median[base]
        rows.append({"stmt": stmt, "median": median[stmt],
                     "min": min(samples[stmt]), "base": base, "extra": extra,
                     "target": target,
                     "met": None if target is None else extra <= target})
    return rows


def table(bench):
    """Markdown lines: the table of a result, its verdicts in the last
    column."""
    lines = ["| statement | median ns | min ns | baseline "
             "| median − baseline, ns | target | result |",
             "|---|---:|---:|---|---:|---|---|"]
    for r in summarize(bench):
        if r["target"] is None:
            target = result = ""
        else:
            target = "≤ %d ns" % r["target"]
            result = "met" if r["met"] else "**MISSED**"
        lines.append("| `%s` | %.1f | %.1f | `%s` | %+.1f | %s | %s |"
                     % (r["stmt"], r["median"], r["min"], r["base"],
                        r["extra"], target, result))
    samples = bench["samples_ns"]["pass"]
    lines.append("| `pass` | %.1f | %.1f | | | | |"
                 % (statistics.median(samples), min(samples)))
    return lines


def render(bench):
    i = bench["interpreter"]
    c = bench["config"]
    return "\n".join([
        "usdt module, unarmed: `%s` (%s, %s), %d runs of %d loops, ns per "
        "loop" % (i["path"], i["version"], i["build"], c["repeat"],
                  c["number"]),
        "", *table(bench)]) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=1_000_000)
    parser.add_argument("--out-md")
    parser.add_argument("--out-json")
    args = parser.parse_args()
    python = os.path.abspath(args.python)
    machine = machine_info({}, {})
    del machine["interpreters"]
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0]); print("
         "'free-threaded' if hasattr(sys, '_is_gil_enabled') and not "
         "sys._is_gil_enabled() else 'GIL')"],
        capture_output=True, text=True).stdout.split()
    if len(version) != 2:
        sys.exit("%s does not run" % python)
    samples = measure(python, args.repeat, args.number)
    machine["loadavg_at_end"] = open("/proc/loadavg").read().strip()
    bench = {"schema": 1, "kind": "usdt_module", "machine": machine,
             "interpreter": {"path": python, "version": version[0],
                             "build": version[1]},
             "config": {"repeat": args.repeat, "number": args.number},
             # (statement, baseline, target in ns over the baseline or None)
             "rows": [list(row) for row in ROWS],
             "samples_ns": samples}
    text = render(bench)
    sys.stdout.write(text)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(text)
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(bench, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
