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
 *                long lost)
 *
 * once per buffer: a tracer reads the *count* records at *records* from
 * the process's memory inside the probe and aggregates them (one trap per
 * _PyDTrace_BATCH_CAPACITY events instead of one per event).
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
 * The marker fires:
 *   - when the buffer is full (_PyDTrace_BATCH_CAPACITY records);
 *   - at the first event after the oldest record in the buffer became
 *     older than _PyDTrace_BATCH_MAX_AGE_NS (before that event's record,
 *     so that the records of a batch are less than that apart);
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
#include <time.h>

#ifdef WITH_DTRACE

struct batch_buffer {
    struct batch_buffer *prev;  /* all buffers: guarded by buffers_mutex */
    struct batch_buffer *next;
    int count;
    uint64_t oldest;            /* time of records[0] */
    struct _PyDTrace_BatchRecord records[_PyDTrace_BATCH_CAPACITY];
};

static _Py_thread_local struct batch_buffer *this_buffer;
static pthread_mutex_t buffers_mutex = PTHREAD_MUTEX_INITIALIZER;
static struct batch_buffer *buffers;
static pthread_key_t buffer_key;
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static int setup_ok;

static void
fire(struct batch_buffer *b)
{
    if (b->count > 0) {
        if (PyDTrace_BATCH_ENABLED()) {
            PyDTrace_BATCH(b->records, b->count,
                           (int)sizeof(struct _PyDTrace_BatchRecord),
                           _PyDTrace_BATCH_VERSION, 0L);
        }
        b->count = 0;
    }
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

/* Thread exit: the pthread key's destructor, in the exiting thread.  The
 * mutex keeps process_exit() from handing over the same records. */
static void
thread_exit(void *arg)
{
    struct batch_buffer *b = (struct batch_buffer *)arg;
    pthread_mutex_lock(&buffers_mutex);
    fire(b);
    unlink_buffer(b);
    pthread_mutex_unlock(&buffers_mutex);
    if (this_buffer == b) {
        this_buffer = NULL;
    }
    free(b);
}

/* Process exit: every buffer that is left.  The other threads no longer
 * run Python code once the interpreter is finalized (in the default
 * build; a daemon thread of the free-threaded build could still be
 * writing to its buffer: not handled yet). */
static void
process_exit(void)
{
    pthread_mutex_lock(&buffers_mutex);
    for (struct batch_buffer *b = buffers; b != NULL; b = b->next) {
        fire(b);
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
        this_buffer->prev = NULL;
        this_buffer->next = NULL;
        this_buffer->count = 0;
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
    b->count = 0;
    b->oldest = 0;
    if (pthread_setspecific(buffer_key, b) != 0) {
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
                           _PyDTrace_BATCH_VERSION, 1L);
            return;
        }
        this_buffer = b;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    /* Records of a batch are less than _PyDTrace_BATCH_MAX_AGE_NS apart:
     * a consumer that started in between tells its records from an
     * earlier tracer's by the batch's first record. */
    if (b->count > 0 && now - b->oldest >= _PyDTrace_BATCH_MAX_AGE_NS) {
        fire(b);
    }
    if (b->count == 0) {
        b->oldest = now;
    }
    PyCodeObject *code = _PySeam_FrameCode(frame);
    struct _PyDTrace_BatchRecord *r = &b->records[b->count++];
    r->code = (uint64_t)(uintptr_t)code;
    r->time = now;
    r->kind = kind;
    r->code_version = _PySeam_CodeVersion(code);
    if (b->count == _PyDTrace_BATCH_CAPACITY) {
        fire(b);
    }
}

#endif  /* WITH_DTRACE */
