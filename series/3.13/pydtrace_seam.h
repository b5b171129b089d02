/* The seam between the USDT glue and CPython 3.13's internals
 * (cpython-usdt).
 *
 * The glue, Python/pydtrace_*.c, reaches the interpreter's internals only
 * through this header: the pycore_* headers, the fields of frames, code
 * objects, thread and interpreter states, the runtime, dict keys and
 * generators, and the internal functions and macros of instrumentation,
 * stop-the-world, pending calls, the perf trampoline and the allocators.
 * Everything here is a static inline function, a macro or a typedef with
 * a name of our own (_PySeam_*), which does exactly what the glue did when
 * it used the internals directly.  The glue's files include Python.h,
 * pycore_dtrace.h (the hooks' interface, which upstream files include too)
 * and this header, and no pycore_* header of their own
 * (tests/test_build_facts.py checks it).
 *
 * One header per series: this one is series/3.13/pydtrace_seam.h, which
 * tools/prepare lays into the tree as Include/internal/pydtrace_seam.h.
 * A port to another series writes series/X.Y/pydtrace_seam.h with the same
 * names, and rebases the hooks (series/X.Y/patches/); the glue stays as it
 * is.  docs/layout.md ("The version seam") lists what 3.14 changes here.
 *
 * The names say what they give, not how 3.13 stores it; where another
 * series is known to store it differently, a comment says so.  None of
 * them allocates, runs Python code, or sets or clears an exception, unless
 * its comment says otherwise.
 */

#ifndef Py_INTERNAL_PYDTRACE_SEAM_H
#define Py_INTERNAL_PYDTRACE_SEAM_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

#if PY_VERSION_HEX < 0x030D0000 || PY_VERSION_HEX >= 0x030E0000
#  error "pydtrace_seam.h of series/3.13 serves CPython 3.13 only"
#endif

#include "pycore_ceval.h"         // _PyEval_AddPendingCall(), perf trampoline
#include "pycore_code.h"          // _PyCode_CODE(), _Py_GetBaseOpcode()
#include "pycore_dict.h"          // DK_IS_UNICODE()
#include "pycore_frame.h"         // _PyInterpreterFrame, _PyFrame_GetCode()
#include "pycore_initconfig.h"    // _PyStatus_ERR(), _Py_GetEnv()
#include "pycore_instruments.h"   // _Py_Instrumentation_GetLine()
#include "pycore_interp.h"        // PyInterpreterState
#include "pycore_lock.h"          // PyMutex_LockFlags()
#include "pycore_opcode_metadata.h"  // CALL, CALL_KW, CALL_FUNCTION_EX
#include "pycore_pyatomic_ft_wrappers.h"  // FT_ATOMIC_LOAD_SSIZE_RELAXED()
#include "pycore_pymem.h"         // struct _pymem_allocators
#include "pycore_pystate.h"       // _PyThreadState_GET(), HEAD_LOCK()
#include "pycore_runtime.h"       // _PyRuntime, _Py_ID()
#include "pycore_tuple.h"         // _PyTuple_FromArray()

/* ------------------------------------------------------------------------
 * Frames and instructions
 * ------------------------------------------------------------------------ */

/* The code object a frame runs; the frame must have one
 * (_PySeam_FrameHasCode()). */
static inline PyCodeObject *
_PySeam_FrameCode(_PyInterpreterFrame *frame)
{
    return _PyFrame_GetCode(frame);
}

/* Whether a frame runs a code object: not the entry frame that the
 * interpreter loop keeps on the C stack (FRAME_OWNED_BY_CSTACK).  3.14
 * marks entry frames FRAME_OWNED_BY_INTERPRETER instead (its
 * FRAME_OWNED_BY_CSTACK is unused; 3.15 has none). */
static inline int
_PySeam_FrameHasCode(_PyInterpreterFrame *frame)
{
    return frame->owner != FRAME_OWNED_BY_CSTACK;
}

