/* USDT (DTrace / SystemTap) probe helpers (cpython-usdt).
 *
 * See Include/internal/pycore_dtrace.h for the rules every helper follows.
 *
 * function__entry / function__return / line
 * ------------------------------------------
 * These probes reuse the interpreter's lazy PEP 669 instrumentation, through
 * the two tool slots reserved for legacy tracing: sys.setprofile() uses
 * PY_MONITORING_SYS_PROFILE_ID and sys.settrace() PY_MONITORING_SYS_TRACE_ID
 * (Python/legacy_tracing.c).  While a probe is armed, the events it needs
 * are added to the event set of the corresponding slot (see
 * _PyDTrace_LegacyToolEvents()), so exactly the code paths that deliver a
 * 'call'/'return' event to a sys.setprofile() function (or a 'line' event to
 * a sys.settrace() function) reach the hooks below, which fire the probe
 * before any argument boxing.  When the running thread has no profile/trace
 * function the legacy slot is then dropped from the set of tools to call,
 * so an armed probe never allocates.
 *
 *   function__entry(co_filename, co_name, co_firstlineno):
 *       PY_START, PY_RESUME and PY_THROW (setprofile 'call').
 *   function__return(co_filename, co_name, line of the returning
 *       instruction): PY_RETURN, PY_YIELD and PY_UNWIND (setprofile
 *       'return').
 *   line(co_filename, co_name, line): LINE, plus backward JUMPs to the start
 *       of the same line (settrace 'line').
 *
 * Like the legacy callbacks, no probe fires while tstate->tracing is set
 * (i.e. inside a sys.setprofile()/sys.settrace()/sys.monitoring callback).
 *
 * Arming: probe semaphores are bumped by the tracer without any
 * notification.  They are checked once at start-up (_PyDTrace_Init()), and a
 * native watcher thread (no Python thread state) polls them every 100 ms; on
 * a change it schedules dtrace_reconfigure() with _PyEval_AddPendingCall() so
 * the event sets are updated by a thread holding the GIL at its next
 * eval-breaker check.  The watcher thread can be disabled by setting the
 * environment variable PYTHONDTRACEWATCH=0 (probes armed after start-up are
 * then only noticed at the next sys.setprofile()/sys.settrace() call).  Only
 * the main interpreter is handled.
 */

#include "Python.h"
#include "pycore_ceval.h"         // _PyEval_AddPendingCall()
#include "pycore_code.h"          // _PyCode_CODE()
#include "pycore_dict.h"          // _PyDict_HasOnlyStringKeys()
#include "pycore_dtrace.h"
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_initconfig.h"    // _Py_GetEnv()
#include "pycore_instruments.h"   // _PyMonitoring_SetEvents()
#include "pycore_interp.h"        // PyInterpreterState.sys_profiling_threads
#include "pycore_pyatomic_ft_wrappers.h"
#include "pycore_pystate.h"       // _PyThreadState_GET()

#include <string.h>

#define UNKNOWN "<unknown>"

/* ------------------------------------------------------------------------
 * str -> C string, without allocation
 * ------------------------------------------------------------------------ */

static size_t
encode_utf8_char(Py_UCS4 ch, char *out)
{
    if (ch < 0x80) {
        out[0] = (char)ch;
        return 1;
    }
    if (ch < 0x800) {
        out[0] = (char)(0xc0 | (ch >> 6));
        out[1] = (char)(0x80 | (ch & 0x3f));
        return 2;
    }
    if (ch >= 0xd800 && ch <= 0xdfff) {
        /* Lone surrogate: not encodable in UTF-8. */
        out[0] = '?';
        return 1;
    }
    if (ch < 0x10000) {
        out[0] = (char)(0xe0 | (ch >> 12));
        out[1] = (char)(0x80 | ((ch >> 6) & 0x3f));
        out[2] = (char)(0x80 | (ch & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (ch >> 18));
    out[1] = (char)(0x80 | ((ch >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((ch >> 6) & 0x3f));
    out[3] = (char)(0x80 | (ch & 0x3f));
    return 4;
}

const char *
_PyDTrace_StrAsUTF8(PyObject *s, char *buf, size_t size)
{
    if (s == NULL || !PyUnicode_Check(s)) {
        return UNKNOWN;
    }
    if (PyUnicode_IS_COMPACT_ASCII(s)) {
        return (const char *)PyUnicode_DATA(s);
    }
    if (PyUnicode_IS_COMPACT(s)) {
        const char *utf8 = FT_ATOMIC_LOAD_PTR_ACQUIRE(
            ((PyCompactUnicodeObject *)s)->utf8);
        if (utf8 != NULL) {
            return utf8;
        }
    }
    if (buf == NULL || size == 0) {
        return UNKNOWN;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    size_t pos = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        char tmp[4];
        size_t n = encode_utf8_char(PyUnicode_READ(kind, data, i), tmp);
        if (pos + n >= size) {
            /* Truncate at a character boundary, keep room for the NUL. */
            break;
        }
        memcpy(buf + pos, tmp, n);
        pos += n;
    }
    buf[pos] = '\0';
    return buf;
}

#ifdef WITH_DTRACE

/* ------------------------------------------------------------------------
 * Arming
 * ------------------------------------------------------------------------ */

#define ARMED_FUNCTION 0x1
#define ARMED_LINE 0x2

/* Event sets installed by Python/legacy_tracing.c when some thread has a
 * profile/trace function (kept in sync with _PyEval_SetProfile() and
 * _PyEval_SetTrace()). */
#define EV(name) (1 << PY_MONITORING_EVENT_ ## name)
#define FUNCTION_EVENTS \
    (EV(PY_START) | EV(PY_RESUME) | EV(PY_THROW) \
     | EV(PY_RETURN) | EV(PY_YIELD) | EV(PY_UNWIND))
#define LINE_EVENTS (EV(LINE) | EV(JUMP))
#define LEGACY_PROFILE_EVENTS (FUNCTION_EVENTS | EV(CALL))
#define LEGACY_TRACE_EVENTS \
    (FUNCTION_EVENTS | LINE_EVENTS | EV(RAISE) | EV(STOP_ITERATION))

static int
probes_armed(void)
{
    int armed = 0;
    if (PyDTrace_FUNCTION_ENTRY_ENABLED()
        || PyDTrace_FUNCTION_RETURN_ENABLED())
    {
        armed |= ARMED_FUNCTION;
    }
    if (PyDTrace_LINE_ENABLED()) {
        armed |= ARMED_LINE;
    }
    return armed;
}

uint32_t
_PyDTrace_LegacyToolEvents(PyInterpreterState *interp, int tool)
{
    if (!_Py_IsMainInterpreter(interp)) {
        return 0;
    }
    int armed = probes_armed();
    if (tool == PY_MONITORING_SYS_PROFILE_ID && (armed & ARMED_FUNCTION)) {
        return FUNCTION_EVENTS;
    }
    if (tool == PY_MONITORING_SYS_TRACE_ID && (armed & ARMED_LINE)) {
        return LINE_EVENTS;
    }
    return 0;
}

/* Install on both legacy slots: (what legacy tracing needs) | (what the
 * armed probes need).  Called with the GIL held (or attached, free-threaded
 * build) in the main interpreter. */
static void
dtrace_configure(PyInterpreterState *interp)
{
    uint32_t profile = 0;
    uint32_t trace = 0;
#ifdef Py_GIL_DISABLED
    PyMutex_Lock(&_PyRuntime.ceval.sys_trace_profile_mutex);
#endif
    if (interp->sys_profiling_threads) {
        profile = LEGACY_PROFILE_EVENTS;
    }
    if (interp->sys_tracing_threads) {
        trace = LEGACY_TRACE_EVENTS;
    }
#ifdef Py_GIL_DISABLED
    PyMutex_Unlock(&_PyRuntime.ceval.sys_trace_profile_mutex);
#endif
    profile |= _PyDTrace_LegacyToolEvents(interp,
                                          PY_MONITORING_SYS_PROFILE_ID);
    trace |= _PyDTrace_LegacyToolEvents(interp, PY_MONITORING_SYS_TRACE_ID);

    PyObject *exc = PyErr_GetRaisedException();
    if (_PyMonitoring_SetEvents(PY_MONITORING_SYS_PROFILE_ID, profile) < 0) {
        PyErr_Clear();
    }
    if (_PyMonitoring_SetEvents(PY_MONITORING_SYS_TRACE_ID, trace) < 0) {
        PyErr_Clear();
    }
    PyErr_SetRaisedException(exc);
}

/* ------------------------------------------------------------------------
 * Watcher thread
 * ------------------------------------------------------------------------ */

#include <pthread.h>
#include <time.h>

#define WATCH_INTERVAL_NS (100 * 1000 * 1000)

static struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    pthread_t thread;
    int enabled;        /* PYTHONDTRACEWATCH is not "0" */
    int running;        /* the thread exists (not joined yet) */
    int exited;         /* the thread left its loop on its own */
    int stop;           /* stop request */
    int finalizing;     /* Py_Finalize() started: no more reconfiguration */
    int last_armed;     /* armed state last seen and scheduled */
    PyInterpreterState *interp;
} watcher = {
    .mutex = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,
};

/* Pending call: runs in a thread of the main interpreter, at its next
 * eval-breaker check. */
static int
dtrace_reconfigure(void *Py_UNUSED(arg))
{
    PyThreadState *tstate = _PyThreadState_GET();
    if (tstate == NULL || !_Py_IsMainInterpreter(tstate->interp)
        || _Py_atomic_load_int(&watcher.finalizing))
    {
        return 0;
    }
    dtrace_configure(tstate->interp);
    return 0;
}

static void *
watcher_main(void *Py_UNUSED(arg))
{
    pthread_mutex_lock(&watcher.mutex);
    while (!watcher.stop) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += WATCH_INTERVAL_NS;
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec += 1;
            deadline.tv_nsec -= 1000000000;
        }
        (void)pthread_cond_timedwait(&watcher.cond, &watcher.mutex,
                                     &deadline);
        if (watcher.stop) {
            break;
        }
        /* A native thread keeps the process alive: leave once the
         * interpreter has no thread left, e.g. in a child forked from a
         * non-main thread, whose only thread exits with pthread_exit(). */
        if (_Py_atomic_load_ptr_relaxed(&watcher.interp->threads.head)
            == NULL)
        {
            watcher.exited = 1;
            break;
        }
        int armed = probes_armed();
        if (armed == watcher.last_armed) {
            continue;
        }
        pthread_mutex_unlock(&watcher.mutex);
        _Py_add_pending_call_result res = _PyEval_AddPendingCall(
            watcher.interp, dtrace_reconfigure, NULL, 0);
        pthread_mutex_lock(&watcher.mutex);
        if (res == _Py_ADD_PENDING_SUCCESS) {
            watcher.last_armed = armed;
        }
        /* else: queue full, retry at the next poll */
    }
    pthread_mutex_unlock(&watcher.mutex);
    return NULL;
}

static void
watcher_start(void)
{
    pthread_mutex_lock(&watcher.mutex);
    if (watcher.enabled && !watcher.running && !watcher.finalizing) {
        sigset_t all, old;
        watcher.stop = 0;
        watcher.exited = 0;
        /* The watcher must never handle a signal. */
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &old);
        if (pthread_create(&watcher.thread, NULL, watcher_main, NULL) == 0) {
            watcher.running = 1;
        }
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_mutex_unlock(&watcher.mutex);
}

static void
watcher_stop(void)
{
    pthread_mutex_lock(&watcher.mutex);
    if (!watcher.running) {
        pthread_mutex_unlock(&watcher.mutex);
        return;
    }
    watcher.stop = 1;
    pthread_cond_signal(&watcher.cond);
    pthread_mutex_unlock(&watcher.mutex);
    (void)pthread_join(watcher.thread, NULL);
    pthread_mutex_lock(&watcher.mutex);
    watcher.running = 0;
    pthread_mutex_unlock(&watcher.mutex);
}

void
_PyDTrace_Init(PyThreadState *tstate)
{
    PyInterpreterState *interp = tstate->interp;
    if (!_Py_IsMainInterpreter(interp)) {
        return;
    }
    /* PYTHONDTRACEWATCH=0 disables the watcher thread (ignored with -E). */
    const PyConfig *config = _PyInterpreterState_GetConfig(interp);
    const char *env = _Py_GetEnv(config->use_environment,
                                 "PYTHONDTRACEWATCH");
    watcher.enabled = !(env != NULL && strcmp(env, "0") == 0);
    watcher.interp = interp;
    watcher.finalizing = 0;

    /* Probes armed before start-up (e.g. bpftrace -c): arm now so that the
     * program's first statement is seen. */
    watcher.last_armed = probes_armed();
    if (watcher.last_armed) {
        dtrace_configure(interp);
    }
    watcher_start();
}

void
_PyDTrace_Fini(void)
{
    _Py_atomic_store_int(&watcher.finalizing, 1);
    watcher_stop();
}

void
_PyDTrace_BeforeFork(void)
{
    watcher_stop();
}

void
_PyDTrace_AfterForkParent(void)
{
    watcher_start();
}

void
_PyDTrace_AfterForkChild(void)
{
    /* The thread was joined before fork(); only re-create the sync
     * primitives in case fork() happened without PyOS_BeforeFork(). */
    pthread_mutex_init(&watcher.mutex, NULL);
    pthread_cond_init(&watcher.cond, NULL);
    watcher.running = 0;
    watcher_start();
}

/* os.fork() warns when the process has more than one thread: don't count
 * the watcher. */
Py_ssize_t
_PyDTrace_AdjustThreadCount(Py_ssize_t num_threads)
{
    pthread_mutex_lock(&watcher.mutex);
    if (watcher.running && !watcher.exited && num_threads > 1) {
        num_threads--;
    }
    pthread_mutex_unlock(&watcher.mutex);
    return num_threads;
}

/* ------------------------------------------------------------------------
 * function__entry, function__return, line
 * ------------------------------------------------------------------------ */

static void
fire_function(int event, _PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    int entry;
    switch (event) {
        case PY_MONITORING_EVENT_PY_START:
        case PY_MONITORING_EVENT_PY_RESUME:
        case PY_MONITORING_EVENT_PY_THROW:
            if (!PyDTrace_FUNCTION_ENTRY_ENABLED()) {
                return;
            }
            entry = 1;
            break;
        case PY_MONITORING_EVENT_PY_RETURN:
        case PY_MONITORING_EVENT_PY_YIELD:
        case PY_MONITORING_EVENT_PY_UNWIND:
            if (!PyDTrace_FUNCTION_RETURN_ENABLED()) {
                return;
            }
            entry = 0;
            break;
        default:
            return;
    }
    PyCodeObject *code = _PyFrame_GetCode(frame);
    char filebuf[_PyDTrace_STRBUF_SIZE];
    char namebuf[_PyDTrace_STRBUF_SIZE];
    const char *filename = _PyDTrace_StrAsUTF8(code->co_filename, filebuf,
                                               sizeof(filebuf));
    const char *funcname = _PyDTrace_StrAsUTF8(code->co_name, namebuf,
                                               sizeof(namebuf));
    if (entry) {
        PyDTrace_FUNCTION_ENTRY(filename, funcname, code->co_firstlineno);
    }
    else {
        int offset = (int)(instr - _PyCode_CODE(code));
        int lineno = PyCode_Addr2Line(code,
                                      offset * (int)sizeof(_Py_CODEUNIT));
        PyDTrace_FUNCTION_RETURN(filename, funcname, lineno);
    }
}

uint8_t
_PyDTrace_LegacyEvent(PyThreadState *tstate, int event,
                      _PyInterpreterFrame *frame, _Py_CODEUNIT *instr,
                      uint8_t tools)
{
    if (tools & (1 << PY_MONITORING_SYS_PROFILE_ID)) {
        fire_function(event, frame, instr);
        if (tstate->c_profilefunc == NULL) {
            tools &= ~(1 << PY_MONITORING_SYS_PROFILE_ID);
        }
    }
    if ((tools & (1 << PY_MONITORING_SYS_TRACE_ID))
        && tstate->c_tracefunc == NULL)
    {
        tools &= ~(1 << PY_MONITORING_SYS_TRACE_ID);
    }
    return tools;
}

static int
instr_line(PyCodeObject *code, int index)
{
    if (code->_co_monitoring != NULL
        && code->_co_monitoring->lines != NULL)
    {
        return _Py_Instrumentation_GetLine(code, index);
    }
    return PyCode_Addr2Line(code, index * (int)sizeof(_Py_CODEUNIT));
}

uint8_t
_PyDTrace_LegacyJump(PyThreadState *tstate, _PyInterpreterFrame *frame,
                     _Py_CODEUNIT *instr, _Py_CODEUNIT *target,
                     uint8_t tools)
{
    /* Same rule as sys_trace_jump_func() in Python/legacy_tracing.c: a
     * backward jump within a line is reported as a new line. */
    if (PyDTrace_LINE_ENABLED()) {
        PyCodeObject *code = _PyFrame_GetCode(frame);
        int from = (int)(instr - _PyCode_CODE(code));
        int to = (int)(target - _PyCode_CODE(code));
        if (to <= from) {
            int to_line = instr_line(code, to);
            if (to_line >= 0 && to_line == instr_line(code, from)) {
                _PyDTrace_FireLine(frame, to_line);
            }
        }
    }
    if (tstate->c_tracefunc == NULL) {
        tools &= ~(1 << PY_MONITORING_SYS_TRACE_ID);
    }
    return tools;
}

void
_PyDTrace_FireLine(_PyInterpreterFrame *frame, int line)
{
    if (line < 0) {
        return;
    }
    PyCodeObject *code = _PyFrame_GetCode(frame);
    char filebuf[_PyDTrace_STRBUF_SIZE];
    char namebuf[_PyDTrace_STRBUF_SIZE];
    PyDTrace_LINE(
        _PyDTrace_StrAsUTF8(code->co_filename, filebuf, sizeof(filebuf)),
        _PyDTrace_StrAsUTF8(code->co_name, namebuf, sizeof(namebuf)),
        line);
}

/* ------------------------------------------------------------------------
 * instance__new__start/done, instance__delete__start/done
 * ------------------------------------------------------------------------ */

/* The module name of a heap type: its own __module__ entry.  The lookup is
 * only done if the type dict has str keys only, so that no __eq__ can run;
 * it neither sets nor clears an exception. */
static const char *
type_module_name(PyTypeObject *type, char *buf, size_t size)
{
    PyObject *dict = type->tp_dict;
    if (dict == NULL || !PyDict_CheckExact(dict)
        || !_PyDict_HasOnlyStringKeys(dict))
    {
        return UNKNOWN;
    }
    PyObject *name = &_Py_ID(__module__);
    Py_hash_t hash = _PyASCIIObject_CAST(name)->hash;
    if (hash == -1) {
        return UNKNOWN;
    }
    PyObject *mod = _PyDict_GetItem_KnownHash(dict, name, hash);
    return _PyDTrace_StrAsUTF8(mod, buf, size);
}

#define FIRE_INSTANCE(PROBE, type) \
    do { \
        char modbuf[_PyDTrace_STRBUF_SIZE]; \
        const char *tname = (type)->tp_name ? (type)->tp_name : UNKNOWN; \
        PROBE(tname, type_module_name((type), modbuf, sizeof(modbuf))); \
    } while (0)

void
_PyDTrace_FireInstanceNewStart(PyTypeObject *type)
{
    FIRE_INSTANCE(PyDTrace_INSTANCE_NEW_START, type);
}

void
_PyDTrace_FireInstanceNewDone(PyTypeObject *type)
{
    FIRE_INSTANCE(PyDTrace_INSTANCE_NEW_DONE, type);
}

PyTypeObject *
_PyDTrace_FireInstanceDeleteStart(PyTypeObject *type)
{
    if (PyDTrace_INSTANCE_DELETE_START_ENABLED()) {
        FIRE_INSTANCE(PyDTrace_INSTANCE_DELETE_START, type);
    }
    if (PyDTrace_INSTANCE_DELETE_DONE_ENABLED()) {
        return (PyTypeObject *)Py_NewRef(type);
    }
    return NULL;
}

void
_PyDTrace_FireInstanceDeleteDone(PyTypeObject *type)
{
    if (PyDTrace_INSTANCE_DELETE_DONE_ENABLED()) {
        FIRE_INSTANCE(PyDTrace_INSTANCE_DELETE_DONE, type);
    }
    Py_DECREF(type);
}

#endif  /* WITH_DTRACE */
