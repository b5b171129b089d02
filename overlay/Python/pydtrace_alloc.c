/* Sampled allocation probes on OpenTelemetry's otel_memory contract
 * (cpython-usdt).
 *
 * otel_memory:alloc(ptr, size, weight) fires for a sampled allocation of
 * any of the three PyMem domains (raw, mem, object); otel_memory:free(ptr)
 * fires for the free of a pointer that alloc reported, and for no other
 * free.  Sampling is Poisson over bytes: each thread counts down the bytes
 * it allocates, from a distance drawn from an exponential distribution whose
 * mean is the sampling interval (512 KiB, -X usdt_alloc_interval=BYTES or
 * PYTHONUSDTALLOCINTERVAL=BYTES).  An allocation that crosses N boundaries
 * is sampled with weight N * interval, so that the sum of the weights is an
 * unbiased estimate of the bytes allocated.  A realloc() is a free of the
 * old pointer (if it was sampled) and then an allocation of the new size,
 * sampled or not by the same countdown.
 *
 * Nothing on the allocation path changes while no tracer has armed the
 * probes.  When the probe watcher (Python/pydtrace_arming.c) sees either
 * semaphore set, it calls _PyDTrace_AllocApply() in a thread of the main
 * interpreter holding its GIL, which puts a wrapper on top of the current
 * allocators of the three domains, as tracemalloc.start() does at run time;
 * when the last tracer leaves, the wrapper is taken off again.
 *
 * The wrapper is invisible to PyMem_GetAllocator() and PyMem_SetAllocator():
 * while it is installed they read and replace the allocator *under* it
 * (Objects/obmalloc.c asks _PyDTrace_AllocBelow() where that is), so
 * tracemalloc started or stopped in any order, the debug hooks and a C
 * extension's own allocator all install themselves under the wrapper, get
 * back what they installed, and are never replaced when it is taken off.
 * _PyMem_GetCurrentAllocatorName() and sys._debugmallocstats() look under it
 * too.
 *
 * The set of sampled pointers is bounded (SET_CAPACITY); a sampled
 * allocation that does not fit is not reported, and counted in
 * _PyDTrace_AllocDropped, which a tracer reads from the process's memory
 * (gdb: p _PyDTrace_AllocDropped).  An allocation never waits for the set
 * longer than another thread's insert or removal.
 *
 * Raw-domain functions may run without the GIL while the wrapper goes on or
 * off.  The wrapper's functions ignore their ctx argument, and only the
 * function pointers are swapped (the ctx of the allocator under the wrapper
 * is written first when it comes off), so that a thread that reads the
 * allocator half-way through gets a working pair either way.
 *
 * In the free-threaded build, the mem and object domains are called by
 * threads that run at the same time: the wrapper goes on and off with the
 * world stopped (as the GIL does it in the default build), and everything
 * the wrapper shares between threads is per-thread (the countdown) or
 * behind the set's lock.  Threads without a thread state, which may call
 * the raw domain even while the world is stopped, get a working pair
 * either way, as above.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <math.h>                 // log()
#include <sched.h>                // sched_yield()
#include <stdint.h>
#include <string.h>
#include <time.h>

#ifdef WITH_DTRACE

/* Sampled allocations that were not reported because the set of sampled
 * pointers was full. */
uint64_t _PyDTrace_AllocDropped = 0;

int
_PyDTrace_AllocArmed(void)
{
    return OTEL_MEMORY_ALLOC_ENABLED() || OTEL_MEMORY_FREE_ENABLED();
}


#define DEFAULT_INTERVAL (512 * 1024)
#define N_DOMAINS 3

/* Power of two.  Three quarters of it may be in use: 24576 sampled live
 * blocks, 12 GiB of live heap at the default interval. */
#define SET_CAPACITY (1 << 15)
#define SET_MAX_USED (SET_CAPACITY / 4 * 3)
/* Counters of the hash buckets, for the lock-free "not sampled" answer of
 * almost every free. */
#define FILTER_SIZE (1 << 16)

static uint64_t sampling_interval = DEFAULT_INTERVAL;

/* The allocator under the wrapper of each domain, and whether the wrapper
 * is on.  Written with ALLOCATORS_MUTEX held and the GIL held (the world
 * stopped in the free-threaded build). */
static struct {
    PyMemAllocatorEx below;
    int installed;
} layers[N_DOMAINS];

struct sampled {
    void *ptr;          /* NULL: empty slot */
    uint64_t size;
    uint64_t weight;
};

static struct {
    int lock;                           /* spin lock: never parks */
    Py_ssize_t used;
    struct sampled slots[SET_CAPACITY];
    uint16_t filter[FILTER_SIZE];
} set;

/* Per thread: bytes left before the next sample (0: not drawn yet), and the
 * state of its random generator (xorshift64*). */
static _Py_thread_local uint64_t countdown;
static _Py_thread_local uint64_t rng_state;
/* Per thread: inside the allocator under the wrapper.  pymalloc hands large
 * requests of the mem and object domains to the raw domain, and
 * tracemalloc's hooks allocate too: such nested calls are the same block
 * (or none of the program's), so they pass through unsampled, as
 * tracemalloc does with its own. */
static _Py_thread_local int inside;

static inline size_t
hash_ptr(const void *ptr)
{
    uint64_t h = (uint64_t)(uintptr_t)ptr * 0x9e3779b97f4a7c15ULL;
    return (size_t)(h >> 32);
}

static void
set_lock(void)
{
    while (_Py_atomic_exchange_int(&set.lock, 1)) {
        while (_Py_atomic_load_int_relaxed(&set.lock)) {
            sched_yield();
        }
    }
}

static void
set_unlock(void)
{
    _Py_atomic_store_int_release(&set.lock, 0);
}

/* Called with the lock held.  0 if the set is full. */
static int
set_insert(void *ptr, uint64_t size, uint64_t weight)
{
    if (set.used >= SET_MAX_USED) {
        return 0;
    }
    size_t h = hash_ptr(ptr);
    size_t i = h & (SET_CAPACITY - 1);
    while (set.slots[i].ptr != NULL) {
        i = (i + 1) & (SET_CAPACITY - 1);
    }
    set.slots[i].ptr = ptr;
    set.slots[i].size = size;
    set.slots[i].weight = weight;
    set.used++;
    uint16_t *f = &set.filter[h & (FILTER_SIZE - 1)];
    _Py_atomic_store_uint16_relaxed(f, (uint16_t)(*f + 1));
    return 1;
}

/* Called with the lock held: remove *ptr* and return 1 (with its entry in
 * *out*), or 0 if it was not sampled.  Backward-shift deletion keeps the
 * probe sequences whole without tombstones. */
static int
set_remove(void *ptr, struct sampled *out)
{
    size_t h = hash_ptr(ptr);
    size_t i = h & (SET_CAPACITY - 1);
    while (set.slots[i].ptr != ptr) {
        if (set.slots[i].ptr == NULL) {
            return 0;
        }
        i = (i + 1) & (SET_CAPACITY - 1);
    }
    *out = set.slots[i];
    size_t hole = i;
    size_t j = i;
    for (;;) {
        j = (j + 1) & (SET_CAPACITY - 1);
        if (set.slots[j].ptr == NULL) {
            break;
        }
        size_t home = hash_ptr(set.slots[j].ptr) & (SET_CAPACITY - 1);
        /* Move j into the hole unless its home lies cyclically in
         * (hole, j]. */
        int keep = (hole <= j) ? (hole < home && home <= j)
                               : (hole < home || home <= j);
        if (!keep) {
            set.slots[hole] = set.slots[j];
            hole = j;
        }
    }
    set.slots[hole].ptr = NULL;
    set.used--;
    uint16_t *f = &set.filter[h & (FILTER_SIZE - 1)];
    _Py_atomic_store_uint16_relaxed(f, (uint16_t)(*f - 1));
    return 1;
}

static void
set_clear(void)
{
    set_lock();
    memset(set.slots, 0, sizeof(set.slots));
    memset(set.filter, 0, sizeof(set.filter));
    set.used = 0;
    set_unlock();
}

/* Bytes to the next sample: exponential with mean sampling_interval, at
 * least 1. */
static uint64_t
draw_distance(void)
{
    uint64_t x = rng_state;
    if (x == 0) {
        /* splitmix64 of the thread's address and the clock. */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        x = (uint64_t)(uintptr_t)&countdown ^ (uint64_t)ts.tv_nsec
            ^ ((uint64_t)ts.tv_sec << 32);
        x += 0x9e3779b97f4a7c15ULL;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        x ^= x >> 31;
        if (x == 0) {
            x = 1;
        }
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng_state = x;
    /* Uniform in (0, 1]. */
    double u = ((double)((x * 0x2545f4914f6cdd1dULL) >> 11) + 1.0)
               * (1.0 / 9007199254740992.0);
    double d = -log(u) * (double)sampling_interval;
    if (d >= 18446744073709549568.0) {
        return UINT64_MAX;
    }
    return (uint64_t)d + 1;
}

/* The number of sample boundaries that *size* bytes cross, with the
 * countdown moved on.  Not inlined, nor is anything else off the fast
 * paths: the wrapper's functions then need no callee-saved registers. */
static Py_NO_INLINE uint64_t
crossings_slow(uint64_t size)
{
    uint64_t left = countdown ? countdown : draw_distance();
    uint64_t n = 0;
    while (size >= left) {
        size -= left;
        n++;
        left = draw_distance();
    }
    countdown = left - size;
    return n;
}

static inline uint64_t
crossings(size_t size)
{
    uint64_t left = countdown;
    if ((uint64_t)size < left) {
        countdown = left - size;
        return 0;
    }
    return crossings_slow(size);
}

static Py_NO_INLINE void
report_alloc(void *ptr, uint64_t size, uint64_t n)
{
    uint64_t weight = n * sampling_interval;
    set_lock();
    int kept = set_insert(ptr, size, weight);
    set_unlock();
    if (!kept) {
        _Py_atomic_add_uint64(&_PyDTrace_AllocDropped, 1);
        return;
    }
    OTEL_MEMORY_ALLOC(ptr, size, weight);
}

static inline void
sample_alloc(void *ptr, size_t size)
{
    if (ptr == NULL) {
        return;
    }
    uint64_t n = crossings(size);
    if (n != 0) {
        report_alloc(ptr, size, n);
    }
}

static Py_NO_INLINE int
sample_free_slow(void *ptr, struct sampled *out)
{
    struct sampled entry;
    set_lock();
    int found = set_remove(ptr, &entry);
    set_unlock();
    if (found) {
        /* Before the block goes back to the allocator: a thread that gets
         * the same address next reports its alloc after this free. */
        OTEL_MEMORY_FREE(ptr);
        if (out != NULL) {
            *out = entry;
        }
    }
    return found;
}

/* Fire free for *ptr* if it was sampled; *out*, if not NULL, gets its
 * entry.  Almost
 * every free is answered by one load of the filter, without the lock: the
 * insert of a pointer happened before it can be freed, and the counter of
 * its bucket stays above zero while it is in the set. */
static inline int
maybe_sampled(void *ptr)
{
    size_t h = hash_ptr(ptr);
    return (ptr != NULL
            && _Py_atomic_load_uint16_relaxed(
                   &set.filter[h & (FILTER_SIZE - 1)]) != 0);
}

static inline int
sample_free(void *ptr, struct sampled *out)
{
    if (!maybe_sampled(ptr)) {
        return 0;
    }
    return sample_free_slow(ptr, out);
}

static Py_NO_INLINE void
free_slow(PyMemAllocatorEx *b, void *ptr)
{
    (void)sample_free_slow(ptr, NULL);
    b->free(b->ctx, ptr);
}

/* A realloc() that failed keeps its old block: report it again. */
static Py_NO_INLINE void
report_again(void *ptr, const struct sampled *was)
{
    set_lock();
    int kept = set_insert(ptr, was->size, was->weight);
    set_unlock();
    if (!kept) {
        _Py_atomic_add_uint64(&_PyDTrace_AllocDropped, 1);
        return;
    }
    OTEL_MEMORY_ALLOC(ptr, was->size, was->weight);
}

/* The wrapper.  One set of functions per domain: they ignore ctx (see the
 * top of this file).
 *
 * The fast path of an allocation counts its bytes down first and, when no
 * boundary is crossed, tail-calls the allocator under the wrapper.  Calls
 * nested in that allocator must not be sampled again: pymalloc gives the
 * requests of the mem and object domains larger than 512 bytes (and of 0
 * bytes) to PyMem_RawMalloc(), and its realloc() calls its malloc().  So the
 * mem and object domains take the fast path only for 1 to 512 bytes, and
 * otherwise mark the thread as inside the allocator, which the raw domain's
 * functions check first. */
#define NESTING_THRESHOLD 512

static Py_NO_INLINE void *
malloc_slow(PyMemAllocatorEx *b, size_t size)
{
    if (inside) {
        return b->malloc(b->ctx, size);
    }
    inside = 1;
    void *ptr = b->malloc(b->ctx, size);
    inside = 0;
    sample_alloc(ptr, size);
    return ptr;
}

static Py_NO_INLINE void *
calloc_slow(PyMemAllocatorEx *b, size_t nelem, size_t elsize)
{
    if (inside) {
        return b->calloc(b->ctx, nelem, elsize);
    }
    inside = 1;
    void *ptr = b->calloc(b->ctx, nelem, elsize);
    inside = 0;
    sample_alloc(ptr, nelem * elsize);
    return ptr;
}

static Py_NO_INLINE void *
realloc_hook(PyMemAllocatorEx *b, void *old, size_t size)
{
    if (inside) {
        return b->realloc(b->ctx, old, size);
    }
    struct sampled was;
    int sampled = sample_free(old, &was);
    inside = 1;
    void *ptr = b->realloc(b->ctx, old, size);
    inside = 0;
    if (ptr == NULL) {
        if (sampled) {
            report_again(old, &was);
        }
        return NULL;
    }
    sample_alloc(ptr, size);
    return ptr;
}

/* Whether an allocation of *size* bytes can take the fast path: in the
 * raw domain when not nested, in the others for 1 to 512 bytes. */
#define FAST(DOMAIN, size) \
    ((DOMAIN) == PYMEM_DOMAIN_RAW ? !inside \
                                  : (size_t)((size) - 1) < NESTING_THRESHOLD)

#define DEFINE_HOOKS(NAME, DOMAIN) \
    static void * \
    NAME ## _malloc(void *Py_UNUSED(ctx), size_t size) \
    { \
        PyMemAllocatorEx *b = &layers[DOMAIN].below; \
        uint64_t left = countdown; \
        if (FAST(DOMAIN, size) && (uint64_t)size < left) { \
            countdown = left - size; \
            return b->malloc(b->ctx, size); \
        } \
        return malloc_slow(b, size); \
    } \
    static void * \
    NAME ## _calloc(void *Py_UNUSED(ctx), size_t nelem, size_t elsize) \
    { \
        PyMemAllocatorEx *b = &layers[DOMAIN].below; \
        return calloc_slow(b, nelem, elsize); \
    } \
    static void * \
    NAME ## _realloc(void *Py_UNUSED(ctx), void *old, size_t size) \
    { \
        return realloc_hook(&layers[DOMAIN].below, old, size); \
    } \
    static void \
    NAME ## _free(void *Py_UNUSED(ctx), void *ptr) \
    { \
        /* No guard: a nested free (pymalloc's of a large block) finds \
         * the pointer already out of the set. */ \
        PyMemAllocatorEx *b = &layers[DOMAIN].below; \
        if (maybe_sampled(ptr)) { \
            free_slow(b, ptr); \
            return; \
        } \
        b->free(b->ctx, ptr); \
    }

DEFINE_HOOKS(raw, PYMEM_DOMAIN_RAW)
DEFINE_HOOKS(mem, PYMEM_DOMAIN_MEM)
DEFINE_HOOKS(obj, PYMEM_DOMAIN_OBJ)

static const PyMemAllocatorEx hooks[N_DOMAINS] = {
    [PYMEM_DOMAIN_RAW] = {NULL, raw_malloc, raw_calloc, raw_realloc,
                          raw_free},
    [PYMEM_DOMAIN_MEM] = {NULL, mem_malloc, mem_calloc, mem_realloc,
                          mem_free},
    [PYMEM_DOMAIN_OBJ] = {NULL, obj_malloc, obj_calloc, obj_realloc,
                          obj_free},
};

/* Store the four functions of *from* into *to*, one pointer at a time, for
 * the raw-domain readers that do not hold the GIL. */
static void
store_functions(PyMemAllocatorEx *to, const PyMemAllocatorEx *from)
{
    _Py_atomic_store_ptr_release(&to->malloc, (void *)from->malloc);
    _Py_atomic_store_ptr_release(&to->calloc, (void *)from->calloc);
    _Py_atomic_store_ptr_release(&to->realloc, (void *)from->realloc);
    _Py_atomic_store_ptr_release(&to->free, (void *)from->free);
}

PyMemAllocatorEx *
_PyDTrace_AllocBelow(PyMemAllocatorDomain domain, PyMemAllocatorEx *cur)
{
    if ((int)domain >= 0 && (int)domain < N_DOMAINS
        && layers[domain].installed)
    {
        return &layers[domain].below;
    }
    return cur;
}

/* Called with ALLOCATORS_MUTEX held.  A runtime initialized again after
 * Py_Finalize() (an embedding program) starts from the default allocators:
 * a wrapper that is no longer there is not installed. */
static int
forget_lost_wrappers(void)
{
    int lost = 0;
    for (int d = 0; d < N_DOMAINS; d++) {
        if (layers[d].installed
            && _PySeam_Allocator(d)->malloc != hooks[d].malloc)
        {
            layers[d].installed = 0;
            lost = 1;
        }
    }
    return lost;
}

/* The allocators' mutex first, then the world (no-ops but the mutex in
 * the default build, where the GIL is held): a thread that waits for the
 * mutex parks detached and so lets the world stop, whereas the mutex
 * locked with the world stopped could have been handed to a parked thread
 * that cannot run again until the world starts. */
static void
allocators_lock(void)
{
    PyMutex_Lock(_PySeam_AllocatorsMutex());
    _PySeam_StopTheWorldAll();
}

static void
allocators_unlock(void)
{
    _PySeam_StartTheWorldAll();
    PyMutex_Unlock(_PySeam_AllocatorsMutex());
}

static void
wrap(void)
{
    allocators_lock();
    int lost = forget_lost_wrappers();
    for (int d = 0; d < N_DOMAINS; d++) {
        if (layers[d].installed) {
            continue;
        }
        PyMemAllocatorEx *cur = _PySeam_Allocator(d);
        layers[d].below = *cur;
        layers[d].installed = 1;
        /* cur->ctx stays: the wrapper ignores it. */
        store_functions(cur, &hooks[d]);
    }
    allocators_unlock();
    if (lost) {
        set_clear();
    }
}

static void
unwrap(void)
{
    int was_installed = 0;
    allocators_lock();
    was_installed = forget_lost_wrappers();
    for (int d = 0; d < N_DOMAINS; d++) {
        if (!layers[d].installed) {
            continue;
        }
        was_installed = 1;
        PyMemAllocatorEx *cur = _PySeam_Allocator(d);
        /* The ctx of what is under the wrapper first (the wrapper ignores
         * ctx), then its functions. */
        _Py_atomic_store_ptr_release(&cur->ctx, layers[d].below.ctx);
        store_functions(cur, &layers[d].below);
        layers[d].installed = 0;
    }
    allocators_unlock();
    /* No free of these pointers will be reported: forget them, so that a
     * later tracer is not sent a free for an address it never saw.  (Not
     * touched at all while nothing was ever installed.) */
    if (was_installed) {
        set_clear();
    }
}

void
_PyDTrace_AllocApply(PyThreadState *tstate, int armed)
{
    if (!_PySeam_IsMainInterp(tstate->interp)) {
        return;
    }
    if (armed) {
        wrap();
    }
    else if (layers[PYMEM_DOMAIN_RAW].installed
             || layers[PYMEM_DOMAIN_MEM].installed
             || layers[PYMEM_DOMAIN_OBJ].installed)
    {
        /* Only then: the watcher applies the allocation probes' state
         * whenever any probe is armed or disarmed, and the free-threaded
         * build would stop the world for nothing. */
        unwrap();
    }
}

int
_PyDTrace_AllocSetInterval(uint64_t interval)
{
    if (interval == 0) {
        return -1;
    }
    sampling_interval = interval;
    return 0;
}

#endif  /* WITH_DTRACE */
