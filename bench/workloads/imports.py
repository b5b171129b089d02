"""Import machinery: generate N small modules (chain + package) and import them fresh
each iteration (sys.modules purged, no bytecode cache, so source is compiled each time).

The modules are written to $BENCH_WORKDIR/imp (run.py passes a fixed path of the same
length for every interpreter, keeping instruction counts comparable) or to a temp dir.
"""
import importlib
import os
import shutil
import sys
import tempfile

from _harness import SCALE, bench_main
NMOD = 40

TEMPLATE = '''\
"""generated module {i}"""
{imp}
CONST_{i} = {i}
TABLE = {{k: k * {i} for k in range(10)}}

class Thing{i}:
    def __init__(self, v):
        self.v = v
    def value(self):
        return self.v + CONST_{i}

def func_{i}(x):
    return Thing{i}(x).value() + {prev}

VALUE = func_{i}(1)
'''


def generate(root):
    pkg = os.path.join(root, "benchpkg")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write("from . import m0\n")
    for i in range(NMOD):
        if i == 0:
            imp, prev = "", "0"
        else:
            imp, prev = f"from . import m{i - 1} as prev", "prev.VALUE"
        with open(os.path.join(pkg, f"m{i}.py"), "w") as f:
            f.write(TEMPLATE.format(i=i, imp=imp, prev=prev))


def purge():
    for name in [n for n in sys.modules if n == "benchpkg" or n.startswith("benchpkg.")]:
        del sys.modules[name]


def run(scale):
    reps = max(1, int(35 * scale))
    base = os.environ.get("BENCH_WORKDIR")
    if base:
        root = os.path.join(base, "imp")
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
    else:
        root = tempfile.mkdtemp(prefix="usdtbench")
    sys.dont_write_bytecode = True
    try:
        generate(root)
        sys.path.insert(0, root)
        importlib.invalidate_caches()
        acc = 0
        for _ in range(reps):
            purge()
            importlib.import_module("benchpkg")
            for i in range(NMOD):
                mod = importlib.import_module(f"benchpkg.m{i}")
                acc += mod.VALUE
        sys.path.remove(root)
        purge()
        return acc
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    bench_main(run)
