/* USDT (DTrace / SystemTap) probe helpers (cpython-usdt).
 *
 * The probes themselves are declared in Include/pydtrace.d; the generated
 * PyDTrace_<PROBE>() and PyDTrace_<PROBE>_ENABLED() macros come from
 * Include/pydtrace.h.  This header holds the glue between the interpreter
 * and the probes, and is the one map of which hook calls which helper:
 *
 *   Python/pydtrace_probes.c      strings and type names, function__*,
 *                                 line, instance__*, import__*, audit
 *   Python/pydtrace_arming.c      arming of the PEP 669 events, watcher
 *   Python/pydtrace_cfunction.c   cfunction__entry/return
 *   Python/pydtrace_exceptions.c  exception__raise/reraise/handled
 *   Python/pydtrace_threads.c     gil__*, thread__start/stop
 *   Python/pydtrace_asyncio.c     task__step__start/done
 *   Python/pydtrace_stacks.c      stacks__enable (perf-map trampoline)
 *   Python/pydtrace_alloc.c       otel_memory:alloc/free (a wrapper of
 *                                 the PyMem allocators while armed)
 *   Python/pydtrace_batch.c       batch (function events as records in a
 *                                 buffer per thread, one marker per buffer)
 *
 * Those files reach CPython's internals only through
 * Include/internal/pydtrace_seam.h, the version seam (one per CPython
 * series, series/X.Y/pydtrace_seam.h in cpython-usdt): a port changes the
 * seam and the hooks, not the glue.  This header, which upstream's files
 * include too, is the hooks' side: of CPython's internals it names only
 * what the hooks pass or have at hand (frames, code units, PyStatus, the
 * legacy tool slots' ids).
 *
 * Rules for every helper (and for any probe added in the future):
 *   - arguments are computed only once the probe's semaphore is set;
 *   - no Python object is allocated, no Python code runs, no exception is
 *     set or cleared, and no NULL string is ever passed to a probe;
 *   - the fast path (probe not armed) is a load of the semaphore, inlined
 *     here;
 *   - arming a probe changes nothing that Python code, a debugger, a
 *     profiler or a coverage tool can observe (sys.monitoring state,
 *     sys.getprofile()/gettrace(), the events other tools receive, the
 *     exceptions a call raises).
 *
 * Adding a probe: declare it in Include/pydtrace.d, add a fire helper in
 * the file of its family (use _PyDTrace_StrAsUTF8() for str arguments),
 * an inline wrapper below and a one-line hook at the probe site.
 */

#ifndef Py_INTERNAL_DTRACE_H
#define Py_INTERNAL_DTRACE_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

#include "pydtrace.h"
#include "pycore_initconfig.h"      // PyStatus
#include "pycore_instruments.h"     // PY_MONITORING_SYS_PROFILE_ID

struct _PyInterpreterFrame;

/* The UTF-8 bytes of one code point into *out* (room for 4); a lone
 * surrogate, which UTF-8 cannot encode, becomes '?'.  Inline, so that the
 * _usdt extension (Modules/_usdt/), which cannot link to the interpreter's
 * hidden symbols, encodes strings for its probes by the same rule. */
static inline size_t
_PyDTrace_EncodeUTF8Char(Py_UCS4 ch, char *out)
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

/* The UTF-8 bytes of the *len* code points of *kind* at *data* into *out*
 * (*size* bytes, at least 1), NUL-terminated, cut at the last whole
 * character that fits; the length written.  Shared by the interpreter's
 * probes (_PyDTrace_StrAsUTF8()) and the _usdt extension, which sizes *out*
 * so that nothing is cut. */
static inline size_t
_PyDTrace_EncodeUTF8(int kind, const void *data, Py_ssize_t len, char *out,
                     size_t size)
{
    size_t pos = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        char tmp[4];
        size_t n = _PyDTrace_EncodeUTF8Char(PyUnicode_READ(kind, data, i),
                                            tmp);
        if (pos + n >= size) {
            break;
        }
        memcpy(out + pos, tmp, n);
        pos += n;
    }
    out[pos] = '\0';
    return pos;
}

/* Size of the buffers used to convert non-ASCII str objects. */
#define _PyDTrace_STRBUF_SIZE 256

/* Return a NUL-terminated UTF-8 rendering of the str object *s* without
 * allocating: the object's own data for compact ASCII strings or a cached
 * UTF-8 representation, otherwise an encoding into *buf* (truncated at a
 * character boundary, lone surrogates replaced with '?').  NULL or a non-str
 * object gives "<unknown>". */
extern const char *_PyDTrace_StrAsUTF8(PyObject *s, char *buf, size_t size);

/* The names below are in Python/pydtrace_names.c. */

/* A heap type's __module__, from its own dict, in the way
 * _PyDTrace_TypeNames() reads it (into *buf* if it is not ASCII). */
extern const char *_PyDTrace_TypeModuleName(PyTypeObject *type, char *buf,
                                            size_t size);

/* Python's names for a type, without allocating or running Python code:
 * *module* is its __module__ ("builtins" for a static type without a dot in
 * tp_name; "<unknown>" for a heap type whose dict has no str __module__ or
 * has keys that are not all exact str) and *qualname* its __qualname__.
 * *modbuf* and *qualbuf* hold _PyDTrace_STRBUF_SIZE bytes each. */
extern void _PyDTrace_TypeNames(PyTypeObject *type, char *modbuf,
                                char *qualbuf, const char **module,
                                const char **qualname);

/* *a* + "." + *b* in *buf* (truncated at a UTF-8 character boundary). */
extern const char *_PyDTrace_JoinDotted(const char *a, const char *b,
                                        char *buf, size_t size);

/* A code object's co_filename and co_name as probe arguments. */
struct _PyDTrace_CodeNames {
    const char *filename;
    const char *funcname;
    char filebuf[_PyDTrace_STRBUF_SIZE];
    char namebuf[_PyDTrace_STRBUF_SIZE];
};

extern void _PyDTrace_GetCodeNames(PyCodeObject *code,
                                   struct _PyDTrace_CodeNames *names);

/* The line of the instruction *instr* of *frame*. */
extern int _PyDTrace_InstrLine(struct _PyInterpreterFrame *frame,
                               _Py_CODEUNIT *instr);

#ifdef WITH_DTRACE

/* Start-up, shutdown and fork hooks (Python/pylifecycle.c,
 * Modules/posixmodule.c).  They arm the probes in each interpreter and
 * manage the probe watcher thread, see Python/pydtrace_arming.c. */
extern PyStatus _PyDTrace_Init(PyThreadState *tstate);
extern void _PyDTrace_Fini(PyInterpreterState *interp);
extern void _PyDTrace_BeforeFork(void);
extern void _PyDTrace_AfterForkParent(void);
extern void _PyDTrace_AfterForkChild(void);
extern Py_ssize_t _PyDTrace_AdjustThreadCount(Py_ssize_t num_threads);

/* The watcher thread's poll interval, in milliseconds.  Exported: tools
 * read it from the interpreter's symbol table (usdt.tools waits that long
 * after attaching before the watched markers fire). */
PyAPI_DATA(const int) _PyDTrace_WatchIntervalMs;

/* The selection block (Python/pydtrace_select.c; docs/selection.md is the
 * contract): a tracer writes a text into it through /proc/PID/mem, and
 * while the selectable probes are armed only the code objects that the
 * text selects fire them.  Version 1; the fields never move within a
 * version, and a tool refuses a block whose magic, version or size it
 * does not know. */
#define _PyDTrace_SELECT_MAGIC "usdtsel"
#define _PyDTrace_SELECT_VERSION 1
#define _PyDTrace_SELECT_TEXT_MAX 255

/* The states that the interpreter writes into the block's *state*. */
#define _PyDTrace_SELECT_NONE 0      /* no selection: everything fires */
#define _PyDTrace_SELECT_PENDING 1   /* read; no selectable probe armed yet */
#define _PyDTrace_SELECT_APPLIED 2   /* in effect */
#define _PyDTrace_SELECT_ENDED 3     /* the probes were disarmed: spent */
#define _PyDTrace_SELECT_EXPIRED 4   /* never armed within a minute */
#define _PyDTrace_SELECT_REFUSED 5   /* bad length, or a NUL in the text */

