/* Arming the USDT probes that need instrumentation (cpython-usdt).
 *
 * function__entry, function__return, line, cfunction__entry/return and
 * exception__raise/reraise/handled fire from the PEP 669 events of the two
 * tool slots reserved for legacy tracing (see Python/pydtrace_probes.c).  A tracer arms a probe by bumping its
 * semaphore, without notifying the process, so this file notices the
 * change and adds the events the armed probes need to those slots, in
 * every interpreter:
 *
 *   - once when an interpreter starts, before its first Python frame
 *     (_PyDTrace_Init(), called from pycore_interp_init()), so a tracer
 *     present at start-up sees importlib's bootstrap, encodings and site;
 *   - afterwards from a native watcher thread ("py-usdt-watch", no thread
 *     state) that reads the semaphores once per second and, on a change,
 *     schedules dtrace_reconfigure() as a pending call in each interpreter
 *     whose event sets are out of date.  The pending call runs at the next
 *     eval-breaker check of a thread of that interpreter.
 *
 * The same watcher turns the perf-map trampoline on and off for the marker
 * python:stacks__enable (Python/pydtrace_stacks.c); the main interpreter
 * applies it from the pending call only, never from _PyDTrace_Init(),
 * which runs before -X perf sets up the program's own trampoline.
 *
 * It also puts the allocator wrapper of the otel_memory probes on and takes
 * it off (Python/pydtrace_alloc.c), from the main interpreter's pending
 * call, and from _PyDTrace_Init() when they are armed at start-up.
 *
 * The watcher is disabled with -X dtrace_watch=0 or PYTHONDTRACEWATCH=0;
 * probes armed later are then only noticed at the next sys.setprofile() or
 * sys.settrace() call.  The marker python:stacks__enable does something
 * only in a process started with -X dtrace_stacks or PYTHONDTRACESTACKS=1.
 *
 * Arming must stay invisible to Python code: the events that only the
 * probes need are hidden from sys.monitoring._all_events()
 * (_PyDTrace_VisibleTools()), and instrumentation.c drops the legacy slots
 * from the tools it calls for threads without a profile/trace function.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>               // strtoull()
#include <string.h>
#include <time.h>
#include <wchar.h>

#ifdef WITH_DTRACE

/* One flag per group of the probe registry's watched column
 * (series/SERIES/probes.tsv): tests/test_registry.py checks that
 * probes_armed() reads exactly the probes of each group. */
#define ARMED_FUNCTION 0x1
#define ARMED_LINE 0x2
#define ARMED_CFUNCTION 0x4
#define ARMED_EXCEPTION 0x8
#define ARMED_STACKS 0x10
#define ARMED_ALLOC 0x20

/* Event sets installed by Python/legacy_tracing.c when some thread has a
 * profile/trace function (kept in sync with _PyEval_SetProfile() and
 * _PyEval_SetTrace()). */
#define EV(name) (1 << PY_MONITORING_EVENT_ ## name)
#define FUNCTION_EVENTS \
    (EV(PY_START) | EV(PY_RESUME) | EV(PY_THROW) \
     | EV(PY_RETURN) | EV(PY_YIELD) | EV(PY_UNWIND))
#define LINE_EVENTS (EV(LINE) | EV(JUMP))
/* The events that instrument RESUME. */
#define RESUME_EVENTS (EV(PY_START) | EV(PY_RESUME))
/* C_RETURN and C_RAISE follow CALL. */
#define CFUNCTION_EVENTS EV(CALL)
/* Global events: they instrument no code. */
#define EXCEPTION_EVENTS (EV(RAISE) | EV(RERAISE) | EV(EXCEPTION_HANDLED))
/* The events that a code object can have on its own (local events); the
 * others are the interpreter's only. */
#define LOCAL_EVENTS ((1 << _PySeam_LOCAL_EVENTS) - 1)
/* The local events that the probes use, which a selection sets on the
 * code objects it selects (_PyDTrace_SelectCode()). */
#define SELECTED_EVENTS \
    ((FUNCTION_EVENTS | CFUNCTION_EVENTS | LINE_EVENTS | RESUME_EVENTS) \
     & LOCAL_EVENTS)
#define LEGACY_PROFILE_EVENTS (FUNCTION_EVENTS | EV(CALL))
#define LEGACY_TRACE_EVENTS \
    (FUNCTION_EVENTS | LINE_EVENTS | EV(RAISE) | EV(STOP_ITERATION))

/* _asyncio, a shared extension module, is the only user of
 * Python/pydtrace_asyncio.c.  A program that embeds the static libpython
 * gets only the archive members it references, and -export-dynamic
 * exports only what it got: this reference keeps that object (and
 * _asyncio importable) in every program that has this one. */
static __attribute__((used)) const void *const keep_asyncio_probes =
    &_PyDTrace_TaskStepSemaphores;

/* One poll per second: at most one wakeup per second in an idle process,
 * and a tracer attached with -p sees events within about a second.  The
 * one place this interval is given: usdt.tools reads this symbol. */
const int _PyDTrace_WatchIntervalMs = 1000;

/* The probes that a selection applies to. */
#define SELECTABLE_PROBES \
    (ARMED_FUNCTION | ARMED_LINE | ARMED_CFUNCTION | ARMED_EXCEPTION)

static int
probes_armed(void)
{
    int armed = 0;
    if (PyDTrace_FUNCTION_ENTRY_ENABLED()
        || PyDTrace_FUNCTION_RETURN_ENABLED()
        || PyDTrace_BATCH_ENABLED())
    {
        armed |= ARMED_FUNCTION;
    }
    if (PyDTrace_LINE_ENABLED()) {
        armed |= ARMED_LINE;
    }
    if (PyDTrace_CFUNCTION_ENTRY_ENABLED()
        || PyDTrace_CFUNCTION_RETURN_ENABLED())
    {
        armed |= ARMED_CFUNCTION;
    }
    if (PyDTrace_EXCEPTION_RAISE_ENABLED()
        || PyDTrace_EXCEPTION_RERAISE_ENABLED()
        || PyDTrace_EXCEPTION_HANDLED_ENABLED())
    {
        armed |= ARMED_EXCEPTION;
    }
    if (_PyDTrace_StacksArmed()) {
        armed |= ARMED_STACKS;
    }
    if (_PyDTrace_AllocArmed()) {
        armed |= ARMED_ALLOC;
    }
    return armed;
}

/* The cfunction and exception probes use the profile slot too: it has a
 * CALL callback (sys.setprofile()'s 'c_call'), and no callback for the
 * exception events, which the trace slot's sys.settrace() function would
 * receive. */
static uint32_t
armed_events(int armed, int tool)
{
    uint32_t events = 0;
    if (tool == PY_MONITORING_SYS_PROFILE_ID) {
        if (armed & ARMED_FUNCTION) {
            events |= FUNCTION_EVENTS;
        }
        if (armed & ARMED_CFUNCTION) {
            events |= CFUNCTION_EVENTS;
        }
        if (armed & ARMED_EXCEPTION) {
            events |= EXCEPTION_EVENTS;
        }
    }
    if (tool == PY_MONITORING_SYS_TRACE_ID && (armed & ARMED_LINE)) {
        /* With PY_START and PY_RESUME, which sys.settrace() installs too:
         * they keep each code's RESUME instrumented.  An uninstrumented
         * RESUME is specialized to RESUME_CHECK, and then a LINE event on
         * RESUME's own line right after it is dropped
         * (_Py_call_instrumentation_line() lets it through only after
         * RESUME or INSTRUMENTED_RESUME): the first line event of every
         * run of a generator expression, which settrace reports.  The
         * hook drops these two events at once (no function probe fires
         * from the trace slot). */
        events |= LINE_EVENTS | RESUME_EVENTS;
    }
    return events;
}

/* The events installed on the slot *tool* for the whole interpreter.
 * With a selection in effect, the events that instrument code go to the
 * selected code objects only (_PyDTrace_SelectCode()); the global ones
 * stay global, and the probes' filter drops those of other code. */
static uint32_t
global_events(int armed, int tool)
{
    uint32_t events = armed_events(armed, tool);
    if (_PyDTrace_Selecting()) {
        events &= ~(uint32_t)LOCAL_EVENTS;
    }
    return events;
}

uint32_t
_PyDTrace_LegacyToolEvents(PyInterpreterState *Py_UNUSED(interp), int tool)
{
    return global_events(probes_armed(), tool);
}

