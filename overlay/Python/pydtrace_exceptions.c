/* exception__raise / exception__reraise / exception__handled probes
 * (cpython-usdt).
 *
 * See Include/internal/pycore_dtrace.h for the rules every helper follows.
 *
 * While one of these probes is armed, the PEP 669 events RAISE, RERAISE
 * and EXCEPTION_HANDLED are added to the legacy profile tool slot
 * (Python/pydtrace_arming.c).  They are global events: no code is
 * instrumented for them, and the interpreter's exception paths deliver them
 * (Python/ceval.c) exactly when it would deliver them to a sys.monitoring
 * tool; the slot has no callback for them, so only the probe sees them.
 *
 *   exception__raise(filename, funcname, lineno, exctype)     RAISE
 *   exception__reraise(filename, funcname, lineno, exctype)   RERAISE
 *   exception__handled(filename, funcname, lineno, exctype)   EXCEPTION_HANDLED
 *
 * filename, funcname (co_name) and lineno are the location of the frame the
 * event is reported for: its code and its current line, the f_lineno that a
 * sys.monitoring callback reads from that frame (for RAISE the raising
 * instruction's line; for EXCEPTION_HANDLED and RERAISE the line where the
 * exception entered the frame, not the handler's), or -1 where f_lineno is
 * None (instructions without a line, as in except* machinery).  exctype is
 * the exception type's name as a traceback prints it: __qualname__,
 * prefixed with __module__ and a dot unless the module is builtins or
 * __main__ (ValueError, json.decoder.JSONDecodeError).
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <string.h>

#ifdef WITH_DTRACE

static int
event_armed(int event)
{
    switch (event) {
        case PY_MONITORING_EVENT_RAISE:
            return PyDTrace_EXCEPTION_RAISE_ENABLED();
        case PY_MONITORING_EVENT_RERAISE:
            return PyDTrace_EXCEPTION_RERAISE_ENABLED();
        case PY_MONITORING_EVENT_EXCEPTION_HANDLED:
            return PyDTrace_EXCEPTION_HANDLED_ENABLED();
        default:
            return 0;
    }
}

/* Like the traceback module: no prefix for builtins and __main__, and
 * "<unknown>." when __module__ is not a str (also when it cannot be read
 * without running code, see _PyDTrace_TypeNames()).  *modbuf*, *qualbuf*
 * and *buf* hold _PyDTrace_STRBUF_SIZE bytes each. */
static const char *
traceback_type_name(PyTypeObject *type, char *modbuf, char *qualbuf,
                    char *buf)
{
    const char *module;
    const char *qualname;
    _PyDTrace_TypeNames(type, modbuf, qualbuf, &module, &qualname);
    if (strcmp(module, "builtins") == 0 || strcmp(module, "__main__") == 0) {
        return qualname;
    }
    return _PyDTrace_JoinDotted(module, qualname, buf, _PyDTrace_STRBUF_SIZE);
}

void
_PyDTrace_ExceptionEvent(int event, _PyInterpreterFrame *frame,
                         PyObject *exc)
{
    if (!event_armed(event) || !_PyDTrace_FrameSelected(frame, event)) {
        return;
    }
    char modbuf[_PyDTrace_STRBUF_SIZE];
    char qualbuf[_PyDTrace_STRBUF_SIZE];
    char typebuf[_PyDTrace_STRBUF_SIZE];
    const char *exctype = traceback_type_name(Py_TYPE(exc), modbuf, qualbuf,
                                              typebuf);
    struct _PyDTrace_CodeNames names;
    _PyDTrace_GetCodeNames(_PySeam_FrameCode(frame), &names);
    const char *filename = names.filename;
    const char *funcname = names.funcname;
    /* PyUnstable_InterpreterFrame_GetLine(frame), cached. */
    int lineno = _PyDTrace_InstrLine(frame, _PySeam_FrameInstr(frame));
    switch (event) {
        case PY_MONITORING_EVENT_RAISE:
            PyDTrace_EXCEPTION_RAISE(filename, funcname, lineno, exctype);
            break;
        case PY_MONITORING_EVENT_RERAISE:
            PyDTrace_EXCEPTION_RERAISE(filename, funcname, lineno, exctype);
            break;
        default:
            PyDTrace_EXCEPTION_HANDLED(filename, funcname, lineno, exctype);
            break;
    }
}

#endif  /* WITH_DTRACE */