struct _PyDTrace_SelectBlock {
    char magic[8];              /* _PyDTrace_SELECT_MAGIC */
    uint32_t version;           /* _PyDTrace_SELECT_VERSION */
    uint32_t size;              /* the size of this structure */
    /* Written by a tracer: *seq* odd while it writes, then a new even
     * number; *length* bytes of *text* (UTF-8, no NUL; 0: everything). */
    uint32_t seq;
    uint32_t length;
    char text[_PyDTrace_SELECT_TEXT_MAX + 1];
    /* Written by the interpreter: the *seq* it read last, the state of
     * that text, and the *seq* of the text last put in effect. */
    uint32_t seen_seq;
    uint32_t state;
    uint32_t applied_seq;
    uint32_t reserved;
};

PyAPI_DATA(struct _PyDTrace_SelectBlock) _PyDTrace_Select;

/* The watcher's poll (its mutex held), *armed* whether a selectable probe
 * is armed: reads the block, and returns 1 if the selection in effect
 * changed (the interpreters must then reconfigure), else 0. */
extern int _PyDTrace_SelectPoll(int armed);
/* A selection given at start-up (-X usdt_select, PYTHONUSDTSELECT),
 * written into the block as a tracer would; -1 if it is too long. */
extern int _PyDTrace_SelectFromStartup(const char *text);
/* Whether a selection is in effect. */
extern int _PyDTrace_Selecting(void);
/* Whether the selection in effect selects *code*. */
extern int _PyDTrace_CodeSelected(PyCodeObject *code);
/* Whether the probes fire for *event* of *frame*: always without a
 * selection; else whether the selection instruments its code object for
 * the probes (local events), or selects it (global events). */
extern int _PyDTrace_FrameSelected(struct _PyInterpreterFrame *frame,
                                   int event);

/* Python/instrumentation.c, before the events of *code* are computed:
 * set the legacy slots' local events of *code* to those the selection
 * gives it (Python/pydtrace_arming.c). */
extern void _PyDTrace_SelectCode(PyCodeObject *code);
/* Python/instrumentation.c: a new monitoring version, so that every code
 * object of *interp* re-instruments (and meets _PyDTrace_SelectCode())
 * at its next RESUME.  With the world stopped; -1 with an exception set
 * on failure. */
extern int _PyDTrace_Reinstrument(PyInterpreterState *interp);

/* PEP 669 events that the armed probes need on the legacy tool slot *tool*
 * (PY_MONITORING_SYS_PROFILE_ID or PY_MONITORING_SYS_TRACE_ID). */
extern uint32_t _PyDTrace_LegacyToolEvents(PyInterpreterState *interp,
                                           int tool);

/* *tools* (the tools of *event*) without the legacy slots' events that
 * only the probes use, for sys.monitoring._all_events(). */
extern uint8_t _PyDTrace_VisibleTools(PyInterpreterState *interp, int event,
                                      uint8_t tools);

/* The legacy slots whose events are there only for the probes: those for
 * which no thread has a sys.setprofile() (sys.settrace()) function. */
extern uint8_t _PyDTrace_ProbeOnlySlots(PyInterpreterState *interp);

/* Monitoring hooks (Python/instrumentation.c).  Given the tools that are
 * about to be called for *event* with the vectorcall arguments *args*
 * (args[3] onwards: the event's own arguments, *nargs* - 2 of them), fire
 * the probes fed by the legacy tool slots, then return *tools* minus the
 * legacy slots that this thread has no sys.setprofile()/sys.settrace()
 * function for. */
extern uint8_t _PyDTrace_LegacyEvent(PyThreadState *tstate, int event,
                                     struct _PyInterpreterFrame *frame,
                                     _Py_CODEUNIT *instr, Py_ssize_t nargs,
                                     PyObject *const *args, uint8_t tools);
extern uint8_t _PyDTrace_LegacyJump(PyThreadState *tstate,
                                    struct _PyInterpreterFrame *frame,
                                    _Py_CODEUNIT *instr, _Py_CODEUNIT *target,
                                    uint8_t tools);
extern void _PyDTrace_FireLine(struct _PyInterpreterFrame *frame, int line);

/* python:batch (Python/pydtrace_batch.c, which documents the layout): the
 * record of version 1, and its kinds. */
