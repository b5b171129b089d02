"""usdt._bpftrace, the one place that knows how bpftrace versions differ,
on output each version really printed (kept here as text): what its
NoiseFilter leaves out and shows, and the empty lines each version adds
to its stdout when it ends.  The tools' tests run the same code against
each bpftrace (make check-bpftrace-versions); these need none.
"""

import io
import os
import unittest

from support import bpftrace_module

# bpftrace 0.27's stdout while it compiled the stack tool's program: warnings
# that 0.17 needs the constructs of, one of them on a macro, whose
# expansion 0.27 notes in a block of its own.  Then the -c command's
# output.
COMPILE_027 = """\
/tmp/pystack4/pystack.bt:153:14-22: WARNING: Unnecessary cast: expression \
is already of type uint64
        $cstack = ((uint64)(*uptr((uint8 *)($previous + FR_OWNER)) ^
                   ~~~~~~~~
/tmp/pystack4/pystack.bt:153:14-22: WARNING: expanded from
        $cstack = ((uint64)(*uptr((uint8 *)($previous + FR_OWNER)) ^
                   ~~~~~~~~
/tmp/pystack4/pystack.bt:156:27-34: WARNING: Unnecessary cast: expression \
is already of type int64
               $field, $cstack, (int64)$length, str(uptr($data)));
                                ~~~~~~~
TRUTH big 180039576
"""

# bpftrace 0.27's stdout while it compiled the stack tool's program for a
# tracepoint: a warning on two lines, then a located one, each followed
# by the note on its macro's expansion.  Then a record.
RANGED_027 = """\
/tmp/pystack9/pystack.bt:155-156: WARNING: Addrspace mismatch
\t\t$cstack = ((uint64)(*uptr((uint8 *)($previous + FR_OWNER)) ^
\t\t    FRAME_OWNED_BY_CSTACK) - 1) >> 63;
/tmp/pystack9/pystack.bt:155:14-22: WARNING: expanded from
        $cstack = ((uint64)(*uptr((uint8 *)($previous + FR_OWNER)) ^
                   ~~~~~~~~
/tmp/pystack9/pystack.bt:230:9-57: WARNING: Addrspace mismatch
                (*uptr((uint64 *)($frame + FR_PREVIOUS)) - $frame);
                 ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
PYSTACK D 1 2 0 0 0
"""


def shown(lines):
    noise = bpftrace_module().NoiseFilter()
    kept = [noise.keep(line) for line in lines]
    return kept[0][:0].join(kept), noise


class NoiseFilterTest(unittest.TestCase):

    def test_warning_on_a_macro_left_out_with_its_expansion(self):
        text, noise = shown(COMPILE_027.splitlines(keepends=True))
        self.assertEqual(text, "TRUTH big 180039576\n")
        self.assertEqual(noise.noise, 2)

    def test_expansion_of_a_shown_warning_shown(self):
        # A warning the filter does not know is shown, and so is the note
        # on its macro's expansion.
        lines = COMPILE_027.replace("Unnecessary cast",
                                    "Something new").splitlines(True)
        text, noise = shown(lines)
        self.assertIn("WARNING: Something new", text)
        self.assertIn("WARNING: expanded from", text)
        self.assertEqual(noise.noise, 0)

    def test_bytes_as_text(self):
        lines = COMPILE_027.encode().splitlines(keepends=True)
        text, _ = shown(lines)
        self.assertEqual(text, b"TRUTH big 180039576\n")

    def test_ranged_warning_left_out_with_its_expansion(self):
        # 0.27 on the stack tool's program with a tracepoint probe: a warning
        # on lines 155-156, which it prints, then the note on its macro.
        text, noise = shown(RANGED_027.splitlines(keepends=True))
        self.assertEqual(text, "PYSTACK D 1 2 0 0 0\n")
        self.assertEqual(noise.noise, 2)