/* The frame that called *frame*, or NULL. */
static inline _PyInterpreterFrame *
_PySeam_FramePrevious(_PyInterpreterFrame *frame)
{
    return frame->previous;
}

/* The instruction a frame is running. */
static inline _Py_CODEUNIT *
_PySeam_FrameInstr(_PyInterpreterFrame *frame)
{
    return frame->instr_ptr;
}

/* The index (in code units) of the instruction *instr* in the bytecode
 * that *frame* runs.  3.14's free-threaded build gives each thread its own
 * copy of the bytecode: there it is instr - _PyFrame_GetBytecode(frame). */
static inline int
_PySeam_InstrIndex(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    return (int)(instr - _PyCode_CODE(_PyFrame_GetCode(frame)));
}

/* The opcode of the instruction at *index* as the compiler wrote it: not
 * specialized, not instrumented.  (3.14 has no _Py_GetBaseOpcode():
 * _Py_GetBaseCodeUnit(code, index).op.code.) */
static inline int
_PySeam_BaseOpcode(PyCodeObject *code, int index)
{
    return _Py_GetBaseOpcode(code, index);
}

/* Whether *opcode* (a base opcode) calls: CALL, CALL_KW or
 * CALL_FUNCTION_EX, the instructions whose INSTRUMENTED_ forms deliver the
 * CALL, C_RETURN and C_RAISE events. */
static inline int
_PySeam_IsCallOpcode(int opcode)
{
    return (opcode == CALL || opcode == CALL_KW
            || opcode == CALL_FUNCTION_EX);
}

/* ------------------------------------------------------------------------
 * Code objects
 * ------------------------------------------------------------------------ */

static inline PyObject *
_PySeam_CodeFilename(PyCodeObject *code)
{
    return code->co_filename;
}

static inline PyObject *
_PySeam_CodeName(PyCodeObject *code)
{
    return code->co_name;
}

static inline PyObject *
_PySeam_CodeQualname(PyCodeObject *code)
{
    return code->co_qualname;
}

static inline int
_PySeam_CodeFirstLine(PyCodeObject *code)
{
    return code->co_firstlineno;
}

/* Unique per code object while the counter lasts; 0 once it is
 * exhausted. */
static inline uint32_t
_PySeam_CodeVersion(PyCodeObject *code)
{
    return code->co_version;
}

/* The number of code units of the code's bytecode. */
static inline Py_ssize_t
_PySeam_CodeUnits(PyCodeObject *code)
{
    return Py_SIZE(code);
}

/* ------------------------------------------------------------------------
 * Instrumentation (PEP 669)
 * ------------------------------------------------------------------------ */

/* The number of events that have a tool set per code object (3.15: none;
 * _PY_MONITORING_UNGROUPED_EVENTS counts its per-code events). */
#define _PySeam_LOCAL_EVENTS _PY_MONITORING_LOCAL_EVENTS

/* The value that a CALL event passes for a call without arguments. */
#define _PySeam_MISSING (&_PyInstrumentation_MISSING)

/* Whether *code* has monitoring data (instrumentation reached it). */
static inline int
_PySeam_CodeMonitored(PyCodeObject *code)
{
    return code->_co_monitoring != NULL;
}

/* Whether *code* keeps the lines of its instructions for instrumentation
 * (LINE events); then _PySeam_MonitoringLine() reads them. */
static inline int
_PySeam_HasMonitoringLines(PyCodeObject *code)
{
    return (code->_co_monitoring != NULL
            && code->_co_monitoring->lines != NULL);
}

/* The line of the instruction at *index*, from those lines.  (3.14:
 * _Py_Instrumentation_GetLine(code, code->_co_monitoring->lines,
 * index).) */
static inline int
_PySeam_MonitoringLine(PyCodeObject *code, int index)
{
    return _Py_Instrumentation_GetLine(code, index);
}

/* Whether *code* keeps a tool set per instruction, which the interpreter
 * does only where some event has several tools. */
