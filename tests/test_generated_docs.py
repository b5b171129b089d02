"""Generated documents show paths relative to the repository.

docs/performance.md is rendered by bench/run.py from
bench/recorded/performance.json, which records the absolute paths of the
machine that ran the benchmark (its checkout, its interpreters).  The report must not show them: a reader
has the repository somewhere else.

bench/release.py renders its report the same way, from results made up
here, and judges them by the criterion its report states.

The report's section "The usdt module (unarmed)" comes from
bench/usdt_module.py's results, bench/recorded/usdt-module-bench.json
when it exists: its verdicts follow the targets recorded there.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from support import TOP

BENCH_RUN = os.path.join(TOP, "bench", "run.py")
BENCH_RELEASE = os.path.join(TOP, "bench", "release.py")
RESULTS = os.path.join(TOP, "bench", "recorded", "performance.json")
REPORT = os.path.join(TOP, "docs", "performance.md")
USDT_MODULE_RESULTS = os.path.join(TOP, "bench", "recorded",
                                   "usdt-module-bench.json")
# Where the results below pretend to have been made.
ELSEWHERE = "/srv/some.where/else+deep/cpython-usdt.checkout"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_run():
    return load("bench_run", BENCH_RUN)


def replace_strings(value, old, new):
    """value (parsed JSON) with old replaced by new in every string."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [replace_strings(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: replace_strings(v, old, new) for k, v in value.items()}
    return value


