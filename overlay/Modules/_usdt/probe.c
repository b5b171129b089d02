/* _usdt: probe names and argument types, firing a probe, and the Probe
 * type (see usdt.h).
 */

#ifndef Py_BUILD_CORE_BUILTIN
#  define Py_BUILD_CORE_MODULE 1    /* for pycore_dtrace.h */
#endif

#include "Python.h"
#include "pycore_dtrace.h"        // _PyDTrace_EncodeUTF8()

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "usdt.h"


/* ------------------------------------------------------------------------
 * Names and types
 * ------------------------------------------------------------------------ */

/* Copy the provider or probe name *obj* into *out* (maxlen + 1 bytes) if
 * it is a C identifier of at most *maxlen* characters; else raise, with
 * *hint* at the end of the message. */
int
_PyUsdt_CheckIdentifier(const char *what, PyObject *obj, size_t maxlen,
                        char *out, const char *hint)
{
    if (!PyUnicode_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "usdt: %s must be str, not %T",
                     what, obj);
        return -1;
    }
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(obj, &len);
    if (s == NULL) {
        return -1;
    }
    int valid = len > 0 && !(s[0] >= '0' && s[0] <= '9');
    for (Py_ssize_t i = 0; valid && i < len; i++) {
        char c = s[i];
        valid = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
                || (c >= '0' && c <= '9') || c == '_';
    }
    if (!valid) {
        PyErr_Format(PyExc_ValueError,
                     "usdt: %s %R is not a C identifier (ASCII letters, "
                     "digits and underscores, not starting with a "
                     "digit)%s", what, obj, hint);
        return -1;
    }
    if ((size_t)len > maxlen) {
        PyErr_Format(PyExc_ValueError,
                     "usdt: %s %R is longer than %zu characters%s",
                     what, obj, maxlen, hint);
        return -1;
    }
    memcpy(out, s, len + 1);
    return 0;
}

/* The type codes of the sequence of types *seq* into *out*. */
static int
parse_types(PyObject *seq, char *out)
{
    PyObject *items = PySequence_Tuple(seq);
    if (items == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError,
                         "usdt.Probe(): types must be a sequence of types "
                         "(int, str or bytes), not %T", seq);
        }
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (n > MAX_ARGS) {
        PyErr_Format(PyExc_TypeError,
                     "usdt.Probe(): at most %d arguments, not %zd",
                     MAX_ARGS, n);
        Py_DECREF(items);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(items, i);
        if (t == (PyObject *)&PyLong_Type) {
            out[i] = TYPE_INT;
        }
        else if (t == (PyObject *)&PyUnicode_Type) {
            out[i] = TYPE_STR;
        }
        else if (t == (PyObject *)&PyBytes_Type) {
            out[i] = TYPE_BYTES;
        }
        else {
            PyErr_Format(PyExc_TypeError,
                         "usdt.Probe(): argument %zd's type must be int, "
                         "str or bytes, not %R", i + 1, t);
            Py_DECREF(items);
            return -1;
        }
    }
    out[n] = '\0';
    Py_DECREF(items);
    return 0;
}

static PyObject *
types_tuple(const char *types)
{
    Py_ssize_t n = (Py_ssize_t)strlen(types);
    PyObject *tuple = PyTuple_New(n);
    if (tuple == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = types[i] == TYPE_INT ? (PyObject *)&PyLong_Type
                      : types[i] == TYPE_STR ? (PyObject *)&PyUnicode_Type
                      : (PyObject *)&PyBytes_Type;
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(t));
    }
    return tuple;
}


/* ------------------------------------------------------------------------
 * Firing
 * ------------------------------------------------------------------------ */

#define STRBUF_SIZE 256

/* A NUL-terminated UTF-8 copy of the str *s*: its own data if it is ASCII,
 * else an encoding into *buf* (STRBUF_SIZE bytes) or, if it may not fit,
 * into a PyMem_Malloc()ed buffer stored in *heap* for the caller to free.
 * Unlike the interpreter's probes, which must not allocate, nothing is
 * truncated. */