struct _PyDTrace_BatchRecord {
    uint64_t code;              /* the code object's address */
    uint64_t time;              /* CLOCK_MONOTONIC, ns */
    uint32_t kind;              /* _PyDTrace_BATCH_START... */
    uint32_t code_version;      /* the code object's co_version */
};
#define _PyDTrace_BATCH_VERSION 1
#define _PyDTrace_BATCH_START 1
#define _PyDTrace_BATCH_RESUME 2
#define _PyDTrace_BATCH_THROW 3
#define _PyDTrace_BATCH_RETURN 4
#define _PyDTrace_BATCH_YIELD 5
#define _PyDTrace_BATCH_UNWIND 6
/* Records per buffer (6 KiB): a consumer's loop must go this far.  On
 * bpftrace 0.17, whose verifier walks every iteration, 512 iterations of
 * latency-batch.bt took 94 % of the verifier's million instructions, and
 * 256 take 47 %, under the half that tests/test_verifier_margin.py
 * allows. */
#define _PyDTrace_BATCH_CAPACITY 256
/* A buffer whose oldest record is older is handed over at the next event,
 * before that event's record. */
#define _PyDTrace_BATCH_MAX_AGE_NS 1000000000u
/* Called for the legacy profile slot's function events while the marker
 * is armed. */
extern void _PyDTrace_BatchRecord(int event,
                                  struct _PyInterpreterFrame *frame);
/* The watcher's poll: every thread's records not yet handed over. */
extern void _PyDTrace_BatchPoll(void);
/* Before a code object is freed: the buffers whose records name it. */
extern void _PyDTrace_BatchCodeFreed(PyCodeObject *code);

/* The hook of code_dealloc() (0215-batch-marker.patch), once the code
 * object is sure to be freed and before its fields are: a tracer of
 * python:batch names the code objects of a batch from the process's
 * memory when it reads the batch. */
static inline void
_PyDTrace_CodeFreed(PyCodeObject *code)
{
    if (PyDTrace_BATCH_ENABLED()) {
        _PyDTrace_BatchCodeFreed(code);
    }
}

#define _PyDTrace_LEGACY_TOOLS \
    ((1 << PY_MONITORING_SYS_PROFILE_ID) | (1 << PY_MONITORING_SYS_TRACE_ID))

static inline uint8_t
_PyDTrace_FilterTools(PyThreadState *tstate, int event,
                      struct _PyInterpreterFrame *frame, _Py_CODEUNIT *instr,
                      Py_ssize_t nargs, PyObject *const *args, uint8_t tools)
{
    if (tools & _PyDTrace_LEGACY_TOOLS) {
        return _PyDTrace_LegacyEvent(tstate, event, frame, instr, nargs, args,
                                     tools);
    }
    return tools;
}

static inline uint8_t
_PyDTrace_FilterJump(PyThreadState *tstate,
                     struct _PyInterpreterFrame *frame, _Py_CODEUNIT *instr,
                     _Py_CODEUNIT *target, uint8_t tools)
{
    if (tools & (1 << PY_MONITORING_SYS_TRACE_ID)) {
        return _PyDTrace_LegacyJump(tstate, frame, instr, target, tools);
    }
    return tools;
}

/* CALL, C_RETURN and C_RAISE events of the legacy profile slot
 * (Python/pydtrace_cfunction.c): fire cfunction__entry/return, and return
 * *tools*, or 0 for the C_RETURN/C_RAISE of a call that no tool watched
 * when it started. */
extern uint8_t _PyDTrace_CFunctionEvent(int event,
                                        struct _PyInterpreterFrame *frame,
                                        _Py_CODEUNIT *instr,
                                        PyObject *callable,
                                        PyObject *self_arg, uint8_t tools);

/* Python/instrumentation.c, before the CALL events of *tool_id* (in *code*,
 * or global if NULL) become *events*: see Python/pydtrace_cfunction.c. */
extern void _PyDTrace_CallToolsChanging(PyInterpreterState *interp,
                                        PyCodeObject *code, int tool_id,
                                        uint32_t events);

/* Record whether the profile slot of *interp* has a sys.setprofile()
 * function's events (*profiling* 1 or 0; -1 only reads it); return what
 * it was (Python/pydtrace_arming.c). */
extern int _PyDTrace_SwapLegacyProfiling(PyInterpreterState *interp,
                                         int profiling);

