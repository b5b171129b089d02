#!/usr/bin/python3.11
"""The release build against its pristine peer (issue 10, item 2).

Compares three release (PGO + LTO, frame pointers) interpreters in one run:

  P1  pristine CPython (the version series/SERIES/pin pins) without --with-dtrace
  P2  the same pristine source and flags, built a second time
  R   cpython-usdt's release build (--with-dtrace, every probe)

PGO's training run differs from build to build, so P2/P1 (two builds of the same
source) measures how much two builds differ without any change; R is judged against
that, and against the +0.3 % instruction target:

  1. instruction counts of every workload under valgrind/cachegrind, and a second run
     of P1 (P1') for the run-to-run noise of the workloads that start threads,
  2. interleaved wall-time rounds P1,P2,R / P2,R,P1 / R,P1,P2 ...

No armed phase: that is `bench/run.py`'s, on the development build.  The phases are
those of run.py (measure.py), judged and rendered here from the JSON, which keeps
every raw sample (``--render-only FILE.json`` re-renders without measuring).

Run with /usr/bin/python3.11, from the repository root; see README.md.
"""
import argparse
import hashlib
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from analyze import (MIN_ROUNDS_JUDGED, TARGET_INSTR_GEOMEAN, bootstrap_ci, geomean,
                     layout_counts, median_ratio, net_counts, repeat_noise, spread,
                     wall_stats)
from common import PRISTINE, log, parse_pythons
from measure import machine_info, measure_unarmed
from render import (finish, log_verdicts, ms_cell, pct, render_header, render_only,
                    repo_rel, round_orders, run_as_note, verdict_row, version_of)
from run import MODES, mode_config

ROLES = ("P1", "P2", "R")
DESC = {
    "P1": PRISTINE + ", PGO+LTO, frame pointers, no --with-dtrace: build 1",
    "P2": "the same pristine source and flags, built a second time: build 2",
    "R": "cpython-usdt release build: PGO+LTO, frame pointers, --with-dtrace",
}
REPEAT = "P1"      # run twice under cachegrind (P1'), and more where the two differ
PEER = "P"         # the pristine peer: geometric mean of P1 and P2 (per round in wall time)
# Each ratio: (numerator, denominator).
RATIOS = {"P2_P1": ("P2", "P1"), "R_P1": ("R", "P1"), "R_P2": ("R", "P2"), "R_P": ("R", PEER)}
# Wall time counts as within noise when R is no slower than the pristine peer by more
# than two pristine builds differ from each other, or than this when they differ less:
# the same +0.3 % as the instruction target.
WALL_FLOOR = TARGET_INSTR_GEOMEAN
UNARMED = ("workloads", "cg_scale", "wall_scale", "rounds", "jobs", "layouts")
# run.py's modes without the armed phase's settings; more rounds in full mode, since
# the verdict rests on the P2/P1 interval.
RELEASE_MODES = {
    "full": dict({k: MODES["full"][k] for k in UNARMED}, rounds=12),
    "quick": {k: MODES["quick"][k] for k in UNARMED},
}
BUILD_CMD = "make release build/release-pristine-fp/python build/release-pristine-fp2/python"


# --------------------------------------------------------------------------- analysis

def with_peer(samples):
    """samples with the pseudo-role PEER added to every workload: in each round, the
    geometric mean of P1's and P2's timed regions (they ran in the same round)."""
    out = {}
    for w, s in samples.items():
        p = [math.sqrt(a * b) for a, b in zip(s["P1"]["region_ns"], s["P2"]["region_ns"])]
        out[w] = dict(s, **{PEER: {"region_ns": p}})
    return out


