"""What -f costs on a real application: a selection of one module that
makes well under 1 % of the calls (issue 54's check).

The application (APP below) does symbolic algebra with sympy, renders
markdown with python-markdown and templates with jinja2, all from
Debian 12's packages (python3-sympy, python3-markdown, python3-jinja2,
and mpmath and markupsafe with them), found through a scratch directory
of links on PYTHONPATH (the rest of dist-packages holds 3.11 extension
modules).  First, sys.setprofile counts the calls per module, and the
bench picks the module given (--module), saying its share.  Then, in
rounds that alternate them: the application untraced, under
`usdt.tools calls -f MODULE --top 0 -c`, under `usdt.tools latency
-f MODULE -c`, and under cProfile (of the whole program, for scale);
each gives the CPU time of its work (the process's, user
and system, from inside).  It prints the median ratios, and whether
`calls -f --top 0` counted every function of the module exactly as
sys.setprofile does: of the functions whose counts do not vary between
three runs under sys.setprofile (sympy's caches make a few vary), and
no function that the selection does not select.

usage: python3 bench/select_cost.py PYTHON [--module M] [--rounds N]
           [--out-json F]
As root (bpftrace).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

DIST = "/usr/lib/python3/dist-packages"
PACKAGES = ("sympy", "mpmath", "markdown", "jinja2", "markupsafe")

APP = r'''
import json, os, sys, time

def work():
    import sympy, markdown, jinja2
    x, y, z = sympy.symbols("x y z")
    e = sympy.expand((x + y + z) ** 7)
    f = sympy.factor(x ** 6 - y ** 6)
    i = sympy.integrate(sympy.sin(x) ** 3 * sympy.cos(x) ** 2, x)
    s = sympy.series(sympy.exp(sympy.sin(x)), x, 0, 8)
    text = "\n".join("# Part %d\n\nSome *text* with `code` and a "
                     "[link](http://example.com/%d).\n\n- a\n- b\n"
                     % (n, n) for n in range(40))
    html = [markdown.markdown(text) for _ in range(10)]
    env = jinja2.Environment()
    t = env.from_string("{% for row in rows %}<tr>{% for c in row %}"
                        "<td>{{ c|e }}</td>{% endfor %}</tr>{% endfor %}")
    pages = [t.render(rows=[[n, n * 2, "<%d>" % n] for n in range(50)])
             for _ in range(100)]
    return len(str(e)) + len(str(f)) + len(str(i)) + len(str(s)) \
        + sum(map(len, html)) + sum(map(len, pages))

if sys.argv[1:] == ["profile"]:
    counts = {}
    def profile(frame, event, arg):
        if event == "call":
            c = frame.f_code
            key = "%s|%s|%d" % (c.co_filename, c.co_name, c.co_firstlineno)
            counts[key] = counts.get(key, 0) + 1
    sys.setprofile(profile)
    work()
    sys.setprofile(None)
    print(json.dumps(counts))
else:
    start = time.process_time_ns()
    work()
    print("cpu_ns=%d" % (time.process_time_ns() - start), file=sys.stderr)
    print("total_ns=%d" % time.process_time_ns(), file=sys.stderr)
'''

CPU = re.compile(r"cpu_ns=(\d+)")
TOTAL = re.compile(r"total_ns=(\d+)")
CALLS = re.compile(r"^@calls\[(.*), (.*), (-?\d+)\]: (\d+)$", re.M)


def scratch():
    path = tempfile.mkdtemp(prefix="select-cost")
    for name in PACKAGES:
        os.symlink(os.path.join(DIST, name), os.path.join(path, name))
    app = os.path.join(path, "app.py")
    with open(app, "w") as f:
        f.write(APP)
    return path, app


def cpu(proc):
    found = CPU.findall(proc.stderr)
    if proc.returncode != 0 or len(found) != 1:
        sys.exit("bench/select_cost.py: %s failed (%d):\n%s"
                 % (" ".join(proc.args), proc.returncode, proc.stderr[-3000:]))
    return int(found[0])


def profile_runs(python, app, env, n):
    """The counts that sys.setprofile gives in *n* runs of the
    application: [{"file|name|line": calls}]."""
    runs = []
    for _ in range(n):
        proc = subprocess.run([python, app, "profile"], env=env, text=True,
                              capture_output=True)
        runs.append(json.loads(proc.stdout))
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--module", default="sympy/polys/densebasic",
                        help="the -f text (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out-json")
    in_scratch(measure, parser.parse_args())


def in_scratch(measure, args):
    """measure(args, python, path, app) with the application in a scratch
    directory, removed after."""
    python = os.path.abspath(args.python)
    path, app = scratch()
    try:
        measure(args, python, path, app)
    finally:
        shutil.rmtree(path)


def measure(args, python, path, app):
    env = dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED="0")
    sys.path.insert(0, os.path.join(os.path.dirname(python), "..", "src",
                                    "Lib"))
    from usdt import _select

    runs = profile_runs(python, app, env, 3)
    every = runs[0]
    total = sum(every.values())
    expected = {}
    varying = set()
    for key, n in every.items():
        filename, name, line = key.rsplit("|", 2)
        if _select.selects(args.module, filename, name):
            key = filename, name, int(line)
            expected[key] = n
            if any(run.get("|".join(map(str, key))) != n for run in runs):
                varying.add(key)
    share = sum(expected.values()) / total
    print("%d Python calls; -f %s selects %d functions, %d calls (%.3f %%); "
          "%d of them vary between runs under sys.setprofile"
          % (total, args.module, len(expected), sum(expected.values()),
             100 * share, len(varying)), flush=True)

    commands = {
        "untraced": [python, app],
        "calls -f": [python, "-m", "usdt.tools", "calls", "-f", args.module,
                     "--top", "0", "-c", "%s %s" % (python, app)],
        "latency -f": [python, "-m", "usdt.tools", "latency", "-f",
                       args.module, "-c", "%s %s" % (python, app)],
        "cProfile": [python, "-m", "cProfile", "-o", os.devnull, app],
    }
    times = {name: [] for name in commands}
    exact = []
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            proc = subprocess.run(cmd, env=env, text=True,
                                  capture_output=True)
            times[name].append(cpu(proc))
            if name == "calls -f":
                found = {(f, n, int(l)): int(c)
                         for f, n, l, c in CALLS.findall(proc.stdout)}
                stable = {key: n for key, n in expected.items()
                          if key not in varying}
                shown = {key: found.get(key) for key in stable}
                unselected = set(found) - set(expected)
                exact.append(shown == stable and not unselected)
                if not exact[-1]:
                    print("calls -f differs: %s; not selected: %s" % (
                        sorted((key, shown[key], n) for key, n in
                               stable.items() if shown[key] != n)[:5],
                        sorted(unselected)[:5]))
    untraced = times["untraced"]
    result = {"module": args.module, "calls": total,
              "functions": len(expected), "varying": len(varying),
              "selected_calls": sum(expected.values()), "share": share,
              "cpu_ns": times, "exact": exact}
    for name in ("calls -f", "latency -f", "cProfile"):
        ratio = statistics.median(t / u for t, u in
                                  zip(times[name], untraced))
        result[name] = ratio
        print("%-11s x%.3f (untraced median %.0f ms)"
              % (name, ratio, statistics.median(untraced) / 1e6))
    print("calls -f --top 0 equal to sys.setprofile's counts (%d functions "
          "that do not vary), nothing unselected: %s"
          % (len(expected) - len(varying), exact))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
