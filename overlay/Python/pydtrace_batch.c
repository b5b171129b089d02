/* python:batch: function events as records, one marker per buffer
 * (cpython-usdt).
 *
 * Every hit of function__entry/function__return is a uprobe trap, which
 * costs more than the Python call it reports.  While a tracer has the
 * marker python:batch armed, the hook of the legacy profile slot
 * (_PyDTrace_LegacyEvent(), Python/pydtrace_probes.c) writes instead one
 * fixed-size record per function event into a buffer of the current
 * thread, and this file fires
 *
 *   python:batch(void *records, int count, int record_size, int version,
 *                long lost, int thread)
 *
 * once per batch: a tracer reads the *count* records at *records* from
 * the process's memory inside the probe and aggregates them (one trap per
 * up to _PyDTrace_BATCH_CAPACITY events instead of one per event).
 * *thread* is the kernel's id of the thread whose events the records are
 * (the marker may fire in another thread: see "The marker fires"); the
 * batches of one thread fire in the order of its events, never two at
 * once.
 *
 * Record layout, version 1 (_PyDTrace_BATCH_VERSION), 24 bytes, in the
 * process's byte order (struct _PyDTrace_BatchRecord):
 *
 *   offset 0   uint64  code: the address of the code object (PyCodeObject)
 *   offset 8   uint64  time: CLOCK_MONOTONIC in ns (bpftrace's nsecs)
 *   offset 16  uint32  kind: 1 start (PY_START), 2 resume (PY_RESUME),
 *                      3 throw (PY_THROW): sys.setprofile()'s 'call';
 *                      4 return (PY_RETURN), 5 yield (PY_YIELD),
 *                      6 unwind (PY_UNWIND): sys.setprofile()'s 'return'
 *   offset 20  uint32  code_version: the code object's co_version, which
 *                      tells a code object from a later one at the same
 *                      address (usdt.stacks reads it the same way)
 *
 * Exactly the events that fire function__entry and function__return,
 * in the order they happen in the thread; a consumer that wants only some
 * kinds skips the others (the events are installed anyway for the
 * marker, and writing a record costs less than deciding not to).
 *
 * The marker fires, with the records not yet handed over:
 *   - when the buffer is full (_PyDTrace_BATCH_CAPACITY records);
 *   - at the first event after the oldest record in the buffer became
 *     older than _PyDTrace_BATCH_MAX_AGE_NS (before that event's record,
 *     so that the records of a batch are less than that apart);
 *   - at each poll of the watcher thread (Python/pydtrace_arming.c, once
 *     a second), for every thread's buffer, in the watcher thread: so a
 *     thread that blocks, or runs no Python code, with a partial buffer
 *     delivers it within a poll, and a tracer that waits a poll before it
 *     detaches has every record written before it began to wait;
 *   - before a code object that a buffer's records name is freed
 *     (_PyDTrace_BatchCodeFreed(), from code_dealloc()), for those
 *     buffers, so that a tracer can still read the code object's names;
 *   - at thread exit (a pthread key's destructor, so every thread that
 *     ever wrote a record, with or without a thread state);
 *   - at process exit (atexit()), for the buffers of every thread: the
 *     main thread's and those of threads still alive, which no longer
 *     run Python code once the interpreter is finalized.
 * It fires only while armed: records written for a tracer that has left
 * are dropped at the next flush.  The time of a batch's first record
 * tells a tracer that arrives later whether the batch was written for an
 * earlier tracer (the buffer of a thread that was idle since it left).
 *
 * *lost* counts the events of this thread that no record of this batch
 * or of an earlier one holds: when a thread's buffer cannot be allocated,
 * the marker fires at once with no records and *lost* 1, for each event
 * (and the allocation is tried again at the next one).  A consumer
 * reports the sum, so no loss is silent.
 *
 * Handing over a buffer from another thread: the owner thread writes a
 * record, then publishes it by a release store of the buffer's *head*,
 * without a lock.  Whoever fires (the owner, the watcher, a code
 * object's dealloc, exit) holds the buffer's lock, reads *head* with
 * acquire, fires the records from *tail* to there, and moves *tail* up:
 * no record is handed over twice or torn.  Only the owner moves *head*
 * back to 0, under the lock, once the buffer is full.
 *
 * fork(): the child keeps only the forking thread, whose buffer starts
 * empty in the child; the other threads' buffers are freed.
 *
 * Nothing here allocates a Python object, runs Python code or touches an
 * exception: the buffers come from malloc(), once per thread.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef WITH_DTRACE

struct batch_buffer {
    struct batch_buffer *prev;  /* all buffers: guarded by buffers_mutex */
    struct batch_buffer *next;
    pthread_mutex_t lock;       /* held while firing and moving tail */
    int head;                   /* records written: the owner's, atomic */
    int tail;                   /* records handed over: under lock */
    int thread;                 /* the owner's kernel thread id */
    struct _PyDTrace_BatchRecord records[_PyDTrace_BATCH_CAPACITY];
};

static _Py_thread_local struct batch_buffer *this_buffer;
/* Guards the list of buffers; taken before a buffer's lock, never after. */
static pthread_mutex_t buffers_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct batch_buffer *buffers;
static pthread_key_t buffer_key;
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static int setup_ok;

static int
kernel_thread_id(void)
{
#ifdef SYS_gettid
    return (int)syscall(SYS_gettid);
#else
    return 0;
#endif
}

/* Fire the records from tail to head, with b->lock held; they are handed
 * over (or dropped, if no tracer has the marker armed). */
static void
fire_locked(struct batch_buffer *b)
{
    int head = _Py_atomic_load_int_acquire(&b->head);
    int tail = b->tail;
    if (head > tail) {
        if (PyDTrace_BATCH_ENABLED()) {
            PyDTrace_BATCH(&b->records[tail], head - tail,
                           (int)sizeof(struct _PyDTrace_BatchRecord),
                           _PyDTrace_BATCH_VERSION, 0L, b->thread);
        }
        _Py_atomic_store_int_relaxed(&b->tail, head);
    }
}

/* The owner's flush: hand over what is left, and start the buffer over. */
static void
fire_own(struct batch_buffer *b)
{
    pthread_mutex_lock(&b->lock);
    fire_locked(b);
    _Py_atomic_store_int_relaxed(&b->tail, 0);
    _Py_atomic_store_int_release(&b->head, 0);
    pthread_mutex_unlock(&b->lock);
}

static void
unlink_buffer(struct batch_buffer *b)
{
    if (b->prev != NULL) {
        b->prev->next = b->next;
    }
    else {
        buffers = b->next;
    }
    if (b->next != NULL) {
        b->next->prev = b->prev;
    }
}

/* Thread exit: the pthread key's destructor, in the exiting thread. */
static void
thread_exit(void *arg)
{
    struct batch_buffer *b = (struct batch_buffer *)arg;
    pthread_mutex_lock(&buffers_mutex);
    pthread_mutex_lock(&b->lock);
    fire_locked(b);
    pthread_mutex_unlock(&b->lock);
    unlink_buffer(b);
    pthread_mutex_unlock(&buffers_mutex);
    if (this_buffer == b) {
        this_buffer = NULL;
    }
    pthread_mutex_destroy(&b->lock);
    free(b);
}

/* Every buffer's records that are not handed over yet. */
static void
fire_all(void)
{
    pthread_mutex_lock(&buffers_mutex);
    for (struct batch_buffer *b = buffers; b != NULL; b = b->next) {
        pthread_mutex_lock(&b->lock);
        fire_locked(b);
        pthread_mutex_unlock(&b->lock);
    }
    pthread_mutex_unlock(&buffers_mutex);
}

/* Process exit (atexit(), after Py_Finalize()): every buffer that is
 * left. */
static void
process_exit(void)
{
    fire_all();
}

/* The watcher's poll (Python/pydtrace_arming.c), in the watcher thread:
 * every thread's records written since its last batch are handed over, or
 * dropped if no tracer has the marker armed any more. */
void
_PyDTrace_BatchPoll(void)
{
    if (buffers == NULL) {
        return;
    }
    fire_all();
}

void
_PyDTrace_BatchCodeFreed(PyCodeObject *code)
{
    uint64_t address = (uint64_t)(uintptr_t)code;
    pthread_mutex_lock(&buffers_mutex);
    for (struct batch_buffer *b = buffers; b != NULL; b = b->next) {
        pthread_mutex_lock(&b->lock);
        int head = _Py_atomic_load_int_acquire(&b->head);
        for (int i = b->tail; i < head; i++) {
            if (b->records[i].code == address) {
                fire_locked(b);
                break;
            }
        }
        pthread_mutex_unlock(&b->lock);
    }
    pthread_mutex_unlock(&buffers_mutex);
}

/* In the child, inside fork(): only the forking thread is left. */
static void
atfork_child(void)
{
    pthread_mutex_init(&buffers_mutex, NULL);
    struct batch_buffer *b = buffers;
    while (b != NULL) {
        struct batch_buffer *next = b->next;
        if (b != this_buffer) {
            free(b);
        }
        b = next;
    }
    buffers = this_buffer;
    if (this_buffer != NULL) {
        pthread_mutex_init(&this_buffer->lock, NULL);
        this_buffer->prev = NULL;
        this_buffer->next = NULL;
        this_buffer->head = 0;
        this_buffer->tail = 0;
        this_buffer->thread = kernel_thread_id();
    }
}

static void
setup(void)
{
    if (pthread_key_create(&buffer_key, thread_exit) != 0) {
        return;
    }
    if (atexit(process_exit) != 0) {
        return;
    }
    if (pthread_atfork(NULL, NULL, atfork_child) != 0) {
        return;
    }
    setup_ok = 1;
}

static struct batch_buffer *
new_buffer(void)
{
    (void)pthread_once(&setup_once, setup);
    if (!setup_ok) {
        return NULL;
    }
    struct batch_buffer *b = malloc(sizeof(*b));
    if (b == NULL) {
        return NULL;
    }
    if (pthread_mutex_init(&b->lock, NULL) != 0) {
        free(b);
        return NULL;
    }
    b->head = 0;
    b->tail = 0;
    b->thread = kernel_thread_id();
    if (pthread_setspecific(buffer_key, b) != 0) {
        pthread_mutex_destroy(&b->lock);
        free(b);
        return NULL;
    }
    pthread_mutex_lock(&buffers_mutex);
    b->prev = NULL;
    b->next = buffers;
    if (buffers != NULL) {
        buffers->prev = b;
    }
    buffers = b;
    pthread_mutex_unlock(&buffers_mutex);
    return b;
}

void
_PyDTrace_BatchRecord(int event, _PyInterpreterFrame *frame)
{
    uint32_t kind;
    switch (event) {
        case PY_MONITORING_EVENT_PY_START:
            kind = _PyDTrace_BATCH_START;
            break;
        case PY_MONITORING_EVENT_PY_RESUME:
            kind = _PyDTrace_BATCH_RESUME;
            break;
        case PY_MONITORING_EVENT_PY_THROW:
            kind = _PyDTrace_BATCH_THROW;
            break;
        case PY_MONITORING_EVENT_PY_RETURN:
            kind = _PyDTrace_BATCH_RETURN;
            break;
        case PY_MONITORING_EVENT_PY_YIELD:
            kind = _PyDTrace_BATCH_YIELD;
            break;
        case PY_MONITORING_EVENT_PY_UNWIND:
            kind = _PyDTrace_BATCH_UNWIND;
            break;
        default:
            return;
    }
    /* Only the events of the selected code (Python/pydtrace_select.c), as
     * function__entry and function__return fire them. */
    if (!_PyDTrace_FrameSelected(frame, event)) {
        return;
    }
    struct batch_buffer *b = this_buffer;
    if (b == NULL) {
        b = new_buffer();
        if (b == NULL) {
            PyDTrace_BATCH(NULL, 0, (int)sizeof(struct _PyDTrace_BatchRecord),
                           _PyDTrace_BATCH_VERSION, 1L, kernel_thread_id());
            return;
        }
        this_buffer = b;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    /* Only this thread writes head: a plain read of its own value. */
    int head = b->head;
    /* Records of a batch are less than _PyDTrace_BATCH_MAX_AGE_NS apart:
     * a consumer that started in between tells its records from an
     * earlier tracer's by the batch's first record.  tail moves under
     * the lock; a stale read only makes this flush early. */
    int tail = _Py_atomic_load_int_relaxed(&b->tail);
    if (head > tail
        && now - b->records[tail].time >= _PyDTrace_BATCH_MAX_AGE_NS)
    {
        fire_own(b);
        head = 0;
    }
    PyCodeObject *code = _PySeam_FrameCode(frame);
    struct _PyDTrace_BatchRecord *r = &b->records[head];
    r->code = (uint64_t)(uintptr_t)code;
    r->time = now;
    r->kind = kind;
    r->code_version = _PySeam_CodeVersion(code);
    _Py_atomic_store_int_release(&b->head, head + 1);
    if (head + 1 == _PyDTrace_BATCH_CAPACITY) {
        fire_own(b);
    }
}

#endif  /* WITH_DTRACE */