def analyze_release(data):
    counts = data["instructions"]["counts"]
    workloads = data["config"]["workloads"]
    st = {k: counts[k]["startup"] for k in counts}
    checks = data["instructions"]["checksums"]
    rows = []
    layouts = layout_counts(data["instructions"])
    for w in workloads + ["startup"]:
        nets = [net_counts(c, w) for c in layouts]
        for net in nets:
            net[PEER] = math.sqrt(net["P1"] * net["P2"])
        rows.append({"workload": w, **{r: counts[r][w] for r in ROLES},
                     **{k: median_ratio(nets, a, b) for k, (a, b) in RATIOS.items()},
                     "repeat_noise": repeat_noise(data, w, st, REPEAT),
                     "checksums_agree": len({checks[r][w] for r in ROLES}) == 1})
    wl = [r for r in rows if r["workload"] != "startup"]
    instr = {"rows": rows, **{f"geomean_{k}": geomean([r[k] for r in wl]) for k in RATIOS}}
    samples = with_peer(data["wall"]["samples"])
    wall_rows = []
    for w in workloads:
        s = samples[w]
        med, stats = wall_stats(s, ROLES + (PEER,))
        wall_rows.append({"workload": w, **stats,
                          **{k: med[a] / med[b] for k, (a, b) in RATIOS.items()},
                          **{f"{r}_spread": spread(s, r, med) for r in ROLES},
                          "checksums_agree": len({s[r]["checksum"] for r in ROLES}) == 1})
    wall = {"rows": wall_rows,
            "rounds": min(len(samples[w]["P1"]["region_ns"]) for w in workloads),
            **{f"geomean_{k}": geomean([r[k] for r in wall_rows]) for k in RATIOS},
            **{f"geomean_{k}_ci95": bootstrap_ci(samples, workloads, a, base=b)
               for k, (a, b) in RATIOS.items()},
            **{f"median_{r}_spread": statistics.median(x[f"{r}_spread"] for x in wall_rows)
               for r in ROLES}}
    return {"instructions": instr, "wall": wall,
            "verdict": [instr_verdict(instr), wall_verdict(wall), same_results(instr, wall)]}


def instr_verdict(instr):
    """R <= +0.3 % net instructions (geomean) against the pristine peer.  The peer is two
    builds: met only if R is within the target against both, missed only if it is over it
    against both; otherwise which pristine build one picks decides, and the PGO build-to-
    build difference (P2/P1) is too large to judge by."""
    t = TARGET_INSTR_GEOMEAN
    g1, g2 = instr["geomean_R_P1"] - 1, instr["geomean_R_P2"] - 1
    d, gp = instr["geomean_P2_P1"] - 1, instr["geomean_R_P"] - 1
    wl = [r for r in instr["rows"] if r["workload"] != "startup"]
    worst = max(wl, key=lambda r: r["R_P"])
    value = (f"R/P1 {g1 * 100:+.3f} %, R/P2 {g2 * 100:+.3f} % (R/P̄ {gp * 100:+.3f} %); "
             f"build to build P2/P1 {d * 100:+.3f} %; worst workload R/P̄: "
             f"{worst['workload']} {(worst['R_P'] - 1) * 100:+.3f} %")
    if max(g1, g2) <= t:
        met, miss = True, None
    elif min(g1, g2) > t:
        met, miss = False, (f"missed against both pristine builds, by "
                            f"{(min(g1, g2) - t) * 100:.3f} percentage points or more")
    else:
        met = None
        miss = (f"inconclusive: R is within +{t * 100:.1f} % of one pristine build and over "
                f"it against the other; the two pristine builds differ by {d * 100:+.3f} %, "
                "more than separates R from the target")
    return {"target": f"instructions (net) R <= +{t * 100:.1f} % geomean against the "
                      "pristine peer (against both pristine builds)",
            "value": value, "met": met, "miss": miss}


def wall_noise(wall):
    """(smallest, largest) build-to-build difference |P2/P1 - 1| that the 95 % interval
    of the P2/P1 geomean allows (smallest 0 when the interval contains 0)."""
    lo, hi = (x - 1 for x in wall["geomean_P2_P1_ci95"])
    return max(0.0, lo, -hi), max(abs(lo), abs(hi))