class ExitNewlinesTest(unittest.TestCase):
    """0.17 and 0.23 end their stdout with two newlines of their own,
    even with -o (bpftrace's run_bpftrace.cpp until 0.24); 0.27 with
    none, so the -c command's last newline is its own."""

    def runner(self, version):
        module = bpftrace_module()
        return module.Bpftrace("bpftrace", version, "v%d.%d.%d" % version)

    def test_by_version(self):
        self.assertEqual(self.runner((0, 17, 0)).exit_newlines, 2)
        self.assertEqual(self.runner((0, 23, 2)).exit_newlines, 2)
        self.assertEqual(self.runner((0, 24, 0)).exit_newlines, 0)
        self.assertEqual(self.runner((0, 27, 0)).exit_newlines, 0)

    def test_unknown_version_keeps_every_newline(self):
        module = bpftrace_module()
        self.assertEqual(
            module.Bpftrace("bpftrace", None, "no version").exit_newlines, 0)


def forwarded(data, newlines):
    """What forward_stdout() copies of *data*, bpftrace's stdout."""
    module = bpftrace_module()
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    out = io.BytesIO()
    with open(read, "rb") as pipe:
        module.forward_stdout(pipe, out, newlines)
    return out.getvalue()


class ForwardStdoutTest(unittest.TestCase):
    """The -c command's output, as bpftrace's stdout carries it."""

    def test_empty_lines_at_exit_left_out(self):
        # 0.17 and 0.23: the command's output, then bpftrace's two.
        self.assertEqual(forwarded(b"TRUTH small 6\n\n\n", 2),
                         b"TRUTH small 6\n")

    def test_last_newline_kept(self):
        # 0.27: the command's last newline is all there is.
        self.assertEqual(forwarded(b"TRUTH small 6\n", 0),
                         b"TRUTH small 6\n")

    def test_compile_warnings_left_out(self):
        self.assertEqual(forwarded(COMPILE_027.encode(), 0),
                         b"TRUTH big 180039576\n")


class VerboseTest(unittest.TestCase):
    """Without -v the warnings left out are counted in one line; with it
    they are shown, and the version used is named."""

    def setUp(self):
        module = bpftrace_module()
        self.addCleanup(os.environ.pop, module.VERBOSE, None)
        os.environ.pop(module.VERBOSE, None)
        module.LEFT_OUT[0] = 0
        self.addCleanup(module.LEFT_OUT.__setitem__, 0, 0)

    def test_counted(self):
        module = bpftrace_module()
        text, _ = shown(COMPILE_027.splitlines(keepends=True))
        self.assertEqual(module.left_out_note("usdt.stacks"),
                         "usdt.stacks: 2 known harmless bpftrace warnings not "
                         "shown (-v shows them)\n")

    def test_shown_with_verbose(self):
        module = bpftrace_module()
        module.set_verbose()
        text, _ = shown(COMPILE_027.splitlines(keepends=True))
        self.assertEqual(text, COMPILE_027)
        self.assertEqual(module.left_out_note("usdt.stacks"), "")
        runner = module.Bpftrace("/usr/bin/bpftrace", (0, 23, 2),
                                 "bpftrace v0.23.2")
        self.assertEqual(module.untested_note(runner),
                         "usdt: using /usr/bin/bpftrace (bpftrace v0.23.2) "
                         "(tested: 0.17, 0.23, 0.27)\n")


# A program written with range loops, as usdt.stacks writes its own: a
# nested loop, a continue, braces in a string and in a comment.
RANGE_PROGRAM = """\
BEGIN
{
\t$n = 0;
\tfor ($i : 0..3) {
\t\t/* { not a block */
\t\tif ($i == 1) {
\t\t\tcontinue;
\t\t}
\t\tfor ($j : 0..(2 * 2)) {
\t\t\tif ($j == 2) { break; }
\t\t\tprintf("{%d}\\n", $j);
\t\t}
\t\t$n += $i;
\t}
}
"""

