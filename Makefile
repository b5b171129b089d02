# cpython-usdt build driver.  `make` builds build/obj/python; `make check`
# tests it.  The work is done by the scripts in tools/; this file only
# orders them and keeps stamps so that reruns are incremental.

SERIES ?= 3.13
PREFIX ?= /opt/cpython-usdt
NPROC := $(shell nproc)
B := build

PIN := upstream/$(SERIES)
TARBALL := $(shell sed -n 's/^TARBALL=//p' $(PIN))
PATCH_INPUTS := $(PIN) $(wildcard patches/$(SERIES)/*)
OVERLAY_FILES := $(shell find overlay -type f 2>/dev/null)
TOOLS := tools/lib.sh

export SERIES

.PHONY: all deps fetch prepare configure build check check-regrtest \
	check-regrtest-full check-freethreading install clean distclean \
	patch-queue patch-export release bench bench-quick bench-watcher \
	bench-stacks demo bench-framepointers-release bench-framepointers-release-wall \
	check-install \
	shared install-shared check-shared deb check-release bench-release
.PHONY: check-regrtest-armed check-regrtest-armed-full

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
prepare: $(B)/stamps/prepare
$(B)/stamps/prepare: $(B)/dl/$(TARBALL) $(PATCH_INPUTS) $(OVERLAY_FILES) \
		tools/prepare tools/regen $(TOOLS) | deps
	tools/prepare

# configure reruns only when configure itself, or our flags, change:
# tools/prepare rewrites build/src/configure only when its content changes.
# The target is the flag record that tools/configure writes last, not the
# Makefile, which CPython's own make regenerates (config.status) on its own.
# The no-op recipe runs under `make -n` too (+), so that make looks at
# configure's time again afterwards, as a real run does, rather than assume
# it changed whenever the prepare stamp (written after it) is newer: then
# `make -n` shows a reconfigure only when there will be one.
$(B)/src/configure: $(B)/stamps/prepare
	+@:

configure: $(B)/obj/usdt-configure-flags
$(B)/obj/usdt-configure-flags: $(B)/src/configure tools/configure $(B)/stamps/prefix
	PREFIX=$(PREFIX) tools/configure $(B)/obj $(CURDIR)/$(B)/src

# Record PREFIX so that changing it reconfigures.  The stamp is out of date
# only when it records another prefix (or none), so that `make -n` shows a
# reconfigure only when there will be one.
ifneq ($(file <$(B)/stamps/prefix),$(PREFIX))
$(B)/stamps/prefix: FORCE
endif
$(B)/stamps/prefix:
	@mkdir -p $(@D)
	@echo '$(PREFIX)' > $@

# sys.version names build/src's tag and commit (tools/prepare), compiled
# into Modules/getbuildinfo.o, which CPython rebuilds only when an object
# changes: rebuild it whenever build/src moves.
# make_tree OBJDIR: build one configured tree of build/src.
make_tree = if [ $(B)/stamps/prepare -nt $(1)/Modules/getbuildinfo.o ]; then \
		rm -f $(1)/Modules/getbuildinfo.o; fi; \
	$(MAKE) -C $(1) -j$(NPROC)

build: deps $(B)/obj/usdt-configure-flags
	$(call make_tree,$(B)/obj)

# The release interpreter, build/release/python: upstream's PGO + LTO
# (--enable-optimizations --with-lto), with everything the default build
# carries.  About 30 minutes on 2 cores (docs/release.md).
# GCC refuses profile data older than the sources (-Werror=coverage-
# mismatch), so a tree whose sources moved since its training run is
# trained again: CPython's profile-removal drops the data and the stamp.
release: deps $(B)/release/usdt-configure-flags
	if [ -e $(B)/release/profile-run-stamp ] && \
	   [ $(B)/stamps/prepare -nt $(B)/release/profile-run-stamp ]; then \
		$(MAKE) -C $(B)/release profile-removal; fi
	$(call make_tree,$(B)/release)
$(B)/release/usdt-configure-flags: $(B)/src/configure tools/configure $(B)/stamps/prefix
	OPTIMIZE=release PREFIX=$(PREFIX) tools/configure $(B)/release $(CURDIR)/$(B)/src

# The README's test command, tools/check-all: build facts, our tests,
# test_dtrace and a bpftrace smoke test (tools/check), then the regrtest
# subset, armed and unarmed (tools/regrtest), then the .deb of build/obj
# installed and removed (tools/deb, tools/check-deb), then installs into
# temporary prefixes, static and shared (tools/check-install, make
# check-shared; they leave build/obj and build/obj-shared configured for
# them: the next `make` reconfigures).  It stops at the first tier that
# fails, prints what each tier ran, failed and skipped, and fails if the
# run left probe directories or perf maps in /tmp.  With CI set, or
# REQUIRE_TRACER=1, a test that cannot trace fails instead of skipping.
REQUIRE_TRACER ?=
export REQUIRE_TRACER
check: build
	tools/check-all $(B)/obj $(B)/deb-dev

# The README's two bpftrace examples on the built interpreter, with their
# real output; without root or BPF, bpftrace's error and what is missing.
demo: build
	tools/demo $(B)/obj

# Upstream's whole regression suite on our build and on a pristine build of
# the same version; the results must be the same.
check-regrtest-full: build $(B)/pristine-obj/python
	tools/regrtest $(B)/obj full $(B)/pristine-obj

# Every probe armed path-wide by one bpftrace, then unarmed: each test case
# must give the same result (docs/armed-regrtest.md).  ARMED_TESTS names the
# test modules (default: the armed subset that `make check` runs); the full
# target runs the whole suite.  Both skip when bpftrace cannot attach.
check-regrtest-armed: build
	tools/regrtest $(B)/obj armed $(ARMED_TESTS)

check-regrtest-armed-full: build
	tools/regrtest $(B)/obj armed-full

# Trees of build/pristine, which tools/prepare makes once per tarball:
# they do not depend on our patches or overlay.
PRISTINE_INPUTS = $(B)/dl/$(TARBALL) tools/configure | $(B)/stamps/prepare

$(B)/pristine-obj/python: $(PRISTINE_INPUTS)
	PREFIX=$(PREFIX) tools/configure $(B)/pristine-obj $(CURDIR)/$(B)/pristine
	$(MAKE) -C $(B)/pristine-obj -j$(NPROC)

# The free-threaded (--disable-gil) build of the same tree, and its tests.
$(B)/obj-ft/usdt-configure-flags: $(B)/src/configure tools/configure $(B)/stamps/prefix
	VARIANT=freethreading PREFIX=$(PREFIX) tools/configure $(B)/obj-ft $(CURDIR)/$(B)/src

check-freethreading: deps $(B)/obj-ft/usdt-configure-flags
	$(call make_tree,$(B)/obj-ft)
	tools/check $(B)/obj-ft

install: build
	$(MAKE) -C $(B)/obj install

# The --enable-shared variant, build/obj-shared: libpython3.13.so carries
# the probes, and the installed python3 finds it through its run path.
shared: deps $(B)/obj-shared/usdt-configure-flags
	$(call make_tree,$(B)/obj-shared)
$(B)/obj-shared/usdt-configure-flags: $(B)/src/configure tools/configure $(B)/stamps/prefix
	SHARED=yes PREFIX=$(PREFIX) tools/configure $(B)/obj-shared $(CURDIR)/$(B)/src

install-shared: shared
	$(MAKE) -C $(B)/obj-shared install

# make install-shared PREFIX=<a new directory under /tmp>, then the checks
# of check-install, plus the probes in libpython3.13.so, bpftrace attached
# to the library, and a C program that embeds the interpreter.
check-shared:
	tools/check-install --shared

# A Debian package of the release interpreter, installed in
# /opt/cpython-usdt: build/deb/cpython-usdt_<RELEASE>_<arch>.deb.
deb: release
	tools/deb $(B)/release $(B)/deb

# The release build's tests: tiers 1-3 of `make check` (build facts, the
# probe set, parity and attach tests, test_dtrace) on build/release/python,
# then its .deb installed with apt-get, checked, and removed.
check-release: release
	tools/check $(B)/release
	tools/deb $(B)/release $(B)/deb
	tools/check-deb $(B)/deb

# make install PREFIX=<a new directory under /tmp>, then the installed
# interpreter's venv, pip, python3-config, a C extension and probes
# (tools/check-install); the next `make` reconfigures build/obj for PREFIX.
check-install:
	tools/check-install

# Patch-queue workflow (docs/patch-workflow.md).
patch-queue: $(B)/stamps/prepare
	tools/patch-queue open
patch-export:
	tools/patch-queue export

# Benchmarks (docs/performance.md): (A) pristine without --with-dtrace,
# (B) pristine with it, both built by the same driver and flags as (C) ours,
# frame pointers and -fno-gcse included; (U) pristine built the upstream
# way, without dtrace, frame pointers or -fno-gcse, for what our build's
# flags cost.
$(B)/bench-nodtrace/python: $(PRISTINE_INPUTS)
	DTRACE=no PREFIX=$(PREFIX) tools/configure $(B)/bench-nodtrace $(CURDIR)/$(B)/pristine
	$(MAKE) -C $(B)/bench-nodtrace -j$(NPROC)

$(B)/bench-upstream/python: $(PRISTINE_INPUTS)
	DTRACE=no FRAME_POINTERS=no LOOP_FLAGS=no PREFIX=$(PREFIX) \
		tools/configure $(B)/bench-upstream $(CURDIR)/$(B)/pristine
	$(MAKE) -C $(B)/bench-upstream -j$(NPROC)

# The frame pointers' cost where it matters most, in release builds (PGO +
# LTO, as python.org and the distributions build): pristine without dtrace,
# with (FP) and without (NOFP) frame pointers; docs/framepointers-release.md.
# release-pristine-fp2 is the same as release-pristine-fp, built a second
# time: PGO's training run differs from build to build, and the two give
# the noise that the release comparison must stay within (bench-release);
# release-pristine-nofp2 is release-pristine-nofp's second training
# (bench-framepointers-release-wall).
$(B)/release-pristine-fp/python $(B)/release-pristine-fp2/python: \
		$(B)/%/python: $(PRISTINE_INPUTS)
	DTRACE=no OPTIMIZE=release PREFIX=$(PREFIX) \
		tools/configure $(B)/$* $(CURDIR)/$(B)/pristine
	$(MAKE) -C $(B)/$* -j$(NPROC)

$(B)/release-pristine-nofp/python $(B)/release-pristine-nofp2/python: \
		$(B)/%/python: $(PRISTINE_INPUTS)
	DTRACE=no FRAME_POINTERS=no LOOP_FLAGS=no OPTIMIZE=release PREFIX=$(PREFIX) \
		tools/configure $(B)/$* $(CURDIR)/$(B)/pristine
	$(MAKE) -C $(B)/$* -j$(NPROC)

# Instructions and wall time only (the armed phase needs dtrace).  A and B
# are the same pristine frame-pointer build (there is no pristine release
# build --with-dtrace), C is ours (`make release`): the Frame pointers
# section's A/U is what our flags cost, C/U what the release build users
# install costs against upstream's default.
bench-framepointers-release: release $(B)/release-pristine-fp/python \
		$(B)/release-pristine-nofp/python
	tools/deps bench
	/usr/bin/python3.11 bench/run.py --skip armed \
		--python A=$(B)/release-pristine-fp/python \
		--python B=$(B)/release-pristine-fp/python \
		--python C=$(B)/release/python \
		--python U=$(B)/release-pristine-nofp/python \
		--out-json docs/framepointers-release.json \
		--out-md docs/framepointers-release.md

# Wall time only, each side trained twice: the four pairs across the sides
# are what frame pointers cost release builds in wall time, the two pairs
# within a side what a second PGO training alone moves (bench/wallpairs.py;
# bench/analysis.md, "Release builds").  The JSON's role descriptions are
# run.py's (A, B, C, U); wallpairs.py names each build by its directory.
bench-framepointers-release-wall: $(B)/release-pristine-fp/python \
		$(B)/release-pristine-fp2/python $(B)/release-pristine-nofp/python \
		$(B)/release-pristine-nofp2/python
	tools/deps bench
	mkdir -p $(B)/bench-fp-wall
	/usr/bin/python3.11 bench/run.py --skip instructions,armed --rounds 12 \
		--python A=$(B)/release-pristine-fp/python \
		--python B=$(B)/release-pristine-fp2/python \
		--python C=$(B)/release-pristine-nofp2/python \
		--python U=$(B)/release-pristine-nofp/python \
		--out-json $(B)/bench-fp-wall/wall.json
	/usr/bin/python3.11 bench/wallpairs.py $(B)/bench-fp-wall/wall.json \
		--per-workload U

# The release build's unarmed cost against its pristine peer built twice
# (PGO differs from build to build; P2/P1 is that noise), in instructions
# and interleaved wall time: docs/performance-release.md.
bench-release: release $(B)/release-pristine-fp/python $(B)/release-pristine-fp2/python
	tools/deps bench
	/usr/bin/python3.11 bench/release.py \
		--python P1=$(B)/release-pristine-fp/python \
		--python P2=$(B)/release-pristine-fp2/python \
		--python R=$(B)/release/python \
		--out-json docs/performance-release.json \
		--out-md docs/performance-release.md

BENCH_BUILDS = $(B)/bench-nodtrace/python $(B)/pristine-obj/python \
	$(B)/bench-upstream/python
BENCH_PYTHONS = --python A=$(B)/bench-nodtrace/python \
	--python B=$(B)/pristine-obj/python --python C=$(B)/obj/python \
	--python U=$(B)/bench-upstream/python

bench: build $(BENCH_BUILDS)
	tools/deps bench
	/usr/bin/python3.11 bench/run.py $(BENCH_PYTHONS) \
		--out-json docs/performance.json --out-md docs/performance.md \
		--out-png docs/performance.png

# The probe watcher's idle wakeups and attach latency (docs/watcher.md).
bench-watcher: build
	/usr/bin/python3.11 bench/watcher.py $(B)/obj/python --out-md docs/watcher.md

# Call speed before, while and after a tracer arms python:stacks__enable,
# over arm/disarm cycles in one process (docs/stacks.md).
bench-stacks: build
	/usr/bin/python3.11 bench/stacks.py $(B)/obj/python \
		--out-md docs/stacks.md --out-json docs/stacks.json

# Quick mode for development: fewer workloads and rounds; writes to build/.
bench-quick: build $(BENCH_BUILDS)
	tools/deps bench
	mkdir -p $(B)/bench-quick
	/usr/bin/python3.11 bench/run.py --quick $(BENCH_PYTHONS) \
		--out-json $(B)/bench-quick/performance.json \
		--out-md $(B)/bench-quick/performance.md \
		--out-png $(B)/bench-quick/performance.png

clean:
	rm -rf $(B)/obj $(B)/obj-ft $(B)/obj-shared $(B)/release $(B)/deb $(B)/deb-dev $(B)/pristine-obj $(B)/bench-nodtrace \
		$(B)/bench-upstream $(B)/release-pristine-fp $(B)/release-pristine-fp2 $(B)/release-pristine-nofp $(B)/release-pristine-nofp2 $(B)/bench-fp-wall \
		$(B)/stage $(B)/stamps

distclean:
	rm -rf $(B)

FORCE:
