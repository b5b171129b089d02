"""Unarmed measurements: the machine, instruction counts, wall time.

Instruction counts come from valgrind/cachegrind at a reduced scale (deterministic
but for the threaded workloads, whose noise extra runs of A measure); wall time from
interleaved rounds whose order rotates, timing the workload's own timed region.
"""
import datetime
import os
import platform
import re
import shlex
import shutil
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from common import (ELAPSED_RE, REPO, ROLE_DESC, RUN_CWD, base_env, first_line, log,
                    layout_pads, layout_trees, present_roles, pycache_prefix, sh,
                    workload_path)


# --------------------------------------------------------------------------- machine

def machine_info(interps, desc=ROLE_DESC):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "uname": first_line(["uname", "-a"]),
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "loadavg_at_start": open("/proc/loadavg").read().strip() if os.path.exists("/proc/loadavg") else None,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv),
        "cwd": os.getcwd(),
        "repo": REPO,
        "driver_python": sys.version.split()[0],
        "valgrind": first_line(["valgrind", "--version"]),
        "bpftrace": first_line(["bpftrace", "--version"]),
        "gcc": first_line(["gcc", "--version"]),
        "euid": os.geteuid(),
        "interpreters": {},
    }
    for role, path in interps.items():
        r = sh([path, "--version"])
        cfg = sh([path, "-c", "import sysconfig,sys;print(sysconfig.get_config_var('CONFIG_ARGS'));"
                  "print(sysconfig.get_config_var('WITH_DTRACE'));print(sys.version)"])
        lines = cfg.stdout.splitlines()
        info["interpreters"][role] = {
            "path": path,
            "description": desc[role],
            "version": (r.stdout or r.stderr).strip(),
            "sys_version": lines[2] if len(lines) > 2 else None,
            "config_args": lines[0] if lines else None,
            "with_dtrace": lines[1] if len(lines) > 1 else None,
        }
    return info


# --------------------------------------------------------------------------- cachegrind

IREFS_RE = re.compile(r"==\d+==\s+I\s+refs:\s+([\d,]+)")
# More runs of A for a workload whose first two differ (see measure_instructions).
EXTRA_REPEATS = 3


