"""What calls and latency of every function cost a real application, with
the batches of python:batch against one trap per event, and against
cProfile in the same run (issue 55's check).

The application is select_cost.py's (sympy, python-markdown and jinja2
from Debian 12's packages, through a scratch directory of links on
PYTHONPATH).  In rounds that alternate them: the application untraced,
under cProfile (of the whole program), under `usdt.tools calls --top 0
-c` and `usdt.tools latency --top 0 -c` (batched, their default), and
with --per-event also under both tools' --per-event scripts (one trap per
event: slow, a minute a round).  Each gives the CPU time of the
application's work (the process's, user and system, from inside: the
BPF programs run in the traced process and count there), and the CPU
time of everything else the run took outside the application's process
(the tool, bpftrace: the children's rusage less the application's whole
CPU time, which it prints at exit).  It prints the median ratios to the
untraced work, and whether `calls --top 0` counted every function of the
application's packages exactly as sys.setprofile does: those whose
counts do not vary between --truth-runs runs under sys.setprofile (sympy's
assumptions, cached in sets of objects hashed by address, make a few
hundred vary, some only now and then; and its factoring draws random
numbers, which now and then takes another path, with a few functions
never called).  So each round also checks it in one process: `calls
--top 0 -c` of the application while its own sys.setprofile function
counts its calls, every function of its packages (nothing varies within
one run).

usage: python3 bench/batch_cost.py PYTHON [--rounds N] [--truth-runs N]
           [--per-event] [--out-json F]
As root (bpftrace).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import select_cost  # noqa: E402  (the application, its scratch directory)


def children_cpu_ns():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((usage.ru_utime + usage.ru_stime) * 1e9)


def run(cmd, env):
    """(the application's work CPU ns, the CPU ns outside its process,
    the run's stdout)."""
    before = children_cpu_ns()
    proc = subprocess.run(cmd, env=env, text=True, capture_output=True)
    spent = children_cpu_ns() - before
    work = select_cost.cpu(proc)
    whole = select_cost.TOTAL.findall(proc.stderr)
    if len(whole) != 1:
        sys.exit("bench/batch_cost.py: %s printed no total_ns:\n%s"
                 % (" ".join(cmd), proc.stderr[-3000:]))
    return work, max(0, spent - int(whole[0])), proc.stdout


def same_process(python, app, path, env):
    """calls --top 0 of the application in its profile mode: its own
    sys.setprofile counts printed on its stdout, the tool's in a file."""
    import tempfile
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        proc = subprocess.run(
            [python, "-m", "usdt.tools", "calls", "--top", "0", "-o",
             out.name, "-c", "%s %s profile" % (python, app)],
            env=env, text=True, capture_output=True)
        if proc.returncode != 0:
            sys.exit("bench/batch_cost.py: calls of the profile run failed:"
                     "\n%s" % proc.stderr[-3000:])
        text = out.read()
    truth = json.loads(proc.stdout.strip().splitlines()[-1])
    found = {(f, n, int(l)): int(c)
             for f, n, l, c in select_cost.CALLS.findall(text)}
    expected = {}
    for key, n in truth.items():
        filename, name, line = key.rsplit("|", 2)
        if filename.startswith(path + os.sep):
            expected[filename, name, int(line)] = n
    differ = sorted((key, found.get(key), n) for key, n in expected.items()
                    if found.get(key) != n)
    return {"functions": len(expected), "differ": differ}


def describe(same):
    return "%d functions of the packages, %s" % (
        same["functions"], "all equal" if not same["differ"] else
        "%d differ (function, found, setprofile): %s" % (
            len(same["differ"]), same["differ"][:5]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("python")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--truth-runs", type=int, default=5,
                        help="runs under sys.setprofile that tell the "
                        "functions whose counts vary (default %(default)s)")
    parser.add_argument("--per-event", action="store_true",
                        help="also the tools' --per-event scripts")
    parser.add_argument("--out-json")
    select_cost.in_scratch(measure, parser.parse_args())


def measure(args, python, path, app):
    env = dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED="0")
    runs = select_cost.profile_runs(python, app, env, args.truth_runs)
    expected, varying = {}, set()
    for key, n in runs[0].items():
        filename, name, line = key.rsplit("|", 2)
        if not filename.startswith(path + os.sep):
            continue
        where = filename, name, int(line)
        expected[where] = n
        if any(other.get(key) != n for other in runs):
            varying.add(where)
    total = sum(runs[0].values())
    print("%d Python calls; the application's packages: %d functions, %d "
          "calls, %d functions vary between runs under sys.setprofile"
          % (total, len(expected), sum(expected.values()), len(varying)),
          flush=True)
    command = "%s %s" % (python, app)
    commands = {
        "untraced": [python, app],
        "cProfile": [python, "-m", "cProfile", "-o", os.devnull, app],
        "calls": [python, "-m", "usdt.tools", "calls", "--top", "0",
                  "-c", command],
        "latency": [python, "-m", "usdt.tools", "latency", "--top", "0",
                    "-c", command],
    }
    if args.per_event:
        for tool in ("calls", "latency"):
            commands[tool + " --per-event"] = commands[tool][:4] + [
                "--per-event"] + commands[tool][4:]
    times = {name: [] for name in commands}
    outside = {name: [] for name in commands}
    exact, same_rounds = [], []
    for _ in range(args.rounds):
        for name, cmd in commands.items():
            work, other, stdout = run(cmd, env)
            times[name].append(work)
            outside[name].append(other)
            if name == "calls":
                found = {(f, n, int(l)): int(c) for f, n, l, c in
                         select_cost.CALLS.findall(stdout)}
                differ = sorted((key, found.get(key), n)
                                for key, n in expected.items()
                                if key not in varying
                                and found.get(key) != n)
                exact.append(not differ)
                if differ:
                    # A function of the packages that every setprofile
                    # run called and this one never did: the program
                    # took another path (sympy's factoring draws random
                    # numbers), which the same-process check below rules
                    # in or out as a loss.
                    uncalled = sorted(key for key in expected
                                      if key not in found)
                    print("calls --top 0 differs from the separate "
                          "setprofile runs (function, found, setprofile): "
                          "%s; %d functions of the packages that they "
                          "called were not called in this run%s" % (
                              differ[:5], len(uncalled),
                              " (another path): %s" % uncalled[:4]
                              if uncalled else ""), flush=True)
                # Then in one process, with the application's own
                # sys.setprofile function: nothing varies within a run.
                same_rounds.append(same_process(python, app, path, env))
                print("round %d: calls --top 0 in the process that "
                      "sys.setprofile counts: %s" % (
                          len(same_rounds), describe(same_rounds[-1])),
                      flush=True)
    untraced = times["untraced"]
    result = {"calls": total, "functions": len(expected),
              "same_process": same_rounds, "truth_runs": args.truth_runs,
              "varying": len(varying), "cpu_ns": times,
              "outside_cpu_ns": outside, "exact": exact, "ratios": {}}
    for name in commands:
        if name == "untraced":
            continue
        ratio = statistics.median(t / u for t, u in zip(times[name],
                                                         untraced))
        result["ratios"][name] = ratio
        print("%-20s x%.3f of the untraced work (median %.0f ms); outside "
              "the process %.0f ms CPU" % (
                  name, ratio, statistics.median(untraced) / 1e6,
                  statistics.median(outside[name]) / 1e6))
    print("calls --top 0 equal to separate runs under sys.setprofile (%d "
          "functions that did not vary between them): %s"
          % (len(expected) - len(varying), exact))
    print("calls --top 0 equal to sys.setprofile in the same process (all "
          "%d functions of the packages): %s" % (
              len(expected), [not same["differ"] for same in same_rounds]))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
