"""Tier 1: facts about the built interpreter itself."""

import collections
import os
import re
import tempfile
import unittest

from support import (MARKER_PAIR, PYTHON, SERIES, TOP, marker_sites,
                     promised_probe_pairs, run, stapsdt_notes)

FRAME_POINTER_FLAGS = ("-fno-omit-frame-pointer",
                       "-mno-omit-leaf-frame-pointer")


def pinned_release():
    """RELEASE= of the series' pin: this build's own version."""
    with open(os.path.join(TOP, "series", SERIES, "pin")) as f:
        return re.search(r"^RELEASE=(\S+)$", f.read(), re.M).group(1)

# Extension modules a complete standard library has on Debian, with the
# package that provides what they need (tools/deps installs them).
STDLIB_EXTENSIONS = {
    "_bz2": "libbz2-dev", "_ctypes": "libffi-dev", "_curses": "libncurses-dev",
    "_dbm": "libgdbm-compat-dev", "_gdbm": "libgdbm-dev",
    "_hashlib": "libssl-dev", "_lzma": "liblzma-dev",
    "_sqlite3": "libsqlite3-dev", "_ssl": "libssl-dev",
    "_uuid": "uuid-dev", "readline": "libreadline-dev", "zlib": "zlib1g-dev",
}


def stapsdt_probes(binary):
    """{(provider, name): count} from the .note.stapsdt notes of binary."""
    return collections.Counter((provider, name)
                               for provider, name, _ in stapsdt_notes(binary))


def glue_calls(objects):
    """{file: set of files whose functions and data it uses} of the glue's
    object files, by their symbols (nm)."""
    defined, used = {}, {}
    for path in objects:
        name = os.path.basename(path)
        proc = run(["nm", "--defined-only", "-g", path])
        defined[name] = {line.split()[-1] for line in proc.stdout.splitlines()
                         if line.strip()}
        proc = run(["nm", "-u", path])
        used[name] = {line.split()[-1] for line in proc.stdout.splitlines()
                      if line.strip()}
    return {name: {other for other in defined
                   if other != name and used[name] & defined[other]}
            for name in defined}


def find_cycle(calls):
    """A cycle of calls (a list of files, the first one again at its end),
    or None."""
    state = {}
    path = []

    def visit(name):
        state[name] = "open"
        path.append(name)
        for other in sorted(calls[name]):
            if state.get(other) == "open":
                return path[path.index(other):] + [other]
            if other not in state:
                found = visit(other)
                if found:
                    return found
        state[name] = "done"
        path.pop()
        return None

    for name in sorted(calls):
        if name not in state:
            found = visit(name)
            if found:
                return found
    return None


# The version seam (docs/layout.md): the glue, overlay/Python/*.c, reaches
# CPython's internals only through series/SERIES/pydtrace_seam.h, which
# tools/prepare lays into the tree as Include/internal/pydtrace_seam.h.
GLUE = os.path.join(TOP, "overlay", "Python")
SEAM = "pydtrace_seam.h"
# The underscored names of CPython that the glue may use without the seam:
# those of the public headers (Include/cpython/, pyport.h) and
# _PyInterpreterFrame, which the glue only points to (the seam reads its
# fields).  Everything else that begins with _Py is ours (_PyDTrace_) or
# the seam's (_PySeam_).
GLUE_UNDERSCORED = {"_PyInterpreterFrame", "_Py_CODEUNIT",
                    "_PyFrameEvalFunction", "_Py_thread_local"}
GLUE_UNDERSCORED_PREFIXES = ("_PyDTrace_", "_PySeam_", "_Py_atomic_")


def without_comments(text):
    """C source text without its comments."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def internal_includes(text):
    """The pycore_* headers that C source text includes, but
    pycore_dtrace.h, the hooks' interface."""
    headers = re.findall(r'^\s*#\s*include\s*[<"]([^">]+)[">]',
                         without_comments(text), re.M)
    return [h for h in headers if os.path.basename(h).startswith("pycore_")
            and h != "pycore_dtrace.h"]


def underscored_names(text):
    """The names beginning with _Py that C source text uses, outside
    comments and strings, but those the glue may use (GLUE_UNDERSCORED)."""
    code = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', without_comments(text))
    return sorted({name for name in re.findall(r"\b_Py\w+", code)
                   if name not in GLUE_UNDERSCORED
                   and not name.startswith(GLUE_UNDERSCORED_PREFIXES)})