static const char *
str_as_utf8(PyObject *s, char *buf, char **heap)
{
    if (PyUnicode_IS_ASCII(s)) {
        return (const char *)PyUnicode_DATA(s);
    }
    Py_ssize_t len = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    /* Latin-1 characters take at most 2 bytes, others at most 4. */
    size_t most = kind == PyUnicode_1BYTE_KIND ? 2 : 4;
    char *out = buf;
    size_t size = STRBUF_SIZE;
    if ((size_t)len >= (STRBUF_SIZE - 1) / most) {
        if ((size_t)len > (PY_SSIZE_T_MAX - 1) / most) {
            PyErr_NoMemory();
            return NULL;
        }
        size = (size_t)len * most + 1;
        out = *heap = PyMem_Malloc(size);
        if (out == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    /* The buffer holds every character: nothing is cut. */
    (void)_PyDTrace_EncodeUTF8(kind, data, len, out, size);
    return out;
}

/* Check *args* against the types of *site* and fire it.  Raises TypeError
 * for a wrong count or type, OverflowError for an int outside int64. */
static int
fire(const struct site *site, PyObject *const *args, Py_ssize_t nargs,
     PyObject *kwnames)
{
    Py_ssize_t ntypes = site->ntypes;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_Format(PyExc_TypeError,
                     "probe %s:%s takes no keyword arguments",
                     site->provider, site->name);
        return -1;
    }
    if (nargs != ntypes) {
        PyErr_Format(PyExc_TypeError,
                     "probe %s:%s takes %zd argument%s (%zd given)",
                     site->provider, site->name, ntypes,
                     ntypes == 1 ? "" : "s", nargs);
        return -1;
    }
    uint64_t regs[MAX_ARGS] = {0};
    char bufs[MAX_ARGS][STRBUF_SIZE];
    char *heap[MAX_ARGS] = {NULL};
    int result = -1;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject *arg = args[i];
        const char *want;
        switch (site->types[i]) {
            case TYPE_INT:
                if (PyLong_Check(arg)) {
                    int overflow;
                    long long v = PyLong_AsLongLongAndOverflow(arg,
                                                               &overflow);
                    if (overflow) {
                        PyErr_Format(PyExc_OverflowError,
                                     "probe %s:%s argument %zd does not "
                                     "fit in a signed 64-bit int",
                                     site->provider, site->name, i + 1);
                        goto done;
                    }
                    if (v == -1 && PyErr_Occurred()) {
                        goto done;
                    }
                    regs[i] = (uint64_t)v;
                    continue;
                }
                want = "int";
                break;
            case TYPE_STR:
                if (PyUnicode_Check(arg)) {
                    const char *s = str_as_utf8(arg, bufs[i], &heap[i]);
                    if (s == NULL) {
                        goto done;
                    }
                    regs[i] = (uint64_t)(uintptr_t)s;
                    continue;
                }
                want = "str";
                break;
            default:
                if (PyBytes_Check(arg)) {
                    regs[i] = (uint64_t)(uintptr_t)PyBytes_AS_STRING(arg);
                    continue;
                }
                want = "bytes";
                break;
        }
        PyErr_Format(PyExc_TypeError,
                     "probe %s:%s argument %zd must be %s, not %T",
                     site->provider, site->name, i + 1, want, arg);
        goto done;
    }
    site->stub(regs[0], regs[1], regs[2], regs[3], regs[4], regs[5]);
    result = 0;
done:
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyMem_Free(heap[i]);
    }
    return result;
}


/* ------------------------------------------------------------------------
 * The Probe type
 * ------------------------------------------------------------------------ */