static inline int
_PySeam_HasToolsPerInstruction(PyCodeObject *code)
{
    return (code->_co_monitoring != NULL
            && code->_co_monitoring->tools != NULL);
}

/* The tools of *event* in code with monitoring data: those instrumented
 * now (active, global and local together), and those set on the code
 * object itself (local). */
static inline uint8_t
_PySeam_ActiveTools(PyCodeObject *code, int event)
{
    return code->_co_monitoring->active_monitors.tools[event];
}

static inline uint8_t
_PySeam_LocalTools(PyCodeObject *code, int event)
{
    return code->_co_monitoring->local_monitors.tools[event];
}

/* Set the local tools of *event* of code with monitoring data, before
 * instrumentation computes what to insert (3.15, whose events are all
 * local, keeps them in the same place). */
static inline void
_PySeam_SetLocalTools(PyCodeObject *code, int event, uint8_t tools)
{
    code->_co_monitoring->local_monitors.tools[event] = tools;
}

/* The tools of *event* set for the whole interpreter. */
static inline uint8_t
_PySeam_GlobalTools(PyInterpreterState *interp, int event)
{
    return interp->monitors.tools[event];
}

/* Set the events of the legacy tool slot *tool* (PY_MONITORING_SYS_*_ID)
 * in the current thread's interpreter, with the world stopped; -1 with an
 * exception set on failure. */
static inline int
_PySeam_SetLegacyEvents(int tool, uint32_t events)
{
    return _PyMonitoring_SetEvents(tool, events);
}

/* The number of threads of *interp* with a sys.setprofile()
 * (sys.settrace()) function: a relaxed read, exact with the world
 * stopped. */
static inline Py_ssize_t
_PySeam_ProfilingThreads(PyInterpreterState *interp)
{
    return FT_ATOMIC_LOAD_SSIZE_RELAXED(interp->sys_profiling_threads);
}

static inline Py_ssize_t
_PySeam_TracingThreads(PyInterpreterState *interp)
{
    return FT_ATOMIC_LOAD_SSIZE_RELAXED(interp->sys_tracing_threads);
}

/* Whether the thread has a sys.setprofile() (sys.settrace()) function. */
static inline int
_PySeam_HasProfileFunc(PyThreadState *tstate)
{
    return tstate->c_profilefunc != NULL;
}

static inline int
_PySeam_HasTraceFunc(PyThreadState *tstate)
{
    return tstate->c_tracefunc != NULL;
}

/* ------------------------------------------------------------------------
 * Threads and interpreters
 * ------------------------------------------------------------------------ */

/* The current thread state (NULL if none) and its interpreter. */
static inline PyThreadState *
_PySeam_CurrentThread(void)
{
    return _PyThreadState_GET();
}

static inline PyInterpreterState *
_PySeam_CurrentInterp(void)
{
    return _PyInterpreterState_GET();
}

static inline PyInterpreterState *
_PySeam_MainInterp(void)
{
    return _PyInterpreterState_Main();
}

static inline int
_PySeam_IsMainInterp(PyInterpreterState *interp)
{
    return _Py_IsMainInterpreter(interp);
}

/* Whether *interp* has any thread state, read without a lock (relaxed), by
 * a thread that has none of its own. */
static inline int
_PySeam_InterpHasThreads(PyInterpreterState *interp)
{
    return _Py_atomic_load_ptr_relaxed(&interp->threads.head) != NULL;
}

/* The runtime's lock of the interpreters' thread lists, which
 * _PySeam_FirstThread() and _PySeam_NextThread() need. */
static inline void
_PySeam_HeadLock(PyInterpreterState *interp)
{
    HEAD_LOCK(interp->runtime);
}

static inline void
_PySeam_HeadUnlock(PyInterpreterState *interp)
{
    HEAD_UNLOCK(interp->runtime);
}

static inline PyThreadState *
_PySeam_FirstThread(PyInterpreterState *interp)
{
    return interp->threads.head;
}

