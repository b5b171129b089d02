"""Armed probe cost: C under bpftrace, per group of probes, against the floor.

One ArmedCase arms a group of probes on a workload that exercises them; the cost per
hit is (armed - unarmed timed region) / hits, with a floor (a minimal semaphore-gated
USDT probe, floor/sdt_floor) sampled next to every armed run, and the interpreter's
own share without the trap measured under gdb (semaphores set, no uprobe).
"""
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from typing import NamedTuple

from common import ELAPSED_RE, HERE, MIN_HITS, RUN_CWD, base_env, log, sh, workload_path
from measure import timed_run

FLOOR_DIR = os.path.join(HERE, "floor")
FLOOR_BIN = os.path.join(FLOOR_DIR, "sdt_floor")


# --------------------------------------------------------------------------- probes

def stapsdt_probes(binary):
    """Return set of 'provider:name' found in the ELF stapsdt notes of binary."""
    r = sh(["readelf", "-n", binary])
    probes = set()
    prov = None
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("Provider:"):
            prov = line.split(":", 1)[1].strip()
        elif line.startswith("Name:") and prov is not None:
            probes.add(f"{prov}:{line.split(':', 1)[1].strip()}")
            prov = None
    return probes


def probe_binary(interp):
    """Where the python:* probes live: the executable itself or a linked libpython."""
    cands = [interp]
    r = sh(["ldd", interp])
    for line in r.stdout.splitlines():
        m = re.search(r"(libpython\S*\.so\S*)\s+=>\s+(\S+)", line)
        if m and os.path.exists(m.group(2)):
            cands.append(os.path.realpath(m.group(2)))
    found = {}
    for c in cands:
        p = {x for x in stapsdt_probes(c) if x.startswith("python:")}
        if p:
            found[c] = sorted(p)
    if found:
        b = next(iter(found))
        return b, found[b]
    return interp, []


# --------------------------------------------------------------------------- armed

AT_LINE_RE = re.compile(r"^@(\w+): (\d+)\s*$", re.M)


def bpftrace_available():
    if os.geteuid() != 0:
        return False, "not running as root (bpftrace needs CAP_BPF/CAP_SYS_ADMIN)"
    if not shutil.which("bpftrace"):
        return False, "bpftrace not installed"
    return True, None


def bpftrace_run(program, command, env, timeout):
    """Run `bpftrace -q program -c command`, the program in a temporary file.

    Raises subprocess.TimeoutExpired after timeout seconds."""
    with tempfile.NamedTemporaryFile("w", suffix=".bt", delete=False, dir="/tmp") as f:
        f.write(program)
        bt = f.name
    try:
        return subprocess.run(["bpftrace", "-q", bt, "-c", command],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, timeout=timeout, cwd=RUN_CWD)
    finally:
        os.unlink(bt)


def bpftrace_counts(stdout):
    """{name: count} from the program's `@name: N` lines."""
    counts = {}
    for name, val in AT_LINE_RE.findall(stdout):
        counts.setdefault(name, int(val))       # first print (END) wins over exit dump
    return counts


def run_bpftrace(program, cmd_argv, env, timeout=900):
    """Run `bpftrace -q -e program -c "cmd"`; return (counts, child_elapsed_ns, raw)."""
    for a in cmd_argv:
        if " " in a:
            raise ValueError(f"bpftrace -c splits on spaces; bad argument {a!r}")
    try:
        r = bpftrace_run(program, " ".join(cmd_argv), env, timeout)
    except subprocess.TimeoutExpired:
        return None, None, {"rc": None, "stderr": f"bpftrace run timed out after {timeout} s"}
    counts = bpftrace_counts(r.stdout)
    m = ELAPSED_RE.search(r.stderr) or ELAPSED_RE.search(r.stdout)
    stderr_clean = "\n".join(l for l in r.stderr.splitlines()
                             if "RLIMIT_MEMLOCK" not in l and not ELAPSED_RE.search(l))
    raw = {"rc": r.returncode, "stderr": stderr_clean[-1500:]}
    attached = r.returncode == 0 and m is not None
    if not attached:
        return None, None, raw
    return counts, int(m.group(1)), raw


def bt_program(binary, provider, probes):
    lines = []
    names = []
    for p in probes:
        var = re.sub(r"\W", "_", p.replace("__", "_"))
        names.append(var)
        lines.append(f"usdt:{binary}:{provider}:{p} {{ @{var} = count(); }}")
    end = " ".join(f"print(@{v}); clear(@{v});" for v in names)
    lines.append(f"END {{ {end} }}")
    return "\n".join(lines) + "\n", names


