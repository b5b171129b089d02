"""What the benchmark modules share: roles, paths, the run environment, logging.

run.py measures with measure.py (instructions, wall time) and armed.py (bpftrace,
gdb, the floor), judges with analyze.py and writes the report with render.py;
each of them imports its helpers from here.
"""
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKLOAD_DIR = os.path.join(HERE, "workloads")

ROLES = ("A", "B", "C")          # required
OPTIONAL_ROLES = ("U",)          # only in instructions and wall time, never armed
ROLE_DESC = {
    "A": "pristine 3.13.5, no --with-dtrace",
    "B": "pristine 3.13.5, --with-dtrace (stock)",
    "C": "cpython-usdt",
    "U": "pristine 3.13.5, the upstream way: no --with-dtrace, no frame pointers",
}

T_START = time.monotonic()     # log() and the run's duration count from here
WORKDIR = "/tmp/usdt-bench/wd"
RUN_CWD = "/tmp/usdt-bench/cwd"
PYCACHE_ROOT = "/tmp/usdt-bench/pycache"
# The timed region a workload prints to stderr with BENCH_TIMING=1.
ELAPSED_RE = re.compile(r"elapsed_ns=(\d+)")
# Below this many hits in an armed run the per-hit cost is pure timing noise: it is not
# computed (unless an ArmedCase lowers its min_hits), and never judged.
MIN_HITS = 20_000


def log(msg):
    print(f"[{time.monotonic() - T_START:7.1f}s] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def first_line(cmd):
    try:
        r = sh(cmd)
        out = (r.stdout or r.stderr).strip().splitlines()
        return out[0] if out else ""
    except OSError as e:
        return f"unavailable ({e})"


def base_env(role, scale, extra=None):
    """Fixed, minimal environment so that instruction counts are repeatable.

    BENCH_WORKDIR (imports.py writes there) is the same path for every interpreter: path
    strings end up as dict keys, so even a different name would shift instruction counts.
    The cwd is a fixed empty directory (with `-c`, sys.path[0] is the cwd and its listing
    would otherwise leak into the counts)."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C",
        "LC_ALL": "C",
        "HOME": "/tmp/usdt-bench/home",
        "PYTHONHASHSEED": "0",
        "PYTHONNOUSERSITE": "1",
        "BENCH_SCALE": repr(float(scale)),
        "BENCH_WORKDIR": WORKDIR,
        # Each interpreter gets its own .pyc files, all written the same
        # way by measure.warmup(): see there.
        "PYTHONPYCACHEPREFIX": pycache_prefix(role),
    }
    if extra:
        env.update(extra)
    os.makedirs(env["HOME"], exist_ok=True)
    os.makedirs(env["BENCH_WORKDIR"], exist_ok=True)
    os.makedirs(RUN_CWD, exist_ok=True)
    return env


def pycache_prefix(role):
    return os.path.join(PYCACHE_ROOT, role)


def present_roles(d):
    """The roles that have an entry in d (interpreters, counts, samples), in order."""
    return tuple(r for r in ROLES + OPTIONAL_ROLES if r in d)


def workload_path(name):
    return os.path.join(WORKLOAD_DIR, name + ".py")