class PerformanceReport(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(RESULTS) as f:
            cls.results = json.load(f)
        machine = cls.results["machine"]
        # The checkout the results were made in ("repo"; older results
        # only have the directory the run started in).
        cls.made_in = machine.get("repo") or machine["cwd"]

    def test_committed_report_shows_no_checkout_path(self):
        with open(REPORT) as f:
            report = f.read()
        self.assertNotIn(self.made_in + "/", report)
        self.assertIn("`build/3.13/obj/python`", report)

    def test_renderer_writes_repository_paths_relative(self):
        # The same results, as if made in a checkout at ELSEWHERE.
        data = replace_strings(self.results, self.made_in, ELSEWHERE)
        data["machine"]["repo"] = ELSEWHERE
        report = bench_run().render_md(data, "performance.json", None)
        self.assertNotIn(ELSEWHERE, report)
        interpreters = data["machine"]["interpreters"]
        for role, info in interpreters.items():
            with self.subTest(role=role):
                path = os.path.relpath(info["path"], ELSEWHERE)
                self.assertFalse(path.startswith(".."), info["path"])
                self.assertRegex(report, r"\| %s \| `%s` "
                                 % (role, re.escape(path)))


    def test_committed_report_is_rendered_from_the_results(self):
        # bench/run.py --render-only bench/recorded/performance.json
        # --out-md docs/performance.md gives the committed report, with the
        # usdt module's section (from bench/recorded/usdt-module-bench.json,
        # or saying how to measure it).
        run_py = bench_run()
        args = argparse.Namespace(out_json=RESULTS, out_md=REPORT)
        data = json.loads(json.dumps(self.results))
        data["analysis"] = run_py.analyze(data)
        report = run_py.render_md_for(args)(
            data, os.path.relpath(RESULTS, os.path.dirname(REPORT)),
            "performance.png")
        with open(REPORT) as f:
            self.assertEqual(report, f.read(),
                             "docs/performance.md is not what bench/run.py "
                             "renders from bench/recorded/performance.json: "
                             "re-render it (bench/README.md, --render-only)")
        self.assertIn("\n## The usdt module (unarmed)\n", report)
        if not os.path.exists(USDT_MODULE_RESULTS):
            self.assertIn("Not measured: there is no `usdt-module-bench.json`",
                          report)


class RawResultsOutOfDocs(unittest.TestCase):
    """The benchmarks' raw JSON lives in bench/recorded/, not docs/ (which
    holds what people read): no JSON file in docs/ of more than 2,000
    lines."""

    def test_no_long_json_in_docs(self):
        docs = os.path.join(TOP, "docs")
        for name in sorted(os.listdir(docs)):
            if name.endswith(".json"):
                with open(os.path.join(docs, name)) as f:
                    lines = sum(1 for _ in f)
                self.assertLessEqual(lines, 2000, "docs/%s: move it to "
                                     "bench/recorded/" % name)


class ToolCosts(unittest.TestCase):
    """The measured costs of the tools (bench/tools.py): the raw measures
    in bench/recorded/tools-cost.json, outside the standard library; the
    report docs/tools-cost.md and the toolkit's usdt._tool_costs (what
    --help shows) are rendered from them."""

    def setUp(self):
        import sys
        sys.path.insert(0, os.path.join(TOP, "bench"))
        self.addCleanup(sys.path.remove, os.path.join(TOP, "bench"))
        self.tools = load("bench_tools", os.path.join(TOP, "bench",
                                                      "tools.py"))
        with open(os.path.join(TOP, "bench", "recorded",
                               "tools-cost.json")) as f:
            self.result = json.load(f)

    def test_module_is_rendered_from_the_results(self):
        with open(os.path.join(TOP, "overlay", "Lib", "usdt",
                               "_tool_costs.py")) as f:
            self.assertEqual(f.read(), self.tools.module(self.result),
                             "bench/tools.py --render-only "
                             "bench/recorded/tools-cost.json renders it")

    def test_report_is_rendered_from_the_results(self):
        with open(os.path.join(TOP, "docs", "tools-cost.md")) as f:
            self.assertTrue(f.read().startswith(
                self.tools.markdown(self.result)))


def usdt_module_results(extra):
    """Results as bench/usdt_module.py --out-json writes them, made in a
    checkout at ELSEWHERE: each statement's samples are `pass`'s, plus
    extra[statement] ns, plus its baseline's."""
    rows = [["if probe: pass", "pass", 30], ["obj.attr", "pass", None],
            ["traced(1)", "plain(1)", 50], ["plain(1)", "pass", None]]
    base = {"pass": None, "if probe: pass": "pass", "obj.attr": "pass",
            "plain(1)": "pass", "traced(1)": "plain(1)"}

    def level(stmt):
        return 10.0 if base[stmt] is None else level(base[stmt]) + extra[stmt]
    samples = {stmt: [level(stmt) + d for d in (0.5, 0.0, 2.0)]
               for stmt in base}
    return {"schema": 1, "kind": "usdt_module",
            "machine": {"uname": "Linux test", "cpu_model": "test CPU",
                        "nproc": 2, "date_utc": "2026-01-01 00:00:00 UTC",
                        "loadavg_at_start": "0.10 0.10 0.10 1/80 1",
                        "loadavg_at_end": "0.20 0.10 0.10 1/80 2",
                        "command": "/usr/bin/python3.11 bench/usdt_module.py "
                                   + ELSEWHERE + "/build/obj/python",
                        "cwd": ELSEWHERE, "repo": ELSEWHERE},
            "interpreter": {"path": ELSEWHERE + "/build/obj/python",
                            "version": "3.13.5", "build": "GIL"},
            "config": {"repeat": 3, "number": 1000},
            "rows": rows, "samples_ns": samples}


class UsdtModuleSection(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.render = staticmethod(bench_run().render_usdt_module)

    def section(self, bench):
        return "\n".join(self.render(bench, "usdt-module-bench.json"))

    def test_verdicts_follow_the_recorded_targets(self):
        bench = usdt_module_results({"if probe: pass": 12.0, "obj.attr": 8.0,
                                     "plain(1)": 30.0, "traced(1)": 61.0})
        section = self.section(bench)
        self.assertIn("| `if probe: pass` | 22.5 | 22.0 | `pass` | +12.0 "
                      "| ≤ 30 ns | met |", section)
        self.assertIn("| `traced(1)` | 101.5 | 101.0 | `plain(1)` | +61.0 "
                      "| ≤ 50 ns | **MISSED** |", section)
        self.assertIn("| `obj.attr` | 18.5 | 18.0 | `pass` | +8.0 |  |  |",
                      section)
        self.assertIn("`if probe: pass` at most 30 ns over `pass`", section)
        # Another target recorded: another verdict.
        bench["rows"][0][2] = 10
        bench["rows"][2][2] = 61
        section = self.section(bench)
        self.assertIn("+12.0 | ≤ 10 ns | **MISSED** |", section)
        self.assertIn("+61.0 | ≤ 61 ns | met |", section)
        self.assertIn("`if probe: pass` at most 10 ns over `pass`", section)

    def test_paths_relative(self):
        section = self.section(usdt_module_results(
            {"if probe: pass": 1.0, "obj.attr": 1.0, "plain(1)": 1.0,
             "traced(1)": 1.0}))
        self.assertNotIn(ELSEWHERE, section)
        self.assertIn("- interpreter: `build/obj/python` (3.13.5, GIL build)",
                      section)
        self.assertIn("[`usdt-module-bench.json`](usdt-module-bench.json)",
                      section)

    def test_not_measured(self):
        section = self.section(None)
        self.assertIn("Not measured", section)
        self.assertIn("bench/usdt_module.py build/obj/python --out-json "
                      "bench/recorded/usdt-module-bench.json", section)


RELEASE_PATHS = {"P1": "build/release-pristine-fp/python",
                 "P2": "build/release-pristine-fp2/python",
                 "R": "build/release/python"}
WORKLOADS = ("recursion", "loops")


def release_results(instr, wall):
    """Results as bench/release.py writes them, made in a checkout at
    ELSEWHERE: instr and wall give each role's factor on P1's instruction
    counts and timed regions (5 rounds, a little noise, the same for all)."""
    counts = {role: {"startup": 40_000_000} for role in instr}
    counts["P1_repeat"] = {"startup": 40_000_000}
    for k, w in enumerate(WORKLOADS):
        net = 100_000_000 * (k + 1)
        for role, f in instr.items():
            counts[role][w] = 40_000_000 + round(net * f)
        counts["P1_repeat"][w] = counts["P1"][w]
    noise = (1.0, 1.02, 0.99, 1.01, 0.98)
    samples = {w: {role: {"region_ns": [round(5e8 * f * n) for n in noise],
                          "process_ns": [round(5.2e8 * f * n) for n in noise],
                          "checksum": "%s 42" % w, "order": [0, 1, 2, 0, 1]}
                   for role, f in wall.items()}
               for w in WORKLOADS}
    paths = {role: os.path.join(ELSEWHERE, p) for role, p in RELEASE_PATHS.items()}
    machine = {
        "uname": "Linux test", "cpu_model": "test CPU", "nproc": 2,
        "loadavg_at_start": "0.10 0.10 0.10 1/80 1",
        "loadavg_at_end": "0.20 0.10 0.10 1/80 2",
        "date_utc": "2026-01-01 00:00:00 UTC",
        "command": "/usr/bin/python3.11 bench/release.py --out-json x.json "
                   + " ".join("--python %s=%s" % rp for rp in paths.items()),
        "cwd": ELSEWHERE, "repo": ELSEWHERE, "driver_python": "3.11.2",
        "valgrind": "valgrind-3.19.0", "bpftrace": "bpftrace v0.17.0",
        "gcc": "gcc 12.2.0", "euid": 0,
        "interpreters": {role: {
            "path": path, "description": role, "version": "Python 3.13.5",
            "sys_version": "3.13.5", "config_args": "'--enable-optimizations'",
            "with_dtrace": "1" if role == "R" else "0"}
            for role, path in paths.items()}}
    return {"schema": 1, "kind": "release",
            "config": {"workloads": list(WORKLOADS), "cg_scale": 0.05,
                       "wall_scale": 1.0, "rounds": 5, "jobs": 2, "mode": "full"},
            "machine": machine, "interpreters": paths,
            "binaries": {role: {"sha256": "%064x" % k, "bytes": 1}
                         for k, role in enumerate(paths)},
            "instructions": {"scale": 0.05, "counts": counts,
                             "checksums": {r: {w: "ok" for w in counts[r]}
                                           for r in counts},
                             "extra_P1_repeats": {}},
            "wall": {"scale": 1.0, "rounds": 5, "samples": samples},
            "duration_s": 1.0}


class ReleaseReport(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.release = load("bench_release", BENCH_RELEASE)

    def render(self, data):
        data["analysis"] = self.release.analyze_release(data)
        return self.release.render_release_md(data, "release.json")

    def test_paths_relative(self):
        report = self.render(release_results(
            {"P1": 1, "P2": 1, "R": 1}, {"P1": 1, "P2": 1, "R": 1}))
        self.assertNotIn(ELSEWHERE, report)
        for role, path in RELEASE_PATHS.items():
            with self.subTest(role=role):
                self.assertRegex(report, r"\| %s \| `%s` " % (role, re.escape(path)))

    def test_verdicts(self):
        # what: (P2, R) factors on P1's instruction counts, the same for wall
        # time, the verdicts on instructions and on wall time (None:
        # inconclusive), a line of the report.  "The build decides": R is
        # +0.6 % on P1 and -0.4 % on P2.  "Tolerance": P2 is 4 % slower than
        # P1, R 1 % slower than their mean: within that, above the +0.3 % floor.
        cases = {
            "within": ((1.001, 1.002), (1.001, 1.0), (True, True),
                       "| recursion | 140,000,000 | +0.100 % | +0.200 % |"),
            "over": ((1.001, 1.01), (1.0, 1.05), (False, False), "**MISSED**"),
            "the build decides": ((1.01, 1.006), (1.0, 1.0), (None, True), "**INCONCLUSIVE**"),
            "tolerance": ((1, 1), (1.04, 1.03), (True, True), "| P1, P2 and R print the same"),
        }
        for what, (instr, wall, met, line) in cases.items():
            with self.subTest(what):
                data = release_results(dict(zip(("P1", "P2", "R"), (1,) + instr)),
                                       dict(zip(("P1", "P2", "R"), (1,) + wall)))
                report = self.render(data)
                got = data["analysis"]["verdict"]
                self.assertEqual(tuple(t["met"] for t in got), met + (True,), got)
                self.assertIn(line, report)


def fake_build(top, role, lib_len):
    """A build tree at top whose python prints role, or, asked where its os module is
    (as common.build_tree_of asks, with -S), a standard library whose directory name
    is lib_len characters long and python3.13; returns the interpreter's path."""
    stdlib = os.path.join(top, "L" * lib_len)
    for rel in ("os.py", "pkg/mod.py", "__pycache__/os.cpython-313.pyc"):
        os.makedirs(os.path.dirname(os.path.join(stdlib, rel)), exist_ok=True)
        with open(os.path.join(stdlib, rel), "w") as f:
            f.write("# %s\n" % rel)
    os.makedirs(os.path.join(top, "build", "lib.x"))
    with open(os.path.join(top, "pybuilddir.txt"), "w") as f:
        f.write("build/lib.x\n")
    path = os.path.join(top, "python")
    with open(path, "w") as f:
        f.write('#!/bin/sh\nif [ "$1" = -S ]; then printf "%s\\npython3.13\\n"; '
                'else echo %s; fi\n' % (stdlib, role))
    os.chmod(path, 0o755)
    return path


class ReleaseLayouts(unittest.TestCase):

    def test_median_over_layouts(self):
        # R/P1 +0.1 % in the first layout; two more layouts where R is +0.3 %
        # and +2 %: the median is +0.3 %.
        release = load("bench_release", BENCH_RELEASE)
        data = release_results({"P1": 1, "P2": 1, "R": 1.001},
                               {"P1": 1, "P2": 1, "R": 1})
        first = {r: data["instructions"]["counts"][r] for r in ("P1", "P2", "R")}
        layouts = [first]
        for f in (1.003, 1.02):
            other = json.loads(json.dumps(first))
            for w in WORKLOADS:
                other["R"][w] = 40_000_000 + round((first["P1"][w] - 40_000_000) * f)
            layouts.append(other)
        data["instructions"]["layout_counts"] = layouts
        rows = release.analyze_release(data)["instructions"]["rows"]
        for row in rows:
            if row["workload"] in WORKLOADS:
                self.assertAlmostEqual(row["R_P1"], 1.003, places=6)


class LayoutTrees(unittest.TestCase):
    # The instruction phase runs every interpreter from a tree laid out as an
    # installation, in several paddings of its paths: the lengths of its paths
    # shift the heap's layout.

    def setUp(self):
        self.common = load("bench_common", os.path.join(TOP, "bench", "common.py"))
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def test_trees(self):
        interps = {"A": fake_build(os.path.join(self.tmp, "a-build"), "A", 3),
                   "U": fake_build(os.path.join(self.tmp, "a-much-longer-build"), "U", 9)}
        root = os.path.join(self.tmp, "as")
        layouts = self.common.layout_trees(interps, [0, 3], root)
        self.assertEqual([list(lay) for lay in layouts], [["A", "U"], ["A", "U"]])
        lengths = [{len(p) for p in lay.values()} for lay in layouts]
        self.assertEqual([len(n) for n in lengths], [1, 1], layouts)
        self.assertEqual(lengths[1].pop() - lengths[0].pop(), 3, layouts)
        for lay in layouts:
            for role, exe in lay.items():
                with self.subTest(exe=exe):
                    out = subprocess.run([exe], capture_output=True, text=True)
                    self.assertEqual(out.stdout, role + "\n")
                    build = os.path.dirname(interps[role])
                    stdlib = subprocess.run([interps[role], "-S"], capture_output=True,
                                            text=True).stdout.split("\n")[0]
                    lib = os.path.join(os.path.dirname(os.path.dirname(exe)),
                                       "lib", "python3.13")
                    self.assertEqual(os.path.realpath(os.path.join(lib, "pkg", "mod.py")),
                                     os.path.join(stdlib, "pkg", "mod.py"))
                    # compileall descends only into real directories
                    self.assertFalse(os.path.islink(os.path.join(lib, "pkg")))
                    self.assertFalse(os.path.exists(os.path.join(lib, "__pycache__")))
                    self.assertEqual(os.path.realpath(os.path.join(lib, "lib-dynload")),
                                     os.path.join(build, "build", "lib.x"))
        # A second run replaces the trees, for other interpreters.
        again = self.common.layout_trees({"A": interps["U"]}, [0], root)
        out = subprocess.run([again[0]["A"]], capture_output=True, text=True)
        self.assertEqual(out.stdout, "U\n")
        self.assertEqual(os.listdir(root), ["0"])

    def test_not_a_build_tree(self):
        path = fake_build(os.path.join(self.tmp, "b"), "A", 3)
        os.unlink(os.path.join(self.tmp, "b", "pybuilddir.txt"))
        with self.assertRaises(SystemExit) as cm:
            self.common.layout_trees({"A": path}, [0], os.path.join(self.tmp, "as"))
        self.assertIn("is not in a build tree", str(cm.exception))

    def test_pads(self):
        self.assertEqual(self.common.layout_pads(5), [0, 3, 6, 10, 13])
        self.assertEqual(self.common.layout_pads(1), [0])
        for bad in (0, 17):
            with self.assertRaises(SystemExit):
                self.common.layout_pads(bad)


class LayoutMedian(unittest.TestCase):
    # Each ratio is the median over the layouts of the ratio within a layout.

    def test_median_of_paired_ratios(self):
        bench_run()         # puts bench/ on sys.path, for analyze's imports
        analyze = load("bench_analyze", os.path.join(TOP, "bench", "analyze.py"))
        # net C/U within the layouts: +2 %, +10 % (C in an unlucky layout), +3 %
        layouts = [{"C": {"startup": 10, "w": 10 + 102}, "U": {"startup": 10, "w": 110}},
                   {"C": {"startup": 10, "w": 10 + 110}, "U": {"startup": 10, "w": 110}},
                   {"C": {"startup": 20, "w": 20 + 103}, "U": {"startup": 20, "w": 120}}]
        ins = {"counts": layouts[0], "layout_counts": layouts}
        r = analyze.layout_ratios(ins, "w", {"C_U": ("C", "U")})
        self.assertAlmostEqual(r["net_C_U"], 1.03)
        self.assertAlmostEqual(r["gross_C_U"], (20 + 103) / 120)
        # results from before the layouts: the one layout of counts
        r = analyze.layout_ratios({"counts": layouts[1]}, "w", {"C_U": ("C", "U")})
        self.assertAlmostEqual(r["net_C_U"], 1.10)


class WallPairs(unittest.TestCase):
    # bench/wallpairs.py: every pair of a wall run, named by build directory.

    def setUp(self):
        bench_run()         # puts bench/ on sys.path, for wallpairs' imports
        self.wallpairs = load("bench_wallpairs", os.path.join(TOP, "bench", "wallpairs.py"))

    def data(self):
        # two workloads, five rounds; fp runs 5 % longer than nofp in each round,
        # fp2 10 % longer, except in one outlier round (its slowest) that the
        # medians must ignore
        base = [100, 104, 98, 101, 99]
        samples = {}
        for w, k in (("nbody", 1.0), ("regex", 3.0)):
            samples[w] = {
                "A": {"region_ns": [k * 1.05 * x for x in base]},
                "B": {"region_ns": [k * (500 if i == 1 else 1.10 * x)
                                    for i, x in enumerate(base)]},
                "U": {"region_ns": [k * x for x in base]}}
        return {"interpreters": {"A": "/b/release-pristine-fp/python",
                                 "B": "/b/release-pristine-fp2/python",
                                 "U": "/b/release-pristine-nofp/python"},
                "wall": {"rounds": 5, "samples": samples}}

    def test_pairs(self):
        wallpairs = self.wallpairs
        got = {(r, b): (gm, ci) for r, b, gm, ci in wallpairs.pair_ratios(self.data())}
        self.assertEqual(sorted(got), [("A", "B"), ("A", "U"), ("B", "U")])
        self.assertAlmostEqual(got["A", "U"][0], 1.05)
        self.assertAlmostEqual(got["A", "B"][0], 1.05 / 1.10)
        self.assertAlmostEqual(got["B", "U"][0], 1.10)
        lo, hi = got["A", "U"][1]
        self.assertAlmostEqual(lo, 1.05)
        self.assertAlmostEqual(hi, 1.05)
        out = wallpairs.render(self.data(), per_workload="U")
        self.assertIn("release-pristine-fp / release-pristine-nofp", out)
        self.assertRegex(out, r"release-pristine-fp2 / release-pristine-nofp +\+10\.00 %")
        self.assertRegex(out, r"regex +\+5\.00 % +\+10\.00 %")

    def test_errors(self):
        wallpairs = self.wallpairs
        with self.assertRaisesRegex(SystemExit, "no role 'X' in the run"):
            wallpairs.render(self.data(), per_workload="X")
        data = self.data()
        del data["wall"]
        with self.assertRaisesRegex(SystemExit, "no wall phase"):
            wallpairs.render(data)


if __name__ == "__main__":
    unittest.main()
