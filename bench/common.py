"""What the benchmark modules share: roles, paths, the run environment, logging.

run.py measures with measure.py (instructions, wall time) and armed.py (bpftrace,
gdb, the floor), judges with analyze.py and writes the report with render.py;
each of them imports its helpers from here.  release.py (the release build against
two pristine release builds) reuses measure.py, analyze.py and render.py with its
own roles, P1, P2 and R.
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
    "U": "pristine 3.13.5, the upstream way: no --with-dtrace, no frame pointers, "
         "no loop flags",
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
    """The roles that have an entry in d (interpreters, samples), in order: run.py's
    roles in ROLES + OPTIONAL_ROLES order, then any others (release.py's P1, P2, R)
    in d's own order."""
    known = ROLES + OPTIONAL_ROLES
    return tuple(r for r in known if r in d) + tuple(r for r in d if r not in known)


def parse_pythons(specs, required, optional=()):
    """{role: absolute path} from --python ROLE=PATH options, in role order; exits
    with a message on an unknown role, a missing or unusable path, or a role left out."""
    allowed = tuple(required) + tuple(optional)
    given = {}
    for spec in specs:
        role, _, path = spec.partition("=")
        if role not in allowed or not path:
            sys.exit(f"bad --python {spec!r}; expected "
                     + ", ".join(f"{r}=PATH" for r in allowed[:-1]) + f" or {allowed[-1]}=PATH")
        path = os.path.abspath(path)
        if not os.access(path, os.X_OK):
            sys.exit(f"interpreter {path} not executable")
        if " " in path:
            sys.exit("interpreter path must not contain spaces (bpftrace -c splits on spaces)")
        given[role] = path
    if not set(required) <= set(given):
        sys.exit("need " + " ".join(f"--python {r}=..." for r in required)
                 + (f" ({', '.join(f'{r}=...' for r in optional)} optional)" if optional else ""))
    return {r: given[r] for r in allowed if r in given}


RUN_AS_ROOT = "/tmp/usdt-bench/as"


def same_length_paths(interps, root=RUN_AS_ROOT):
    """{role: path} that runs each interpreter of interps through a directory symlink
    root/<n>, n its position, so that every interpreter's sys.executable and
    build directory strings have the same length.  Otherwise the lengths leak into the
    heap's layout, and with it into the instruction counts of allocation-heavy
    workloads, by several per cent (regex, between build/release-pristine-fp and
    build/release-pristine-nofp; bench/analysis.md).  The source tree, and with it the
    standard library's path, stays each build's own."""
    os.makedirs(root, exist_ok=True)
    if len(interps) > 10:
        sys.exit("at most 10 interpreters")
    out = {}
    for n, (role, path) in enumerate(interps.items()):
        link = os.path.join(root, str(n))
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.dirname(path), link)
        out[role] = os.path.join(link, os.path.basename(path))
    return out


def workload_path(name):
    return os.path.join(WORKLOAD_DIR, name + ".py")