/* RAISE, RERAISE and EXCEPTION_HANDLED events of the legacy profile slot
 * (Python/pydtrace_exceptions.c): exception__raise/reraise/handled. */
extern void _PyDTrace_ExceptionEvent(int event,
                                     struct _PyInterpreterFrame *frame,
                                     PyObject *exc);

/* LINE event delivered to the sys.settrace() tool slot. */
static inline void
_PyDTrace_Line(struct _PyInterpreterFrame *frame, int line)
{
    if (PyDTrace_LINE_ENABLED()) {
        _PyDTrace_FireLine(frame, line);
    }
}

/* Instances of classes whose tp_dealloc is subtype_dealloc (classes defined
 * in Python).  See Objects/typeobject.c for the probe sites. */
extern void _PyDTrace_FireInstanceNewStart(PyTypeObject *type);
extern void _PyDTrace_FireInstanceNewDone(PyTypeObject *type);
extern PyTypeObject *_PyDTrace_FireInstanceDeleteStart(PyTypeObject *type);
extern void _PyDTrace_FireInstanceDeleteDone(PyTypeObject *type);

/* *cond* is only evaluated when the probe is armed. */
#define _PyDTrace_INSTANCE_NEW_START(type, cond) \
    do { \
        if (PyDTrace_INSTANCE_NEW_START_ENABLED() && (cond)) { \
            _PyDTrace_FireInstanceNewStart(type); \
        } \
    } while (0)

#define _PyDTrace_INSTANCE_NEW_DONE(type, cond) \
    do { \
        if (PyDTrace_INSTANCE_NEW_DONE_ENABLED() && (cond)) { \
            _PyDTrace_FireInstanceNewDone(type); \
        } \
    } while (0)

/* Fire instance__delete__start; return a strong reference to *type* to be
 * passed to _PyDTrace_InstanceDeleteDone() if instance__delete__done is
 * armed (the type may otherwise be freed by the base tp_dealloc). */
static inline PyTypeObject *
_PyDTrace_InstanceDeleteStart(PyTypeObject *type)
{
    if (PyDTrace_INSTANCE_DELETE_START_ENABLED()
        || PyDTrace_INSTANCE_DELETE_DONE_ENABLED())
    {
        return _PyDTrace_FireInstanceDeleteStart(type);
    }
    return NULL;
}

static inline void
_PyDTrace_InstanceDeleteDone(PyTypeObject *type)
{
    if (type != NULL) {
        _PyDTrace_FireInstanceDeleteDone(type);
    }
}

/* import__find__load__start/done (Python/import.c). */
extern void _PyDTrace_FireImportStart(PyObject *name);
extern void _PyDTrace_FireImportDone(PyObject *name, int found);

#define _PyDTrace_IMPORT_FIND_LOAD_START(name) \
    do { \
        if (PyDTrace_IMPORT_FIND_LOAD_START_ENABLED()) { \
            _PyDTrace_FireImportStart(name); \
        } \
    } while (0)

#define _PyDTrace_IMPORT_FIND_LOAD_DONE(name, found) \
    do { \
        if (PyDTrace_IMPORT_FIND_LOAD_DONE_ENABLED()) { \
            _PyDTrace_FireImportDone((name), (found)); \
        } \
    } while (0)

/* sys.audit() (Python/sysmodule.c): true when the audit probe is the only
 * consumer of audit events, then _PyDTrace_FireAuditFromPython() reports
 * the event without the errors that audit hooks would add. */
extern int _PyDTrace_AuditOnly(PyInterpreterState *interp);
extern void _PyDTrace_FireAuditFromPython(PyObject *event,
                                          PyObject *const *args,
                                          Py_ssize_t nargs);

/* GIL (Python/ceval_gil.c) and threads started by the _thread module
 * (Modules/_threadmodule.c); see Python/pydtrace_threads.c.  The GIL
 * probes never fire in the free-threaded build. */
extern void _PyDTrace_FireGilTakeStart(void);
extern void _PyDTrace_FireGilTakeDone(void);
extern void _PyDTrace_FireGilDrop(void);
extern void _PyDTrace_FireThreadStart(void);
extern void _PyDTrace_FireThreadStop(void);