static inline PyThreadState *
_PySeam_NextThread(PyThreadState *tstate)
{
    return tstate->next;
}

/* The frame a thread runs now (innermost), or NULL. */
static inline _PyInterpreterFrame *
_PySeam_ThreadFrame(PyThreadState *tstate)
{
    return tstate->current_frame;
}

/* Stop and start every thread of *interp* (no-ops with the GIL). */
static inline void
_PySeam_StopTheWorld(PyInterpreterState *interp)
{
    _PyEval_StopTheWorld(interp);
}

static inline void
_PySeam_StartTheWorld(PyInterpreterState *interp)
{
    _PyEval_StartTheWorld(interp);
}

/* The same for every interpreter. */
static inline void
_PySeam_StopTheWorldAll(void)
{
    _PyEval_StopTheWorldAll(&_PyRuntime);
}

static inline void
_PySeam_StartTheWorldAll(void)
{
    _PyEval_StartTheWorldAll(&_PyRuntime);
}

/* Schedule *func*(*arg*) in a thread of *interp*, at its next eval-breaker
 * check; 1 if scheduled, 0 if the queue is full. */
static inline int
_PySeam_AddPendingCall(PyInterpreterState *interp, int (*func)(void *),
                       void *arg)
{
    return (_PyEval_AddPendingCall(interp, func, arg, 0)
            == _Py_ADD_PENDING_SUCCESS);
}

/* Whether audit hooks are installed: in the runtime (PySys_AddAuditHook())
 * or in *interp* (sys.addaudithook()). */
static inline int
_PySeam_HasAuditHooks(PyInterpreterState *interp)
{
    return (interp->runtime->audit_hooks.head != NULL
            || interp->audit_hooks != NULL);
}

/* ------------------------------------------------------------------------
 * Start-up
 * ------------------------------------------------------------------------ */

/* Macros, so that a status records its caller's function name. */
#define _PySeam_STATUS_OK() _PyStatus_OK()
#define _PySeam_STATUS_ERR(msg) _PyStatus_ERR(msg)
#define _PySeam_STATUS_NO_MEMORY() _PyStatus_NO_MEMORY()

static inline const PyConfig *
_PySeam_InterpConfig(PyInterpreterState *interp)
{
    return _PyInterpreterState_GetConfig(interp);
}

/* The environment variable *name*, or NULL: always NULL when
 * *use_environment* is 0 (-E, -I). */
static inline const char *
_PySeam_GetEnv(int use_environment, const char *name)
{
    return _Py_GetEnv(use_environment, name);
}

/* ------------------------------------------------------------------------
 * Objects
 * ------------------------------------------------------------------------ */

/* A compact str's cached UTF-8 bytes, or NULL if it has none yet. */
static inline const char *
_PySeam_StrCachedUTF8(PyObject *s)
{
    return FT_ATOMIC_LOAD_PTR_ACQUIRE(((PyCompactUnicodeObject *)s)->utf8);
}

/* A str's cached hash, or -1 if it was never computed. */
static inline Py_hash_t
_PySeam_StrCachedHash(PyObject *s)
{
    return _PyASCIIObject_CAST(s)->hash;
}

/* The interpreter's own str object of the identifier NAME (a borrowed
 * reference to an immortal object). */
#define _PySeam_ID(NAME) (&_Py_ID(NAME))

/* Whether every key of the exact dict *dict* is an exact str, so that a
 * lookup compares keys without calling __eq__. */
static inline int
_PySeam_DictStrKeysOnly(PyObject *dict)
{
    return DK_IS_UNICODE(((PyDictObject *)dict)->ma_keys);
}

/* dict[key] for a key with that hash, a borrowed reference, or NULL
 * (without an exception) when there is none. */
static inline PyObject *
_PySeam_DictGetKnownHash(PyObject *dict, PyObject *key, Py_hash_t hash)
{
    return _PyDict_GetItem_KnownHash(dict, key, hash);
}

