#!/usr/bin/python3.11
"""Every pair of a wall-time run's interpreters: geomean ratio and its interval.

    wallpairs.py RESULTS.json [--per-workload ROLE]

RESULTS.json is what `bench/run.py` or `bench/release.py` wrote with a wall phase.
Their reports judge fixed pairs (A/U, C/A, R/P1 ...); this prints every pair, each
interpreter named by its build directory, which is what a comparison of several
builds of the same flags needs: `make bench-framepointers-release-wall` runs two
PGO trainings with frame pointers against two without, so that the frame
pointers' cost (the four cross pairs) can be read against what a second training
alone changes (the two same-flag pairs).

Each ratio is the geomean over the workloads of the ratio of the median timed
regions, with the 95 % bootstrap interval of bench/analyze.py (bootstrap_ci).
With --per-workload ROLE, each workload's median ratio of every other role to
ROLE follows.
"""
import argparse
import itertools
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from analyze import bootstrap_ci, geomean, wall_stats  # noqa: E402
from render import pct  # noqa: E402


def names_of(data):
    """{role: build directory name} of the run's interpreters, in role order."""
    return {role: os.path.basename(os.path.dirname(path))
            for role, path in data["interpreters"].items()}


def medians(samples):
    """{workload: {role: median timed region}} of a wall phase's samples."""
    return {w: wall_stats(s, list(s))[0] for w, s in samples.items()}


def wall_of(data):
    if "wall" not in data:
        raise SystemExit("wallpairs: the run has no wall phase (was it run with "
                         "--skip wall?)")
    return data["wall"]


def pair_ratios(data):
    """[(role, base, geomean ratio, (low, high))] for every unordered pair, the
    earlier role over the later one."""
    samples = wall_of(data)["samples"]
    workloads = sorted(samples)
    med = medians(samples)
    out = []
    for role, base in itertools.combinations(list(data["interpreters"]), 2):
        gm = geomean([med[w][role] / med[w][base] for w in workloads])
        out.append((role, base, gm, tuple(bootstrap_ci(samples, workloads, role, base))))
    return out


def render(data, per_workload=None):
    names = names_of(data)
    width = max(len(n) for n in names.values())
    wall = wall_of(data)
    rounds = wall["rounds"]
    lines = [f"wall time, {len(wall['samples'])} workloads, {rounds} rounds: "
             "geomean of median ratios [95 % bootstrap interval]"]
    for role, base, gm, (lo, hi) in pair_ratios(data):
        lines.append(f"  {names[role]:>{width}} / {names[base]:<{width}}  "
                     f"{pct(gm):>9}  [{pct(lo)}, {pct(hi)}]")
    if per_workload is not None:
        if per_workload not in names:
            raise SystemExit(f"wallpairs: no role {per_workload!r} in the run "
                             f"(roles: {', '.join(names)})")
        others = [r for r in names if r != per_workload]
        med = medians(wall["samples"])
        lines.append("")
        lines.append(f"per workload, median ratio to {names[per_workload]}:")
        lines.append(" " * 18 + "".join(f"{names[r]:>{width + 2}}" for r in others))
        for w in sorted(med):
            lines.append(f"  {w:<16}" + "".join(
                f"{pct(med[w][r] / med[w][per_workload]):>{width + 2}}" for r in others))
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="a results JSON of bench/run.py or bench/release.py")
    ap.add_argument("--per-workload", metavar="ROLE",
                    help="also each workload's ratio of every role to ROLE")
    args = ap.parse_args(argv)
    try:
        with open(args.json) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"wallpairs: cannot read {args.json}: {e}")
    sys.stdout.write(render(data, args.per_workload))


if __name__ == "__main__":
    main()
