"""The entry point every workload shares: scale, dry run, timing, checksum.

Environment, set by bench/run.py:
  BENCH_SCALE     work multiplier (default 1.0; cachegrind runs use less)
  BENCH_DRYRUN    stop after start-up and the module body: the baseline
                  that armed-probe hit counts are measured against
  BENCH_TIMING    print the timed region's duration as elapsed_ns= on
                  stderr, and its CPU time (user and system, of every
                  thread) as cpu_ns= (bench/tools.py)
  BENCH_GO        a path: before the timed region, create PATH.PID.ready
                  and wait until PATH exists (bench/alloc_armed.py
                  --paired starts two processes' timed regions together)
"""

import os
import sys
import time

SCALE = float(os.environ.get("BENCH_SCALE", "1.0"))


def bench_main(run, setup=None):
    """Run run(SCALE) once, timed, and print its checksum."""
    if os.environ.get("BENCH_DRYRUN"):
        sys.exit(0)
    if setup is not None:
        setup()
    go = os.environ.get("BENCH_GO")
    if go:
        open("%s.%d.ready" % (go, os.getpid()), "w").close()
        while not os.path.exists(go):
            time.sleep(0.0005)
    timing = bool(os.environ.get("BENCH_TIMING"))
    c0 = time.process_time_ns() if timing else 0
    t0 = time.perf_counter_ns()
    checksum = run(SCALE)
    t1 = time.perf_counter_ns()
    if timing:
        c1 = time.process_time_ns()
        print(f"elapsed_ns={t1 - t0}", file=sys.stderr)
        print(f"cpu_ns={c1 - c0}", file=sys.stderr)
    print(checksum)
