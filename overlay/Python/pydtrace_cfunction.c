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
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pycore_frame.h"         // _PyFrame_GetCode()
#include "pycore_instruments.h"   // _PyInstrumentation_MISSING

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

void
_PyDTrace_CFunctionEvent(int event, _PyInterpreterFrame *frame,
                         _Py_CODEUNIT *instr, PyObject *callable,
                         PyObject *self_arg)
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

#endif  /* WITH_DTRACE */