def cachegrind_one(role, interp, script, scale):
    extra = {"BENCH_SWITCH_INTERVAL": "30"}
    env = base_env(role, scale, extra)
    argv = [interp, script] if script else [interp, "-c", "pass"]
    cmd = ["setarch", platform.machine(), "-R", "valgrind", "--tool=cachegrind",
           "--cache-sim=no", "--cachegrind-out-file=/dev/null"] + argv
    r = sh(cmd, env=env, cwd=RUN_CWD)
    m = IREFS_RE.findall(r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"cachegrind failed rc={r.returncode}: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    out = r.stdout.strip().splitlines()
    return int(m[-1].replace(",", "")), (out[-1] if out else "")


def measure_instructions(layouts, workloads, scale, jobs, repeat="A"):
    """Returns {label: {workload: count}} for every role in the first layout, plus a
    second run of the role repeat (label 'A_repeat' for A) for noise; the checksums;
    the further runs of repeat on the workloads whose first two differ; and
    [{role: {workload: count}}], every role's counts in every layout (layouts, from
    common.layout_trees: [{role: path}])."""
    rep = f"{repeat}_repeat"
    roles = present_roles(layouts[0])
    runs = [(0, r, r) for r in roles] + [(0, rep, repeat)]
    runs += [(j, r, r) for j in range(1, len(layouts)) for r in roles]
    names = ["startup"] + workloads
    tasks = []
    for j, label, role in runs:       # label-major: neighbours are different workloads
        for name in names:
            script = None if name == "startup" else workload_path(name)
            tasks.append((j, label, role, name, script))
    res = {label: {} for j, label, _ in runs if j == 0}
    per_layout = [{r: {} for r in roles} for _ in layouts]
    checks = {label: {} for label in res}
    done = [0]

    def job(t):
        # The repeat runs with its role's own .pyc prefix, the one warmup() filled: under
        # a prefix of its own (as before), modules imported after a workload sets
        # sys.dont_write_bytecode (imports.py) were compiled again in every run.
        j, label, role, name, script = t
        with locks[name]:
            n, chk = cachegrind_one(role, layouts[j][role], script, scale)
        done[0] += 1
        log(f"cachegrind {done[0]}/{len(tasks)} layout {j} {label:8s} {name:15s} {n:,}")
        return j, label, name, n, chk

    # the same workload never runs twice at once: all runs share one BENCH_WORKDIR
    locks = {name: threading.Lock() for name in names}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        for j, label, name, n, chk in ex.map(job, tasks):
            if label in per_layout[j]:
                per_layout[j][label][name] = n
            if j == 0:
                res[label][name] = n
                checks[label][name] = chk
            elif chk != checks[label][name]:     # layout 0's came first (map's order)
                raise RuntimeError(f"{label} {name}: checksum {chk} in layout {j}, "
                                   f"{checks[label][name]} in layout 0")
    # workloads whose two runs of repeat differ are not bit-for-bit repeatable (threads):
    # run it a few more times so their noise (max-min over all its runs) is not a
    # single-pair guess
    extra = {}
    unstable = [n for n in names if res[repeat][n] != res[rep][n]]
    for name in unstable:
        script = None if name == "startup" else workload_path(name)
        extra[name] = []
        for i in range(EXTRA_REPEATS):
            n, _ = cachegrind_one(repeat, layouts[0][repeat], script, scale)
            extra[name].append(n)
            log(f"cachegrind extra repeat {i + 1}/{EXTRA_REPEATS} {repeat} {name:15s} {n:,}")
    return res, checks, extra, per_layout


# --------------------------------------------------------------------------- wall time

def timed_run(role, interp, script, scale, extra=None):
    env = base_env(role, scale, dict({"BENCH_TIMING": "1"}, **(extra or {})))
    t0 = time.perf_counter_ns()
    r = sh([interp, script], env=env, cwd=RUN_CWD)
    t1 = time.perf_counter_ns()
    m = ELAPSED_RE.search(r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(f"run failed rc={r.returncode}: {interp} {script}\n{r.stderr[-2000:]}")
    out = r.stdout.strip().splitlines()
    return int(m.group(1)), t1 - t0, (out[-1] if out else "")


def warmup(layouts, workloads):
    """Compile the stdlib .pyc files, then one tiny run per interpreter/workload,
    in every layout, so that neither cachegrind nor wall runs pay for compilation.

    Which strings a .pyc marks as interned depends on what the process that
    wrote it had interned before, so .pyc files left behind by earlier, unrelated
    runs (test suites, other tools) differ between interpreters and shift the
    unmarshalling cost by up to 1 %.  Every interpreter therefore gets a fresh
    PYTHONPYCACHEPREFIX, filled by one sequential compileall of its stdlib per
    layout (the .pyc paths follow the layout's source paths)."""
    for role in present_roles(layouts[0]):
        prefix = pycache_prefix(role)
        shutil.rmtree(prefix, ignore_errors=True)
        for interps in layouts:
            env = base_env(role, 0.01)
            stdlib = sh([interps[role], "-c",
                         "import os; print(os.path.dirname(os.__file__))"],
                        env=env, cwd=RUN_CWD).stdout.strip()
            r = sh([interps[role], "-m", "compileall", "-q",
                    "-x", "/(test|tests|idlelib|tkinter|turtledemo)/", stdlib],
                   env=env, cwd=RUN_CWD)
            if r.returncode != 0:
                raise RuntimeError(f"compileall failed for {role}: {r.stdout[-2000:]}"
                                   f"{r.stderr[-2000:]}")
            for name in workloads:
                timed_run(role, interps[role], workload_path(name), 0.01)
            sh([interps[role], "-c", "pass"], env=base_env(role, 0.01), cwd=RUN_CWD)
    log("warm-up done")


def measure_wall(interps, workloads, scale, rounds):
    roles = present_roles(interps)
    res = {}
    total = len(workloads) * rounds
    k = 0
    for name in workloads:
        script = workload_path(name)
        samples = {r: {"region_ns": [], "process_ns": [], "checksum": None, "order": []}
                   for r in roles}
        for role in roles:      # one discarded warm round (page cache, CPU frequency)
            timed_run(role, interps[role], script, scale)
        for rnd in range(rounds):
            # interleaved; the order is rotated every round (ABC, BCA, CAB, ...) so that no
            # interpreter always runs first/last and position effects cancel out
            order = roles[rnd % len(roles):] + roles[:rnd % len(roles)]
            for pos, role in enumerate(order):
                region, proc, chk = timed_run(role, interps[role], script, scale)
                s = samples[role]
                s["region_ns"].append(region)
                s["process_ns"].append(proc)
                s["order"].append(pos)
                s["checksum"] = chk
            k += 1
        res[name] = samples
        med = {r: statistics.median(samples[r]["region_ns"]) for r in roles}
        base = roles[0]
        log(f"wall {name:15s} {base}={med[base] / 1e6:8.1f}ms "
            + " ".join(f"{r}/{base}={med[r] / med[base]:.4f}" for r in roles[1:])
            + f" ({k}/{total} rounds)")
    return res


def measure_unarmed(data, interps, cfg, skip, repeat="A"):
    """The warm-up, then the instruction and wall-time phases not in skip, into data
    ("instructions", "wall"); the further runs of repeat are "extra_<repeat>_repeats".
    Each interpreter runs from a tree of its own in cfg["layouts"] heap layouts
    (common.layout_trees; data["layouts"]): the instruction phase runs all of them,
    the wall-time phase the first."""
    pads = layout_pads(cfg["layouts"])
    layouts = layout_trees(interps, pads)
    data["layouts"] = {"pads": pads, "run_as": layouts}
    warmup(layouts if "instructions" not in skip else layouts[:1], cfg["workloads"])
    if "instructions" not in skip:
        t = time.monotonic()
        counts, checks, extra, per_layout = measure_instructions(
            layouts, cfg["workloads"], cfg["cg_scale"], cfg["jobs"], repeat)
        data["instructions"] = {"scale": cfg["cg_scale"], "counts": counts, "checksums": checks,
                                f"extra_{repeat}_repeats": extra,
                                "layout_counts": per_layout,
                                "duration_s": time.monotonic() - t}
    if "wall" not in skip:
        t = time.monotonic()
        data["wall"] = {"scale": cfg["wall_scale"], "rounds": cfg["rounds"],
                        "samples": measure_wall(layouts[0], cfg["workloads"],
                                                cfg["wall_scale"], cfg["rounds"]),
                        "duration_s": time.monotonic() - t}