#ifdef Py_GIL_DISABLED
#  define _PyDTrace_GIL_TAKE_START() ((void)0)
#  define _PyDTrace_GIL_TAKE_DONE() ((void)0)
#  define _PyDTrace_GIL_DROP() ((void)0)
#else
#  define _PyDTrace_GIL_TAKE_START() \
    do { \
        if (PyDTrace_GIL_TAKE_START_ENABLED()) { \
            _PyDTrace_FireGilTakeStart(); \
        } \
    } while (0)
#  define _PyDTrace_GIL_TAKE_DONE() \
    do { \
        if (PyDTrace_GIL_TAKE_DONE_ENABLED()) { \
            _PyDTrace_FireGilTakeDone(); \
        } \
    } while (0)
#  define _PyDTrace_GIL_DROP() \
    do { \
        if (PyDTrace_GIL_DROP_ENABLED()) { \
            _PyDTrace_FireGilDrop(); \
        } \
    } while (0)
#endif

#define _PyDTrace_THREAD_START() \
    do { \
        if (PyDTrace_THREAD_START_ENABLED()) { \
            _PyDTrace_FireThreadStart(); \
        } \
    } while (0)

#define _PyDTrace_THREAD_STOP() \
    do { \
        if (PyDTrace_THREAD_STOP_ENABLED()) { \
            _PyDTrace_FireThreadStop(); \
        } \
    } while (0)

/* asyncio Task steps (Modules/_asynciomodule.c, a shared extension module:
 * it reads the semaphores through these exported pointers, index 0 for
 * task__step__start and 1 for task__step__done); see
 * Python/pydtrace_asyncio.c. */
PyAPI_DATA(const unsigned short *const) _PyDTrace_TaskStepSemaphores[2];
PyAPI_FUNC(void) _PyDTrace_FireTaskStep(int done, PyObject *task_name,
                                        PyObject *coro);

#define _PyDTrace_TASK_STEP_START(task_name, coro) \
    do { \
        if (*_PyDTrace_TaskStepSemaphores[0]) { \
            _PyDTrace_FireTaskStep(0, (task_name), (coro)); \
        } \
    } while (0)

#define _PyDTrace_TASK_STEP_DONE(task_name, coro) \
    do { \
        if (*_PyDTrace_TaskStepSemaphores[1]) { \
            _PyDTrace_FireTaskStep(1, (task_name), (coro)); \
        } \
    } while (0)

/* Python names in native stacks (Python/pydtrace_stacks.c).  The watcher
 * reads the marker's semaphore with _PyDTrace_StacksArmed() and applies it
 * with _PyDTrace_StacksApply() in a thread of each interpreter.  The other
 * three are hooks in Python/sysmodule.c: sys.activate_stack_trampoline()
 * and sys.deactivate_stack_trampoline() return None at once when the hook
 * returns 1, and sys.is_stack_trampoline_active() is false while
 * _PyDTrace_StacksHidden() is 1 (the trampoline is on for a tracer only). */
extern int _PyDTrace_StacksArmed(void);
/* -X dtrace_stacks: whether the owner allows a tracer to turn the
 * trampoline on, set by _PyDTrace_Init() in the main interpreter before
 * its first frame; and the co_extra slot reserved then for the trampoline
 * (-1 if none), which Python/perf_trampoline.c takes. */
extern void _PyDTrace_StacksAllow(int allowed);
extern Py_ssize_t _PyDTrace_StacksCodeExtraIndex(PyThreadState *tstate);
/* How many co_extra slots _PyCode_SetExtra() gives a code object that
 * needs slot *index*: upstream's co_extra_user_count, but only the
 * trampoline's own slot when the trampoline a tracer turned on asks. */
extern Py_ssize_t _PyDTrace_StacksCodeExtraSize(PyInterpreterState *interp,
                                                Py_ssize_t index);
extern void _PyDTrace_StacksApply(PyThreadState *tstate, int armed);
extern int _PyDTrace_StacksActivate(PyThreadState *tstate,
                                    const char *backend);
extern int _PyDTrace_StacksDeactivate(PyThreadState *tstate);
extern int _PyDTrace_StacksHidden(PyThreadState *tstate);

