"""Generated documents show paths relative to the repository.

docs/performance.md is rendered by bench/run.py from docs/performance.json,
which records the absolute paths of the machine that ran the benchmark
(its checkout, its interpreters).  The report must not show them: a reader
has the repository somewhere else.
"""

import importlib.util
import json
import os
import re
import unittest

from support import TOP

BENCH_RUN = os.path.join(TOP, "bench", "run.py")
RESULTS = os.path.join(TOP, "docs", "performance.json")
REPORT = os.path.join(TOP, "docs", "performance.md")
# Where the results below pretend to have been made.
ELSEWHERE = "/srv/some.where/else+deep/cpython-usdt.checkout"


def bench_run():
    spec = importlib.util.spec_from_file_location("bench_run", BENCH_RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
        self.assertIn("`build/obj/python`", report)

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


if __name__ == "__main__":
    unittest.main()
