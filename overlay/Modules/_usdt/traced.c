/* _usdt: usdt.traced(), the decorator it returns, and the functions that
 * decorator wraps (see usdt.h).
 */

#include "Python.h"

#include <stddef.h>
#include <stdio.h>

#include "usdt.h"


/* ------------------------------------------------------------------------
 * The traced function type
 * ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *func;
    uint16_t *entry_semaphore;
    stub_func entry_stub;
    uint16_t *return_semaphore;
    stub_func return_stub;
    PyObject *entry_probe;
    PyObject *return_probe;
    PyObject *dict;
    PyObject *weakreflist;
} TracedObject;

/* <name>__entry() before the call, <name>__return(raised) after it, each
 * only while armed.  Firing runs no Python code and touches no exception
 * state, so the call's result or exception passes through unchanged. */
static PyObject *
traced_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf,
                  PyObject *kwnames)
{
    TracedObject *self = (TracedObject *)op;
    if (self->func == NULL) {
        /* Only reachable from a finalizer of a garbage cycle. */
        PyErr_SetString(PyExc_RuntimeError,
                        "usdt.traced function called after being cleared");
        return NULL;
    }
    if (_PyUsdt_IsArmed(self->entry_semaphore)) {
        self->entry_stub(0, 0, 0, 0, 0, 0);
    }
    PyObject *result = PyObject_Vectorcall(self->func, args, nargsf,
                                           kwnames);
    if (_PyUsdt_IsArmed(self->return_semaphore)) {
        self->return_stub(result == NULL, 0, 0, 0, 0, 0);
    }
    return result;
}

/* Bind like a function, so that a traced function works as a method. */
static PyObject *
traced_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        return Py_NewRef(self);
    }
    return PyMethod_New(self, obj);
}

static int
traced_traverse(PyObject *op, visitproc visit, void *arg)
{
    TracedObject *self = (TracedObject *)op;
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(self->func);
    Py_VISIT(self->entry_probe);
    Py_VISIT(self->return_probe);
    Py_VISIT(self->dict);
    return 0;
}

static int
traced_clear(PyObject *op)
{
    TracedObject *self = (TracedObject *)op;
    Py_CLEAR(self->func);
    Py_CLEAR(self->entry_probe);
    Py_CLEAR(self->return_probe);
    Py_CLEAR(self->dict);
    return 0;
}

static void
traced_dealloc(PyObject *op)
{
    TracedObject *self = (TracedObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs(op);
    }
    (void)traced_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *
traced_repr(PyObject *op)
{
    TracedObject *self = (TracedObject *)op;
    ProbeObject *entry = (ProbeObject *)self->entry_probe;
    if (self->func == NULL || entry == NULL) {
        return PyUnicode_FromString("<usdt.traced function>");
    }
    return PyUnicode_FromFormat("<usdt.traced %U:%U of %R>",
                                entry->provider, entry->name, self->func);
}

/* Pickled by reference, like a function. */
static PyObject *
traced_reduce(PyObject *self, PyObject *unused)
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef traced_methods[] = {
    {"__reduce__", traced_reduce, METH_NOARGS},
    {NULL}
};

static PyMemberDef traced_members[] = {
    {"entry_probe", Py_T_OBJECT_EX, offsetof(TracedObject, entry_probe),
     Py_READONLY, PyDoc_STR("The probe fired before each call.")},
    {"return_probe", Py_T_OBJECT_EX, offsetof(TracedObject, return_probe),
     Py_READONLY, PyDoc_STR("The probe fired after each call.")},
    {"__vectorcalloffset__", Py_T_PYSSIZET,
     offsetof(TracedObject, vectorcall), Py_READONLY},
    {"__dictoffset__", Py_T_PYSSIZET, offsetof(TracedObject, dict),
     Py_READONLY},
    {"__weaklistoffset__", Py_T_PYSSIZET,
     offsetof(TracedObject, weakreflist), Py_READONLY},
    {NULL}
};

static PyGetSetDef traced_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL}
};

PyDoc_STRVAR(traced_type_doc,
"A function wrapped by usdt.traced(): calls fire PROVIDER:NAME__entry()\n\
before and PROVIDER:NAME__return(raised) after the call, while armed.");

static PyType_Slot traced_slots[] = {
    {Py_tp_doc, (void *)traced_type_doc},
    {Py_tp_dealloc, traced_dealloc},
    {Py_tp_traverse, traced_traverse},
    {Py_tp_clear, traced_clear},
    {Py_tp_repr, traced_repr},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, traced_descr_get},
    {Py_tp_methods, traced_methods},
    {Py_tp_members, traced_members},
    {Py_tp_getset, traced_getset},
    {0, NULL}
};

PyType_Spec _PyUsdt_TracedSpec = {
    .name = "usdt.TracedFunction",
    .basicsize = sizeof(TracedObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = traced_slots,
};


/* ------------------------------------------------------------------------
 * The decorator and usdt.traced()
 * ------------------------------------------------------------------------ */

/* The object usdt.traced(provider, name) returns. */
typedef struct {
    PyObject_HEAD
    PyObject *provider;
    PyObject *name;             /* or None: the function's __name__ */
} DecoratorObject;

static PyObject *
decorator_call(PyObject *op, PyObject *args, PyObject *kwargs)
{
    DecoratorObject *self = (DecoratorObject *)op;
    PyObject *func;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError,
                        "a usdt.traced() decorator takes no keyword "
                        "arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O:traced", &func)) {
        return NULL;
    }
    if (!PyCallable_Check(func)) {
        PyErr_Format(PyExc_TypeError,
                     "usdt.traced() decorates a callable, not %T", func);
        return NULL;
    }
    module_state *state = _PyUsdt_StateOfType(Py_TYPE(op));
    char provider[MAX_PROVIDER + 1];
    char base[MAX_TRACED_NAME + 1];
    if (_PyUsdt_CheckIdentifier("provider", self->provider, MAX_PROVIDER,
                                provider, "") < 0)
    {
        return NULL;
    }
    if (self->name != Py_None) {
        if (_PyUsdt_CheckIdentifier("probe name", self->name,
                                    MAX_TRACED_NAME, base, "") < 0)
        {
            return NULL;
        }
    }
    else {
        PyObject *name = PyObject_GetAttrString(func, "__name__");
        if (name == NULL) {
            return NULL;
        }
        int rc = _PyUsdt_CheckIdentifier(
            "the function's __name__", name, MAX_TRACED_NAME, base,
            ": pass usdt.traced(provider, name=...)");
        Py_DECREF(name);
        if (rc < 0) {
            return NULL;
        }
    }
    char entry_name[MAX_NAME + 1], return_name[MAX_NAME + 1];
    snprintf(entry_name, sizeof(entry_name), "%s__entry", base);
    snprintf(return_name, sizeof(return_name), "%s__return", base);
    const char *names[2] = {entry_name, return_name};
    const char *types[2] = {"", "i"};
    struct site *found[2];
    if (_PyUsdt_GetSites(provider, names, types, 2, found) < 0) {
        return NULL;
    }

    PyObject *functools = NULL, *result = NULL;
    TracedObject *traced = PyObject_GC_New(TracedObject,
                                           state->traced_type);
    if (traced == NULL) {
        return NULL;
    }
    traced->vectorcall = traced_vectorcall;
    traced->func = Py_NewRef(func);
    traced->entry_semaphore = found[0]->semaphore;
    traced->entry_stub = found[0]->stub;
    traced->return_semaphore = found[1]->semaphore;
    traced->return_stub = found[1]->stub;
    traced->entry_probe = NULL;
    traced->return_probe = NULL;
    traced->dict = NULL;
    traced->weakreflist = NULL;
    PyObject_GC_Track(traced);
    traced->entry_probe = _PyUsdt_ProbeFromSite(state->probe_type,
                                                found[0]);
    if (traced->entry_probe == NULL) {
        goto done;
    }
    traced->return_probe = _PyUsdt_ProbeFromSite(state->probe_type,
                                                 found[1]);
    if (traced->return_probe == NULL) {
        goto done;
    }
    /* __module__, __name__, __qualname__, __doc__, __dict__, __wrapped__
     * and the rest, exactly as functools.wraps() sets them. */
    functools = PyImport_ImportModule("functools");
    if (functools == NULL) {
        goto done;
    }
    PyObject *updated = PyObject_CallMethod(functools, "update_wrapper",
                                            "OO", traced, func);
    if (updated == NULL) {
        goto done;
    }
    Py_DECREF(updated);
    result = Py_NewRef(traced);
done:
    Py_XDECREF(functools);
    Py_DECREF(traced);
    return result;
}

static void
decorator_dealloc(PyObject *op)
{
    DecoratorObject *self = (DecoratorObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    Py_XDECREF(self->provider);
    Py_XDECREF(self->name);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *
decorator_repr(PyObject *op)
{
    DecoratorObject *self = (DecoratorObject *)op;
    if (self->name == Py_None) {
        return PyUnicode_FromFormat("usdt.traced(%R)", self->provider);
    }
    return PyUnicode_FromFormat("usdt.traced(%R, %R)", self->provider,
                                self->name);
}

static PyType_Slot decorator_slots[] = {
    {Py_tp_dealloc, decorator_dealloc},
    {Py_tp_repr, decorator_repr},
    {Py_tp_call, decorator_call},
    {0, NULL}
};

PyType_Spec _PyUsdt_DecoratorSpec = {
    .name = "usdt._TracedDecorator",
    .basicsize = sizeof(DecoratorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = decorator_slots,
};

const char _PyUsdt_TracedDoc[] = PyDoc_STR(
"traced(provider, name=None)\n\
--\n\
\n\
A decorator: calls of the function fire the probes\n\
PROVIDER:NAME__entry() before and PROVIDER:NAME__return(raised) after\n\
(raised is 1 if the call raised an exception, else 0), each only while a\n\
tracer has armed it.  NAME defaults to the function's __name__.");

PyObject *
_PyUsdt_Traced(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"provider", "name", NULL};
    PyObject *provider, *name = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:traced", keywords,
                                     &provider, &name))
    {
        return NULL;
    }
    char buf[MAX_NAME + 1];
    if (PyCallable_Check(provider)) {
        PyErr_SetString(PyExc_TypeError,
                        "usdt.traced() takes the provider name: write "
                        "@usdt.traced(\"provider\")");
        return NULL;
    }
    if (_PyUsdt_CheckIdentifier("provider", provider, MAX_PROVIDER,
                                buf, "") < 0
        || (name != Py_None
            && _PyUsdt_CheckIdentifier("probe name", name,
                                       MAX_TRACED_NAME, buf, "") < 0))
    {
        return NULL;
    }
    module_state *state = PyModule_GetState(module);
    DecoratorObject *self = PyObject_New(DecoratorObject,
                                         state->decorator_type);
    if (self == NULL) {
        return NULL;
    }
    self->provider = Py_NewRef(provider);
    self->name = Py_NewRef(name);
    return (PyObject *)self;
}
