"""Lib/usdt/flamegraph.py: folded stacks drawn as an interactive SVG.

The graph is read back from the SVG: every frame's count must be the sum
of the counts of the folded stacks that go through it, and its width that
count's share of the image's width, exactly (to the 6 decimals written).
The SVG then opens in Debian's chromium, headless, driven through the
DevTools protocol (tests/chromium.py): a click on a frame zooms to it,
the search highlights what matches, and the screenshot shows the frames'
colors.  The renderer runs as documented: `python3 .../flamegraph.py`
from the source tree (any Python 3), and `python -m usdt.flamegraph` of
the interpreter under test.
"""

import collections
import os
import random
import re
import shutil
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ElementTree

import chromium
from support import PYTHON, USDT_PACKAGE, run, tracer_required

RENDERER = os.path.join(USDT_PACKAGE, "flamegraph.py")
# The renderer runs under any Python 3: prefer the system's.
TOOL_PYTHON = shutil.which("python3") or sys.executable
SVG = "{http://www.w3.org/2000/svg}"
# Where the browser test leaves its screenshot, for the howto's picture
# when CPYTHON_USDT_SCREENSHOT names a file.
SCREENSHOT = os.environ.get("CPYTHON_USDT_SCREENSHOT")


def random_stacks(seed, count=300):
    """Folded stacks of a made-up program: names with characters that
    XML escapes, shared prefixes, depths 1 to 12."""
    rng = random.Random(seed)
    names = ["<module>", "main", "run", "handle", "parse", "Request.read",
             "json.loads & dumps", 'say "hi"', "a'b", "leaf", "x" * 80,
             "<genexpr>"]
    stacks = collections.Counter()
    for _ in range(count):
        depth = rng.randint(1, 12)
        frames = ["<module>"] + [rng.choice(names[:6 + depth // 2])
                                 for _ in range(depth)]
        stacks[";".join(frames)] += rng.randint(1, 50)
    return stacks


def folded_text(stacks):
    return "".join("%s %d\n" % item for item in sorted(stacks.items()))


def expected_frames(stacks):
    """{path of frames from the root: count} of folded stacks."""
    frames = collections.Counter()
    for stack, count in stacks.items():
        names = stack.split(";")
        for depth in range(1, len(names) + 1):
            frames[tuple(names[:depth])] += count
    return frames


def svg_frames(text):
    """(svg attributes, [frame]) of a rendered graph, each frame a dict:
    name, count, start, depth, x, width, fill, title, path (names from the
    root, "all" left out)."""
    root = ElementTree.fromstring(text)
    frames = []
    for g in root.iter(SVG + "g"):
        if g.get("class") != "frame":
            continue
        rect = g.find(SVG + "rect")
        frames.append({"name": g.get("data-name"),
                       "count": int(g.get("data-count")),
                       "start": int(g.get("data-start")),
                       "depth": int(g.get("data-depth")),
                       "x": float(rect.get("x")),
                       "width": float(rect.get("width")),
                       "fill": rect.get("fill"),
                       "title": g.find(SVG + "title").text})
    # A frame's callers: the frames one level down whose span holds it.
    by_depth = collections.defaultdict(list)
    for frame in frames:
        by_depth[frame["depth"]].append(frame)
    for frame in sorted(frames, key=lambda f: f["depth"]):
        if frame["depth"] == 0:
            frame["path"] = ()
            continue
        parents = [p for p in by_depth[frame["depth"] - 1]
                   if p["start"] <= frame["start"]
                   and frame["start"] + frame["count"]
                   <= p["start"] + p["count"]]
        assert len(parents) == 1, (frame, parents)
        frame["path"] = parents[0]["path"] + (frame["name"],)
    return root.attrib, frames


class FlameGraphTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="flamegraph")
        self.addCleanup(shutil.rmtree, self.tmp)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def render(self, *args, python=TOOL_PYTHON):
        output = os.path.join(self.tmp, "out.svg")
        if python == TOOL_PYTHON:
            cmd = [python, RENDERER, *args, "-o", output]
        else:
            cmd = [python, "-m", "usdt.flamegraph", *args, "-o", output]
        proc = run(cmd)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(output) as f:
            return f.read()

    def check_widths(self, text, stacks):
        attrs, frames = svg_frames(text)
        expected = expected_frames(stacks)
        total = sum(stacks.values())
        self.assertEqual(int(attrs["data-total"]), total)
        inner = float(attrs["data-inner"])
        pad = float(attrs["data-pad"])
        scale = inner / total
        found = {frame["path"]: frame for frame in frames if frame["path"]}
        self.assertEqual(len(found), len(frames) - 1, "a path drawn twice")
        self.assertEqual({path: frame["count"]
                          for path, frame in found.items()}, dict(expected))
        for frame in frames:
            # Written with 6 decimals: off by half a unit of the last at
            # most.
            self.assertLessEqual(abs(frame["width"] - frame["count"] * scale),
                                 5e-7, frame)
            self.assertLessEqual(abs(frame["x"] - (pad + frame["start"]
                                                    * scale)), 5e-7, frame)
        # Siblings side by side, within their caller, in name order.
        children = collections.defaultdict(list)
        for frame in frames:
            if frame["path"]:
                children[frame["path"][:-1]].append(frame)
        for path, kids in children.items():
            parent = found.get(path) or [f for f in frames
                                         if not f["path"]][0]
            kids.sort(key=lambda f: f["start"])
            self.assertEqual([k["name"] for k in kids],
                             sorted(k["name"] for k in kids))
            position = parent["start"]
            for kid in kids:
                self.assertEqual(kid["start"], position, kid)
                position += kid["count"]
            self.assertLessEqual(position, parent["start"] + parent["count"])
        return frames

    def test_widths_match_counts(self):
        stacks = random_stacks(26)
        path = self.write("stacks.folded", folded_text(stacks))
        frames = self.check_widths(self.render(path), stacks)
        total = sum(stacks.values())
        for frame in frames:
            share = 100.0 * frame["count"] / total
            self.assertEqual(frame["title"], "%s (%d, %.2f%%)"
                             % (frame["name"], frame["count"], share))

    def test_installed_module(self):
        # python -m usdt.flamegraph of the interpreter under test draws
        # the same graph as the source tree's file.
        stacks = random_stacks(7, count=40)
        path = self.write("stacks.folded", folded_text(stacks))
        ours = self.render(path, python=PYTHON)
        self.check_widths(ours, stacks)
        self.assertEqual(ours, self.render(path))

    def test_differential(self):
        before = random_stacks(1)
        after = random_stacks(2)
        paths = [self.write("before.folded", folded_text(before)),
                 self.write("after.folded", folded_text(after))]
        text = self.render("--diff", *paths)
        frames = self.check_widths(text, after)
        then = expected_frames(before)
        before_total, after_total = sum(before.values()), sum(after.values())
        grew = shrank = 0
        for frame in frames:
            if not frame["path"]:
                continue
            old = then.get(frame["path"], 0)
            self.assertIn("before %d, %+d)" % (old, frame["count"] - old),
                          frame["title"])
            change = (frame["count"] / after_total - old / before_total)
            red, green, blue = map(int, re.findall(r"\d+", frame["fill"]))
            if change > 0:
                self.assertEqual(red, 240, frame)
                self.assertLess(blue, 240, frame)
                grew += 1
            elif change < 0:
                self.assertEqual(blue, 240, frame)
                self.assertLess(red, 240, frame)
                shrank += 1
        self.assertTrue(grew and shrank, (grew, shrank))

    def test_bad_input(self):
        path = self.write("bad.folded", "main;leaf 3\nmain;oops\n")
        proc = run([TOOL_PYTHON, RENDERER, path])
        self.assertEqual(proc.returncode, 2)
        self.assertEqual(proc.stderr, "flamegraph: %s:2: no count at the end "
                         "of 'main;oops'\n" % path)


class FlameGraphBrowserTest(unittest.TestCase):
    """The SVG in a real browser: zoom, search, a picture."""

    WIDTH, HEIGHT = 1200, 320

    def setUp(self):
        executable = chromium.find()
        if executable is None:
            reason = "chromium not found (apt-get install chromium)"
            if tracer_required():
                self.fail(reason)
            self.skipTest(reason)
        self.tmp = tempfile.mkdtemp(prefix="flamegraph")
        self.addCleanup(shutil.rmtree, self.tmp)
        try:
            self.browser = chromium.Browser(executable)
        except (chromium.BrowserError, OSError) as error:
            if tracer_required():
                self.fail("chromium: %s" % error)
            self.skipTest("chromium: %s" % error)
        self.addCleanup(self.browser.close)

    def frames(self):
        """[name, depth, start, count, x, width, hidden] in the page."""
        return self.browser.evaluate("""
            Array.prototype.map.call(
                document.querySelectorAll("#frames .frame"), function (g) {
                    var r = g.querySelector("rect");
                    return [g.dataset.name, +g.dataset.depth,
                            +g.dataset.start, +g.dataset.count,
                            +r.getAttribute("x"), +r.getAttribute("width"),
                            g.classList.contains("hidden"),
                            g.classList.contains("match")];
                })""")

    def test_click_zooms_search_and_picture(self):
        stacks = random_stacks(26)
        path = os.path.join(self.tmp, "stacks.svg")
        folded = os.path.join(self.tmp, "stacks.folded")
        with open(folded, "w") as f:
            f.write(folded_text(stacks))
        proc = run([TOOL_PYTHON, RENDERER, folded, "-o", path,
                    "--title", "Flame graph of made-up stacks"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(path) as f:
            attrs, _ = svg_frames(f.read())
        inner, pad = float(attrs["data-inner"]), float(attrs["data-pad"])
        browser = self.browser
        browser.open("file://" + path)
        before = browser.screenshot(self.WIDTH, self.HEIGHT)
        # The widest frame two levels up (a child of "<module>").
        frames = self.frames()
        target = max((f for f in frames if f[1] == 2), key=lambda f: f[3])
        name, depth, start, count = target[:4]
        box = browser.evaluate("""
            (function () {
                var g = Array.prototype.find.call(
                    document.querySelectorAll("#frames .frame"),
                    function (g) { return g.dataset.depth == "%d" &&
                                          g.dataset.start == "%d"; });
                var r = g.querySelector("rect").getBoundingClientRect();
                return [r.x + r.width / 2, r.y + r.height / 2];
            })()""" % (depth, start))
        browser.click(*box)
        zoomed = self.frames()
        scale = inner / count
        for f_name, f_depth, f_start, f_count, x, width, hidden, _ in zoomed:
            inside = f_start >= start and f_start + f_count <= start + count
            if f_depth < depth:
                # Its callers span the whole width.
                self.assertFalse(hidden)
                self.assertAlmostEqual(width, inner, places=5)
            elif inside:
                self.assertFalse(hidden, f_name)
                self.assertAlmostEqual(width, f_count * scale, places=5)
                self.assertAlmostEqual(x, pad + (f_start - start) * scale,
                                       places=5)
            else:
                self.assertTrue(hidden, f_name)
        self.assertEqual(browser.evaluate(
            'document.getElementById("details").textContent'),
            "%s (%d, %.2f%%)" % (name, count,
                                 100.0 * count / sum(stacks.values())))
        after = browser.screenshot(self.WIDTH, self.HEIGHT)
        self.assertNotEqual(before, after)
        # Not blank: the clicked frame's own color covers pixels of the
        # picture, and so do many others.
        fill = browser.evaluate("""
            Array.prototype.find.call(
                document.querySelectorAll("#frames .frame"),
                function (g) { return g.dataset.depth == "%d" &&
                                      g.dataset.start == "%d"; })
            .querySelector("rect").getAttribute("fill")""" % (depth, start))
        pixels = chromium.colors(after)
        rgb = tuple(map(int, re.findall(r"\d+", fill)))
        self.assertGreater(pixels.get(rgb, 0), inner, (fill, len(pixels)))
        self.assertGreater(len(pixels), 20)
        if SCREENSHOT:
            with open(SCREENSHOT, "wb") as f:
                f.write(after)
        # Search: the frames named "leaf" are highlighted, and the share
        # they cover (a leaf inside a leaf counted once) is shown.
        browser.evaluate('search("^leaf$")')
        searched = self.frames()
        leaves = [f for f in searched if f[0] == "leaf"]
        self.assertTrue(leaves)
        self.assertTrue(all(f[7] for f in leaves))
        self.assertFalse(any(f[7] for f in searched if f[0] != "leaf"))
        covered = set()
        for stack, n in stacks.items():
            if "leaf" in stack.split(";"):
                covered.add(stack)
        share = 100.0 * sum(stacks[s] for s in covered) / sum(stacks.values())
        self.assertEqual(browser.evaluate(
            'document.getElementById("matched").textContent'),
            "Matched: %.2f%%" % share)
        # Escape zooms back out.
        browser.command("Input.dispatchKeyEvent", type="keyDown",
                        key="Escape", code="Escape",
                        windowsVirtualKeyCode=27)
        self.assertFalse(any(f[6] for f in self.frames()))


if __name__ == "__main__":
    unittest.main()