/* The selection's part of a code object's events, set on the legacy
 * slots' local events, which are ours alone: sys.monitoring refuses the
 * slots' ids, so they are invisible to Python code.  Without a selection
 * they are clear. */
void
_PyDTrace_SelectCode(PyCodeObject *code)
{
    uint32_t profile = 0;
    uint32_t trace = 0;
    if (_PyDTrace_Selecting() && _PyDTrace_CodeSelected(code)) {
        int armed = probes_armed();
        profile = armed_events(armed, PY_MONITORING_SYS_PROFILE_ID);
        trace = armed_events(armed, PY_MONITORING_SYS_TRACE_ID);
    }
    const uint8_t slots = ((1 << PY_MONITORING_SYS_PROFILE_ID)
                           | (1 << PY_MONITORING_SYS_TRACE_ID));
    for (int event = 0; event < _PySeam_LOCAL_EVENTS; event++) {
        /* Only the events the probes use: legacy tracing sets the trace
         * slot's INSTRUCTION events on code objects itself
         * (f_trace_opcodes). */
        if (!((SELECTED_EVENTS >> event) & 1)) {
            continue;
        }
        uint8_t tools = _PySeam_LocalTools(code, event) & ~slots;
        tools |= ((profile >> event) & 1) << PY_MONITORING_SYS_PROFILE_ID;
        tools |= ((trace >> event) & 1) << PY_MONITORING_SYS_TRACE_ID;
        _PySeam_SetLocalTools(code, event, tools);
    }
}

/* sys.monitoring._all_events() shows a legacy slot for an event only while
 * some thread has a profile/trace function that asked for it, as without
 * the probes. */
uint8_t
_PyDTrace_VisibleTools(PyInterpreterState *interp, int event, uint8_t tools)
{
    uint8_t hidden = _PyDTrace_ProbeOnlySlots(interp);
    if (!((LEGACY_PROFILE_EVENTS >> event) & 1)) {
        hidden |= 1 << PY_MONITORING_SYS_PROFILE_ID;
    }
    if (!((LEGACY_TRACE_EVENTS >> event) & 1)) {
        hidden |= 1 << PY_MONITORING_SYS_TRACE_ID;
    }
    return tools & ~hidden;
}

uint8_t
_PyDTrace_ProbeOnlySlots(PyInterpreterState *interp)
{
    uint8_t slots = 0;
    if (_PySeam_ProfilingThreads(interp) == 0) {
        slots |= 1 << PY_MONITORING_SYS_PROFILE_ID;
    }
    if (_PySeam_TracingThreads(interp) == 0) {
        slots |= 1 << PY_MONITORING_SYS_TRACE_ID;
    }
    return slots;
}

/* Install on both legacy slots of the current thread's interpreter:
 * (what legacy tracing needs) | (what the armed probes need).  Neither sets
 * nor clears the caller's exception.
 *
 * With the world stopped, as sys.setprofile() and sys.settrace() install
 * their events (Python/legacy_tracing.c): _PyMonitoring_SetEvents()
 * requires it, and it keeps the thread counts read here from changing
 * before the events are set.  A no-op in builds with the GIL. */
static void
dtrace_configure(PyInterpreterState *interp, int armed, int reinstrument)
{
    PyObject *exc = PyErr_GetRaisedException();
    _PySeam_StopTheWorld(interp);
    uint32_t profile = 0;
    uint32_t trace = 0;
    if (_PySeam_ProfilingThreads(interp)) {
        profile = LEGACY_PROFILE_EVENTS;
    }
    if (_PySeam_TracingThreads(interp)) {
        trace = LEGACY_TRACE_EVENTS;
    }
    profile |= global_events(armed, PY_MONITORING_SYS_PROFILE_ID);
    trace |= global_events(armed, PY_MONITORING_SYS_TRACE_ID);

    if (_PySeam_SetLegacyEvents(PY_MONITORING_SYS_PROFILE_ID, profile) < 0) {
        PyErr_Clear();
    }
    if (_PySeam_SetLegacyEvents(PY_MONITORING_SYS_TRACE_ID, trace) < 0) {
        PyErr_Clear();
    }
    /* The code objects' own events follow the selection and the armed
     * probes: every code object computes them again. */
    if (reinstrument && _PyDTrace_Reinstrument(interp) < 0) {
        PyErr_Clear();
    }
    _PySeam_StartTheWorld(interp);
    PyErr_SetRaisedException(exc);
}

