/* cfunction__entry / cfunction__return probes (cpython-usdt).
 *
 * See Include/internal/pycore_dtrace.h for the rules every helper follows.
 *
 * While one of these probes is armed, the CALL event (and with it C_RETURN
 * and C_RAISE) is added to the legacy profile tool slot
 * (Python/pydtrace_arming.c), so every instrumented call reaches
 * _PyDTrace_LegacyEvent() (Python/pydtrace_probes.c), which passes the
 * callable here.  The rule that decides whether a call is reported is the
 * one of sys_profile_call_or_return() in Python/legacy_tracing.c, so the
 * probes fire exactly when a sys.setprofile() function would receive
 * 'c_call' (CALL) and 'c_return' (C_RETURN) or 'c_exception' (C_RAISE):
 *
 *   - a builtin function or method (PyCFunction_Check());
 *   - a method descriptor (list.append) called with a first argument that
 *     the descriptor applies to: the legacy path binds it with
 *     tp_descr_get(), which fails, and reports nothing, otherwise.
 *
 *   cfunction__entry(filename, funcname, lineno, modulename)
 *   cfunction__return(filename, funcname, lineno, modulename)
 *
 * filename and lineno are the calling Python frame's (the line of the call
 * instruction).  modulename + "." + funcname names the callable as Python
 * code spells it:
 *
 *   len                  "builtins"     "len"
 *   time.sleep           "time"         "sleep"
 *   [].append, list.append
 *                        "builtins"     "list.append"
 *   dict.fromkeys        "builtins"     "dict.fromkeys"
 *   deque().append       "collections"  "deque.append"
 *
 * funcname is the function's __qualname__ (ml_name, prefixed with the type
 * that owns the method: the descriptor's type, the bound type for a
 * classmethod, otherwise the type of __self__).  modulename is the
 * function's __module__ when that is a str, otherwise the module of that
 * type, otherwise "".
 *
 * Calls in progress when a tool starts watching CALL
 * ---------------------------------------------------
 * Whether a call delivers C_RETURN/C_RAISE to any tool is decided when the
 * CALL instruction is dispatched: only INSTRUMENTED_CALL (and _KW,
 * _FUNCTION_EX) emits them (Python/bytecodes.c).  While a cfunction probe
 * is armed every CALL is instrumented, so a call that was in progress when
 * a tool started watching CALL (sys.setprofile(f) itself, or
 * sys.monitoring.set_events(tool, CALL)) would deliver a C_RETURN that the
 * unarmed interpreter never emits.  _PyDTrace_CallToolsChanging() records
 * those calls when the first visible tool gets CALL events, and their
 * C_RETURN/C_RAISE then reaches the probe only.  A record is dropped at the
 * next CALL event of the same instruction in the same frame, so a record
 * for a call that was not in progress is harmless.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pycore_frame.h"         // _PyFrame_GetCode()
#include "pycore_instruments.h"   // _PyInstrumentation_MISSING
#include "pycore_lock.h"          // PyMutex
#include "pycore_opcode_metadata.h"  // CALL
#include "pycore_pyatomic_ft_wrappers.h"  // FT_ATOMIC_LOAD_SSIZE_RELAXED()
#include "pycore_pystate.h"       // HEAD_LOCK()

#ifdef WITH_DTRACE

/* Owner type of a method, for its qualified name: NULL for a function of a
 * module (or without __self__). */
static PyTypeObject *
method_owner(PyCFunctionObject *func)
{
    PyObject *self = func->m_self;
    if (self == NULL || PyModule_Check(self)) {
        return NULL;
    }
    if (PyType_Check(self)) {
        return (PyTypeObject *)self;
    }
    return Py_TYPE(self);
}

static void
fire_cfunction(int event, _PyInterpreterFrame *frame, _Py_CODEUNIT *instr,
               PyObject *callable, PyObject *self_arg)
{
    int entry = (event == PY_MONITORING_EVENT_CALL);
    if (entry ? !PyDTrace_CFUNCTION_ENTRY_ENABLED()
              : !PyDTrace_CFUNCTION_RETURN_ENABLED())
    {
        return;
    }
    const char *ml_name;
    PyTypeObject *owner;
    PyObject *module = NULL;
    if (PyCFunction_Check(callable)) {
        PyCFunctionObject *func = (PyCFunctionObject *)callable;
        ml_name = func->m_ml->ml_name;
        owner = method_owner(func);
        module = func->m_module;
    }
    else if (Py_IS_TYPE(callable, &PyMethodDescr_Type)) {
        PyMethodDescrObject *descr = (PyMethodDescrObject *)callable;
        owner = descr->d_common.d_type;
        if (self_arg == &_PyInstrumentation_MISSING
            || !PyObject_TypeCheck(self_arg, owner))
        {
            return;
        }
        ml_name = descr->d_method->ml_name;
    }
    else {
        return;
    }

    char modbuf[_PyDTrace_STRBUF_SIZE];
    char qualbuf[_PyDTrace_STRBUF_SIZE];
    char namebuf[_PyDTrace_STRBUF_SIZE];
    const char *modulename = "";
    const char *funcname = ml_name;
    if (owner != NULL) {
        const char *type_module;
        const char *type_qualname;
        _PyDTrace_TypeNames(owner, modbuf, qualbuf, &type_module,
                            &type_qualname);
        funcname = _PyDTrace_JoinDotted(type_qualname, ml_name, namebuf,
                                        sizeof(namebuf));
        modulename = type_module;
    }
    if (module != NULL && PyUnicode_Check(module)) {
        modulename = _PyDTrace_StrAsUTF8(module, modbuf, sizeof(modbuf));
    }

    PyCodeObject *code = _PyFrame_GetCode(frame);
    char filebuf[_PyDTrace_STRBUF_SIZE];
    const char *filename = _PyDTrace_StrAsUTF8(code->co_filename, filebuf,
                                               sizeof(filebuf));
    int lineno = _PyDTrace_InstrLine(frame, instr);
    if (entry) {
        PyDTrace_CFUNCTION_ENTRY(filename, funcname, lineno, modulename);
    }
    else {
        PyDTrace_CFUNCTION_RETURN(filename, funcname, lineno, modulename);
    }
}