def wall_verdict(wall):
    """R within noise: R/P̄'s 95 % interval against a tolerance of max(+0.3 %, |P2/P1-1|),
    met only if the interval is below the smallest tolerance the P2/P1 interval allows,
    missed only if it is above the largest, else inconclusive."""
    g = wall["geomean_R_P"] - 1
    lo, hi = (x - 1 for x in wall["geomean_R_P_ci95"])
    n_lo, n_hi = wall_noise(wall)
    tol_lo, tol_hi = max(WALL_FLOOR, n_lo), max(WALL_FLOOR, n_hi)
    d = wall["geomean_P2_P1"] - 1
    d_lo, d_hi = (x - 1 for x in wall["geomean_P2_P1_ci95"])
    value = (f"R/P̄ {g * 100:+.2f} %, 95 % CI [{lo * 100:+.2f} %, {hi * 100:+.2f} %]; "
             f"build to build P2/P1 {d * 100:+.2f} % [{d_lo * 100:+.2f} %, {d_hi * 100:+.2f} %], "
             f"so the tolerance is between +{tol_lo * 100:.2f} % and +{tol_hi * 100:.2f} %")
    if wall["rounds"] < MIN_ROUNDS_JUDGED:
        met = None
        miss = (f"inconclusive: only {wall['rounds']} rounds; a bootstrap over fewer than "
                f"{MIN_ROUNDS_JUDGED} rounds is too coarse to judge by")
    elif hi <= tol_lo:
        met, miss = True, None
    elif lo > tol_hi:
        met, miss = False, (f"missed: R is slower than the pristine peer by more than the "
                            f"largest tolerance, by {(lo - tol_hi) * 100:.2f} percentage "
                            "points or more")
    else:
        met = None
        miss = (f"inconclusive: R/P̄'s interval [{lo * 100:+.2f} %, {hi * 100:+.2f} %] is "
                f"neither wholly below +{tol_lo * 100:.2f} % nor wholly above "
                f"+{tol_hi * 100:.2f} %; more rounds or a quieter machine are needed")
    return {"target": "wall time R within noise: R/P̄ <= max(+0.3 %, |P2/P1 - 1|) geomean",
            "value": value, "met": met, "miss": miss}


def same_results(instr, wall):
    bad = sorted({r["workload"] for r in instr["rows"] + wall["rows"]
                  if not r["checksums_agree"]})
    return {"target": "P1, P2 and R print the same checksum on every workload",
            "value": f"mismatches: {', '.join(bad) or 'none'}", "met": not bad,
            "miss": None if not bad else f"missed on {len(bad)} workload(s)"}


# --------------------------------------------------------------------------- report

