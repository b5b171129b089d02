"""Render folded stacks as an interactive flame graph: one SVG file.

    python -m usdt.flamegraph stacks.folded > stacks.svg
    python -m usdt.flamegraph --diff before.folded after.folded > diff.svg

The input is the folded format, one stack per line, root first, frames
separated by ";", then a space and a count ("main;work;leaf 42"): what
python -m usdt.stacks --folded, the folding of pyprofile.bt's stacks and
python -m usdt.tools latency --folded (usdt/scripts/callpaths.bt's wall time
by call path) print.  Each frame is a
rectangle whose width is its share of the total count: the count of the
stacks that go through it.  The file needs no network and no other file:
a click on a frame zooms to it (a click on the bottom bar, or Escape,
zooms back out), Search (or Ctrl-F) highlights the frames whose name
matches a regular expression and shows their share, and each frame's
tooltip gives its name, count and percentage.

With --diff, the widths are those of the second file, and each frame is
colored by how its count changed from the first: red where it grew, blue
where it shrank, the deeper the more; its tooltip gives both counts.
Runs under any Python 3 (no module outside the standard library).
"""

import argparse
import hashlib
import html
import sys

WIDTH = 1200            # of the image, in pixels
FRAME_HEIGHT = 16
PAD_TOP = 44            # title and search controls
PAD_BOTTOM = 24         # the details line
PAD_SIDE = 10
FONT_SIZE = 12
# A frame narrower than this (in pixels) is drawn without its label.
MIN_LABEL_WIDTH = 22
# Decimals of x and width: the widths add up exactly at this precision.
DECIMALS = 6


class Error(Exception):
    """A malformed input, reported in one line."""


class Node:
    """A frame of the graph: the stacks that go through it."""

    __slots__ = ("name", "count", "before", "children")

    def __init__(self, name):
        self.name = name
        self.count = 0
        self.before = 0
        self.children = {}

    def child(self, name):
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = Node(name)
        return node


def parse_folded(lines, where="<input>"):
    """[(frames, count)] of folded lines; empty lines are skipped."""
    stacks = []
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        try:
            count = int(count)
        except ValueError:
            raise Error("%s:%d: no count at the end of %r"
                        % (where, number, line)) from None
        if not stack or count < 0:
            raise Error("%s:%d: not a folded stack: %r"
                        % (where, number, line))
        stacks.append((stack.split(";"), count))
    return stacks


def build(stacks, before=()):
    """The tree of stacks (root node "all"); *before*, for a differential
    graph, adds its counts as each node's before."""
    if not sum(count for _, count in stacks):
        raise Error("no stacks to draw (no counts above 0)")
    root = Node("all")
    for attribute, counted in (("count", stacks), ("before", before)):
        for frames, count in counted:
            node = root
            setattr(node, attribute, getattr(node, attribute) + count)
            for name in frames:
                node = node.child(name)
                setattr(node, attribute, getattr(node, attribute) + count)
    return root


def color(name):
    """A warm color from the name, the same for the same name."""
    digest = hashlib.sha1(name.encode("utf-8", "replace")).digest()
    red = 205 + digest[0] % 50
    green = 80 + digest[1] % 150
    blue = digest[2] % 55
    return "rgb(%d,%d,%d)" % (red, green, blue)


def diff_color(node, total, before_total):
    """Red where the node's share grew, blue where it shrank."""
    now = node.count / total if total else 0.0
    then = node.before / before_total if before_total else 0.0
    change = now - then
    strength = min(1.0, abs(change) * 5)
    fade = int(round(230 - 180 * strength))
    if change > 0:
        return "rgb(240,%d,%d)" % (fade, fade)
    if change < 0:
        return "rgb(%d,%d,240)" % (fade, fade)
    return "rgb(230,230,230)"


def layout(root):
    """[(node, depth, start)] in drawing order: each node with its depth
    and the count of the stacks drawn left of it."""
    frames = []
    todo = [(root, 0, 0)]
    while todo:
        node, depth, start = todo.pop()
        frames.append((node, depth, start))
        offset = start
        children = []
        for name in sorted(node.children):
            child = node.children[name]
            if child.count:
                children.append((child, depth + 1, offset))
                offset += child.count
        todo.extend(reversed(children))
    return frames