/* The __qualname__ of a generator, coroutine or async generator (3.14
 * moves PyGenObject's fields into an internal header). */
static inline PyObject *
_PySeam_GenQualname(PyObject *gen)
{
    return ((PyGenObject *)gen)->gi_qualname;
}

/* A new tuple of *n* items; allocates: NULL with an exception set if it
 * fails. */
static inline PyObject *
_PySeam_TupleFromArray(PyObject *const *items, Py_ssize_t n)
{
    return _PyTuple_FromArray(items, n);
}

/* ------------------------------------------------------------------------
 * Memory allocators
 * ------------------------------------------------------------------------ */

/* The allocator of *domain* that PyMem_*() and PyObject_*() call (the
 * object domain for any other value), and the runtime's lock of the
 * allocators. */
static inline PyMemAllocatorEx *
_PySeam_Allocator(int domain)
{
    switch (domain) {
    case PYMEM_DOMAIN_RAW:
        return &_PyRuntime.allocators.standard.raw;
    case PYMEM_DOMAIN_MEM:
        return &_PyRuntime.allocators.standard.mem;
    default:
        return &_PyRuntime.allocators.standard.obj;
    }
}

static inline PyMutex *
_PySeam_AllocatorsMutex(void)
{
    return &_PyRuntime.allocators.mutex;
}

/* ------------------------------------------------------------------------
 * The frame evaluator and the perf trampoline
 * ------------------------------------------------------------------------ */

/* The interpreter's PEP 523 frame evaluator (NULL: the default one), read
 * and written as a field: _PyInterpreterState_SetEvalFrameFunc() would
 * also change the interpreter's instrumentation version. */
static inline _PyFrameEvalFunction
_PySeam_EvalFrame(PyInterpreterState *interp)
{
    return interp->eval_frame;
}

static inline void
_PySeam_SetEvalFrame(PyInterpreterState *interp, _PyFrameEvalFunction func)
{
    interp->eval_frame = func;
}

/* How many co_extra slots the interpreter's code objects have users for. */
static inline Py_ssize_t
_PySeam_CodeExtraUsers(PyInterpreterState *interp)
{
    return interp->co_extra_user_count;
}

#ifdef PY_HAVE_PERF_TRAMPOLINE

/* The type of a trampoline's code_size, in the perf-map writer's
 * signature below (3.15: size_t). */
typedef unsigned int _PySeam_PerfCodeSize;

/* The function that writes a perf-map entry for each trampoline. */
typedef void (*_PySeam_PerfWriter)(void *state, const void *code_addr,
                                   _PySeam_PerfCodeSize code_size,
                                   PyCodeObject *code);

/* The writer the trampoline uses now, and the one -X perf uses. */
static inline _PySeam_PerfWriter
_PySeam_CurrentPerfWriter(void)
{
    _PyPerf_Callbacks cur;
    _PyPerfTrampoline_GetCallbacks(&cur);
    return cur.write_state;
}

static inline _PySeam_PerfWriter
_PySeam_PerfMapWriter(void)
{
    return _Py_perfmap_callbacks.write_state;
}

/* The perf map's callbacks (-X perf) with *write* as their writer, for the
 * trampoline's next start. */
static inline int
_PySeam_SetPerfWriter(_PySeam_PerfWriter write)
{
    _PyPerf_Callbacks callbacks = _Py_perfmap_callbacks;
    callbacks.write_state = write;
    return _PyPerfTrampoline_SetCallbacks(&callbacks);
}

/* Start (*activate* 1) or stop the trampoline: it sets the current
 * interpreter's frame evaluator; -1 with an exception set on failure. */
static inline int
_PySeam_PerfTrampolineInit(int activate)
{
    return _PyPerfTrampoline_Init(activate);
}

/* Whether the trampoline's state is set up and ready to run. */
static inline int
_PySeam_PerfTrampolineReady(void)
{
    return _PyRuntime.ceval.perf.status == PERF_STATUS_OK;
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_PYDTRACE_SEAM_H */