def render_release_md(data, json_rel, png_rel=None):
    a = data["analysis"]
    m, c = data["machine"], data["config"]
    rel = repo_rel(data)
    L = render_header(data, "cpython-usdt release build against pristine PGO+LTO",
                      "bench/release.py", json_rel)
    L.append(f"Reproduce from the repository root: `{BUILD_CMD}` builds R, P1 and P2, then "
             "the command above measures (`--quick` for a short run).\n")
    L.extend(build_notes(data))
    L.append("## What is judged\n")
    L.append(f"P1 and P2 are the same pristine {version_of(data, 'P1')} source configured "
             "with the same flags "
             "(`--enable-optimizations --with-lto`, frame pointers, no `--with-dtrace`), built "
             "twice: PGO's training run differs from build to build, and P2/P1 is how much two "
             "builds differ without any change to the source.  R is this project's release "
             "build.  P̄ (the pristine peer) is the geometric mean of P1 and P2.\n")
    L.append(f"- **Instructions**: the issue's target, R ≤ +{TARGET_INSTR_GEOMEAN * 100:.1f} % "
             "geomean (net), counts as met only if R is within it against *both* pristine "
             "builds, as missed only if R is over it against both; otherwise (R within it "
             "against one build, over it against the other) which pristine build one calls "
             "the peer decides, and the verdict is inconclusive.")
    L.append(f"- **Wall time**: R is within noise if it is no slower than P̄ by more than the "
             "two pristine builds differ from each other (|P2/P1 − 1|, geomean), or by more "
             f"than +{WALL_FLOOR * 100:.1f} % (the instruction target) when they differ less.  "
             "If R were just a third build of the same source, R/P̄ would differ from 1 "
             "by about as much as P2/P1 does (for independent builds, its spread is √¾ of "
             "P2/P1's), which is why the whole build-to-build difference is the tolerance "
             "and not half of it.  The run measures that difference only as a 95 % interval "
             "(bootstrap over rounds); the target counts as met only if R/P̄'s whole 95 % "
             "interval is below the *smallest* tolerance that interval allows, as missed "
             "only if R/P̄'s whole interval is above the *largest*, else inconclusive; with "
             f"fewer than {MIN_ROUNDS_JUDGED} rounds (quick mode) it is not judged.")
    L.append("- Two builds give one sample of the build-to-build difference: a third build "
             "could differ more.  The instruction counts are repeatable run to run (but for "
             "the threaded workloads, *P1 noise*), so P2/P1 in instructions is the build "
             "difference itself; in wall time it also holds the run-to-run noise.\n")
    ins = a["instructions"]
    L.append("## Instructions (valgrind cachegrind)\n")
    L.append(f"Each workload at `BENCH_SCALE={c['cg_scale']}` under `valgrind --tool=cachegrind "
             "--cache-sim=no` with ASLR off, `PYTHONHASHSEED=0` and a fixed environment, as in "
             "`docs/performance.md`.  Ratios are *net* (workload count minus the `-c pass` "
             "start-up count of the same interpreter); the `startup` row is the gross start-up "
             "count.  *P1 noise* = (max−min)/min over the runs of P1 (P1 and P1′, plus extra "
             "repeats where those two differ)." + run_as_note(data) + "\n")
    L.append("| workload | P1 instr | P2/P1 | R/P1 | R/P2 | R/P̄ | P1 noise | checksums |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in ins["rows"]:
        L.append(f"| {r['workload']} | {r['P1']:,} | " +
                 " | ".join(pct(r[k], 3) for k in RATIOS) +
                 f" | {r['repeat_noise'] * 100:.4f} % | "
                 f"{'ok' if r['checksums_agree'] else 'MISMATCH'} |")
    L.append("| **geomean** (workloads) | | " +
             " | ".join(f"**{pct(ins['geomean_' + k], 3)}**" for k in RATIOS) + " | | |")
    L.append("")
    w = a["wall"]
    L.append("## Wall time\n")
    L.append(f"`BENCH_SCALE={c['wall_scale']}`, {c['rounds']} rounds after one discarded warm "
             f"round, interleaved {round_orders(ROLES)} ... (order rotated every round).  Time "
             "is the workload's timed region (`time.perf_counter_ns`, excludes start-up); "
             "whole-process times are in the JSON.  Ratio = median/median; P̄'s time in a "
             "round is the geometric mean of P1's and P2's in that round.  The geomeans' 95 % "
             "intervals come from a bootstrap over rounds (the interpreters of one round kept "
             "together).  *spread* = (max−min)/median of each interpreter's own samples.\n")
    L.append("| workload | P1 median [min–max] ms | P2 median [min–max] ms "
             "| R median [min–max] ms | P2/P1 | R/P1 | R/P2 | R/P̄ | P1 spread | P2 spread "
             "| R spread | checksums |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in w["rows"]:
        L.append(f"| {r['workload']} | " + " | ".join(ms_cell(r, role) for role in ROLES) +
                 " | " + " | ".join(pct(r[k]) for k in RATIOS) + " | " +
                 " | ".join(f"{r[role + '_spread'] * 100:.1f} %" for role in ROLES) +
                 f" | {'ok' if r['checksums_agree'] else 'MISMATCH'} |")
    L.append("| **geomean** [95 % CI] | | | | " +
             " | ".join(f"**{pct(w['geomean_' + k])}** [" +
                        ", ".join(pct(x) for x in w[f"geomean_{k}_ci95"]) + "]"
                        for k in RATIOS) + " | " +
             " | ".join(f"median {w[f'median_{role}_spread'] * 100:.1f} %" for role in ROLES) +
             " | |")
    L.append("")
    L.append("## Verdict\n")
    L.append("| target | measured | result |")
    L.append("|---|---|---|")
    L.extend(verdict_row(t) for t in a["verdict"])
    L.append("")
    L.append("## Raw data\n")
    L.append(f"All raw samples, interpreter versions and configuration: [`{json_rel}`]"
             f"({json_rel}); the interpreters: "
             + ", ".join(f"{r} `{rel(m['interpreters'][r]['path'])}`" for r in ROLES) + ".\n")
    return "\n".join(L) + "\n"


def build_notes(data):
    """Markdown lines: are P1 and P2 configured alike, are they the same file, does R
    have dtrace (what the comparison assumes)."""
    it, b = data["machine"]["interpreters"], data.get("binaries") or {}
    L = []
    if it["P1"].get("config_args") != it["P2"].get("config_args"):
        L.append("- **warning: P1 and P2 were configured differently** (see the table); "
                 "P2/P1 is then not the build-to-build noise.")
    if b.get("P1") and b.get("P2") and b["P1"]["sha256"] == b["P2"]["sha256"]:
        L.append("- P1 and P2 are byte-identical files (sha256 "
                 f"`{b['P1']['sha256'][:16]}…`): the build gave the same binary twice, so "
                 "P2/P1 holds only run-to-run noise.")
    elif b.get("P1") and b.get("P2"):
        L.append("- P1 and P2 are different files (sha256 " +
                 ", ".join(f"{r} `{b[r]['sha256'][:16]}…`" for r in ROLES if r in b) + ").")
    for r in ROLES:
        if it[r].get("with_dtrace") != ("1" if r == "R" else "0"):
            L.append(f"- **warning: {r} has WITH_DTRACE={it[r].get('with_dtrace')}**, where "
                     f"this comparison expects {'1' if r == 'R' else '0'}.")
    return L + [""] if L else []


# --------------------------------------------------------------------------- main

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", action="append", default=[], metavar="ROLE=PATH",
                   help="interpreter for role P1, P2 (pristine release, built twice) and R "
                        "(cpython-usdt release); give all three")
    p.add_argument("--out-json", default=os.path.join(HERE, "results", "release.json"))
    p.add_argument("--out-md", default=None, help="Markdown report")
    p.add_argument("--quick", action="store_true", help="fewer workloads/rounds, smaller scale")
    p.add_argument("--workloads", default=None, help="comma-separated subset (overrides the mode's list)")
    p.add_argument("--rounds", type=int, default=None, help="wall-time rounds (overrides the mode)")
    p.add_argument("--jobs", type=int, default=None, help="parallel cachegrind jobs (default 2)")
    p.add_argument("--layouts", type=int, default=None,
                   help="heap layouts of the instruction phase (default 5, --quick 1)")
    p.add_argument("--skip", default="", help="comma list of phases to skip: instructions,wall")
    p.add_argument("--render-only", metavar="JSON", help="re-render --out-md from a JSON file")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render_only:
        render_only(args, analyze_release, render_release_md)
        return 0
    interps = parse_pythons(args.python, ROLES)
    mode = "quick" if args.quick else "full"
    cfg = mode_config(args, RELEASE_MODES[mode])
    cfg["mode"] = mode
    skip = set(filter(None, args.skip.split(",")))
    data = {"schema": 1, "kind": "release", "config": cfg,
            "machine": machine_info(interps, DESC), "interpreters": interps,
            "binaries": {r: {"sha256": sha256(p), "bytes": os.path.getsize(p)}
                         for r, p in interps.items()},
            "targets": {"instr_geomean": TARGET_INSTR_GEOMEAN, "wall_floor": WALL_FLOOR}}
    log(f"mode={mode} workloads={len(cfg['workloads'])} interpreters={interps}")
    measure_unarmed(data, interps, cfg, skip, repeat=REPEAT)
    an = finish(data, args, analyze_release, render_release_md)
    log_verdicts(an.get("verdict", []))
    log(f"done in {data['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
