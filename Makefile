# cpython-usdt build driver.  `make` builds build/3.13/obj/python; `make
# check` tests it.  The work is done by the scripts in tools/; this file
# only orders them and keeps stamps so that reruns are incremental.
#
# SERIES names the CPython series: series/$(SERIES)/ holds everything that
# is specific to it (docs/layout.md), and its trees are under
# build/$(SERIES)/.  What is shared between series stays in build/: the
# downloads (dl/) and the pristine trees, one per tarball's sha256.  The
# default series is the one series/DEFAULT names, which tools/lib.sh reads
# too, so that the scripts of tools/ run alone pick the same one.
#
# The benchmarks' targets and trees are in bench/bench.mk, included below.

SERIES ?= $(file <series/DEFAULT)
PREFIX ?= /opt/cpython-usdt
NPROC := $(shell nproc)
B := build
SERIES_DIR := series/$(SERIES)
PIN := $(SERIES_DIR)/pin
ifeq ($(wildcard $(PIN)),)
$(error no series '$(SERIES)': $(PIN) does not exist (the series are: $(patsubst series/%/pin,%,$(wildcard series/*/pin))))
endif
# The series' own build trees.
S := $(B)/$(SERIES)
TARBALL := $(shell sed -n 's/^TARBALL=//p' $(PIN))
SHA256 := $(shell sed -n 's/^SHA256=//p' $(PIN))
PRISTINE := $(B)/pristine/$(SHA256)
# The series' inputs of tools/prepare: its pin, the files it lays into the
# tree (the loop flags, the version seam) and its patches.
PATCH_INPUTS := $(PIN) $(SERIES_DIR)/loop-flags \
	$(SERIES_DIR)/pydtrace_seam.h \
	$(wildcard $(SERIES_DIR)/overlay-replaces $(SERIES_DIR)/patches/*)
# overlay/ but the toolkit, overlay/Lib/usdt, which tools/sync-toolkit
# lays (below): nothing compiled or regenerated reads it.
OVERLAY_FILES := $(shell find overlay -path overlay/Lib/usdt -prune -o \
	-type f -print 2>/dev/null)
# The toolkit's files, and its directories, whose times change when a file
# is removed.
TOOLKIT_FILES := $(shell find overlay/Lib/usdt -name __pycache__ -prune -o \
	-print 2>/dev/null)
TOOLS := tools/lib.sh
# The machine's Python (Debian 12's), which runs the benchmarks' scripts:
# they measure the interpreters they are given, not the one they run on.
SYSTEM_PYTHON := /usr/bin/python3.11
# The series' trees under $(S) that `make clean` removes, each added where
# its rules are (src, the prepared tree, stays: the next build moves it).
TREES := stage stamps

export SERIES

.PHONY: all deps fetch prepare toolkit configure build check check-regrtest \
	check-regrtest-full check-freethreading install clean distclean \
	patch-queue patch-export release demo check-install \
	shared install-shared check-shared deb check-release
.PHONY: check-regrtest-armed check-regrtest-armed-full dist check-dist
.PHONY: check-bpftrace-versions check-deb-trixie compare-bpftrace-versions
.PHONY: dtrace-root check-dtrace check-docs check-uprobe-guest

all: build

# Missing Debian packages: installed when run as root, else the exact
# apt-get line is printed.
deps:
	tools/deps build test

fetch: $(B)/dl/$(TARBALL)
$(B)/dl/$(TARBALL): $(PIN) tools/fetch $(TOOLS)
	tools/fetch
	touch $@

# prepare regenerates (autoconf): deps first, so that every target that
# reaches it, the pristine benchmark trees too, works on a fresh machine.
prepare: $(S)/stamps/prepare
$(S)/stamps/prepare: $(B)/dl/$(TARBALL) $(PATCH_INPUTS) $(OVERLAY_FILES) \
		tools/prepare tools/regen $(TOOLS) | deps
	tools/prepare

# The toolkit, overlay/Lib/usdt, as the last commit of build/3.13/src
# (tools/sync-toolkit): after an edit of it, `make` writes the files that
# changed and rebuilds only the build info (sys.version names the commit),
# without a prepare.  $(S)/stamps/toolkit-commit changes only when the
# commit does, which is what the build info depends on.
toolkit: $(S)/stamps/toolkit
$(S)/stamps/toolkit: $(TOOLKIT_FILES) tools/sync-toolkit $(TOOLS) \
		$(S)/stamps/prepare
	tools/sync-toolkit $(S)/src
	git -C $(S)/src rev-parse HEAD | cmp -s - $(S)/stamps/toolkit-commit || \
		git -C $(S)/src rev-parse HEAD > $(S)/stamps/toolkit-commit
	touch $@

# configure reruns only when configure itself, or our flags, change:
# tools/prepare rewrites build/3.13/src/configure only when its content changes.
# The target is the flag record that tools/configure writes last, not the
# Makefile, which CPython's own make regenerates (config.status) on its own.
# The no-op recipe runs under `make -n` too (+), so that make looks at
# configure's time again afterwards, as a real run does, rather than assume
# it changed whenever the prepare stamp (written after it) is newer: then
# `make -n` shows a reconfigure only when there will be one.
$(S)/src/configure: $(S)/stamps/prepare
	+@:
# The same for the series' loop flags, which our tree's configure reads
# (series/$(SERIES)/loop-flags, laid there by tools/prepare).
LOOP_FLAGS_FILE = $(S)/src/Misc/cpython-usdt-loop-flags
$(LOOP_FLAGS_FILE): $(S)/stamps/prepare
	+@:

configure: $(S)/obj/usdt-configure-flags
$(S)/obj/usdt-configure-flags: $(S)/src/configure $(LOOP_FLAGS_FILE) tools/configure $(S)/stamps/prefix
	PREFIX=$(PREFIX) tools/configure $(S)/obj $(CURDIR)/$(S)/src

# Record PREFIX so that changing it reconfigures.  The stamp is out of date
# only when it records another prefix (or none), so that `make -n` shows a
# reconfigure only when there will be one.
ifneq ($(file <$(S)/stamps/prefix),$(PREFIX))
$(S)/stamps/prefix: FORCE
endif
$(S)/stamps/prefix:
	@mkdir -p $(@D)
	@echo '$(PREFIX)' > $@

# sys.version names build/3.13/src's tag and commit (tools/prepare), compiled
# into Modules/getbuildinfo.o, which CPython rebuilds only when an object
# changes: rebuild it whenever build/3.13/src moves.
# make_tree OBJDIR: build one configured tree of build/3.13/src.
make_tree = if [ $(S)/stamps/prepare -nt $(1)/Modules/getbuildinfo.o ] || \
		[ $(S)/stamps/toolkit-commit -nt $(1)/Modules/getbuildinfo.o ]; then \
		rm -f $(1)/Modules/getbuildinfo.o; fi; \
	$(MAKE) -C $(1) -j$(NPROC)

TREES += obj
build: deps $(S)/obj/usdt-configure-flags $(S)/stamps/toolkit
	$(call make_tree,$(S)/obj)

# The release interpreter, build/3.13/release/python: upstream's PGO + LTO
# (--enable-optimizations --with-lto), with everything the default build
# carries.  About 30 minutes on 2 cores (docs/release.md).
# GCC refuses profile data older than the sources (-Werror=coverage-
# mismatch), so a tree whose sources moved since its training run is
# trained again: CPython's profile-removal drops the data and the stamp.
TREES += release
release: deps $(S)/release/usdt-configure-flags $(S)/stamps/toolkit
	if [ -e $(S)/release/profile-run-stamp ] && \
	   [ $(S)/stamps/prepare -nt $(S)/release/profile-run-stamp ]; then \
		$(MAKE) -C $(S)/release profile-removal; fi
	$(call make_tree,$(S)/release)
$(S)/release/usdt-configure-flags: $(S)/src/configure $(LOOP_FLAGS_FILE) tools/configure $(S)/stamps/prefix
	OPTIMIZE=release PREFIX=$(PREFIX) tools/configure $(S)/release $(CURDIR)/$(S)/src

# The README's test command, tools/check-all: the tiers of the table
# tools/tiers, in order (the install tiers leave build/3.13/obj and
# build/3.13/obj-shared configured for their prefixes: the next `make`
# reconfigures).  It stops after the first tier that fails (tiers 1-3,
# one command, run to their end), prints what each tier ran, failed and
# skipped, and fails if the run left probe directories or perf maps in
# /tmp.  With CI set, or
# REQUIRE_TRACER=1, a test that cannot trace fails instead of skipping.
REQUIRE_TRACER ?=
export REQUIRE_TRACER
check: build
	tools/check-all $(S)/obj $(S)/deb-dev

# The README's two bpftrace examples on the built interpreter, with their
# real output; without root or BPF, bpftrace's error and what is missing.
# Then upstream's call_stack.d under DTrace for Linux, where it can run.
demo: build
	tools/demo $(S)/obj

# DTrace for Linux (Debian forky's dtrace package) in a root of its own,
# build/dtrace/root-VERSION, which tools/dtrace runs; as root, with
# mmdebstrap (installed here) and the machine's Debian mirror.
dtrace-root:
	tools/deps dtrace
	tools/dtrace-root

# make check's tier 10 alone: the D scripts and the howto's DTrace
# examples under DTrace for Linux.
check-dtrace: build
	tools/check-dtrace $(S)/obj

# The markers' nop pair on a kernel that optimizes it: Debian
# experimental's Linux 7.3 booted under qemu (TCG, no KVM), uprobes on the
# pair's 10-byte nop (docs/marker-sites.md); as root.  Not part of make
# check: it boots a kernel, and its timings are emulated.
check-uprobe-guest: build
	tools/deps guest
	tools/uprobe-guest-7.3 $(S)/obj/python

# make check's tier 12 alone: our pages of the documentation (the howto
# and the toolkit's page) built by Sphinx with the prepared tree's
# Doc/conf.py, failing on any warning in them; Sphinx is Debian forky's,
# in the root of tools/dtrace-root (docs/howto-build.md).  It needs the
# prepared tree only, not the build.
TREES += docs
check-docs: $(S)/stamps/toolkit
	tools/check-docs

# Upstream's whole regression suite on our build and on a pristine build of
# the same version; the results must be the same.
check-regrtest-full: build $(S)/pristine-obj/python
	tools/regrtest $(S)/obj full $(S)/pristine-obj

# Every probe armed path-wide by one bpftrace, then unarmed: each test case
# must give the same result (docs/armed-regrtest.md).  ARMED_TESTS names the
# test modules (default: the armed subset that `make check` runs); the full
# target runs the whole suite.  Both skip when bpftrace cannot attach.
check-regrtest-armed: build
	tools/regrtest $(S)/obj armed $(ARMED_TESTS)

check-regrtest-armed-full: build
	tools/regrtest $(S)/obj armed-full

# The toolkit's tests (usdt.tools, Lib/usdt/scripts, usdt.stacks, the allocation
# tools) with bpftrace 0.17 (this machine's), 0.23 (Debian 13) and 0.27
# (forky), from the Debian roots of tools/bpftrace-root, built if missing.
check-bpftrace-versions: build
	tools/check-bpftrace-versions $(S)/obj

# Every tool of usdt.tools on a real application (docutils and pygments,
# from Debian's python3-docutils and python3-pygments) with bpftrace 0.17,
# 0.23 and 0.27: the exact counts must agree (docs/release.md).
compare-bpftrace-versions: build
	tools/deps compare
	tools/compare-bpftrace-versions $(S)/obj

# The .deb of build/3.13/obj (tools/deb, as make check's tier 6 makes it)
# on Debian 13: installed with apt-get in an overlay over the trixie root
# of tools/bpftrace-root, checked there by tools/check-deb --all-tools
# with trixie's bpftrace 0.23 (every tool of usdt.tools).  Not part of
# make check (docs/release.md: 9 minutes with the build and the .deb, of
# which the check itself 2 to 2.5).
check-deb-trixie: build
	tools/deb $(S)/obj $(S)/deb-dev
	tools/check-deb-trixie $(S)/deb-dev

# Trees of build/pristine, which tools/prepare makes once per tarball:
# they do not depend on our patches or overlay.
PRISTINE_INPUTS = $(B)/dl/$(TARBALL) $(SERIES_DIR)/loop-flags tools/configure \
	| $(S)/stamps/prepare

TREES += pristine-obj
$(S)/pristine-obj/python: $(PRISTINE_INPUTS)
	PREFIX=$(PREFIX) tools/configure $(S)/pristine-obj $(CURDIR)/$(PRISTINE)
	$(MAKE) -C $(S)/pristine-obj -j$(NPROC)

# The free-threaded (--disable-gil) build of the same tree, and its tests.
TREES += obj-ft
$(S)/obj-ft/usdt-configure-flags: $(S)/src/configure $(LOOP_FLAGS_FILE) tools/configure $(S)/stamps/prefix
	VARIANT=freethreading PREFIX=$(PREFIX) tools/configure $(S)/obj-ft $(CURDIR)/$(S)/src

check-freethreading: deps $(S)/obj-ft/usdt-configure-flags $(S)/stamps/toolkit
	$(call make_tree,$(S)/obj-ft)
	tools/check $(S)/obj-ft

install: build
	$(MAKE) -C $(S)/obj install

# The source release, build/dist/cpython-usdt-RELEASE.tar.xz (tools/dist):
# build/SERIES/src as a tarball that distributors build with
# `./configure --with-dtrace && make && make install`
# (docs/source-release.md).  check-dist builds it exactly so in a scratch
# directory and compares the result with build/SERIES/obj/python, as it
# is: `make check` runs it after the install tiers, which leave that tree
# built for another prefix, and the facts compared do not depend on it.
dist: $(S)/stamps/toolkit
	tools/dist $(B)/dist
check-dist: dist
	tools/check-dist $(S)/obj

# The --enable-shared variant, build/3.13/obj-shared: libpython3.13.so carries
# the probes, and the installed python3 finds it through its run path.
TREES += obj-shared
shared: deps $(S)/obj-shared/usdt-configure-flags $(S)/stamps/toolkit
	$(call make_tree,$(S)/obj-shared)
$(S)/obj-shared/usdt-configure-flags: $(S)/src/configure $(LOOP_FLAGS_FILE) tools/configure $(S)/stamps/prefix
	SHARED=yes PREFIX=$(PREFIX) tools/configure $(S)/obj-shared $(CURDIR)/$(S)/src

install-shared: shared
	$(MAKE) -C $(S)/obj-shared install

# make install-shared PREFIX=<a new directory under /tmp>, then the checks
# of check-install, plus the probes in libpython3.13.so, bpftrace attached
# to the library, and a C program that embeds the interpreter.
check-shared:
	tools/check-install --shared

# A Debian package of the release interpreter, installed in
# /opt/cpython-usdt: build/3.13/deb/cpython-usdt_<RELEASE>_<arch>.deb.
# make check packages build/3.13/obj the same way, into build/3.13/deb-dev.
TREES += deb deb-dev
deb: release
	tools/deb $(S)/release $(S)/deb

# The release build's tests: tiers 1-3 of `make check` (build facts, the
# probe set, parity and attach tests, test_dtrace) on build/3.13/release/python,
# then its .deb installed with apt-get, checked, and removed.
check-release: release
	tools/check $(S)/release
	tools/deb $(S)/release $(S)/deb
	tools/check-deb $(S)/deb

# make install PREFIX=<a new directory under /tmp>, then the installed
# interpreter's venv, pip, python3-config, a C extension and probes
# (tools/check-install); the next `make` reconfigures build/3.13/obj for PREFIX.
check-install:
	tools/check-install

# Patch-queue workflow (docs/patch-workflow.md).
patch-queue: $(S)/stamps/prepare
	tools/patch-queue open
patch-export:
	tools/patch-queue export

include bench/bench.mk

# clean removes the series' trees but src; distclean all of build/: every
# series, the downloads, the pristine trees and the tracers' roots.
clean:
	rm -rf $(addprefix $(S)/,$(TREES))

distclean:
	rm -rf $(B)

FORCE:
