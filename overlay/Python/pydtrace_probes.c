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
 * The same hook passes the profile slot's CALL, C_RETURN and C_RAISE events
 * to Python/pydtrace_cfunction.c and its RAISE, RERAISE and
 * EXCEPTION_HANDLED events to Python/pydtrace_exceptions.c.
 *
 * Like the legacy callbacks, no probe fires while tstate->tracing is set
 * (i.e. inside a sys.setprofile()/sys.settrace()/sys.monitoring callback).
 *
 * Arming (adding the events to the legacy slots when a semaphore changes)
 * is in Python/pydtrace_arming.c.  Every interpreter fires these probes.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <string.h>

#define UNKNOWN "<unknown>"

#ifdef WITH_DTRACE

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
    if (!_PyDTrace_FrameSelected(frame, event)) {
        return;
    }
    PyCodeObject *code = _PySeam_FrameCode(frame);
    struct _PyDTrace_CodeNames names;
    _PyDTrace_GetCodeNames(code, &names);
    if (entry) {
        PyDTrace_FUNCTION_ENTRY(names.filename, names.funcname,
                                _PySeam_CodeFirstLine(code));
    }
    else {
        PyDTrace_FUNCTION_RETURN(names.filename, names.funcname,
                                 _PyDTrace_InstrLine(frame, instr));
    }
}

uint8_t
_PyDTrace_LegacyEvent(PyThreadState *tstate, int event,
                      _PyInterpreterFrame *frame, _Py_CODEUNIT *instr,
                      Py_ssize_t nargs, PyObject *const *args, uint8_t tools)
{
    if (tools & (1 << PY_MONITORING_SYS_PROFILE_ID)) {
        switch (event) {
            case PY_MONITORING_EVENT_CALL:
            case PY_MONITORING_EVENT_C_RETURN:
            case PY_MONITORING_EVENT_C_RAISE:
                /* args: callable, then its first argument or MISSING. */
                assert(nargs == 4);
                tools = _PyDTrace_CFunctionEvent(event, frame, instr,
                                                 args[3], args[4], tools);
                break;
            case PY_MONITORING_EVENT_RAISE:
            case PY_MONITORING_EVENT_RERAISE:
            case PY_MONITORING_EVENT_EXCEPTION_HANDLED:
                /* args: the exception. */
                assert(nargs == 3);
                _PyDTrace_ExceptionEvent(event, frame, args[3]);
                break;
            default:
                fire_function(event, frame, instr);
                if (PyDTrace_BATCH_ENABLED()) {
                    _PyDTrace_BatchRecord(event, frame);
                }
                break;
        }
        if (!_PySeam_HasProfileFunc(tstate)) {
            tools &= ~(1 << PY_MONITORING_SYS_PROFILE_ID);
        }
    }
    if ((tools & (1 << PY_MONITORING_SYS_TRACE_ID))
        && !_PySeam_HasTraceFunc(tstate))
    {
        tools &= ~(1 << PY_MONITORING_SYS_TRACE_ID);
    }
    return tools;
}

static int
instr_line(PyCodeObject *code, int index)
{
    if (_PySeam_HasMonitoringLines(code)) {
        return _PySeam_MonitoringLine(code, index);
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
        PyCodeObject *code = _PySeam_FrameCode(frame);
        int from = _PySeam_InstrIndex(frame, instr);
        int to = _PySeam_InstrIndex(frame, target);
        if (to <= from) {
            int to_line = instr_line(code, to);
            if (to_line >= 0 && to_line == instr_line(code, from)) {
                _PyDTrace_FireLine(frame, to_line);
            }
        }
    }
    if (!_PySeam_HasTraceFunc(tstate)) {
        tools &= ~(1 << PY_MONITORING_SYS_TRACE_ID);
    }
    return tools;
}

void
_PyDTrace_FireLine(_PyInterpreterFrame *frame, int line)
{
    if (line < 0
        || !_PyDTrace_FrameSelected(frame, PY_MONITORING_EVENT_LINE))
    {
        return;
    }
    struct _PyDTrace_CodeNames names;
    _PyDTrace_GetCodeNames(_PySeam_FrameCode(frame), &names);
    PyDTrace_LINE(names.filename, names.funcname, line);
}

/* ------------------------------------------------------------------------
 * instance__new__start/done, instance__delete__start/done
 * ------------------------------------------------------------------------ */

#define FIRE_INSTANCE(PROBE, type) \
    do { \
        char modbuf[_PyDTrace_STRBUF_SIZE]; \
        const char *tname = (type)->tp_name ? (type)->tp_name : UNKNOWN; \
        PROBE(tname, _PyDTrace_TypeModuleName((type), modbuf, sizeof(modbuf))); \
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

/* ------------------------------------------------------------------------
 * import__find__load__start/done (Python/import.c), audit
 * (Python/sysmodule.c): upstream's probes, with arguments that follow the
 * rules of pycore_dtrace.h
 * ------------------------------------------------------------------------ */

void
_PyDTrace_FireImportStart(PyObject *name)
{
    char buf[_PyDTrace_STRBUF_SIZE];
    PyDTrace_IMPORT_FIND_LOAD_START(
        _PyDTrace_StrAsUTF8(name, buf, sizeof(buf)));
}

void
_PyDTrace_FireImportDone(PyObject *name, int found)
{
    char buf[_PyDTrace_STRBUF_SIZE];
    PyDTrace_IMPORT_FIND_LOAD_DONE(
        _PyDTrace_StrAsUTF8(name, buf, sizeof(buf)), found);
}

int
_PyDTrace_AuditOnly(PyInterpreterState *interp)
{
    return PyDTrace_AUDIT_ENABLED() && !_PySeam_HasAuditHooks(interp);
}

void
_PyDTrace_FireAuditFromPython(PyObject *event, PyObject *const *args,
                              Py_ssize_t nargs)
{
    /* Without audit hooks sys.audit() accepts anything and does nothing:
     * keep that, and report only str events. */
    if (!PyUnicode_Check(event)) {
        return;
    }
    char buf[_PyDTrace_STRBUF_SIZE];
    const char *name = _PyDTrace_StrAsUTF8(event, buf, sizeof(buf));
    /* The probe's second argument is the tuple of the event's arguments,
     * as upstream passes it.  Building it is the one allocation of this
     * probe; if it fails, the event is reported with an empty tuple. */
    PyObject *exc = PyErr_GetRaisedException();
    PyObject *tuple = _PySeam_TupleFromArray(args, nargs);
    if (tuple == NULL) {
        PyErr_Clear();
    }
    PyErr_SetRaisedException(exc);
    PyDTrace_AUDIT(name, tuple != NULL ? (void *)tuple
                                       : (void *)Py_GetConstantBorrowed(
                                             Py_CONSTANT_EMPTY_TUPLE));
    Py_XDECREF(tuple);
}

#endif  /* WITH_DTRACE */
