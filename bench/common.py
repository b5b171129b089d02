"""What the benchmark modules share: roles, paths, the run environment, logging.

run.py measures with measure.py (instructions, wall time) and armed.py (bpftrace,
gdb, the floor), judges with analyze.py and writes the report with render.py;
each of them imports its helpers from here.  release.py (the release build against
two pristine release builds) reuses measure.py, analyze.py and render.py with its
own roles, P1, P2 and R.
"""
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORKLOAD_DIR = os.path.join(HERE, "workloads")

ROLES = ("A", "B", "C")          # required
OPTIONAL_ROLES = ("U",)          # only in instructions and wall time, never armed


def pinned_version(series=None):
    """The upstream version series/SERIES/pin pins (SERIES: $SERIES, else
    the default that series/DEFAULT names): the pristine interpreters'
    source."""
    if not series:
        with open(os.path.join(REPO, "series", "DEFAULT")) as f:
            series = os.environ.get("SERIES") or f.read().strip()
    path = os.path.join(REPO, "series", series, "pin")
    with open(path) as f:
        for line in f:
            if line.startswith("VERSION="):
                return line.split("=", 1)[1].strip()
    raise SystemExit(f"{path}: no VERSION=")


PRISTINE = "pristine " + pinned_version()
ROLE_DESC = {
    "A": PRISTINE + ", no --with-dtrace",
    "B": PRISTINE + ", --with-dtrace (stock)",
    "C": "cpython-usdt",
    "U": PRISTINE + ", the upstream way: no --with-dtrace, no frame pointers, "
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
# Names of the standard library's entries a layout tree leaves out.
TREE_SKIP = ("__pycache__",)
# What build_tree_of asks the interpreter: its standard library, and the name of the
# directory an installation keeps it in (python3.13, python3.13t when free-threaded).
WHERE_STDLIB = ("import os, sys, sysconfig; print(os.path.dirname(os.__file__)); "
                "print('python%d.%d%s' % (sys.version_info[:2] + "
                "('t' if sysconfig.get_config_var('Py_GIL_DISABLED') else '',)))")


def layout_pads(n):
    """The n path paddings of measure_instructions' heap layouts: spread over 16
    characters, the allocators' size-class step (0, 3, 6, 10, 13 for n = 5)."""
    if not 1 <= n <= 16:
        sys.exit(f"--layouts must be between 1 and 16, not {n}")
    return [round(16 * j / n) for j in range(n)]


def build_tree_of(interp):
    """(standard library directory, extension module directory, the name of an
    installation's directory for them) of a build-tree interpreter; exits with a
    message for any other interpreter."""
    builddir = os.path.dirname(interp)
    try:
        with open(os.path.join(builddir, "pybuilddir.txt")) as f:
            dynload = os.path.join(builddir, f.read().strip())
    except OSError as e:
        sys.exit(f"{interp} is not in a build tree ({e.filename}: {e.strerror}); "
                 "the benchmarks run build-tree interpreters")
    r = sh([interp, "-S", "-c", WHERE_STDLIB], env={"PATH": "/usr/bin:/bin"}, cwd="/")
    out = r.stdout.split("\n")
    if r.returncode != 0 or len(out) < 2 or not os.path.isfile(
            os.path.join(out[0], "os.py")):
        sys.exit(f"{interp}: cannot find its standard library: {r.stderr.strip()}")
    return out[0], dynload, out[1]


def layout_trees(interps, pads, root=RUN_AS_ROOT):
    """[{role: path}] per padding in pads: each interpreter of interps, run from a
    tree of its own, root/<j><pad underscores>/<n>/bin/python3.13 (j the layout's
    index, n the role's position).  Only build-tree interpreters can have one.

    A tree is laid out as an installation: the interpreter (a hard link, or a copy
    across file systems), lib/python3.13 (python3.13t when free-threaded) with a
    symlink to each file of the build's standard library, and its lib-dynload linked
    to the build's extension modules.  So within a layout every interpreter's
    sys.executable, sys.path and module file names have the same length, whichever
    source tree and build directory it comes from (a free-threaded interpreter's are
    one character longer).  Those lengths shift the heap's layout, and with it the counts
    of allocation-heavy workloads: with all paths equal, padding them moved regex's
    count by up to 3.4 %, and not always the same way for two interpreters (its C/U
    ranged over -0.4 % to +4.6 %; bench/analysis.md).  measure_instructions therefore
    runs every layout, and analyze takes the median over the layouts of each ratio."""
    if len(interps) > 10:
        sys.exit("at most 10 interpreters")
    trees = {role: build_tree_of(path) for role, path in interps.items()}
    if os.path.isdir(root):
        shutil.rmtree(root)
    out = []
    for j, pad in enumerate(pads):
        layout = {}
        for n, (role, path) in enumerate(interps.items()):
            top = os.path.join(root, str(j) + "_" * pad, str(n))
            layout[role] = make_tree(top, path, *trees[role])
        out.append(layout)
    return out


def make_tree(top, interp, stdlib, dynload, libname):
    """The tree of layout_trees at top; returns its interpreter's path."""
    lib = os.path.join(top, "lib", libname)
    os.makedirs(os.path.join(top, "bin"))
    exe = os.path.join(top, "bin", "python3.13")
    try:
        os.link(interp, exe)
    except OSError:
        shutil.copy2(interp, exe)
    for here, dirs, files in os.walk(stdlib):
        dirs[:] = [d for d in dirs if d not in TREE_SKIP]
        there = os.path.join(lib, os.path.relpath(here, stdlib))
        os.makedirs(there, exist_ok=True)
        for name in files:
            os.symlink(os.path.join(here, name), os.path.join(there, name))
    os.symlink(dynload, os.path.join(lib, "lib-dynload"))
    return exe


def workload_path(name):
    return os.path.join(WORKLOAD_DIR, name + ".py")