def render(root, title, diff=False, before_total=0):
    """The SVG text of the graph of *root*."""
    total = root.count
    frames = layout(root)
    depth = max(d for _, d, _ in frames) + 1
    height = PAD_TOP + depth * FRAME_HEIGHT + PAD_BOTTOM
    inner = WIDTH - 2 * PAD_SIDE
    scale = inner / total if total else 0.0
    out = []
    add = out.append
    add('<?xml version="1.0" standalone="no"?>\n')
    add('<svg version="1.1" xmlns="http://www.w3.org/2000/svg" '
        'width="%d" height="%d" viewBox="0 0 %d %d" '
        'data-total="%d" data-inner="%d" data-pad="%d" data-diff="%d" '
        'onload="init(evt)">\n'
        % (WIDTH, height, WIDTH, height, total, inner, PAD_SIDE,
           1 if diff else 0))
    add('<style>\n'
        'text { font-family: monospace; font-size: %dpx; fill: #000; }\n'
        '.frame rect { stroke: #fff; stroke-width: 0.5; }\n'
        '.frame:hover rect { stroke: #000; stroke-width: 1; }\n'
        '.frame text { pointer-events: none; }\n'
        '.hidden { display: none; }\n'
        '.match rect { fill: rgb(230,0,230) !important; }\n'
        '#search, #reset { cursor: pointer; }\n'
        '</style>\n' % FONT_SIZE)
    add('<rect x="0" y="0" width="%d" height="%d" fill="#f8f8f8"/>\n'
        % (WIDTH, height))
    add('<text id="title" x="%d" y="20" text-anchor="middle" '
        'style="font-size:16px">%s</text>\n'
        % (WIDTH // 2, html.escape(title)))
    add('<text id="reset" x="%d" y="36" class="hidden">Reset zoom</text>\n'
        % PAD_SIDE)
    add('<text id="search" x="%d" y="36" text-anchor="end">Search</text>\n'
        % (WIDTH - PAD_SIDE))
    add('<text id="matched" x="%d" y="%d" text-anchor="end"></text>\n'
        % (WIDTH - PAD_SIDE, height - 8))
    add('<text id="details" x="%d" y="%d"> </text>\n'
        % (PAD_SIDE, height - 8))
    add('<g id="frames">\n')
    for node, level, start in frames:
        x = PAD_SIDE + start * scale
        width = node.count * scale
        y = height - PAD_BOTTOM - (level + 1) * FRAME_HEIGHT
        share = 100.0 * node.count / total if total else 0.0
        if diff:
            fill = diff_color(node, total, before_total)
            tip = ("%s (%d, %.2f%%; before %d, %+d)"
                   % (node.name, node.count, share, node.before,
                      node.count - node.before))
        else:
            fill = color(node.name) if level else "rgb(200,200,200)"
            tip = "%s (%d, %.2f%%)" % (node.name, node.count, share)
        label = node.name if width >= MIN_LABEL_WIDTH else ""
        add('<g class="frame" data-name="%s" data-count="%d" '
            'data-start="%d" data-depth="%d">'
            '<title>%s</title>'
            '<rect x="%.*f" y="%d" width="%.*f" height="%d" fill="%s" '
            'rx="2" ry="2"/>'
            '<text x="%.*f" y="%d">%s</text></g>\n'
            % (html.escape(node.name), node.count, start, level,
               html.escape(tip),
               DECIMALS, x, y, DECIMALS, width, FRAME_HEIGHT - 1, fill,
               DECIMALS, x + 3, y + FRAME_HEIGHT - 4,
               html.escape(fit(label, width))))
    add('</g>\n')
    add('<script type="text/ecmascript"><![CDATA[\n%s]]></script>\n'
        % SCRIPT)
    add('</svg>\n')
    return "".join(out)


def fit(name, width):
    """The label that fits in *width* pixels, cut with ".." if need be."""
    chars = int((width - 6) // (FONT_SIZE * 0.6))
    if chars >= len(name):
        return name
    if chars < 3:
        return ""
    return name[:chars - 2] + ".."


# Zoom, search and the details line.  A frame's data-start and
# data-count say where it lies in counts; zooming to a frame draws the
# frames inside it across the whole width, hides those beside it, and
# leaves those below it (its callers) whole, as in Brendan Gregg's
# flamegraph.pl.
SCRIPT = r"""
var svg, frames, details, matched, reset, total, inner, pad, zoomed = null;
var CHAR = %(char)s, MINLABEL = %(minlabel)d;
function init(evt) {
    svg = document.documentElement;
    frames = Array.prototype.slice.call(
        document.querySelectorAll("#frames .frame"));
    details = document.getElementById("details");
    matched = document.getElementById("matched");
    reset = document.getElementById("reset");
    total = +svg.getAttribute("data-total");
    inner = +svg.getAttribute("data-inner");
    pad = +svg.getAttribute("data-pad");
    frames.forEach(function (g) {
        g.addEventListener("click", function () { zoom(g); });
        g.addEventListener("mouseover", function () {
            details.textContent = g.querySelector("title").textContent;
        });
        g.addEventListener("mouseout", function () {
            details.textContent = " ";
        });
    });
    reset.addEventListener("click", function () { zoom(null); });
    document.getElementById("search").addEventListener("click", ask);
    window.addEventListener("keydown", function (e) {
        if (e.key === "Escape") { zoom(null); search(""); }
        if ((e.ctrlKey || e.metaKey) && e.key === "f") {
            e.preventDefault(); ask();
        }
    });
}
function num(g, name) { return +g.getAttribute("data-" + name); }
function label(g, width) {
    var name = g.getAttribute("data-name");
    var chars = Math.floor((width - 6) / CHAR);
    if (width < MINLABEL || chars < 3) { return ""; }
    return chars >= name.length ? name : name.slice(0, chars - 2) + "..";
}
function zoom(target) {
    var start = 0, count = total, depth = 0;
    if (target && num(target, "depth") > 0) {
        start = num(target, "start");
        count = num(target, "count");
        depth = num(target, "depth");
    } else {
        target = null;
    }
    zoomed = target;
    reset.setAttribute("class", target ? "" : "hidden");
    var scale = inner / count;
    frames.forEach(function (g) {
        var s = num(g, "start"), c = num(g, "count"), d = num(g, "depth");
        var rect = g.querySelector("rect"), text = g.querySelector("text");
        var x, w;
        if (d < depth) {
            x = pad; w = inner;      /* a caller of the frame: whole */
        } else if (s >= start && s + c <= start + count) {
            x = pad + (s - start) * scale; w = c * scale;
        } else {
            g.classList.add("hidden");
            return;
        }
        g.classList.remove("hidden");
        rect.setAttribute("x", x.toFixed(6));
        rect.setAttribute("width", w.toFixed(6));
        text.setAttribute("x", (x + 3).toFixed(6));
        text.textContent = label(g, w);
    });
}
function ask() {
    var term = window.prompt("Search (regular expression)", "");
    if (term !== null) { search(term); }
}
function search(term) {
    var re = null;
    if (term) {
        try { re = new RegExp(term); } catch (e) { re = null; }
    }
    /* The share of the matching frames, without counting a frame inside
       a matching frame twice. */
    var covered = [], sum = 0;
    frames.forEach(function (g) {
        var hit = re !== null && num(g, "depth") > 0 &&
            re.test(g.getAttribute("data-name"));
        g.classList.toggle("match", hit);
        if (hit) {
            var s = num(g, "start"), c = num(g, "count");
            var inside = covered.some(function (r) {
                return s >= r[0] && s + c <= r[0] + r[1];
            });
            if (!inside) { covered.push([s, c]); sum += c; }
        }
    });
    matched.textContent = re === null ? "" :
        "Matched: " + (100 * sum / total).toFixed(2) + "%%";
}
""" % {"char": FONT_SIZE * 0.6, "minlabel": MIN_LABEL_WIDTH}


def read(path):
    if path == "-":
        return parse_folded(sys.stdin, "<stdin>")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_folded(f, path)
    except OSError as error:
        raise Error("%s: %s" % (path, error.strerror)) from None


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m usdt.flamegraph",
        description="Render folded stacks (\"root;...;leaf count\" lines) "
        "as an interactive flame graph: one SVG file, with no network and "
        "no other file.")
    parser.add_argument("files", nargs="+", metavar="FOLDED",
                        help="folded stacks; - for standard input.  With "
                        "--diff, two: before, then after")
    parser.add_argument("--diff", action="store_true",
                        help="a differential graph: the widths of the "
                        "second file, red where a frame grew from the "
                        "first, blue where it shrank")
    parser.add_argument("--title", help="the graph's title")
    parser.add_argument("-o", dest="output", metavar="FILE",
                        help="write the SVG to FILE (default: standard "
                        "output)")
    args = parser.parse_args(argv)
    try:
        if args.diff:
            if len(args.files) != 2:
                parser.error("--diff takes two files: before, then after")
            before, after = read(args.files[0]), read(args.files[1])
            root = build(after, before)
            before_total = sum(count for _, count in before)
            title = args.title or "Differential flame graph"
            svg = render(root, title, diff=True, before_total=before_total)
        else:
            stacks = []
            for path in args.files:
                stacks.extend(read(path))
            title = args.title or "Flame graph"
            svg = render(build(stacks), title)
    except Error as error:
        sys.stderr.write("flamegraph: %s\n" % error)
        return 2
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(svg)
    else:
        sys.stdout.write(svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