/* ------------------------------------------------------------------------
 * Calls in progress when a tool starts watching CALL
 * ------------------------------------------------------------------------ */

#define MAX_HIDDEN_CALLS 4096

struct hidden_call {
    _PyInterpreterFrame *frame;
    _Py_CODEUNIT *instr;
};

static struct {
    PyMutex mutex;              /* guards everything below */
    Py_ssize_t count;           /* also read without the mutex */
    struct hidden_call calls[MAX_HIDDEN_CALLS];
} hidden;

/* Remove the record of (frame, instr); return 1 if there was one. */
static int
take_hidden(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    int found = 0;
    PyMutex_Lock(&hidden.mutex);
    for (Py_ssize_t i = 0; i < hidden.count; i++) {
        if (hidden.calls[i].frame == frame
            && hidden.calls[i].instr == instr)
        {
            hidden.calls[i] = hidden.calls[hidden.count - 1];
            _Py_atomic_store_ssize_relaxed(&hidden.count, hidden.count - 1);
            found = 1;
            break;
        }
    }
    PyMutex_Unlock(&hidden.mutex);
    return found;
}

uint8_t
_PyDTrace_CFunctionEvent(int event, _PyInterpreterFrame *frame,
                         _Py_CODEUNIT *instr, PyObject *callable,
                         PyObject *self_arg, uint8_t tools)
{
    fire_cfunction(event, frame, instr, callable, self_arg);
    if (_Py_atomic_load_ssize_relaxed(&hidden.count) > 0
        && take_hidden(frame, instr)
        && event != PY_MONITORING_EVENT_CALL)
    {
        /* Dispatched before any tool watched CALL: no tool sees it. */
        return 0;
    }
    return tools;
}

static int
is_call_instruction(_PyInterpreterFrame *frame)
{
    PyCodeObject *code = _PyFrame_GetCode(frame);
    int offset = (int)(frame->instr_ptr - _PyCode_CODE(code));
    if (offset < 0 || offset >= Py_SIZE(code)) {
        return 0;
    }
    int opcode = _Py_GetBaseOpcode(code, offset);
    return (opcode == CALL || opcode == CALL_KW
            || opcode == CALL_FUNCTION_EX);
}

/* Record the calls in progress in the frames (of *code*, or all) of every
 * thread of *interp*.  Called with the world stopped. */
static void
hide_calls_in_progress(PyInterpreterState *interp, PyCodeObject *code)
{
    PyMutex_Lock(&hidden.mutex);
    HEAD_LOCK(interp->runtime);
    for (PyThreadState *ts = interp->threads.head; ts != NULL;
         ts = ts->next)
    {
        for (_PyInterpreterFrame *f = ts->current_frame; f != NULL;
             f = f->previous)
        {
            if (f->owner == FRAME_OWNED_BY_CSTACK
                || (code != NULL && _PyFrame_GetCode(f) != code)
                || !is_call_instruction(f)
                || hidden.count >= MAX_HIDDEN_CALLS)
            {
                continue;
            }
            hidden.calls[hidden.count].frame = f;
            hidden.calls[hidden.count].instr = f->instr_ptr;
            _Py_atomic_store_ssize_relaxed(&hidden.count, hidden.count + 1);
        }
    }
    HEAD_UNLOCK(interp->runtime);
    PyMutex_Unlock(&hidden.mutex);
}

void
_PyDTrace_CallToolsChanging(PyInterpreterState *interp, PyCodeObject *code,
                            int tool_id, uint32_t events)
{
    const uint8_t profile = 1 << PY_MONITORING_SYS_PROFILE_ID;
    uint8_t before = interp->monitors.tools[PY_MONITORING_EVENT_CALL];
    if (code != NULL && code->_co_monitoring != NULL) {
        before |= code->_co_monitoring->local_monitors.tools[
            PY_MONITORING_EVENT_CALL];
    }
    int wants_call = (events >> PY_MONITORING_EVENT_CALL) & 1;
    /* Does the profile slot watch CALL for a sys.setprofile() function, or
     * only for the probes? */
    int was_profiling;
    if (tool_id == PY_MONITORING_SYS_PROFILE_ID) {
        int profiling =
            FT_ATOMIC_LOAD_SSIZE_RELAXED(interp->sys_profiling_threads) > 0;
        was_profiling = _PyDTrace_SwapLegacyProfiling(interp, profiling);
        wants_call = wants_call && profiling;
    }
    else {
        was_profiling = _PyDTrace_SwapLegacyProfiling(interp, -1);
    }
    int probes_only = (before & profile) && !was_profiling;
    if (probes_only) {
        before &= ~profile;
    }
    if (before == 0 && wants_call && probes_only) {
        hide_calls_in_progress(interp, code);
    }
}

#endif  /* WITH_DTRACE */