/* ------------------------------------------------------------------------
 * Interpreters and the watcher thread
 * ------------------------------------------------------------------------ */

/* An interpreter whose event sets the watcher keeps up to date. */
struct watched_interp {
    PyInterpreterState *interp;
    int applied;        /* armed state its event sets were made for */
    int profiling;      /* its profile slot has a profiler's events */
    int scheduled;      /* a dtrace_reconfigure() call is pending */
    unsigned selection; /* the selection generation it was made for */
    struct watched_interp *next;
};

static struct {
    pthread_mutex_t mutex;      /* guards everything below */
    pthread_cond_t cond;
    pthread_t thread;
    int enabled;        /* not disabled by -X dtrace_watch=0 or the env */
    int running;        /* the thread exists (not joined yet) */
    int exited;         /* the thread left its loop on its own */
    int stop;           /* stop request */
    int finalizing;     /* Py_Finalize() started: no more reconfiguration */
    unsigned selection; /* changes each time the selection in effect does */
    struct watched_interp *interps;
} watcher = {
    .mutex = PTHREAD_MUTEX_INITIALIZER,
    .cond = PTHREAD_COND_INITIALIZER,   /* re-made by init_cond() */
};

static void watcher_atfork_child(void);

/* Called with watcher.mutex held. */
static struct watched_interp *
find_interp(PyInterpreterState *interp)
{
    for (struct watched_interp *w = watcher.interps; w; w = w->next) {
        if (w->interp == interp) {
            return w;
        }
    }
    return NULL;
}

/* Called with the world stopped, before the profile slot's events change
 * (or, with *profiling* -1, to read the state). */
int
_PyDTrace_SwapLegacyProfiling(PyInterpreterState *interp, int profiling)
{
    pthread_mutex_lock(&watcher.mutex);
    struct watched_interp *w = find_interp(interp);
    int before = 0;
    if (w != NULL) {
        before = w->profiling;
        if (profiling >= 0) {
            w->profiling = profiling;
        }
    }
    pthread_mutex_unlock(&watcher.mutex);
    return before;
}

/* Pending call: runs in a thread of the interpreter it was scheduled for,
 * at its next eval-breaker check. */
static int
dtrace_reconfigure(void *Py_UNUSED(arg))
{
    PyThreadState *tstate = _PySeam_CurrentThread();
    if (tstate == NULL) {
        return 0;
    }
    pthread_mutex_lock(&watcher.mutex);
    struct watched_interp *w = find_interp(tstate->interp);
    int armed = probes_armed();
    int configure = w != NULL && !watcher.finalizing;
    /* The code objects' own events change with the selection, and while
     * one is in effect, with the armed probes. */
    int reinstrument = _PyDTrace_Selecting();
    if (w != NULL) {
        w->scheduled = 0;
        w->applied = armed;
        reinstrument |= w->selection != watcher.selection;
        w->selection = watcher.selection;
    }
    pthread_mutex_unlock(&watcher.mutex);
    if (configure) {
        dtrace_configure(tstate->interp, armed, reinstrument);
        _PyDTrace_StacksApply(tstate, armed & ARMED_STACKS);
        _PyDTrace_AllocApply(tstate, armed & ARMED_ALLOC);
    }
    return 0;
}

/* The condition variable waits on the monotonic clock, so that a step of
 * the wall clock does not move the polls.  Called while no watcher thread
 * exists. */
static void
init_cond(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&watcher.cond, &attr);
    pthread_condattr_destroy(&attr);
}

static void
wait_interval(void)
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += _PyDTrace_WatchIntervalMs / 1000;
    deadline.tv_nsec += (long)(_PyDTrace_WatchIntervalMs % 1000) * 1000000;
    if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000;
    }
    (void)pthread_cond_timedwait(&watcher.cond, &watcher.mutex, &deadline);
}