def floor_measure(iters, reps, floor_bin):
    res = {"iterations": iters, "unarmed_ns": [], "armed_ns": [], "hits": [], "errors": []}
    env = {"PATH": "/usr/bin:/bin", "LANG": "C"}
    prog, names = bt_program(floor_bin, "floor", ["hit"])
    for _ in range(reps):
        for _ in range(3):
            r = sh([floor_bin, str(iters)])
            res["unarmed_ns"].append(int(re.search(r"elapsed_ns=(\d+)", r.stdout).group(1)))
        counts, el, raw = run_bpftrace(prog, [floor_bin, str(iters)], env)
        if counts is None:
            res["errors"].append(raw)
            continue
        res["armed_ns"].append(el)
        res["hits"].append(counts.get(names[0], 0))
    return summarize_armed(res)


class ArmedCase(NamedTuple):
    """Probes armed together (one bpftrace program counts each) on one workload."""
    label: str
    probes: tuple
    workload: str
    # Lower for a workload that cannot give MIN_HITS hits in a run at scale
    # 1.0 (the cap): the per-hit cost is then computed down to this many hits,
    # but it is mostly timing noise, and no target is judged on it.
    min_hits: int = MIN_HITS
    # The workload starts threads, and gdb stops at every thread it sees
    # created: the no-trap run is then compared with the same gdb run without
    # the semaphores set, not with a plain run.
    gdb_baseline: bool = False


FUNCTION_PROBES = ("function__entry", "function__return")
# In the order measured and reported; the first four are the original cases.
ARMED_CASES = (
    ArmedCase("function__entry+return", FUNCTION_PROBES, "recursion"),
    ArmedCase("line", ("line",), "recursion"),
    ArmedCase("function__entry+return", FUNCTION_PROBES, "loops"),
    ArmedCase("line", ("line",), "loops"),
    ArmedCase("cfunction__entry+return", ("cfunction__entry", "cfunction__return"), "ccalls"),
    ArmedCase("exception__raise+reraise+handled",
              ("exception__raise", "exception__reraise", "exception__handled"), "exceptions"),
    ArmedCase("gil__take__start+take__done+drop",
              ("gil__take__start", "gil__take__done", "gil__drop"), "gil_switches",
              gdb_baseline=True),
    ArmedCase("thread__start+stop", ("thread__start", "thread__stop"), "thread_churn",
              min_hits=2_000, gdb_baseline=True),
    ArmedCase("task__step__start+done", ("task__step__start", "task__step__done"),
              "asyncio_tasks"),
)


def summarize_armed(res, min_hits=MIN_HITS):
    if not res["armed_ns"] or not res["unarmed_ns"]:
        res["ns_per_hit"] = None
        return res
    un = statistics.median(res["unarmed_ns"])
    hits = statistics.median(res["hits"])
    res["unarmed_median_ns"] = un
    res["armed_median_ns"] = statistics.median(res["armed_ns"])
    res["armed_slowdown"] = res["armed_median_ns"] / un - 1
    res["hits_median"] = hits
    if not hits:
        res["ns_per_hit"] = None
        res["note"] = "no hits"
        return res
    if hits < min_hits:
        res["ns_per_hit"] = None
        res["note"] = (f"only {hits:,.0f} hits in the timed region (< {min_hits:,}); per-hit cost "
                       f"not computed, armed/unarmed = {res['armed_slowdown'] * 100:+.1f} %")
        return res
    per = [(a - un) / h for a, h in zip(res["armed_ns"], res["hits"]) if h]
    res["ns_per_hit"] = (res["armed_median_ns"] - un) / hits
    res["ns_per_hit_min"] = min(per)
    res["ns_per_hit_max"] = max(per)
    return res


