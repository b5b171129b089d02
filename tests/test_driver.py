"""Tier 2: the build driver fails loudly and early on bad input, and its
unpack/apply/configure steps are reproducible.

These tests run the driver scripts in a scratch copy of the repository's
tools/, series/ and overlay/ with BUILD pointing into a temporary
directory; they reuse the verified tarball and pristine tree of the real
build so that no test downloads anything.
"""

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

from support import BUILD, PYTHON, TOP, run

with open(os.path.join(TOP, "series", "3.13", "pin")) as pin:
    PIN = dict(line.split("=", 1) for line in pin.read().splitlines()
               if line and not line.startswith("#"))
TARBALL = os.path.join(BUILD, "dl", PIN["TARBALL"])
PRISTINE = os.path.join(BUILD, "pristine", PIN["SHA256"])
# The 3.13 series' own trees.
SBUILD = os.path.join(BUILD, "3.13")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@unittest.skipUnless(os.path.exists(os.path.join(PRISTINE, ".git",
                                                 "cpython-usdt-verified")),
                     "run `make` first: these tests reuse build/pristine/SHA256")
class DriverTest(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="cpython-usdt-test-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.top = os.path.join(self.tmp, "repo")
        for name in ("tools", "series", "overlay"):
            src = os.path.join(TOP, name)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(self.top, name))
        os.makedirs(os.path.join(self.top, "overlay"), exist_ok=True)
        self.build = os.path.join(self.top, "build")
        os.makedirs(os.path.join(self.build, "dl"))
        self.env = dict(os.environ, BUILD=self.build)
        self.env.pop("UPSTREAM_TARBALL", None)

    def tool(self, name, *args, env=None):
        return run([os.path.join(self.top, "tools", name), *args],
                   env=env or self.env)

    def use_real_upstream(self):
        os.symlink(TARBALL, os.path.join(self.build, "dl", PIN["TARBALL"]))
        os.makedirs(os.path.join(self.build, "pristine"))
        os.symlink(PRISTINE, os.path.join(self.build, "pristine",
                                          PIN["SHA256"]))

    def write_script(self, path, text):
        """An executable shell script at path: a stand-in for a tool."""
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + text)
        os.chmod(path, 0o755)

    def assertFailsWith(self, proc, *fragments):
        self.assertNotEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        for fragment in fragments:
            self.assertIn(fragment, proc.stderr)

    # -- the tarball -------------------------------------------------------

    def corrupt_tarball(self):
        path = os.path.join(self.tmp, PIN["TARBALL"])
        with open(TARBALL, "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        with open(path, "wb") as f:
            f.write(data)
        return path, hashlib.sha256(data).hexdigest()

    def test_corrupt_user_tarball(self):
        path, found = self.corrupt_tarball()
        env = dict(self.env, UPSTREAM_TARBALL=path)
        proc = self.tool("fetch", env=env)
        self.assertFailsWith(proc, "sha256 mismatch for " + path,
                             "expected: " + PIN["SHA256"], "found:    " + found)
        self.assertEqual(os.listdir(os.path.join(self.build, "dl")), [])

    def test_corrupt_cached_tarball_is_not_unpacked(self):
        path, found = self.corrupt_tarball()
        cached = os.path.join(self.build, "dl", PIN["TARBALL"])
        shutil.move(path, cached)
        proc = self.tool("prepare")
        self.assertFailsWith(proc, "sha256 mismatch for " + cached,
                             "found:    " + found, "Refusing to unpack")
        self.assertFalse(os.path.exists(os.path.join(self.build, "pristine")))

    def test_genuine_user_tarball(self):
        env = dict(self.env, UPSTREAM_TARBALL=TARBALL)
        proc = self.tool("fetch", env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(
            sha256(os.path.join(self.build, "dl", PIN["TARBALL"])),
            PIN["SHA256"])

    # -- patches and overlay ----------------------------------------------

    def write(self, relpath, text):
        path = os.path.join(self.top, relpath)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def test_patch_that_does_not_apply(self):
        self.use_real_upstream()
        self.write("series/3.13/patches/0999-bad.patch", BAD_PATCH)
        with open(os.path.join(self.top, "series/3.13/patches/series"), "a") as f:
            f.write("0999-bad.patch\n")
        proc = self.tool("prepare")
        self.assertFailsWith(proc, "patch 0999-bad.patch does not apply")
        self.assertFalse(os.path.exists(os.path.join(self.build, "3.13", "src")))

    def test_series_names_missing_patch(self):
        self.use_real_upstream()
        with open(os.path.join(self.top, "series/3.13/patches/series"), "a") as f:
            f.write("0998-missing.patch\n")
        proc = self.tool("prepare")
        self.assertFailsWith(proc, "names missing 0998-missing.patch")

    def test_overlay_clobbers_unlisted_upstream_file(self):
        self.use_real_upstream()
        self.write("overlay/Python/ceval.c", "/* not upstream's */\n")
        proc = self.tool("prepare")
        self.assertFailsWith(proc, "overlay/Python/ceval.c would clobber "
                             "upstream Python/ceval.c")

    def test_overlay_replaces_changed_upstream_file(self):
        self.use_real_upstream()
        self.write("overlay/Python/ceval.c", "/* ours */\n")
        with open(os.path.join(self.top, "series/3.13/overlay-replaces"),
                  "a") as f:
            f.write("%s  Python/ceval.c\n" % ("0" * 64))
        proc = self.tool("prepare")
        self.assertFailsWith(proc, "overlay/Python/ceval.c replaces "
                             "Python/ceval.c, whose sha256 is",
                             "upstream changed")

    def test_series_without_its_seam(self):
        # The glue reaches CPython's internals only through the series'
        # seam (docs/layout.md): a series without one stops prepare.
        self.use_real_upstream()
        os.remove(os.path.join(self.top, "series/3.13/pydtrace_seam.h"))
        proc = self.tool("prepare")
        self.assertFailsWith(proc, "series/3.13/pydtrace_seam.h does not "
                             "exist")

    def test_overlay_has_the_seam(self):
        # The seam is the series' own: overlay/, shared by every series,
        # must not have it.
        self.use_real_upstream()
        self.write("overlay/Include/internal/pydtrace_seam.h", "/* */\n")
        proc = self.tool("prepare")
        self.assertFailsWith(proc, "Include/internal/pydtrace_seam.h is in "
                             "the tree already")

    # -- tools --------------------------------------------------------------

    def path_without(self, *missing):
        """A PATH of symlinks to every command except the missing ones."""
        bindir = os.path.join(self.tmp, "bin")
        os.makedirs(bindir)
        for d in os.environ["PATH"].split(os.pathsep):
            if not os.path.isdir(d):
                continue
            for name in os.listdir(d):
                link = os.path.join(bindir, name)
                if name in missing or os.path.lexists(link):
                    continue
                os.symlink(os.path.join(d, name), link)
        return dict(self.env, PATH=bindir)

    def test_missing_dtrace(self):
        env = self.path_without("dtrace")
        proc = self.tool("configure", os.path.join(self.tmp, "obj"),
                         os.path.join(SBUILD, "src"), env=env)
        self.assertFailsWith(proc, "dtrace not found; install it with: "
                             "apt-get install systemtap-sdt-dev")

    def test_missing_compiler(self):
        env = self.path_without("gcc")
        proc = self.tool("configure", os.path.join(self.tmp, "obj"),
                         os.path.join(SBUILD, "src"), env=env)
        self.assertFailsWith(proc, "gcc not found; install it with: "
                             "apt-get install gcc")

    def test_missing_autoconf(self):
        env = self.path_without("autoconf")
        proc = self.tool("regen", self.tmp, env=env)
        self.assertFailsWith(proc, "autoconf not found; install it with: "
                             "apt-get install autoconf")

    # -- reproducibility ----------------------------------------------------

    def test_prepare_is_reproducible(self):
        # The real build was prepared from the same inputs: a fresh prepare
        # must give the very same tree, and a second one must too.  The
        # real tree's own commit, not its prepare stamp: `make` lays an
        # edited toolkit into it (tools/sync-toolkit) without a prepare.
        self.use_real_upstream()
        stamp = os.path.join(self.build, "3.13", "stamps", "prepare")
        expected = run(["git", "-C", os.path.join(SBUILD, "src"),
                        "rev-parse", "HEAD^{tree}"]).stdout
        for attempt in (1, 2):
            proc = self.tool("prepare")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(stamp) as f:
                self.assertEqual(f.read(), expected, "prepare #%d" % attempt)
        status = run(["git", "-C", os.path.join(self.build, "3.13", "src"),
                      "status", "--porcelain"])
        self.assertEqual(status.stdout, "")

    def test_configure_is_reproducible(self):
        # Against build/obj, the default build's tree, which a clone that
        # only ran `make release` (make check-release) does not have.
        if not os.path.exists(os.path.join(SBUILD, "obj", "pyconfig.h")):
            self.skipTest("build/obj is not configured (run `make`): this "
                          "test compares a scratch configure with it")
        obj = os.path.join(self.tmp, "obj")
        # The Makefile configures with $(CURDIR)/build/src, a path without
        # symbolic links (build/ itself may be one).
        src = os.path.realpath(os.path.join(SBUILD, "src"))
        proc = self.tool("configure", obj, src)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        real = os.path.realpath(os.path.join(SBUILD, "obj"))
        for name in ("pyconfig.h", "Makefile"):
            with open(os.path.join(obj, name)) as f:
                ours = f.read().replace(obj, "@OBJ@")
            with open(os.path.join(real, name)) as f:
                theirs = f.read().replace(real, "@OBJ@")
            self.assertEqual(ours, theirs, name)

        # The same flags and prefix again: configure does not rerun (the
        # Makefile stays as it is), so that a scratch install of one tree
        # does not reconfigure the others.
        makefile = os.path.join(obj, "Makefile")
        before = os.stat(makefile).st_mtime_ns
        proc = self.tool("configure", obj, src)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("configured with these flags and prefix already",
                      proc.stderr)
        self.assertEqual(os.stat(makefile).st_mtime_ns, before)
        # Another prefix makes it rerun (a third configure, 100 s): make
        # check's tier 7 (tools/check-install) does that, for it installs
        # this tree into a new scratch prefix, which fails unless configure
        # reran for it.

    def test_deb_refuses_a_tree_for_another_prefix(self):
        # The prefix is compiled in: a package of a tree configured for
        # another one would install an interpreter that looks elsewhere.
        obj = os.path.join(self.tmp, "obj")
        os.makedirs(obj)
        with open(os.path.join(obj, "Makefile"), "w") as f:
            f.write("prefix=\t\t/tmp/elsewhere\n")
        self.write_script(os.path.join(obj, "python"), "")
        proc = self.tool("deb", obj, os.path.join(self.tmp, "out"))
        self.assertFailsWith(proc, "is configured for --prefix=/tmp/elsewhere, "
                             "not /opt/cpython-usdt")
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out")))

    def test_check_deb_without_a_package(self):
        proc = self.tool("check-deb", os.path.join(self.tmp))
        self.assertFailsWith(proc, "run tools/deb first")

    def test_bad_variant_values(self):
        obj = os.path.join(self.tmp, "obj")
        for name in ("SHARED", "OPTIMIZE", "DTRACE", "VARIANT",
                     "FRAME_POINTERS", "LOOP_FLAGS"):
            env = dict(self.env, **{name: "maybe"})
            proc = self.tool("configure", obj, os.path.join(SBUILD, "src"),
                             env=env)
            self.assertFailsWith(proc, "%s must be " % name,
                                 "not 'maybe'")
            self.assertFalse(os.path.exists(obj), name)

    def stand_in_source(self, configure):
        """A source tree whose configure script is *configure*."""
        src = os.path.join(self.tmp, "src")
        os.makedirs(src)
        self.write_script(os.path.join(src, "configure"), configure)
        return src

    def configured(self, src, variables):
        """tools/configure of src into a new tree with *variables* set: the
        tree, and the lines of its usdt-configure-flags."""
        obj = os.path.join(self.tmp, "obj")
        proc = self.tool("configure", obj, src,
                         env=dict(self.env, **variables))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(obj, "usdt-configure-flags")) as f:
            return obj, f.read().splitlines()

    def test_loop_flags_per_optimization(self):
        # The Modules/Setup.local lines: for Python/ceval.o, -fno-tracer in
        # every build with the loop flags, and the longer dispatch-copy
        # limit and the priority register allocator only in release (PGO)
        # builds, which give the allocator to Modules/_sre/sre.o too; none
        # without the loop flags.
        # A source tree whose configure only succeeds stands in for
        # CPython's, so the line is what tools/configure itself writes.
        src = self.stand_in_source("exit 0\n")
        loop = "Python/ceval.o: PY_CORE_CFLAGS += -fno-tracer"
        cases = [
            ({"OPTIMIZE": "dev"}, [loop]),
            ({"OPTIMIZE": "release"},
             [loop + " --param max-goto-duplication-insns=30"
              " -fira-algorithm=priority",
              "Modules/_sre/sre.o: PY_BUILTIN_MODULE_CFLAGS +="
              " -fira-algorithm=priority"]),
            ({"OPTIMIZE": "release", "LOOP_FLAGS": "no",
              "FRAME_POINTERS": "no"}, []),
        ]
        for variables, lines in cases:
            with self.subTest(**variables):
                obj, recorded = self.configured(src, variables)
                with open(os.path.join(obj, "Modules", "Setup.local")) as f:
                    setup = f.read().splitlines()
                self.assertEqual(setup[1:], ["*noconfig*"] + lines)
                self.assertEqual([line for line in recorded
                                  if line.startswith("Setup.local: ")],
                                 ["Setup.local: " + line for line in lines])
                shutil.rmtree(obj)

    def test_our_tree_uses_its_defaults(self):
        # A tree whose configure knows --with-usdt-defaults (ours, patch
        # 0104) applies the flags itself: none on the command line and no
        # Setup.local lines; --without-usdt-defaults when either set is
        # off, and the other given as for a pristine tree.
        src = self.stand_in_source("# --with-usdt-defaults\nexit 0\n")
        fp = "CFLAGS=-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer"
        cases = [
            ({}, []),
            ({"OPTIMIZE": "release"}, []),
            ({"LOOP_FLAGS": "no"}, [fp, "--without-usdt-defaults"]),
            ({"LOOP_FLAGS": "no", "FRAME_POINTERS": "no"},
             ["--without-usdt-defaults"]),
        ]
        for variables, extra in cases:
            with self.subTest(**variables):
                obj, recorded = self.configured(src, variables)
                self.assertEqual([line for line in recorded
                                  if line.startswith(("CFLAGS", "Setup",
                                                      "--without-usdt"))],
                                 extra)
                shutil.rmtree(obj)


    def test_loop_flags_are_the_series(self):
        # Our tree's configure reads the loop flags from the tree
        # (Misc/cpython-usdt-loop-flags, the series' file): they are
        # recorded, and a change of them starts the tree afresh, as a
        # change of the flags on the command line does.
        src = self.stand_in_source("# --with-usdt-defaults\n"
                                   "touch Makefile config.status\n")
        os.makedirs(os.path.join(src, "Misc"))
        flags = os.path.join(src, "Misc", "cpython-usdt-loop-flags")
        with open(os.path.join(TOP, "series", "3.13", "loop-flags")) as f:
            series = f.read()
        with open(flags, "w") as f:
            f.write(series)
        obj, recorded = self.configured(src, {})
        self.assertEqual([line for line in recorded
                          if line.startswith("loop-flags: ")],
                         ["loop-flags: " + line
                          for line in series.splitlines()
                          if re.match(r"[A-Z_]+=", line)])
        self.assertIn("loop-flags: CEVAL=-fno-tracer", recorded)
        with open(flags, "w") as f:
            f.write(series.replace("CEVAL=-fno-tracer", "CEVAL="))
        proc = self.tool("configure", obj, src, env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("configure flags changed: emptying", proc.stderr)
        with open(os.path.join(obj, "usdt-configure-flags")) as f:
            self.assertIn("loop-flags: CEVAL=\n", f.read())


class MakefileOrderTest(unittest.TestCase):
    """On a fresh machine every target that configures a tree installs the
    Debian packages (tools/deps) before it regenerates (tools/prepare runs
    autoconf) or configures, the pristine benchmark trees included."""

    TARGETS = ("build", "release", "shared", "check-freethreading",
               "{b}/3.13/pristine-obj/python", "{b}/3.13/bench-upstream/python",
               "{b}/3.13/release-pristine-fp2/python",
               "{b}/3.13/release-pristine-nofp2/python",
               "bench-framepointers-release-wall")

    def test_deps_come_first(self):
        with tempfile.TemporaryDirectory() as tmp:
            build = os.path.join(tmp, "build")
            for target in self.TARGETS:
                target = target.format(b=build)
                with self.subTest(target=target):
                    # -n still runs the recursive $(MAKE) -C TREE lines,
                    # which fail for want of the tree: only the order of
                    # the printed steps before them counts.
                    proc = run(["make", "-n", "-C", TOP, "B=" + build,
                                target])
                    # one list, so that the indices below compare
                    lines = [line.strip() for line in
                             proc.stdout.splitlines() if line.strip()]
                    steps = [line.split()[0] for line in lines]
                    self.assertIn("tools/prepare", steps)
                    deps = steps.index("tools/deps")
                    self.assertLess(deps, steps.index("tools/prepare"))
                    configure = [i for i, line in enumerate(lines)
                                 if "tools/configure " in line]
                    self.assertTrue(configure, proc.stdout)
                    self.assertLess(deps, configure[0])


class MakefileSeriesTest(unittest.TestCase):
    """A series without a directory fails with one line that names the
    series there are."""

    def test_unknown_series(self):
        proc = run(["make", "-n", "-C", TOP, "SERIES=3.99"])
        self.assertNotEqual(proc.returncode, 0)
        errors = [line for line in proc.stderr.splitlines()
                  if "***" in line]
        self.assertEqual(len(errors), 1, proc.stderr)
        self.assertIn("no series '3.99': series/3.99/pin does not exist "
                      "(the series are: 3.13)", errors[0])


class MakefilePreviewTest(unittest.TestCase):
    """`make -n TARGET` shows a reconfigure only when there would be one:
    the prefix stamp is out of date only when PREFIX changed."""

    def test_no_reconfigure_when_up_to_date(self):
        with tempfile.TemporaryDirectory() as tmp:
            build = os.path.join(tmp, "build")
            # A tree whose every stamp is newer than its inputs, in the
            # order make and tools/prepare write them (the prepare stamp
            # last, after configure and the series' loop flags, which it
            # rewrites only when their content changes), configured for
            # the default prefix.
            chain = [os.path.join("dl", PIN["TARBALL"]),
                     os.path.join("3.13", "src", "configure"),
                     os.path.join("3.13", "src", "Misc",
                                  "cpython-usdt-loop-flags"),
                     os.path.join("3.13", "stamps", "prepare"),
                     os.path.join("3.13", "stamps", "prefix"),
                     os.path.join("3.13", "obj", "usdt-configure-flags")]
            now = time.time_ns()
            for k, name in enumerate(chain):
                path = os.path.join(build, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    if name.endswith("prefix"):
                        f.write("/opt/cpython-usdt\n")
                os.utime(path, ns=(now + k * 1000, now + k * 1000))

            def preview(*args):
                proc = run(["make", "-n", "-C", TOP, "B=" + build,
                            "configure", *args])
                self.assertEqual(proc.returncode, 0, proc.stderr)
                return proc.stdout

            out = preview()
            self.assertNotIn("tools/configure", out)
            self.assertNotIn("stamps/prefix", out)
            out = preview("PREFIX=/opt/cpython-usdt")
            self.assertNotIn("tools/configure", out)
            # Another prefix: the stamp is rewritten and the tree
            # reconfigured, in that order.
            out = preview("PREFIX=/opt/elsewhere")
            lines = out.splitlines()
            stamp = [i for i, line in enumerate(lines)
                     if "/opt/elsewhere" in line and "stamps/prefix" in line]
            configure = [i for i, line in enumerate(lines)
                         if "tools/configure" in line
                         and "PREFIX=/opt/elsewhere" in line]
            self.assertTrue(stamp and configure, out)
            self.assertLess(stamp[0], configure[0])
            # No stamp yet: it is written.
            os.unlink(os.path.join(build, "3.13", "stamps", "prefix"))
            self.assertIn("tools/configure", preview())


class MakefileToolkitTest(unittest.TestCase):
    """An edit of the toolkit, overlay/Lib/usdt, needs no prepare: make
    lays it into build/SERIES/src with tools/sync-toolkit alone; another
    file of overlay/ still prepares."""

    def preview(self, *args):
        with tempfile.TemporaryDirectory() as tmp:
            build = os.path.join(tmp, "build")
            # Every stamp newer than its inputs, in the order make writes
            # them.
            chain = [os.path.join("dl", PIN["TARBALL"]),
                     os.path.join("3.13", "stamps", "prepare"),
                     os.path.join("3.13", "stamps", "toolkit")]
            now = time.time_ns()
            for k, name in enumerate(chain):
                path = os.path.join(build, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "w").close()
                os.utime(path, ns=(now + k * 1000, now + k * 1000))
            proc = run(["make", "-n", "-C", TOP, "B=" + build, *args,
                        "toolkit"])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            return [line.split()[0] for line in proc.stdout.splitlines()
                    if line.strip()]

    def test_up_to_date(self):
        steps = self.preview()
        self.assertNotIn("tools/sync-toolkit", steps)
        self.assertNotIn("tools/prepare", steps)

    def test_toolkit_edited(self):
        for name in ("tools.py", os.path.join("scripts", "call_stack.bt")):
            with self.subTest(name=name):
                steps = self.preview("-W", os.path.join(
                    "overlay", "Lib", "usdt", name))
                self.assertIn("tools/sync-toolkit", steps)
                self.assertNotIn("tools/prepare", steps)

    def test_other_overlay_file_edited(self):
        steps = self.preview("-W", os.path.join("overlay", "Modules",
                                                "_usdt", "module.c"))
        self.assertIn("tools/prepare", steps)
        self.assertLess(steps.index("tools/prepare"),
                        steps.index("tools/sync-toolkit"))


ATTACH_ERROR = ("ERROR: Error attaching probe: usdt:stand-in: "
                "Operation not permitted")


class RequireTracerTest(unittest.TestCase):
    """With a bpftrace that cannot attach (a stand-in on PATH that prints an
    attach error and exits 1), the tracer-dependent tests skip with its
    error; under CI (or REQUIRE_TRACER) they fail with it instead."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="require-tracer-")
        self.addCleanup(shutil.rmtree, self.tmp)
        bindir = os.path.join(self.tmp, "bin")
        os.mkdir(bindir)
        with open(os.path.join(bindir, "bpftrace"), "w") as f:
            f.write("#!/bin/sh\necho '%s' >&2\nexit 1\n" % ATTACH_ERROR)
        os.chmod(os.path.join(bindir, "bpftrace"), 0o755)
        self.env = dict(os.environ, PATH=bindir + ":" + os.environ["PATH"],
                        BUILD=os.path.join(self.tmp, "build"))
        for var in ("CI", "REQUIRE_TRACER"):
            self.env.pop(var, None)

    def settings(self):
        """(name, extra environment, whether skipping fails) of each
        setting of the mode."""
        return [("unset", {}, False), ("CI=true", {"CI": "true"}, True),
                ("CI empty", {"CI": ""}, False),
                ("REQUIRE_TRACER=1", {"REQUIRE_TRACER": "1"}, True),
                ("REQUIRE_TRACER=0", {"REQUIRE_TRACER": "0"}, False)]

    def test_tracer_tests(self):
        # test_bpftrace_smoke: two tests, each needing bpftrace.
        for name, extra, required in self.settings():
            with self.subTest(name):
                proc = run([PYTHON, "-m", "unittest", "-v",
                            "test_bpftrace_smoke"],
                           cwd=os.path.join(TOP, "tests"),
                           env=dict(self.env, **extra), timeout=300)
                out = proc.stdout + proc.stderr
                self.assertIn("Ran 2 tests", out)
                if required:
                    self.assertNotEqual(proc.returncode, 0, out)
                    self.assertIn("FAILED (failures=2)", out)
                    self.assertEqual(out.count("AssertionError: bpftrace "
                                               "cannot trace here"), 2, out)
                else:
                    self.assertEqual(proc.returncode, 0, out)
                    self.assertIn("OK (skipped=2)", out)
                # Each says why, in the tracer's words.
                self.assertEqual(out.count(ATTACH_ERROR), 2, out)

    def test_shell_checks(self):
        # The installed interpreter's probe check (tools/check-install,
        # tools/check-deb) and the armed regrtest (tools/regrtest armed).
        commands = {
            "probe check": ["bash", "-c", ". tools/lib.sh; "
                            ". tools/installed-checks.sh; "
                            "expect_100_calls 'the stand-in' %s true"
                            % PYTHON],
            "armed regrtest": ["tools/regrtest", os.path.dirname(PYTHON),
                               "armed", "test_bool"],
        }
        for what, command in commands.items():
            for name, extra, required in self.settings():
                with self.subTest(what=what, setting=name):
                    proc = run(command, cwd=TOP, timeout=300,
                               env=dict(self.env, **extra))
                    self.assertIn(ATTACH_ERROR, proc.stderr)
                    if required:
                        self.assertNotEqual(proc.returncode, 0, proc.stderr)
                        self.assertIn("error:", proc.stderr)
                        self.assertNotIn("SKIPPED", proc.stderr)
                    else:
                        self.assertEqual(proc.returncode, 0, proc.stderr)
                        self.assertIn("SKIPPED", proc.stderr)


# Stand-ins for the tier scripts of tools/check-all: each prints what the
# real one would about its tests (unittest's and regrtest's summaries, the
# shell tiers' log lines), and fails when STANDIN_FAIL names its tier.
STANDINS = {
    "check": """
fail() { [ "${STANDIN_FAIL:-}" != "$1" ] || status=1; }
status=0
printf '\\n=== tier 1: build facts\\n' >&2
echo 'Ran 5 tests in 0.1s'; echo 'OK (skipped=1)'; fail 1
printf '\\n=== tier 2: tests/\\n' >&2
echo 'Ran 10 tests in 1.0s'; echo 'OK (skipped=3)'
echo 'Ran 4 tests in 1.0s'
if [ "${STANDIN_FAIL:-}" = 2 ]; then
    echo 'FAILED (failures=1, errors=2, skipped=1)'; status=1
else
    echo 'OK (skipped=1)'
fi
printf '\\n=== tier 3: test_dtrace and bpftrace\\n' >&2
echo 'Ran 2 tests in 0.1s'; echo 'OK'
echo 'Ran 12 tests in 8.4s'; echo 'OK (skipped=4, expected failures=1)'
fail 3
exit $status
""",
    "regrtest": """
if [ "$2" = subset ]; then
    echo 'Total tests: run=1,234 failures=2 skipped=45'; n=4
else
    # Two armed groups, each armed then unarmed: the armed runs count.
    echo 'regrtest: regrtest (armed-subset): test_a' >&2
    echo 'Total tests: run=500 skipped=7'
    echo 'regrtest: regrtest (unarmed-subset): test_a' >&2
    echo 'Total tests: run=501 skipped=8'
    echo 'regrtest: regrtest (armed-subset-without-line): test_b' >&2
    echo 'Total tests: run=15 failures=1 skipped=1'
    echo 'regrtest: regrtest (unarmed-subset-without-line): test_b' >&2
    echo 'Total tests: run=15 failures=1 skipped=1'; n=5
fi
[ -z "${STANDIN_HANG:-}" ] || [ $n != 4 ] || { echo 'hangs' >&2; sleep 600; }
[ "${STANDIN_FAIL:-}" != $n ]
""",
    "deb": "echo 'deb: built' >&2\n",
    "check-deb": """
echo 'check-deb: control fields' >&2
echo 'check-deb: SKIPPED installing x.deb: dpkg needs root' >&2
[ "${STANDIN_FAIL:-}" != 6 ]
""",
    "check-dist": """
echo 'check-dist: ./configure --with-dtrace' >&2
echo 'check-dist: make' >&2
[ "${STANDIN_FAIL:-}" != 9 ]
""",
    "check-dtrace": """
echo 'Ran 19 tests in 300.0s'
if [ -n "${STANDIN_DTRACE_SKIP:-}" ]; then
    echo "setUpModule (test_dtrace_scripts) ... skipped" \
        "'tools/dtrace cannot run DTrace: needs root'"
    echo 'OK (skipped=1)'
else
    echo 'OK (skipped=2)'
fi
[ "${STANDIN_FAIL:-}" != 10 ]
""",
    "check-bpftrace-versions": """
# make check runs the versions of Debian 13 and forky, not this machine's.
[ "$BPFTRACE_SUITES" = "trixie forky" ] && [ "$BPFTRACE_PARALLEL" = 1 ] || exit 3
echo 'Ran 40 tests in 90.0s'; echo 'OK (skipped=1)'
echo 'Ran 12 tests in 60.0s'; echo 'OK'
[ "${STANDIN_FAIL:-}" != 11 ]
""",
    "check-install": """
n=7; [ "${1:-}" != --shared ] || n=8
echo 'check-install: make install' >&2
echo 'check-install: venv with pip' >&2
echo 'check-install: SKIPPED a probe: bpftrace not found' >&2
[ -z "${STANDIN_LEAK:-}" ] || [ $n != 7 ] || mkdir "$STANDIN_LEAK"
if [ "${STANDIN_FAIL:-}" = $n ]; then
    echo 'check-install: error: it broke' >&2; exit 1
fi
""",
    "check-docs": """
if [ -n "${STANDIN_DOCS_SKIP:-}" ]; then
    echo 'check-docs: SKIPPED the documentation build: not root' >&2
    exit 0
fi
echo 'check-docs: Sphinx 9.1.0 with docutils 0.23' >&2
if [ "${STANDIN_FAIL:-}" = 12 ]; then
    echo '/x/Doc/howto/usdt-tools.rst:3: WARNING: undefined label: x'
    echo 'check-docs.py: howto/instrumentation.rst: 0 warnings' >&2
    echo 'check-docs.py: howto/usdt-tools.rst: 1 warnings' >&2
    echo 'check-docs: error: Sphinx warns about our pages (above)' >&2
    exit 1
fi
echo 'check-docs.py: howto/instrumentation.rst: 0 warnings' >&2
echo 'check-docs.py: howto/usdt-tools.rst: 0 warnings' >&2
""",
}


class CheckAllTest(unittest.TestCase):
    """tools/check-all, make check's driver, with stand-ins for the tier
    scripts: it prints one line per tier with what ran, failed and skipped,
    also when a tier fails, and fails if the run left a probe directory or
    a perf map behind."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="check-all-")
        self.addCleanup(shutil.rmtree, self.tmp)
        top = os.path.join(self.tmp, "repo")
        tools = os.path.join(top, "tools")
        os.makedirs(tools)
        for name in ("lib.sh", "check-all", "tiers"):
            shutil.copy2(os.path.join(TOP, "tools", name), tools)
        # lib.sh's default series, for a run without make's SERIES.
        os.mkdir(os.path.join(top, "series"))
        shutil.copy2(os.path.join(TOP, "series", "DEFAULT"),
                     os.path.join(top, "series"))
        for name, text in STANDINS.items():
            path = os.path.join(tools, name)
            with open(path, "w") as f:
                f.write("#!/bin/bash\n" + text)
            os.chmod(path, 0o755)
        with open(os.path.join(top, "Makefile"), "w") as f:
            f.write("check-shared:\n\ttools/check-install --shared\n"
                    "check-dist:\n\ttools/check-dist\n")
        self.systmp = os.path.join(self.tmp, "systmp")
        os.mkdir(self.systmp)
        self.env = dict(os.environ, CHECK_ALL_SYSTEM_TMP=self.systmp)
        self.env.pop("TMPDIR", None)
        self.command = [os.path.join(tools, "check-all"), "obj", "deb"]
        self.top = top

    def check_all(self, **env):
        """The run, and its summary's lines with each tier's duration
        ("in 0 min 01 s (budget 15 min)") taken out, where it must be."""
        proc = run(self.command, cwd=self.top, env=dict(self.env, **env),
                   timeout=120)
        summary = proc.stderr.rpartition("=== make check: summary\n")[2]
        lines = []
        for line in summary.splitlines():
            if re.match(r"tier \d+ \(.*\): (passed|FAILED)", line):
                line, n = re.subn(r" in \d+ min \d\d s \(budget \d+ min"
                                  r"(, OVER its budget)?\):", ":", line)
                self.assertEqual(n, 1, line)
            if line.startswith("all tiers: "):
                self.assertRegex(line, r"^all tiers: \d+ min \d\d s "
                                 r"\(budget 60 min\)$")
                continue
            lines.append(line)
        return proc, lines

    def test_summary(self):
        proc, lines = self.check_all()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(lines, [
            "tier 1 (build facts): passed: 5 tests run, 0 failed, "
            "1 skipped",
            "tier 2 (tests/): passed: 14 tests run, 0 failed, 4 skipped",
            "tier 3 (test_dtrace and bpftrace): passed: 14 tests run, "
            "0 failed, 4 skipped",
            "tier 4 (regrtest subset): passed: 1234 tests run, 2 failed, "
            "45 skipped; failures compared with "
            "series/3.13/regrtest-known-failures",
            "tier 5 (regrtest subset, armed): passed: 515 tests run, "
            "1 failed, 8 skipped; failures compared with "
            "series/3.13/regrtest-known-failures",
            "tier 6 (.deb installed and removed): passed: 3 steps run, "
            "0 failed, 1 skipped",
            "tier 7 (make install): passed: 3 steps run, 0 failed, "
            "1 skipped",
            "tier 8 (make install-shared): passed: 3 steps run, 0 failed, "
            "1 skipped",
            "tier 9 (source release): passed: 2 steps run, 0 failed, "
            "0 skipped",
            "tier 10 (D scripts under DTrace): passed: 19 tests run, "
            "0 failed, 2 skipped",
            "tier 11 (toolkit on bpftrace 0.23 and 0.27): passed: 52 tests "
            "run, 0 failed, 1 skipped",
            "tier 12 (our pages under Sphinx): passed: 2 pages run, "
            "0 failed, 0 skipped",
            "left behind in %s: nothing new (python-usdt-*, perf-PID.map)"
            % self.systmp])

    def test_dtrace_skipped(self):
        # Tier 10 skipped as a whole says why.
        proc, lines = self.check_all(STANDIN_DTRACE_SKIP="1")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(lines[9], "tier 10 (D scripts under DTrace): "
                         "passed: 19 tests run, 0 failed, 1 skipped; "
                         "skipped: tools/dtrace cannot run DTrace: needs "
                         "root")

    def test_docs_skipped(self):
        # Tier 12 skipped says why.
        proc, lines = self.check_all(STANDIN_DOCS_SKIP="1")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(lines[11], "tier 12 (our pages under Sphinx): "
                         "passed: 0 pages run, 0 failed, 1 skipped; "
                         "skipped: not root")

    def test_summary_after_a_failure(self):
        # The tiers run so far, and those that did not run.
        for tier in (2, 4, 7, 10, 11, 12):
            with self.subTest(tier=tier):
                proc, lines = self.check_all(STANDIN_FAIL=str(tier))
                self.assertNotEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(len(lines), 13, proc.stderr)
                for n, line in enumerate(lines[:12], 1):
                    self.assertTrue(line.startswith("tier %d (" % n), line)
                    if n == tier:
                        self.assertIn("): FAILED: ", line)
                        if tier == 2:
                            self.assertIn(": 14 tests run, 3 failed, "
                                          "4 skipped", line)
                        if tier == 12:
                            self.assertIn(": 2 pages run, 1 failed, "
                                          "0 skipped", line)
                    elif n > max(tier, 3):
                        self.assertTrue(line.endswith("): not run"), line)
                    else:
                        self.assertNotIn("not run", line)

    def test_hung_tier_stopped(self):
        # Under CI, a tier that runs twice its budget (tier 4: 4 "min",
        # here 4 s) is stopped, with its children, and fails, saying so;
        # outside CI it is not (a terminal's Ctrl-C must reach it).
        started = time.monotonic()
        proc, lines = self.check_all(STANDIN_HANG="1", CI="true",
                                     CHECK_ALL_MINUTE="1")
        self.assertLess(time.monotonic() - started, 60, proc.stderr)
        self.assertNotEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("tier 4 stopped: still running after 4 min, "
                      "twice its budget", proc.stderr)
        self.assertEqual(lines[3], "tier 4 (regrtest subset): FAILED: "
                         "1234 tests run, 2 failed, 45 skipped; stopped "
                         "after 4 min")
        self.assertTrue(lines[4].endswith("): not run"), lines[4])
        self.assertNotIn("sleep 600", run(["ps", "-eo", "args"]).stdout)

    def test_left_behind(self):
        # A python-usdt-* directory or a perf map that was not there before,
        # whose process still runs (this one), fails the run and is named;
        # one that was there is not.
        old = os.path.join(self.systmp, "perf-1.map")
        open(old, "w").close()
        with open("/proc/self/stat") as f:
            start = f.read().rpartition(") ")[2].split()[19]
        for name in ("python-usdt-%d-%s-3-abcdef" % (os.getpid(), start),
                     "perf-%d.map" % os.getpid()):
            with self.subTest(name):
                leak = os.path.join(self.systmp, name)
                proc, lines = self.check_all(STANDIN_LEAK=leak)
                os.rmdir(leak)
                self.assertNotEqual(proc.returncode, 0, proc.stderr)
                self.assertIn("left behind in %s: 1 new python-usdt-* or "
                              "perf-PID.map:" % self.systmp, lines)
                self.assertIn("  " + leak, lines)
                self.assertNotIn(old, proc.stderr)

    def test_swept_when_owner_dead(self):
        # A perf map or python-usdt-* directory whose process is dead (a
        # test's child that a timeout killed) is removed and named, and
        # fails nothing; one of a live process still fails the run.
        dead = subprocess.Popen(["true"])
        dead.wait()
        with open("/proc/self/stat") as f:
            start = f.read().rpartition(") ")[2].split()[19]
        for name, live in (("perf-%d.map" % dead.pid, False),
                           ("python-usdt-%d-%s-1-abcdef" % (dead.pid, start),
                            False),
                           ("python-usdt-%d-%s-1-abcdef" % (os.getpid(),
                                                            start), True)):
            with self.subTest(name):
                leak = os.path.join(self.systmp, name)
                proc, lines = self.check_all(STANDIN_LEAK=leak)
                if live:
                    os.rmdir(leak)
                    self.assertNotEqual(proc.returncode, 0, proc.stderr)
                    self.assertIn("  " + leak, lines)
                    continue
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertFalse(os.path.exists(leak))
                self.assertIn("swept from %s: 1 left by processes now dead "
                              "(a killed test's, say), removed:"
                              % self.systmp, lines)
                self.assertIn("  " + leak, lines)


def read_tiers():
    """tools/tiers, the table of make check's tiers: a dict per tier line
    (number, name, budget, counter, command), and the total budget."""
    tiers, total = [], None
    with open(os.path.join(TOP, "tools", "tiers")) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            number, name, budget, counter, command = line.split("\t")
            if number == "total":
                total = int(budget)
                continue
            tiers.append(dict(number=int(number), name=name,
                              budget=int(budget), counter=counter,
                              command=command))
    return tiers, total


def spans(numbers):
    """[6, 7, 8, 9, 12] as the README says it: "6-9" and "12"."""
    out = []
    for n in numbers:
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ["%d" % a if a == b else "%d-%d" % (a, b) for a, b in out]


class TiersTableTest(unittest.TestCase):
    """tools/tiers is the one list of make check's tiers: tools/check-all
    can run it, and the README's description of the tiers agrees with it."""

    def setUp(self):
        self.tiers, self.total = read_tiers()

    def test_table(self):
        self.assertEqual([t["number"] for t in self.tiers],
                         list(range(1, len(self.tiers) + 1)))
        self.assertIsNotNone(self.total)
        self.assertNotEqual(self.tiers[0]["command"], "-")
        with open(os.path.join(TOP, "tools", "check-all")) as f:
            check_all = f.read()
        for tier in self.tiers:
            with self.subTest(tier=tier["number"]):
                self.assertIn("\n%s() {\n" % tier["counter"], check_all)
                self.assertGreater(tier["budget"], 0)

    def test_readme(self):
        # The README's "What make check runs" numbers the tiers (1), (2),
        # ..., says which are counted in steps and pages, and the whole
        # run's budget.
        with open(os.path.join(TOP, "README.md")) as f:
            readme = f.read()
        section = readme.partition("## What `make check` runs\n")[2]
        section = " ".join(section.partition("\n## ")[0].split())
        self.assertIn("`tools/tiers`", section)
        numbers = [int(n) for n in re.findall(r"(?:^|[ ;:])\((\d+)\) ",
                                              section)]
        self.assertEqual(numbers, [t["number"] for t in self.tiers])
        units = "; ".join(
            "for %s %s, the %s" % ("tiers" if "-" in span else "tier",
                                   span, unit)
            for counter, unit in (("count_steps", "logged steps"),
                                  ("count_docs", "pages"))
            for span in spans([t["number"] for t in self.tiers
                               if t["counter"] == counter]))
        self.assertIn("(%s)" % units, section)
        self.assertIn("budget of %d minutes" % self.total, section)


BAD_PATCH = """\
From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: cpython-usdt <build@cpython-usdt.invalid>
Subject: [PATCH] A patch whose context is not in 3.13.5

Origin: vendor, cpython-usdt tests
Forwarded: not-needed
Bug: n/a
---
 Python/ceval.c | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/Python/ceval.c b/Python/ceval.c
--- a/Python/ceval.c
+++ b/Python/ceval.c
@@ -1,3 +1,3 @@
-/* This line is not in CPython. */
+/* Neither is this one. */
 /* Nor this. */
 /* Nor this. */
"""

if __name__ == "__main__":
    unittest.main()
