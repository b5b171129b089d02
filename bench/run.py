#!/usr/bin/python3.11
"""cpython-usdt benchmark driver.

Compares three interpreters -- A (pristine, no dtrace), B (pristine --with-dtrace),
C (cpython-usdt), all three with frame pointers and the loop flags -- and optionally a fourth,
U (pristine built the upstream way: no dtrace, no frame pointers, no loop flags), in
one run:

  1. instruction counts of every workload under valgrind/cachegrind (deterministic),
  2. interleaved wall-time rounds A,B,C[,U],A,B,C[,U],...,
  3. armed probe cost with bpftrace, one case per group of probes and workload
     (ARMED_CASES), against the floor of a minimal semaphore-gated USDT probe
     (floor/sdt_floor), and the interpreter's own cost per hit without the trap (gdb).

Writes a JSON file with every raw sample, then renders the Markdown report and the PNG
plot FROM that JSON (``--render-only FILE.json`` re-renders without measuring).

Run with /usr/bin/python3.11 (needs matplotlib for the PNG).  See README.md.
"""
import argparse
import os
import sys
import time

# This file parses the command line and runs the phases; the modules next to it do the
# work (README.md, "Files"): common (roles, paths, environment, logging), measure
# (instructions, wall time), armed (bpftrace, gdb, the floor), analyze (ratios,
# intervals, verdicts), render (Markdown, PNG).  Python puts this directory on
# sys.path when it runs the file as a script, but not when the file is loaded by
# name (tests/test_generated_docs.py, which calls render_md through this module).
HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from analyze import (TARGET_ARMED_NS, TARGET_INSTR_GEOMEAN, TARGET_INSTR_MAX,
                     TARGET_WALL, analyze)
from armed import ARMED_CASES, measure_armed
from common import OPTIONAL_ROLES, ROLES, log, parse_pythons, workload_path
from measure import machine_info, measure_unarmed
from render import (finish, log_verdicts, render_md, render_md_for,  # noqa: F401 (tests:
                    render_only, render_usdt_module)               # render_md, render_usdt_module)

ALL_WORKLOADS = [
    "recursion", "methods", "closures", "generators", "coroutines", "exceptions",
    "strings", "containers", "nbody", "loops", "richards", "deltablue",
    "json_roundtrip", "regex", "threads", "imports",
    "ccalls", "asyncio_tasks", "gil_switches", "thread_churn",
]
QUICK_WORKLOADS = ["recursion", "methods", "generators", "nbody", "loops", "richards",
                   "ccalls", "exceptions", "asyncio_tasks", "gil_switches", "thread_churn"]

MODES = {
    "full": dict(workloads=ALL_WORKLOADS, cg_scale=0.05, wall_scale=1.0, rounds=8,
                 armed_hits_target=2_000_000, armed_reps=3, unarmed_reps=5,
                 floor_iters=2_000_000, jobs=2, layouts=5),
    "quick": dict(workloads=QUICK_WORKLOADS, cg_scale=0.02, wall_scale=0.4, rounds=3,
                  armed_hits_target=300_000, armed_reps=1, unarmed_reps=3,
                  floor_iters=300_000, jobs=2, layouts=1),
}


# --------------------------------------------------------------------------- main

def mode_config(args, mode):
    """The mode's settings with --workloads, --rounds, --jobs and --layouts applied
    (release.py uses it too)."""
    cfg = dict(mode)
    if args.workloads:
        cfg["workloads"] = [w for w in args.workloads.split(",") if w]
        for w in cfg["workloads"]:
            if not os.path.exists(workload_path(w)):
                sys.exit(f"unknown workload {w}")
    if args.rounds:
        cfg["rounds"] = args.rounds
    if args.jobs:
        cfg["jobs"] = args.jobs
    if args.layouts is not None:
        cfg["layouts"] = args.layouts
    return cfg


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", action="append", default=[], metavar="ROLE=PATH",
                   help="interpreter for role A, B or C (give all three), and optionally "
                        "U (pristine built the upstream way)")
    p.add_argument("--out-json", default=os.path.join(HERE, "results", "results.json"))
    p.add_argument("--out-md", default=None, help="Markdown report, e.g. docs/performance.md")
    p.add_argument("--out-png", default=None)
    p.add_argument("--quick", action="store_true", help="fewer workloads/rounds, smaller scale (<5 min)")
    p.add_argument("--workloads", default=None, help="comma-separated subset (overrides the mode's list)")
    p.add_argument("--rounds", type=int, default=None, help="wall-time rounds (overrides the mode)")
    p.add_argument("--jobs", type=int, default=None, help="parallel cachegrind jobs (default 2)")
    p.add_argument("--layouts", type=int, default=None,
                   help="heap layouts of the instruction phase (default 5, --quick 1)")
    p.add_argument("--skip", default="", help="comma list of phases to skip: instructions,wall,armed")
    p.add_argument("--armed-workloads", default=None,
                   help="comma-separated: only the armed cases on these workloads")
    p.add_argument("--render-only", metavar="JSON", help="re-render --out-md/--out-png from a JSON file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render_only:
        render_only(args, analyze, render_md_for(args))
        return 0
    interps = parse_pythons(args.python, ROLES, OPTIONAL_ROLES)
    mode = "quick" if args.quick else "full"
    cfg = mode_config(args, MODES[mode])
    cfg["armed_workloads"] = sorted({c.workload for c in ARMED_CASES})
    if args.armed_workloads:
        cfg["armed_workloads"] = [w for w in args.armed_workloads.split(",") if w]
        for w in cfg["armed_workloads"]:
            if w not in {c.workload for c in ARMED_CASES}:
                sys.exit(f"no armed case on workload {w}")
    skip = set(filter(None, args.skip.split(",")))
    cfg["mode"] = mode
    data = {"schema": 1, "config": cfg, "machine": machine_info(interps), "interpreters": interps,
            "targets": {"instr_geomean": TARGET_INSTR_GEOMEAN, "instr_max": TARGET_INSTR_MAX,
                        "wall": TARGET_WALL, "armed_ns": TARGET_ARMED_NS}}
    log(f"mode={mode} workloads={len(cfg['workloads'])} interpreters={interps}")
    measure_unarmed(data, interps, cfg, skip)
    if "armed" not in skip:
        t = time.monotonic()
        data["armed"] = measure_armed(interps, cfg)
        data["armed"]["duration_s"] = time.monotonic() - t
    an = finish(data, args, analyze, render_md_for(args))
    log_verdicts(an.get("verdict", []) + an.get("frame_pointers", {}).get("verdict", []))
    log(f"done in {data['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