def version_guard(text):
    """The series ("3.13") that C header text stops for every other CPython
    with, before it includes anything: `#if PY_VERSION_HEX < 0x030D0000 ||
    PY_VERSION_HEX >= 0x030E0000` and an #error that names the series; None
    without such a guard."""
    code = without_comments(text)
    match = re.search(r"^#\s*if\s+PY_VERSION_HEX\s*<\s*0x([0-9A-Fa-f]{8})"
                      r"\s*\|\|\s*PY_VERSION_HEX\s*>=\s*0x([0-9A-Fa-f]{8})"
                      r"\s*\n#\s*error\s+\"([^\"\n]*)\"\s*\n#\s*endif",
                      code, re.M)
    include = re.search(r"^\s*#\s*include\b", code, re.M)
    if match is None or (include and include.start() < match.start()):
        return None
    low, high = int(match.group(1), 16), int(match.group(2), 16)
    major, minor = low >> 24, (low >> 16) & 0xFF
    series = "%d.%d" % (major, minor)
    if (low & 0xFFFF or high != (major << 24 | (minor + 1) << 16)
            or not re.search(r"\b%s\b" % re.escape(series),
                             match.group(3))):
        return None
    return series


class BuildFactsTest(unittest.TestCase):

    def test_glue_reaches_internals_through_the_seam(self):
        # A port to another CPython series changes the series' seam and
        # the hooks, not the glue: no glue file includes a pycore_* header
        # of its own (but pycore_dtrace.h) or uses an underscored name of
        # CPython's that the seam does not give.
        names = sorted(name for name in os.listdir(GLUE)
                       if name.endswith(".c"))
        self.assertTrue(names)
        for name in names:
            with open(os.path.join(GLUE, name)) as f:
                text = f.read()
            with self.subTest(name):
                self.assertEqual(internal_includes(text), [],
                                 "overlay/Python/%s reaches CPython's "
                                 "internals without %s" % (name, SEAM))
                self.assertEqual(underscored_names(text), [],
                                 "overlay/Python/%s reaches CPython's "
                                 "internals without %s" % (name, SEAM))
        # The checks themselves find what they look for.
        self.assertEqual(internal_includes(
            '#include "Python.h"\n#include "pycore_dtrace.h"\n'
            '#  include "pycore_frame.h"  // _PyFrame_GetCode()\n'
            '/* #include "pycore_code.h" */\n'), ["pycore_frame.h"])
        self.assertEqual(underscored_names(
            'f->instr_ptr - _PyCode_CODE(_PySeam_FrameCode(f)); '
            '_Py_atomic_load_int(&x); "_PyRuntime" /* _PyRuntime */'),
            ["_PyCode_CODE"])

    def test_seam_serves_its_series_only(self):
        # Each series has its seam, and the seam stops the build of any
        # other CPython before it includes a pycore_* header.
        series = sorted(name for name in os.listdir(os.path.join(TOP,
                                                                 "series"))
                        if os.path.exists(os.path.join(TOP, "series", name,
                                                       "pin")))
        self.assertIn(SERIES, series)
        for name in series:
            path = os.path.join(TOP, "series", name, SEAM)
            with self.subTest(name):
                self.assertTrue(os.path.exists(path),
                                "series/%s has no %s" % (name, SEAM))
                with open(path) as f:
                    self.assertEqual(version_guard(f.read()), name,
                                     "series/%s/%s has no version guard "
                                     "for %s" % (name, SEAM, name))
        # The check itself: a guard for 3.13, one for the wrong range, one
        # after an #include, none.
        guard = ('#if PY_VERSION_HEX < 0x030D0000 || '
                 'PY_VERSION_HEX >= 0x030E0000\n'
                 '#  error "pydtrace_seam.h of series/3.13 serves CPython '
                 '3.13 only"\n#endif\n')
        self.assertEqual(version_guard(guard), "3.13")
        self.assertIsNone(version_guard(guard.replace("0x030E", "0x030F")))
        self.assertIsNone(version_guard('#include "pycore_code.h"\n'
                                        + guard))
        self.assertIsNone(version_guard("/* " + guard + " */"))

    def test_glue_calls_without_a_cycle(self):
        # The files of overlay/Python call each other as a DAG (names at
        # the bottom, probes at the top): each can be read, and ported to
        # a new CPython, from the bottom up.
        glue = sorted(name[:-2] for name in os.listdir(
            os.path.join(TOP, "overlay", "Python")) if name.endswith(".c"))
        objects = [os.path.join(os.path.dirname(PYTHON), "Python",
                                name + ".o") for name in glue]
        missing = [path for path in objects if not os.path.exists(path)]
        self.assertEqual(missing, [], "the glue's objects of the build")
        calls = glue_calls(objects)
        self.assertIsNone(find_cycle(calls), calls)
        # The check itself finds a cycle.
        self.assertEqual(find_cycle({"a.o": {"b.o"}, "b.o": {"c.o"},
                                     "c.o": {"a.o"}}),
                         ["a.o", "b.o", "c.o", "a.o"])

    def test_with_dtrace(self):
        proc = run([PYTHON, "-c", "import sysconfig; "
                    "print(sysconfig.get_config_var('WITH_DTRACE'))"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.strip(), "1")

    def test_probe_set(self):
        found = stapsdt_probes(PYTHON)
        self.assertEqual({p for p, _ in found}, {"python", "otel_memory"},
                         "unexpected USDT providers")
        self.assertEqual(sorted(found), promised_probe_pairs(),
                         "readelf -n %s differs from the probe registry"
                         % PYTHON)

    def test_probes_have_semaphores(self):
        # Semaphore-gated markers cost a load and a branch when no tracer is
        # attached; a probe without one would evaluate its arguments always.
        notes = stapsdt_notes(PYTHON)
        self.assertTrue(notes)
        for provider, name, semaphore in notes:
            self.assertIsNotNone(semaphore, (provider, name))
            self.assertNotEqual(semaphore, 0, (provider, name))

    def assertMarkerPairs(self, binary, providers):
        sites = marker_sites(binary)
        self.assertEqual({provider for provider, *_ in sites}, providers)
        wrong = ["%s:%s at %#x: %s" % (provider, name, address, code.hex(" "))
                 for provider, name, address, code in sites
                 if code != MARKER_PAIR]
        self.assertEqual(wrong, [], "%d of %d markers of %s are not on the "
                         "pair %s" % (len(wrong), len(sites), binary,
                                      MARKER_PAIR.hex(" ")))

    def test_markers_on_the_nop_pair(self):
        # Every marker: a 1-byte nop where its note points, which tools
        # replace with an int3, then the 10-byte nop at which libbpf
        # attaches on a kernel that optimizes it (Linux 7.3 and later).
        self.assertMarkerPairs(PYTHON, {"python", "otel_memory"})

    def test_usdt_module_probe_on_the_nop_pair(self):
        # The probes that the usdt module makes at run time sit on the
        # same pair (the stubs of Modules/_usdt/elf.c).
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "probe.so")
            proc = run([PYTHON, "-c", "import shutil, sys, usdt; "
                        "p = usdt.Probe('pairtest', 'site', (int, str)); "
                        "shutil.copy(p.path, sys.argv[1])", copy])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertMarkerPairs(copy, {"pairtest"})

    def test_identity(self):
        # sys.version, python -VV and platform.python_build() name this
        # project and its version, never a scratch branch or "dirty".
        build = "tags/cpython-usdt-%s:" % pinned_release()
        proc = run([PYTHON, "-c", "import platform, sys; print(sys.version); "
                    "print(platform.python_build()[0])"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        version, python_build = proc.stdout.splitlines()
        self.assertIn("(" + build, version)
        self.assertTrue(python_build.startswith(build), python_build)
        proc = run([PYTHON, "-VV"])
        self.assertIn("(" + build, proc.stdout)
        for text in (version, python_build, proc.stdout):
            self.assertNotIn("dirty", text)

    def test_frame_pointers(self):
        # Built with frame pointers, and so are C extensions built for it
        # (sysconfig's CFLAGS); the interpreter loop keeps its frame
        # pointer, which native unwinders need to walk through it.
        proc = run([PYTHON, "-c", "import sysconfig; "
                    "print(sysconfig.get_config_var('CFLAGS'))"])
        for flag in FRAME_POINTER_FLAGS:
            self.assertIn(flag, proc.stdout.split())
        proc = run(["objdump", "-d", "--no-show-raw-insn",
                    "--disassemble=_PyEval_EvalFrameDefault", PYTHON])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        body = proc.stdout.split("<_PyEval_EvalFrameDefault>:", 1)[1]
        first = [line.split("\t")[-1].split() for line in
                 body.strip().splitlines()[:2]]
        self.assertEqual(first, [["push", "%rbp"], ["mov", "%rsp,%rbp"]])

    def test_no_gcse_for_the_interpreter_only(self):
        # The interpreter's own files are compiled with -fno-gcse, which
        # pays for the frame pointers in the interpreter loop; C extensions
        # built for it (sysconfig's CFLAGS) keep the compiler's default.
        proc = run([PYTHON, "-c", "import sysconfig; "
                    "print(sysconfig.get_config_var('PY_CFLAGS_NODIST')); "
                    "print(sysconfig.get_config_var('CFLAGS'))"])
        nodist, cflags = proc.stdout.splitlines()
        self.assertIn("-fno-gcse", nodist.split())
        self.assertNotIn("-fno-gcse", cflags.split())

    def test_no_tracer_for_the_loop_only(self):
        # Python/ceval.c, and no other file, is compiled with -fno-tracer
        # (configure's default, Misc/cpython-usdt.m4): with PGO,
        # the tracer costs the loop a register.  GCC records each file's
        # options in its compile unit's DW_AT_producer.
        proc = run(["readelf", "--debug-dump=info", "--dwarf-depth=1",
                    PYTHON])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        units = {}
        producer = None
        for line in proc.stdout.splitlines():
            if "DW_TAG_compile_unit" in line:
                producer = None
            elif "DW_AT_producer" in line:
                producer = line.split("): ", 1)[-1].split()
            elif "DW_AT_name" in line and producer is not None:
                units[line.split("): ", 1)[-1].strip()] = producer

        proc = run([PYTHON, "-c", "import sysconfig; "
                    "print(sysconfig.get_config_var('srcdir')); "
                    "print('--enable-optimizations' in "
                    "sysconfig.get_config_var('CONFIG_ARGS'))"])
        srcdir, release = proc.stdout.splitlines()
        release = release == "True"

        def files_with(flag):
            # the units given flag itself or flag=VALUE, as paths in the
            # source tree (Python/ceval.c); an in-tree build (the source
            # release's) names them relative to it already
            return sorted(os.path.relpath(name, srcdir)
                          if os.path.isabs(name) else name
                          for name, options in units.items()
                          if any(option == flag or option.startswith(flag + "=")
                                 for option in options))

        self.assertEqual(files_with("-fno-tracer"), ["Python/ceval.c"])
        self.assertGreater(len(units), 100)
        # The longer limit for copying the dispatch and the priority
        # register allocator are for release (PGO) builds only; -O3
        # builds keep GCC's defaults (tools/configure).
        self.assertEqual(files_with("--param=max-goto-duplication-insns"),
                         ["Python/ceval.c"] if release else [])
        self.assertEqual(files_with("-fira-algorithm"),
                         ["Modules/_sre/sre.c", "Python/ceval.c"]
                         if release else [])

    def test_stdlib_extensions(self):
        for module, package in sorted(STDLIB_EXTENSIONS.items()):
            with self.subTest(module=module):
                proc = run([PYTHON, "-c", "import " + module])
                self.assertEqual(proc.returncode, 0,
                                 "%s (needs %s): %s"
                                 % (module, package, proc.stderr))

    def test_stdlib_module_names(self):
        # The usdt package and its extension are standard library modules
        # of this build, and the patched Python/stdlib_module_names.h is
        # what CPython's generator writes for the built interpreter.
        proc = run([PYTHON, "-c", "import sys; print(sorted({'usdt', "
                    "'_usdt'} & sys.stdlib_module_names))"])
        self.assertEqual(proc.stdout, "['_usdt', 'usdt']\n", proc.stderr)
        proc = run([PYTHON, "-c", "import sysconfig; "
                    "print(sysconfig.get_config_var('srcdir'))"])
        srcdir = proc.stdout.strip()
        generator = os.path.join(srcdir, "Tools", "build",
                                 "generate_stdlib_module_names.py")
        # The generator runs in the build directory (it reads
        # pybuilddir.txt there), so an installed interpreter is skipped.
        builddir = os.path.dirname(PYTHON)
        if not (os.path.exists(generator) and os.path.exists(
                os.path.join(builddir, "pybuilddir.txt"))):
            self.skipTest("%s is not in a build tree with its sources"
                          % PYTHON)
        proc = run([PYTHON, generator], cwd=builddir)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(srcdir, "Python",
                               "stdlib_module_names.h")) as f:
            self.assertEqual(proc.stdout, f.read())


if __name__ == "__main__":
    unittest.main()