/* otel_memory:alloc/free (Python/pydtrace_alloc.c).  The watcher reads
 * the semaphores with _PyDTrace_AllocArmed() and puts the allocator wrapper
 * on or takes it off with _PyDTrace_AllocApply() (main interpreter, GIL
 * held).  Objects/obmalloc.c reads and writes the allocator of a domain
 * through _PyDTrace_AllocBelow(domain, &current): the one under the
 * wrapper while it is installed, so that PyMem_GetAllocator() and
 * PyMem_SetAllocator() never see it.  The interval (bytes, > 0) is set once
 * by _PyDTrace_Init() before any wrapper exists. */
extern int _PyDTrace_AllocArmed(void);
extern void _PyDTrace_AllocApply(PyThreadState *tstate, int armed);
extern PyMemAllocatorEx *_PyDTrace_AllocBelow(PyMemAllocatorDomain domain,
                                              PyMemAllocatorEx *cur);
extern int _PyDTrace_AllocSetInterval(uint64_t interval);
/* Sampled allocations not reported because the set of sampled pointers was
 * full (tracers read it by its symbol). */
extern uint64_t _PyDTrace_AllocDropped;

#else  /* !WITH_DTRACE */

#define _PyDTrace_AllocBelow(domain, cur) (cur)

static inline PyStatus
_PyDTrace_Init(PyThreadState *tstate)
{
    (void)tstate;
    return _PyStatus_OK();
}

static inline void _PyDTrace_Fini(PyInterpreterState *interp) { (void)interp; }
static inline void _PyDTrace_BeforeFork(void) {}
static inline void _PyDTrace_AfterForkParent(void) {}
static inline void _PyDTrace_AfterForkChild(void) {}

static inline Py_ssize_t
_PyDTrace_AdjustThreadCount(Py_ssize_t num_threads)
{
    return num_threads;
}

static inline uint32_t
_PyDTrace_LegacyToolEvents(PyInterpreterState *interp, int tool)
{
    (void)interp;
    (void)tool;
    return 0;
}

static inline uint8_t
_PyDTrace_VisibleTools(PyInterpreterState *interp, int event, uint8_t tools)
{
    (void)interp;
    (void)event;
    return tools;
}

static inline int
_PyDTrace_AuditOnly(PyInterpreterState *interp)
{
    (void)interp;
    return 0;
}

#define _PyDTrace_FireAuditFromPython(event, args, nargs) ((void)0)
#define _PyDTrace_CallToolsChanging(interp, code, tool_id, events) ((void)0)
#define _PyDTrace_IMPORT_FIND_LOAD_START(name) ((void)0)
#define _PyDTrace_IMPORT_FIND_LOAD_DONE(name, found) ((void)0)
#define _PyDTrace_FilterTools(tstate, event, frame, instr, nargs, args, tools) \
    (tools)
#define _PyDTrace_FilterJump(tstate, frame, instr, target, tools) (tools)
#define _PyDTrace_Line(frame, line) ((void)0)
#define _PyDTrace_SelectCode(code) ((void)0)
#define _PyDTrace_CodeFreed(code) ((void)0)
#define _PyDTrace_INSTANCE_NEW_START(type, cond) ((void)0)
#define _PyDTrace_INSTANCE_NEW_DONE(type, cond) ((void)0)
#define _PyDTrace_InstanceDeleteStart(type) ((PyTypeObject *)NULL)
#define _PyDTrace_InstanceDeleteDone(type) ((void)(type))
#define _PyDTrace_GIL_TAKE_START() ((void)0)
#define _PyDTrace_GIL_TAKE_DONE() ((void)0)
#define _PyDTrace_GIL_DROP() ((void)0)
#define _PyDTrace_THREAD_START() ((void)0)
#define _PyDTrace_THREAD_STOP() ((void)0)
#define _PyDTrace_TASK_STEP_START(task_name, coro) ((void)0)
#define _PyDTrace_TASK_STEP_DONE(task_name, coro) ((void)0)
#define _PyDTrace_StacksCodeExtraIndex(tstate) ((Py_ssize_t)-1)
#define _PyDTrace_StacksCodeExtraSize(interp, index) \
    ((interp)->co_extra_user_count)
#define _PyDTrace_StacksActivate(tstate, backend) 0
#define _PyDTrace_StacksDeactivate(tstate) 0
#define _PyDTrace_StacksHidden(tstate) 0

#endif  /* !WITH_DTRACE */

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_DTRACE_H */