static void *
watcher_main(void *Py_UNUSED(arg))
{
    PyInterpreterState *main_interp = _PySeam_MainInterp();
    pthread_mutex_lock(&watcher.mutex);
    while (!watcher.stop) {
        wait_interval();
        if (watcher.stop) {
            break;
        }
        /* A native thread keeps the process alive: leave once the main
         * interpreter has no thread left, e.g. in a child forked from a
         * non-main thread, whose only thread exits with pthread_exit(). */
        if (!_PySeam_InterpHasThreads(main_interp)) {
            watcher.exited = 1;
            break;
        }
        int armed = probes_armed();
        /* python:batch's records of threads that wrote no full buffer
         * since the last poll (Python/pydtrace_batch.c). */
        _PyDTrace_BatchPoll();
        if (_PyDTrace_SelectPoll(armed & SELECTABLE_PROBES)) {
            watcher.selection++;
        }
        for (struct watched_interp *w = watcher.interps; w; w = w->next) {
            if ((w->applied == armed && w->selection == watcher.selection)
                || w->scheduled)
            {
                continue;
            }
            /* An interpreter is only unregistered with watcher.mutex held,
             * so it stays alive during this call.  If the queue is full,
             * retry at the next poll. */
            if (_PySeam_AddPendingCall(w->interp, dtrace_reconfigure, NULL)) {
                w->scheduled = 1;
            }
        }
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
#ifdef __linux__
            /* Named so that ps -L and top -H show what it is, from the
             * moment this function returns. */
            (void)pthread_setname_np(watcher.thread, "py-usdt-watch");
#endif
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

/* A setting of -X NAME[=0|1] and of an environment variable ENV=0|1: the
 * -X option wins over the variable (which -E and -I ignore); without
 * either, the setting is *dflt*. */
struct bool_setting {
    const wchar_t *opt;
    const char *env;
    int dflt;
    const char *bad_opt;        /* the errors for a value not 0 or 1 */
    const char *bad_env;
};

/* -X dtrace_watch=0 or PYTHONDTRACEWATCH=0: no watcher thread. */
static const struct bool_setting watch_setting = {
    L"dtrace_watch", "PYTHONDTRACEWATCH", 1,
    "-X dtrace_watch: expected 0 or 1", "PYTHONDTRACEWATCH: expected 0 or 1",
};

/* -X dtrace_stacks or PYTHONDTRACESTACKS=1: the owner's consent to the perf
 * trampoline for python:stacks__enable (Python/pydtrace_stacks.c). */
static const struct bool_setting stacks_setting = {
    L"dtrace_stacks", "PYTHONDTRACESTACKS", 0,
    "-X dtrace_stacks: expected 0 or 1", "PYTHONDTRACESTACKS: expected 0 or 1",
};

/* -X usdt_alloc_interval=BYTES or PYTHONUSDTALLOCINTERVAL=BYTES: the mean
 * number of bytes between two samples of otel_memory:alloc.  Returns 0, or
 * -1 with *bad* set to the error. */
static int
read_alloc_interval(const PyConfig *config, const char **bad)
{
    static const wchar_t opt[] = L"usdt_alloc_interval=";
    const size_t optlen = wcslen(opt);
    const char *env = "PYTHONUSDTALLOCINTERVAL";
    for (Py_ssize_t i = config->xoptions.length - 1; i >= 0; i--) {
        const wchar_t *x = config->xoptions.items[i];
        if (wcsncmp(x, opt, optlen) == 0
            || wcscmp(x, L"usdt_alloc_interval") == 0)
        {
            wchar_t *end = NULL;
            const wchar_t *value = x + (wcslen(x) > optlen ? optlen
                                                           : wcslen(x));
            errno = 0;
            unsigned long long n = wcstoull(value, &end, 10);
            if (*value < L'0' || *value > L'9' || *end != L'\0'
                || errno != 0 || _PyDTrace_AllocSetInterval(n) < 0)
            {
                *bad = "-X usdt_alloc_interval: expected a number of bytes "
                       "greater than 0";
                return -1;
            }
            return 0;
        }
    }
    const char *value = _PySeam_GetEnv(config->use_environment, env);
    if (value == NULL || *value == '\0') {
        return 0;
    }
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(value, &end, 10);
    if (*value < '0' || *value > '9' || *end != '\0' || errno != 0
        || _PyDTrace_AllocSetInterval(n) < 0)
    {
        *bad = "PYTHONUSDTALLOCINTERVAL: expected a number of bytes greater "
               "than 0";
        return -1;
    }
    return 0;
}

/* -X usdt_select=TEXT or PYTHONUSDTSELECT=TEXT: a selection
 * (Python/pydtrace_select.c) for the probes armed from start-up, which is
 * how usdt.tools -f reaches a command it runs (bpftrace -c arms the
 * probes before the command's first instruction).  Returns 0, or -1 with
 * *bad* set to the error. */
static int
read_selection(const PyConfig *config, const char **bad)
{
    static const wchar_t opt[] = L"usdt_select=";
    const size_t optlen = wcslen(opt);
    for (Py_ssize_t i = config->xoptions.length - 1; i >= 0; i--) {
        const wchar_t *x = config->xoptions.items[i];
        if (wcsncmp(x, opt, optlen) != 0) {
            continue;
        }
        char text[_PyDTrace_SELECT_TEXT_MAX + 1];
        size_t n = wcstombs(text, x + optlen, sizeof(text));
        if (n == (size_t)-1 || n >= sizeof(text)
            || _PyDTrace_SelectFromStartup(text) < 0)
        {
            *bad = "-X usdt_select: expected a text of at most 255 bytes";
            return -1;
        }
        return 0;
    }
    const char *value = _PySeam_GetEnv(config->use_environment,
                                       "PYTHONUSDTSELECT");
    if (value != NULL && _PyDTrace_SelectFromStartup(value) < 0) {
        *bad = "PYTHONUSDTSELECT: expected a text of at most 255 bytes";
        return -1;
    }
    return 0;
}

/* Returns 1 or 0, or -1 with *bad* set to the error. */
static int
read_setting(const PyConfig *config, const struct bool_setting *setting,
             const char **bad)
{
    const size_t optlen = wcslen(setting->opt);
    for (Py_ssize_t i = config->xoptions.length - 1; i >= 0; i--) {
        const wchar_t *x = config->xoptions.items[i];
        if (wcsncmp(x, setting->opt, optlen) != 0) {
            continue;
        }
        const wchar_t *value = x + optlen;
        if (*value == L'\0' || wcscmp(value, L"=1") == 0) {
            return 1;
        }
        if (wcscmp(value, L"=0") == 0) {
            return 0;
        }
        if (*value == L'=') {
            *bad = setting->bad_opt;
            return -1;
        }
    }
    const char *value = _PySeam_GetEnv(config->use_environment,
                                       setting->env);
    if (value == NULL) {
        return setting->dflt;
    }
    if (strcmp(value, "1") == 0) {
        return 1;
    }
    if (strcmp(value, "0") == 0) {
        return 0;
    }
    *bad = setting->bad_env;
    return -1;
}

PyStatus
_PyDTrace_Init(PyThreadState *tstate)
{
    PyInterpreterState *interp = tstate->interp;
    int is_main = _PySeam_IsMainInterp(interp);
    if (is_main) {
        const PyConfig *config = _PySeam_InterpConfig(interp);
        const char *bad = NULL;
        int enabled = read_setting(config, &watch_setting, &bad);
        if (enabled < 0) {
            return _PySeam_STATUS_ERR(bad);
        }
        int stacks = read_setting(config, &stacks_setting, &bad);
        if (stacks < 0) {
            return _PySeam_STATUS_ERR(bad);
        }
        _PyDTrace_StacksAllow(stacks);
        if (read_alloc_interval(config, &bad) < 0) {
            return _PySeam_STATUS_ERR(bad);
        }
        if (read_selection(config, &bad) < 0) {
            return _PySeam_STATUS_ERR(bad);
        }
        static int atfork_registered;   /* once per process */
        if (!atfork_registered) {
            if (pthread_atfork(NULL, NULL, watcher_atfork_child) != 0) {
                return _PySeam_STATUS_NO_MEMORY();
            }
            atfork_registered = 1;
        }
        pthread_mutex_lock(&watcher.mutex);
        if (!watcher.running) {
            init_cond();
        }
        watcher.enabled = enabled;
        watcher.finalizing = 0;
        pthread_mutex_unlock(&watcher.mutex);
    }

    struct watched_interp *w = PyMem_RawCalloc(1, sizeof(*w));
    if (w == NULL) {
        return _PySeam_STATUS_NO_MEMORY();
    }
    w->interp = interp;
    pthread_mutex_lock(&watcher.mutex);
    /* The marker python:stacks__enable is left to the watcher's first
     * poll. */
    w->applied = probes_armed() & ~ARMED_STACKS;
    /* A selection given at start-up takes effect with probes armed at
     * start-up. */
    if (is_main && _PyDTrace_SelectPoll(w->applied & SELECTABLE_PROBES)) {
        watcher.selection++;
    }
    w->selection = watcher.selection;
    w->next = watcher.interps;
    watcher.interps = w;
    pthread_mutex_unlock(&watcher.mutex);

    /* Probes armed before this interpreter runs its first frame (bpftrace
     * -c, or an attach before a subinterpreter is created). */
    if (w->applied & ~ARMED_ALLOC) {
        dtrace_configure(interp, w->applied, _PyDTrace_Selecting());
    }
    /* Allocations from the first frame on. */
    _PyDTrace_AllocApply(tstate, w->applied & ARMED_ALLOC);
    if (is_main) {
        watcher_start();
    }
    return _PySeam_STATUS_OK();
}

void
_PyDTrace_Fini(PyInterpreterState *interp)
{
    pthread_mutex_lock(&watcher.mutex);
    struct watched_interp **link = &watcher.interps;
    while (*link != NULL && (*link)->interp != interp) {
        link = &(*link)->next;
    }
    struct watched_interp *w = *link;
    if (w != NULL) {
        *link = w->next;
    }
    if (_PySeam_IsMainInterp(interp)) {
        watcher.finalizing = 1;
    }
    pthread_mutex_unlock(&watcher.mutex);
    PyMem_RawFree(w);
    if (_PySeam_IsMainInterp(interp)) {
        watcher_stop();
    }
}

/* fork() keeps the watcher thread: PyOS_BeforeFork() calls this once the
 * world is stopped and before it takes the runtime's HEAD_LOCK (which the
 * watcher needs while it schedules a pending call in the free-threaded
 * build), and holds watcher.mutex until PyOS_AfterFork_Parent().  So the
 * watcher is idle, never inside a poll, at fork().
 *
 * Stopping and re-creating the thread instead left a window: pthread_join()
 * returns before the kernel has released the joined thread, so the
 * "multi-threaded" check of os.fork(), which reads the thread count from
 * /proc/self/stat, could still count it and warn. */
void
_PyDTrace_BeforeFork(void)
{
    pthread_mutex_lock(&watcher.mutex);
}

void
_PyDTrace_AfterForkParent(void)
{
    pthread_mutex_unlock(&watcher.mutex);
}

/* pthread_atfork() child handler: runs inside fork(), before anything in
 * the child can take watcher.mutex (PyOS_AfterFork_Child() may run Python
 * code and pending calls before _PyDTrace_AfterForkChild()), and after a
 * fork() that bypassed PyOS_BeforeFork() too.  The child has no watcher
 * thread, so the lock and condition variable are made anew. */
static void
watcher_atfork_child(void)
{
    pthread_mutex_init(&watcher.mutex, NULL);
    init_cond();
    watcher.running = 0;
    watcher.exited = 0;
}

/* Called at the end of PyOS_AfterFork_Child(). */
void
_PyDTrace_AfterForkChild(void)
{
    pthread_mutex_lock(&watcher.mutex);
    /* The child only keeps the main interpreter (its other interpreters
     * were deleted without Py_EndInterpreter()), and pending calls of the
     * parent are gone. */
    PyInterpreterState *main_interp = _PySeam_MainInterp();
    struct watched_interp **link = &watcher.interps;
    while (*link != NULL) {
        struct watched_interp *w = *link;
        if (w->interp == main_interp) {
            w->scheduled = 0;
            /* Not known: compare with the child's semaphores at the
             * next poll. */
            w->applied = -1;
            link = &w->next;
        }
        else {
            *link = w->next;
            PyMem_RawFree(w);
        }
    }
    pthread_mutex_unlock(&watcher.mutex);
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

#endif  /* WITH_DTRACE */