def armed_measure(interp, case, cfg, floor_bin=None):
    """Cost per hit of case.probes (python:* names) on case.workload, run by C."""
    workload, probes = case.workload, list(case.probes)
    out = {"label": case.label, "workload": workload, "probes": probes,
           "min_hits": case.min_hits}
    binary, available = probe_binary(interp)
    out["probe_binary"] = binary
    missing = [p for p in probes if f"python:{p}" not in available]
    if missing:
        out["error"] = (f"probe(s) {', '.join('python:' + p for p in missing)} not present in "
                        f"{binary} (stapsdt notes list: {', '.join(available) or 'none'})")
        out["ns_per_hit"] = None
        return out
    prog, names = bt_program(binary, "python", probes)
    script = workload_path(workload)
    role = "C"

    def armed(scale):
        env = base_env(role, scale, {"BENCH_TIMING": "1"})
        return run_bpftrace(prog, [interp, script], env)

    # baseline hits: interpreter startup + module body, outside the timed region
    dry_counts, _, raw = run_bpftrace_dry(prog, interp, script, base_env(role, 0.01, {"BENCH_DRYRUN": "1"}))
    if dry_counts is None:
        out["error"] = f"bpftrace failed (rc={raw['rc']}): {raw['stderr']}"
        out["ns_per_hit"] = None
        return out
    base_hits = sum(dry_counts.get(n, 0) for n in names)
    out["startup_hits"] = dry_counts
    # calibration: hits per unit of scale
    cal_scale = 0.02
    counts, el, raw = armed(cal_scale)
    if counts is None:
        out["error"] = f"bpftrace failed (rc={raw['rc']}): {raw['stderr']}"
        out["ns_per_hit"] = None
        return out
    cal_hits = sum(counts.get(n, 0) for n in names) - base_hits
    out["calibration"] = {"scale": cal_scale, "region_hits": cal_hits, "counts": counts}
    if cal_hits <= 0:
        out["note"] = "no hits (probe present but did not fire in the timed region)"
        out["ns_per_hit"] = None
        return out
    scale = min(1.0, max(cal_scale, cfg["armed_hits_target"] / (cal_hits / cal_scale)))
    scale = float(f"{scale:.4g}")
    out["scale"] = scale
    res = {"unarmed_ns": [], "armed_ns": [], "hits": [], "counts": [], "errors": []}
    for i in range(cfg["armed_reps"]):
        for _ in range(max(1, cfg["unarmed_reps"] // cfg["armed_reps"])):
            region, _, _ = timed_run(role, interp, script, scale)
            res["unarmed_ns"].append(region)
        counts, el, raw = armed(scale)
        if counts is None:
            res["errors"].append(raw)
            continue
        res["armed_ns"].append(el)
        res["counts"].append(counts)
        res["hits"].append(sum(counts.get(n, 0) for n in names) - base_hits)
        # the uprobe trap cost drifts with machine load: take a floor sample next to
        # every armed run and subtract the floor measured in the same case
        if floor_bin:
            fl = floor_measure(cfg["floor_iters"], 1, floor_bin)
            if fl.get("ns_per_hit") is not None:
                res.setdefault("floor_samples_ns_per_hit", []).append(fl["ns_per_hit"])
    region, _, _ = timed_run(role, interp, script, scale)
    res["unarmed_ns"].append(region)
    out.update(summarize_armed(res, case.min_hits))
    if res["counts"]:
        out["hits_by_probe"] = {
            p: statistics.median(c.get(n, 0) - dry_counts.get(n, 0) for c in res["counts"])
            for p, n in zip(probes, names)}
    if res.get("floor_samples_ns_per_hit"):
        out["floor_ns_per_hit"] = statistics.median(res["floor_samples_ns_per_hit"])
    if out.get("ns_per_hit") is not None:
        out["no_trap"] = no_trap_measure(interp, script, probes, scale,
                                         cfg["armed_reps"], out["hits_median"],
                                         None if case.gdb_baseline else out["unarmed_median_ns"])
    return out


def no_trap_measure(interp, script, probes, scale, reps, hits, unarmed_ns):
    """The interpreter's own cost per hit, without the uprobe trap.

    gdb sets the probes' semaphores before the interpreter starts, exactly as a
    tracer arms them, but places no uprobe: every probe site runs its argument
    code and then the marker's nop.  (armed - unarmed) / hits is then what the
    interpreter itself spends per hit; the bpftrace measurement adds the trap.
    With unarmed_ns None, the unarmed time is taken under gdb too (runs
    alternating with the armed ones), for workloads whose threads gdb stops at."""
    if not shutil.which("gdb"):
        return {"error": "gdb not found"}
    env = base_env("C", scale, {"BENCH_TIMING": "1"})

    def gdb_run(armed_probes):
        cmd = ["gdb", "-batch", "-nx", "-ex", "starti"]
        for p in armed_probes:
            cmd += ["-ex", f"set var python_{p}_semaphore = 1"]
        cmd += ["-ex", "continue", "--args", interp, script]
        r = sh(cmd, env=env, cwd=RUN_CWD)
        m = ELAPSED_RE.search(r.stdout + r.stderr)
        if r.returncode != 0 or not m:
            raise RuntimeError(f"gdb run failed (rc={r.returncode}): {r.stderr[-500:]}")
        return int(m.group(1))

    out = {"armed_ns": []}
    if unarmed_ns is None:
        out["unarmed_gdb_ns"] = []
    try:
        for _ in range(reps):
            out["armed_ns"].append(gdb_run(probes))
            if "unarmed_gdb_ns" in out:
                out["unarmed_gdb_ns"].append(gdb_run(()))
    except RuntimeError as e:
        return {"error": str(e)}
    if unarmed_ns is None:
        unarmed_ns = statistics.median(out["unarmed_gdb_ns"])
    out["armed_median_ns"] = statistics.median(out["armed_ns"])
    out["ns_per_hit"] = (out["armed_median_ns"] - unarmed_ns) / hits
    return out


def run_bpftrace_dry(prog, interp, script, env):
    r = bpftrace_run(prog, f"{interp} {script}", env, 300)
    raw = {"rc": r.returncode, "stderr": "\n".join(
        l for l in r.stderr.splitlines() if "RLIMIT_MEMLOCK" not in l)[-1500:]}
    if r.returncode != 0:
        return None, None, raw
    return bpftrace_counts(r.stdout), None, raw


def plumbing_check(interp):
    """gc__start fires on every --with-dtrace build: proves bpftrace attaches at all."""
    binary, available = probe_binary(interp)
    if "python:gc__start" not in available:
        return {"ok": False, "reason": f"python:gc__start not in {binary}"}
    prog, names = bt_program(binary, "python", ["gc__start"])
    env = base_env("C", 0.1, {"BENCH_TIMING": "1"})
    counts, el, raw = run_bpftrace(prog, [interp, workload_path("containers")], env)
    if counts is None:
        return {"ok": False, "reason": f"bpftrace rc={raw['rc']}: {raw['stderr']}"}
    return {"ok": counts.get(names[0], 0) > 0, "probe": "python:gc__start",
            "workload": "containers", "scale": 0.1, "hits": counts.get(names[0], 0)}


def measure_armed(interps, cfg):
    ok, why = bpftrace_available()
    if not ok:
        log(f"armed: skipped: {why}")
        return {"available": False, "reason": why}
    if not os.path.exists(FLOOR_BIN) or \
            os.path.getmtime(FLOOR_BIN) < os.path.getmtime(FLOOR_BIN + ".c"):
        r = sh(["make", "-C", FLOOR_DIR])
        if r.returncode != 0:
            return {"available": False, "reason": f"building sdt_floor failed: {r.stderr[-500:]}"}
    out = {"available": True, "interpreter": interps["C"]}
    out["plumbing"] = plumbing_check(interps["C"])
    log(f"armed: plumbing check {out['plumbing']}")
    out["floor"] = floor_measure(cfg["floor_iters"], cfg["armed_reps"], FLOOR_BIN)
    log(f"armed: floor ns/hit = {out['floor'].get('ns_per_hit')}")
    if out["floor"].get("ns_per_hit") is None and out["floor"]["errors"]:
        out["floor"]["error"] = out["floor"]["errors"][0].get("stderr")
    out["cases"] = []
    for spec in ARMED_CASES:
        if spec.workload not in cfg["armed_workloads"]:
            continue
        log(f"armed: {spec.label} on {spec.workload} ...")
        case = armed_measure(interps["C"], spec, cfg, FLOOR_BIN)
        fl = case.get("floor_ns_per_hit", out["floor"].get("ns_per_hit"))
        if case.get("ns_per_hit") is not None and fl is not None:
            case["floor_ns_per_hit"] = fl
            case["interpreter_share_ns"] = case["ns_per_hit"] - fl
        log(f"armed: {spec.label} on {spec.workload}: hits={case.get('hits_by_probe')} "
            f"ns/hit={case.get('ns_per_hit')} "
            f"no-trap={(case.get('no_trap') or {}).get('ns_per_hit')} "
            f"{case.get('error') or case.get('note') or ''}")
        out["cases"].append(case)
    return out