WHILE_PROGRAM = """\
BEGIN
{
\t$n = 0;
\t$i = 0;
\twhile ($i < 3) {
\t\t/* { not a block */
\t\tif ($i == 1) {
\t\t\t$i++; continue;
\t\t}
\t\t$j = 0;
\t\twhile ($j < (2 * 2)) {
\t\t\tif ($j == 2) { break; }
\t\t\tprintf("{%d}\\n", $j);
\t\t\t$j++;
\t\t}
\t\t$n += $i;
\t\t$i++;
\t}
}
"""


class LoopsTest(unittest.TestCase):
    """Range loops from 0.24 (bpf_loop() calls, whose bodies the kernel
    checks once; 0.25 deprecates while loops), the same loops as while
    loops before: 0.27 refused the stack tool's program written with while
    loops as too large."""

    def runner(self, version):
        module = bpftrace_module()
        return module.Bpftrace("bpftrace", version, "v%d.%d.%d" % version)

    def test_while_loops(self):
        self.assertEqual(bpftrace_module().while_loops(RANGE_PROGRAM),
                         WHILE_PROGRAM)

    def test_by_version(self):
        for version in ((0, 17, 0), (0, 23, 2)):
            self.assertFalse(self.runner(version).range_loops)
            self.assertEqual(self.runner(version).loops(RANGE_PROGRAM),
                             WHILE_PROGRAM)
        for version in ((0, 24, 0), (0, 27, 0)):
            self.assertTrue(self.runner(version).range_loops)
            self.assertEqual(self.runner(version).loops(RANGE_PROGRAM),
                             RANGE_PROGRAM)

    def test_unbalanced_refused(self):
        with self.assertRaises(ValueError):
            bpftrace_module().while_loops("for ($i : 0..3) {\n")
        with self.assertRaises(ValueError):
            bpftrace_module().while_loops(
                "for ($i : 0..3) {\n\t$x = 1; }\n")


class BufferPagesTest(unittest.TestCase):
    """BPFTRACE_PERF_RB_PAGES: before 0.25, 1024 pages per CPU, less on a
    machine of more than 4 CPUs (16 MiB in all, at least bpftrace's 64);
    4096 from 0.25, where it sizes one ring buffer for all CPUs whose own
    default reaches 4096 pages with enough memory."""

    def pages(self, version, base=None):
        module = bpftrace_module()
        runner = module.Bpftrace("bpftrace", version, "v")
        return runner.environ(base=base or {}).get("BPFTRACE_PERF_RB_PAGES")

    def test_by_version(self):
        here = str(bpftrace_module().per_cpu_pages(os.cpu_count()))
        self.assertEqual(self.pages((0, 17, 0)), here)
        self.assertEqual(self.pages((0, 23, 2)), here)
        self.assertEqual(self.pages((0, 24, 0)), here)
        self.assertEqual(self.pages((0, 25, 0)), "4096")
        self.assertEqual(self.pages((0, 27, 0)), "4096")

    def test_per_cpu_by_cpus(self):
        per_cpu_pages = bpftrace_module().per_cpu_pages
        self.assertEqual([per_cpu_pages(cpus) for cpus in
                          (1, 2, 4, 5, 8, 16, 64, 256)],
                         [1024, 1024, 1024, 512, 512, 256, 64, 64])

    def test_advice_names_the_value_in_effect(self):
        module = bpftrace_module()
        self.assertEqual(
            module.buffer_advice({"BPFTRACE_PERF_RB_PAGES": "8"}),
            "set BPFTRACE_PERF_RB_PAGES higher than its 8")
        self.assertEqual(
            module.buffer_advice({}),
            "set BPFTRACE_PERF_RB_PAGES higher than the tools' %d pages "
            "per CPU here (bpftrace before 0.25), or 4096 from 0.25"
            % module.per_cpu_pages(os.cpu_count()))

    def test_set_kept(self):
        self.assertEqual(self.pages((0, 27, 0),
                                    {"BPFTRACE_PERF_RB_PAGES": "64"}), "64")


if __name__ == "__main__":
    unittest.main()
