/*
 * sdt_floor: the cheapest possible semaphore-gated USDT probe, as a floor for
 * the per-hit cost of an armed probe.
 *
 * One probe, provider "floor", name "hit", with the same argument shape as
 * CPython's python:function__entry (two strings and an int), guarded by its
 * semaphore exactly like the interpreter's PyDTrace_*_ENABLED() checks.
 *
 * usage: sdt_floor N   -> runs N iterations, prints "iterations=N elapsed_ns=T"
 *
 * Note: <sys/sdt.h> derives the semaphore symbol as <provider>_<probe>_semaphore,
 * i.e. floor_hit_semaphore.  bpftrace finds it via the stapsdt note and
 * increments it when it attaches.
 */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__extension__ unsigned short floor_hit_semaphore
    __attribute__((unused)) __attribute__((section(".probes")));

static const char *const files[4] = {
    "/work/bench/a.py", "/work/bench/bb.py", "/usr/lib/x.py", "<string>"};
static const char *const funcs[4] = {"f", "method", "__init__", "<module>"};

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    volatile long sink = 0;
    unsigned long long t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (__builtin_expect(floor_hit_semaphore, 0)) {
            const char *file = files[i & 3];
            const char *func = funcs[i & 3];
            int line = (int)(i & 1023);
            DTRACE_PROBE3(floor, hit, file, func, line);
        }
        sink += i;
    }
    unsigned long long t1 = now_ns();
    printf("iterations=%ld elapsed_ns=%llu semaphore=%u\n", n, t1 - t0,
           (unsigned)floor_hit_semaphore);
    return 0;
}
