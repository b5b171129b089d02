# The benchmarks' targets (bench/README.md), included by the top
# Makefile: run them from the top of the clone, as `make bench`,
# `make bench-quick` and so on.  They use the top Makefile's variables
# (S, PREFIX, NPROC, PRISTINE, PRISTINE_INPUTS, SYSTEM_PYTHON) and its
# trees: build (our C), release, and pristine-obj, the pristine
# --with-dtrace build (B) that check-regrtest-full uses too.  The trees
# made only for the benchmarks are added to TREES here, for make clean.

.PHONY: bench bench-quick bench-watcher bench-stacks bench-whole-stacks bench-soak \
	bench-profile-parts \
	bench-framepointers-release bench-framepointers-release-wall \
	bench-release bench-tools bench-batch

# Benchmarks (docs/performance.md): (A) pristine without --with-dtrace,
# (B) pristine with it, both built by the same driver and flags as (C) ours,
# frame pointers and -fno-gcse included; (U) pristine built the upstream
# way, without dtrace, frame pointers or -fno-gcse, for what our build's
# flags cost.
TREES += bench-nodtrace bench-upstream
$(S)/bench-nodtrace/python: $(PRISTINE_INPUTS)
	DTRACE=no PREFIX=$(PREFIX) tools/configure $(S)/bench-nodtrace $(CURDIR)/$(PRISTINE)
	$(MAKE) -C $(S)/bench-nodtrace -j$(NPROC)

$(S)/bench-upstream/python: $(PRISTINE_INPUTS)
	DTRACE=no FRAME_POINTERS=no LOOP_FLAGS=no PREFIX=$(PREFIX) \
		tools/configure $(S)/bench-upstream $(CURDIR)/$(PRISTINE)
	$(MAKE) -C $(S)/bench-upstream -j$(NPROC)

# The frame pointers' cost where it matters most, in release builds (PGO +
# LTO, as python.org and the distributions build): pristine without dtrace,
# with (FP) and without (NOFP) frame pointers; docs/framepointers-release.md.
# release-pristine-fp2 is the same as release-pristine-fp, built a second
# time: PGO's training run differs from build to build, and the two give
# the noise that the release comparison must stay within (bench-release);
# release-pristine-nofp2 is release-pristine-nofp's second training
# (bench-framepointers-release-wall).
TREES += release-pristine-fp release-pristine-fp2 release-pristine-nofp \
	release-pristine-nofp2
$(S)/release-pristine-fp/python $(S)/release-pristine-fp2/python: \
		$(S)/%/python: $(PRISTINE_INPUTS)
	DTRACE=no OPTIMIZE=release PREFIX=$(PREFIX) \
		tools/configure $(S)/$* $(CURDIR)/$(PRISTINE)
	$(MAKE) -C $(S)/$* -j$(NPROC)

$(S)/release-pristine-nofp/python $(S)/release-pristine-nofp2/python: \
		$(S)/%/python: $(PRISTINE_INPUTS)
	DTRACE=no FRAME_POINTERS=no LOOP_FLAGS=no OPTIMIZE=release PREFIX=$(PREFIX) \
		tools/configure $(S)/$* $(CURDIR)/$(PRISTINE)
	$(MAKE) -C $(S)/$* -j$(NPROC)

# Instructions and wall time only (the armed phase needs dtrace).  A and B
# are the same pristine frame-pointer build (there is no pristine release
# build --with-dtrace), C is ours (`make release`): the Frame pointers
# section's A/U is what our flags cost, C/U what the release build users
# install costs against upstream's default.
bench-framepointers-release: release $(S)/release-pristine-fp/python \
		$(S)/release-pristine-nofp/python
	tools/deps bench
	$(SYSTEM_PYTHON) bench/run.py --skip armed \
		--python A=$(S)/release-pristine-fp/python \
		--python B=$(S)/release-pristine-fp/python \
		--python C=$(S)/release/python \
		--python U=$(S)/release-pristine-nofp/python \
		--out-json bench/recorded/framepointers-release.json \
		--out-md docs/framepointers-release.md

# Wall time only, each side trained twice: the four pairs across the sides
# are what frame pointers cost release builds in wall time, the two pairs
# within a side what a second PGO training alone moves (bench/wallpairs.py;
# bench/analysis.md, "Release builds").  The JSON's role descriptions are
# run.py's (A, B, C, U); wallpairs.py names each build by its directory.
TREES += bench-fp-wall
bench-framepointers-release-wall: $(S)/release-pristine-fp/python \
		$(S)/release-pristine-fp2/python $(S)/release-pristine-nofp/python \
		$(S)/release-pristine-nofp2/python
	tools/deps bench
	mkdir -p $(S)/bench-fp-wall
	$(SYSTEM_PYTHON) bench/run.py --skip instructions,armed --rounds 12 \
		--python A=$(S)/release-pristine-fp/python \
		--python B=$(S)/release-pristine-fp2/python \
		--python C=$(S)/release-pristine-nofp2/python \
		--python U=$(S)/release-pristine-nofp/python \
		--out-json $(S)/bench-fp-wall/wall.json
	$(SYSTEM_PYTHON) bench/wallpairs.py $(S)/bench-fp-wall/wall.json \
		--per-workload U

# The release build's unarmed cost against its pristine peer built twice
# (PGO differs from build to build; P2/P1 is that noise), in instructions
# and interleaved wall time: docs/performance-release.md.
bench-release: release $(S)/release-pristine-fp/python $(S)/release-pristine-fp2/python
	tools/deps bench
	$(SYSTEM_PYTHON) bench/release.py \
		--python P1=$(S)/release-pristine-fp/python \
		--python P2=$(S)/release-pristine-fp2/python \
		--python R=$(S)/release/python \
		--out-json bench/recorded/performance-release.json \
		--out-md docs/performance-release.md

BENCH_BUILDS = $(S)/bench-nodtrace/python $(S)/pristine-obj/python \
	$(S)/bench-upstream/python
BENCH_PYTHONS = --python A=$(S)/bench-nodtrace/python \
	--python B=$(S)/pristine-obj/python --python C=$(S)/obj/python \
	--python U=$(S)/bench-upstream/python

bench: build $(BENCH_BUILDS)
	tools/deps bench
	$(SYSTEM_PYTHON) bench/run.py $(BENCH_PYTHONS) \
		--out-json bench/recorded/performance.json --out-md docs/performance.md \
		--out-png docs/performance.png

# The probe watcher's idle wakeups and attach latency (docs/watcher.md).
bench-watcher: build
	$(SYSTEM_PYTHON) bench/watcher.py $(S)/obj/python --out-md docs/watcher.md

# Call speed before, while and after a tracer arms python:stacks__enable,
# over arm/disarm cycles in one process (docs/stacks.md).
bench-stacks: build
	$(SYSTEM_PYTHON) bench/stacks.py $(S)/obj/python \
		--out-md docs/stacks.md --out-json bench/recorded/stacks.json

# What usdt.stacks --native costs: BPF time per sample, and the traced
# process's slowdown at 99 and 999 Hz, and at 99 Hz under 30 and 100 more
# frames; then profile's BPF time per sample on a real application
# (docutils and pygments, bench/real_app_cost.py) (docs/whole-stacks.md).
bench-whole-stacks: build
	$(SYSTEM_PYTHON) bench/whole_stacks.py $(S)/obj/python \
		--seconds 8 --cycles 3 --out-json bench/recorded/whole-stacks.json
	$(SYSTEM_PYTHON) bench/whole_stacks.py $(S)/obj/python --depth 30 \
		--rates 99 --seconds 8 --cycles 2 \
		--out-json bench/recorded/whole-stacks-depth30.json
	$(SYSTEM_PYTHON) bench/whole_stacks.py $(S)/obj/python --depth 100 \
		--rates 99 --seconds 8 --cycles 2 \
		--out-json bench/recorded/whole-stacks-depth100.json
	$(SYSTEM_PYTHON) bench/real_app_cost.py $(S)/obj/python \
		--seconds 8 --cycles 3 --out-json bench/recorded/whole-stacks-real-app.json

# Where profile's BPF time per sample goes: the stack tool's program cut down
# part by part, on the real application and a one-frame loop
# (bench/profile_parts.py, docs/whole-stacks.md).
bench-profile-parts: build
	$(SYSTEM_PYTHON) bench/profile_parts.py $(S)/obj/python \
		--seconds 10 --out-json bench/recorded/profile-parts.json

# 100 sessions of usdt.stacks --probe profile:hz:99 -p of 2 s each against
# a threaded HTTP server under load: every request answered, and the
# server's fds, threads and RSS back to their baseline (bench/soak_profile.py).
bench-soak: build
	$(SYSTEM_PYTHON) bench/soak_profile.py $(S)/obj/python

# What each tool of python -m usdt.tools costs the process it traces
# (docs/tools-cost.md, of bench/recorded/tools-cost.json; the slowdowns, in
# overlay/Lib/usdt/_tool_costs.py, are what the tools' --help shows).
bench-tools: build
	$(SYSTEM_PYTHON) bench/tools.py $(S)/obj/python \
		--out-json bench/recorded/tools-cost.json --out-md docs/tools-cost.md \
		--out-py overlay/Lib/usdt/_tool_costs.py

# What python:batch costs: calls and latency of every function, batched
# against --per-event and cProfile, on a real application (sympy, markdown,
# jinja2; bench/batch_cost.py, as root); then what writing one record costs
# inside the interpreter with no tracer, a copy of it with the batch
# semaphore set in the file against it unarmed, in instructions per event
# (cachegrind) and CPU time (bench/batch_event_cost.py) (docs/batch.md).
bench-batch: build
	$(SYSTEM_PYTHON) bench/batch_cost.py $(S)/obj/python --rounds 3 \
		--per-event --out-json bench/recorded/batch-cost.json
	$(SYSTEM_PYTHON) bench/batch_event_cost.py $(S)/obj/python \
		--out-json bench/recorded/batch-event-cost.json

# Quick mode for development: fewer workloads and rounds; writes to build/.
bench-quick: build $(BENCH_BUILDS)
	tools/deps bench
	mkdir -p $(S)/bench-quick
	$(SYSTEM_PYTHON) bench/run.py --quick $(BENCH_PYTHONS) \
		--out-json $(S)/bench-quick/performance.json \
		--out-md $(S)/bench-quick/performance.md \
		--out-png $(S)/bench-quick/performance.png
