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
probe:` at most 30 ns, a traced call at most 50 ns over a plain one.

usage: python3 bench/usdt_module.py PYTHON [--repeat N] [--number N]
                                           [--out-md FILE]
"""

import argparse
import json
import statistics
import subprocess
import sys

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


def render(python, version, results, repeat, number):
    median = {stmt: statistics.median(ns) for stmt, ns in results.items()}
    lines = [
        "usdt module, unarmed: `%s` (%s), %d runs of %d loops, ns per loop"
        % (python, version, repeat, number),
        "",
        "| statement | median | min | over | = | target |",
        "|---|---:|---:|---|---:|---|",
    ]
    for stmt, base, target in ROWS:
        extra = median[stmt] - median[base]
        if target is None:
            verdict = ""
        else:
            verdict = "≤ %d: %s" % (target, "met" if extra <= target
                                    else "**not met**")
        lines.append("| `%s` | %.1f | %.1f | `%s` | %+.1f | %s |"
                     % (stmt, median[stmt], min(results[stmt]), base, extra,
                        verdict))
    lines.append("| `pass` | %.1f | %.1f | | | |"
                 % (median["pass"], min(results["pass"])))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--number", type=int, default=1_000_000)
    parser.add_argument("--out-md")
    args = parser.parse_args()
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version.split()[0], "
         "'free-threaded' if hasattr(sys, '_is_gil_enabled') and not "
         "sys._is_gil_enabled() else 'GIL')"],
        capture_output=True, text=True).stdout.strip()
    results = measure(args.python, args.repeat, args.number)
    table = render(args.python, version, results, args.repeat, args.number)
    sys.stdout.write(table)
    if args.out_md:
        with open(args.out_md, "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