static PyObject *
probe_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                 PyObject *kwnames)
{
    ProbeObject *probe = (ProbeObject *)self;
    if (fire(probe->site, args, PyVectorcall_NARGS(nargsf), kwnames) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* A Probe object for *site*. */
PyObject *
_PyUsdt_ProbeFromSite(PyTypeObject *type, const struct site *site)
{
    ProbeObject *self = (ProbeObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = probe_vectorcall;
    self->semaphore = site->semaphore;
    self->site = site;
    self->provider = PyUnicode_FromString(site->provider);
    self->name = PyUnicode_FromString(site->name);
    self->types = types_tuple(site->types);
    self->path = PyUnicode_DecodeFSDefault(site->object->path);
    if (self->provider == NULL || self->name == NULL || self->types == NULL
        || self->path == NULL)
    {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
probe_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"provider", "name", "types", NULL};
    PyObject *provider_obj, *name_obj, *types_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O:Probe", keywords,
                                     &provider_obj, &name_obj, &types_obj))
    {
        return NULL;
    }
    char provider[MAX_PROVIDER + 1], name[MAX_NAME + 1];
    char types[MAX_ARGS + 1] = "";
    if (_PyUsdt_CheckIdentifier("provider", provider_obj, MAX_PROVIDER,
                                provider, "") < 0
        || _PyUsdt_CheckIdentifier("probe name", name_obj, MAX_NAME,
                                   name, "") < 0
        || (types_obj != NULL && parse_types(types_obj, types) < 0))
    {
        return NULL;
    }
    const char *names[1] = {name};
    const char *typelist[1] = {types};
    struct site *site;
    if (_PyUsdt_GetSites(provider, names, typelist, 1, &site) < 0) {
        return NULL;
    }
    return _PyUsdt_ProbeFromSite(type, site);
}

static void
probe_dealloc(PyObject *op)
{
    ProbeObject *self = (ProbeObject *)op;
    PyTypeObject *type = Py_TYPE(op);
    Py_XDECREF(self->provider);
    Py_XDECREF(self->name);
    Py_XDECREF(self->types);
    Py_XDECREF(self->path);
    type->tp_free(op);
    Py_DECREF(type);
}

/* "if probe:" — a load of the semaphore. */
static int
probe_bool(PyObject *op)
{
    return _PyUsdt_IsArmed(((ProbeObject *)op)->semaphore);
}

static PyObject *
probe_get_armed(PyObject *op, void *closure)
{
    ProbeObject *self = (ProbeObject *)op;
    return PyBool_FromLong(_PyUsdt_IsArmed(self->semaphore));
}

static PyObject *
probe_repr(PyObject *op)
{
    ProbeObject *self = (ProbeObject *)op;
    char args[ARGUMENTS_SIZE];
    _PyUsdt_FormatArguments(self->site->types, args);
    return PyUnicode_FromFormat("<usdt.Probe %s:%s(%s) %R>",
                                self->site->provider, self->site->name,
                                args, self->path);
}

static PyMemberDef probe_members[] = {
    {"provider", Py_T_OBJECT_EX, offsetof(ProbeObject, provider),
     Py_READONLY, PyDoc_STR("The provider name.")},
    {"name", Py_T_OBJECT_EX, offsetof(ProbeObject, name), Py_READONLY,
     PyDoc_STR("The probe name.")},
    {"types", Py_T_OBJECT_EX, offsetof(ProbeObject, types), Py_READONLY,
     PyDoc_STR("The argument types, a tuple of int, str and bytes.")},
    {"path", Py_T_OBJECT_EX, offsetof(ProbeObject, path), Py_READONLY,
     PyDoc_STR("The file a tracer attaches to (usdt:PATH:PROVIDER:NAME).")},
    {"__vectorcalloffset__", Py_T_PYSSIZET,
     offsetof(ProbeObject, vectorcall), Py_READONLY},
    {NULL}
};

static PyGetSetDef probe_getset[] = {
    {"armed", probe_get_armed, NULL,
     PyDoc_STR("True while a tracer has armed the probe (bool(probe)).")},
    {NULL}
};

PyDoc_STRVAR(probe_doc,
"Probe(provider, name, types=())\n\
--\n\
\n\
A USDT probe provider:name whose arguments have the given types (int,\n\
str or bytes; at most 6).  bool(probe) is true while a tracer has armed\n\
it; probe(*args) fires it.");

static PyType_Slot probe_slots[] = {
    {Py_tp_doc, (void *)probe_doc},
    {Py_tp_new, probe_new},
    {Py_tp_dealloc, probe_dealloc},
    {Py_tp_repr, probe_repr},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_members, probe_members},
    {Py_tp_getset, probe_getset},
    {Py_nb_bool, probe_bool},
    {0, NULL}
};

PyType_Spec _PyUsdt_ProbeSpec = {
    .name = "usdt.Probe",
    .basicsize = sizeof(ProbeObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = probe_slots,
};
