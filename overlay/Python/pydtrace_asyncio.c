/* task__step__start / task__step__done probes (cpython-usdt).
 *
 * See Include/internal/pycore_dtrace.h for the rules every helper follows.
 *
 *   task__step__start(task_name, coro_qualname)
 *   task__step__done(task_name, coro_qualname)
 *
 * fire around each step of an asyncio Task of the C implementation
 * (Modules/_asynciomodule.c: each call of task_step_impl(), the first step
 * of an eager task included): the step runs the task's coroutine until it
 * suspends, returns or raises.  task_name is the name task.get_name()
 * returns, read from the task without calling it (so not a get_name() that
 * a Task subclass overrides): a name given to the task or set_name(), or
 * "Task-N" for the default one.  coro_qualname is the __qualname__ of a
 * coroutine, generator or async generator object, and "<unknown>" for any
 * other awaitable.
 *
 * _asyncio is a shared extension module and cannot see the interpreter's
 * semaphores (hidden symbols), so its hooks read them through
 * _PyDTrace_TaskStepSemaphores.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <string.h>

#ifdef WITH_DTRACE

const unsigned short *const _PyDTrace_TaskStepSemaphores[2] = {
    &python_task__step__start_semaphore,
    &python_task__step__done_semaphore,
};

/* The Task keeps an int N until get_name() first formats it as "Task-N"
 * (formatted here by hand: snprintf() was most of a hit's work). */
static const char *
task_name_utf8(PyObject *name, char *buf, size_t size)
{
    if (name != NULL && PyLong_CheckExact(name)) {
        /* The counter is positive; for an exact int this conversion
         * neither fails nor sets an exception. */
        unsigned long long n = PyLong_AsUnsignedLongLongMask(name);
        char digits[24];
        size_t len = 0;
        do {
            digits[len++] = (char)('0' + n % 10);
            n /= 10;
        } while (n != 0);
        static const char prefix[] = "Task-";
        if (size < sizeof(prefix) + len) {
            return "<unknown>";
        }
        memcpy(buf, prefix, sizeof(prefix) - 1);
        for (size_t i = 0; i < len; i++) {
            buf[sizeof(prefix) - 1 + i] = digits[len - 1 - i];
        }
        buf[sizeof(prefix) - 1 + len] = '\0';
        return buf;
    }
    return _PyDTrace_StrAsUTF8(name, buf, size);
}

static const char *
coro_qualname_utf8(PyObject *coro, char *buf, size_t size)
{
    if (coro != NULL
        && (PyCoro_CheckExact(coro) || PyGen_CheckExact(coro)
            || PyAsyncGen_CheckExact(coro)))
    {
        return _PyDTrace_StrAsUTF8(_PySeam_GenQualname(coro), buf, size);
    }
    return "<unknown>";
}

void
_PyDTrace_FireTaskStep(int done, PyObject *task_name, PyObject *coro)
{
    char namebuf[_PyDTrace_STRBUF_SIZE];
    char qualbuf[_PyDTrace_STRBUF_SIZE];
    const char *name = task_name_utf8(task_name, namebuf, sizeof(namebuf));
    const char *qualname = coro_qualname_utf8(coro, qualbuf, sizeof(qualbuf));
    if (done) {
        PyDTrace_TASK_STEP_DONE(name, qualname);
    }
    else {
        PyDTrace_TASK_STEP_START(name, qualname);
    }
}

#endif  /* WITH_DTRACE */
