/* _usdt: the module, its state and its definition (see usdt.h for the
 * files of the module and what each one does).
 */

#include "Python.h"

#include "usdt.h"

static struct PyModuleDef usdt_module;

/* The state of the module that defined *type*: found through the type,
 * since a decorator's call gets no module. */
module_state *
_PyUsdt_StateOfType(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &usdt_module);
    assert(module != NULL);
    return PyModule_GetState(module);
}

static PyMethodDef usdt_methods[] = {
    {"traced", (PyCFunction)(void (*)(void))_PyUsdt_Traced,
     METH_VARARGS | METH_KEYWORDS, _PyUsdt_TracedDoc},
    {NULL}
};

static int
usdt_exec(PyObject *module)
{
    module_state *state = PyModule_GetState(module);
    state->probe_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &_PyUsdt_ProbeSpec, NULL);
    if (state->probe_type == NULL
        || PyModule_AddType(module, state->probe_type) < 0)
    {
        return -1;
    }
    state->traced_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &_PyUsdt_TracedSpec, NULL);
    if (state->traced_type == NULL
        || PyModule_AddType(module, state->traced_type) < 0)
    {
        return -1;
    }
    state->decorator_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &_PyUsdt_DecoratorSpec, NULL);
    if (state->decorator_type == NULL) {
        return -1;
    }
    if (PyModule_AddIntConstant(module, "MAX_ARGS", MAX_ARGS) < 0
        || PyModule_AddIntConstant(module, "MAX_PROVIDER", MAX_PROVIDER) < 0
        || PyModule_AddIntConstant(module, "MAX_NAME", MAX_NAME) < 0)
    {
        return -1;
    }
    return 0;
}

static int
usdt_traverse(PyObject *module, visitproc visit, void *arg)
{
    module_state *state = PyModule_GetState(module);
    Py_VISIT(state->probe_type);
    Py_VISIT(state->traced_type);
    Py_VISIT(state->decorator_type);
    return 0;
}

static int
usdt_clear(PyObject *module)
{
    module_state *state = PyModule_GetState(module);
    Py_CLEAR(state->probe_type);
    Py_CLEAR(state->traced_type);
    Py_CLEAR(state->decorator_type);
    return 0;
}

static void
usdt_free(void *module)
{
    (void)usdt_clear((PyObject *)module);
}

static PyModuleDef_Slot usdt_slots[] = {
    {Py_mod_exec, usdt_exec},
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
    {0, NULL}
};

PyDoc_STRVAR(usdt_doc,
"USDT probes defined at run time (the C part of the usdt module).");

static struct PyModuleDef usdt_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_usdt",
    .m_doc = usdt_doc,
    .m_size = sizeof(module_state),
    .m_methods = usdt_methods,
    .m_slots = usdt_slots,
    .m_traverse = usdt_traverse,
    .m_clear = usdt_clear,
    .m_free = usdt_free,
};

PyMODINIT_FUNC
PyInit__usdt(void)
{
    return PyModuleDef_Init(&usdt_module);
}
