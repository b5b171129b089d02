/* Python names in native stacks on demand (cpython-usdt).
 *
 * A tracer that wants py::QUALNAME:FILENAME frames in perf, bpftrace's
 * ustack or bcc's profile arms the marker python:stacks__enable.  The marker
 * never fires; only its semaphore matters.  In a process whose owner allowed
 * it at start-up (-X dtrace_stacks or PYTHONDTRACESTACKS=1), the probe
 * watcher (Python/pydtrace_arming.c) notices the semaphore within a poll
 * and, from a thread of the main interpreter, calls _PyDTrace_StacksApply(),
 * which turns on the perf-map trampoline of Python/perf_trampoline.c (the
 * machinery behind -X perf): every Python function entered from then on
 * runs through its own copy of a small trampoline, listed in
 * /tmp/perf-PID.map under its Python name.  When the last tracer detaches,
 * the trampoline is turned off again.
 *
 * Why consent: the trampoline is a PEP 523 frame evaluator, and a program
 * can see what it costs.  Each Python call runs through extra C frames (a
 * thread with a small stack overflows sooner, and deep recursion meets the
 * C recursion limit sooner), it takes a co_extra slot, and it writes a
 * perf map through one more file descriptor, a file perf reads after the
 * process has exited, so it stays in /tmp.  Without consent, arming the
 * marker does nothing at all; whole Python stacks then come from walking
 * the frames in BPF (Lib/usdt/stacks).
 *
 * With consent, what Python code sees stays as if no tracer were there,
 * except for those costs:
 *   - sys.is_stack_trampoline_active() is false while only the marker keeps
 *     the trampoline on;
 *   - sys.activate_stack_trampoline("perf") then hands the trampoline over
 *     to the program, which keeps it after the tracer leaves;
 *   - sys.deactivate_stack_trampoline() while only the marker keeps it on
 *     changes nothing the program can tell; once the program has turned the
 *     trampoline on, its deactivation turns it off, as upstream, and nothing
 *     more is written to the perf map until a tracer arms the marker again;
 *   - a trampoline the program turned on (-X perf, PYTHONPERFSUPPORT,
 *     sys.activate_stack_trampoline()) is never turned off by a tracer;
 *   - a program's co_extra free function is not called (with NULL) for the
 *     code objects only the trampoline touched.  code_dealloc() calls the
 *     free function of every slot a code object has, and
 *     _PyCode_SetExtra() gives a code object as many slots as there are
 *     users: so the trampoline's slot is reserved at start-up, before the
 *     program can request one (slot 0), and a code object that gets its
 *     first extra there gets that one slot only
 *     (_PyDTrace_StacksCodeExtraSize(), a hook in Objects/codeobject.c).
 *     A program's own SetExtra later adds its slots as upstream.
 *
 * Turning off only clears the interpreter's frame evaluator: trampolines,
 * their code-extra slot and the perf map stay, so attaching again reuses
 * them instead of taking a new arena each time (which is what
 * _PyPerfTrampoline_Init(1) does).
 *
 * Limits (docs: "Python stacks" in Doc/howto/usdt-tools.rst): the main
 * interpreter only, as -X perf (the trampoline's state is process-wide);
 * not in the free-threaded build, where 3.13's trampoline compiler is not
 * thread-safe; not while another PEP 523 frame evaluator is installed; and
 * frames that were already running when the marker was armed get no name
 * until they are entered again.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <limits.h>               // PATH_MAX
#include <stdio.h>                // snprintf()
#include <string.h>               // strcmp()

#if defined(WITH_DTRACE) && defined(PY_HAVE_PERF_TRAMPOLINE) \
    && !defined(Py_GIL_DISABLED)
#  define STACKS_SUPPORTED
#endif

#ifdef WITH_DTRACE

/* The marker's only site.  Nothing calls it: tracers arm the marker for its
 * semaphore, which _PyDTrace_StacksArmed() reads.  'used' keeps the
 * function, and with it the marker's note, through LTO. */
static __attribute__((used)) void
stacks_enable_site(void)
{
    PyDTrace_STACKS_ENABLE();
}

int
_PyDTrace_StacksArmed(void)
{
    return PyDTrace_STACKS_ENABLE_ENABLED() != 0;
}

#endif  /* WITH_DTRACE */

#ifdef STACKS_SUPPORTED

/* Guarded by the main interpreter's GIL: every function below runs in a
 * thread of the main interpreter that holds it. */
static struct {
    /* -X dtrace_stacks or PYTHONDTRACESTACKS=1: the owner's consent. */
    int allowed;
    /* The co_extra slot reserved for the trampoline under consent, else
     * -1 (no index matches it). */
    Py_ssize_t code_extra_index;
    /* The trampoline has started with that slot once. */
    int code_extra_taken;
    /* The trampoline is on only because the marker is armed. */
    int owned;
    /* perf_trampoline.c's frame evaluator, as seen when it was first on. */
    _PyFrameEvalFunction evaluator;
} stacks;

/* The perf map entry of one trampoline: "py::QUALNAME:FILENAME", the names
 * -X perf writes, but converted without allocating or raising (upstream's
 * writer uses PyUnicode_AsUTF8(), which caches a UTF-8 copy in each str and
 * raises for lone surrogates). */
static void
write_entry(void *Py_UNUSED(state), const void *code_addr,
            _PySeam_PerfCodeSize code_size, PyCodeObject *co)
{
    char qualbuf[1024];
    char filebuf[PATH_MAX];
    char entry[sizeof(qualbuf) + sizeof(filebuf) + 8];
    const char *qualname = _PyDTrace_StrAsUTF8(_PySeam_CodeQualname(co),
                                               qualbuf, sizeof(qualbuf));
    const char *filename = _PyDTrace_StrAsUTF8(_PySeam_CodeFilename(co),
                                               filebuf, sizeof(filebuf));
    (void)snprintf(entry, sizeof(entry), "py::%s:%s", qualname, filename);
    (void)PyUnstable_WritePerfMapEntry(code_addr, code_size, entry);
}

static int
writes_perf_map(void)
{
    _PySeam_PerfWriter cur = _PySeam_CurrentPerfWriter();
    return cur == write_entry || cur == _PySeam_PerfMapWriter();
}

static void
stacks_on(PyInterpreterState *interp)
{
    if (stacks.owned || _PySeam_EvalFrame(interp) != NULL) {
        /* Ours already, the program's, or another PEP 523 evaluator's. */
        return;
    }
    if (stacks.evaluator != NULL
        && _PySeam_PerfTrampolineReady())
    {
        /* Turned off by stacks_off() only: everything is still set up. */
        _PySeam_SetEvalFrame(interp, stacks.evaluator);
        stacks.owned = 1;
        return;
    }
    PyObject *exc = PyErr_GetRaisedException();
    if (!writes_perf_map()) {
        (void)_PySeam_SetPerfWriter(write_entry);
    }
    if (_PySeam_PerfTrampolineInit(1) < 0) {
        PyErr_Clear();
        _PySeam_SetEvalFrame(interp, NULL);
    }
    else {
        stacks.evaluator = _PySeam_EvalFrame(interp);
        stacks.owned = 1;
    }
    PyErr_SetRaisedException(exc);
}

static void
stacks_off(PyInterpreterState *interp)
{
    if (!stacks.owned) {
        return;
    }
    if (_PySeam_EvalFrame(interp) == stacks.evaluator) {
        _PySeam_SetEvalFrame(interp, NULL);
    }
    stacks.owned = 0;
}

void
_PyDTrace_StacksAllow(int allowed)
{
    stacks.owned = 0;
    stacks.evaluator = NULL;
    stacks.allowed = allowed;
    stacks.code_extra_index = -1;
    stacks.code_extra_taken = 0;
    if (allowed) {
        /* Before any Python code runs: see "co_extra" above.  With no slot
         * left, the trampoline asks for one when it starts, as upstream. */
        stacks.code_extra_index = PyUnstable_Eval_RequestCodeExtraIndex(NULL);
    }
}

Py_ssize_t
_PyDTrace_StacksCodeExtraIndex(PyThreadState *tstate)
{
    if (!_PySeam_IsMainInterp(tstate->interp) || stacks.code_extra_taken) {
        return -1;
    }
    /* For the trampoline's first start only.  It starts afresh only after
     * its watcher was cleared (in a fork child), while code objects of the
     * first start may still hold trampolines in their slot: the new start's
     * watcher must not count those, so it takes a new slot, as upstream. */
    stacks.code_extra_taken = 1;
    return stacks.code_extra_index;
}

Py_ssize_t
_PyDTrace_StacksCodeExtraSize(PyInterpreterState *interp, Py_ssize_t index)
{
    if (index == stacks.code_extra_index && _PySeam_IsMainInterp(interp)) {
        return index + 1;
    }
    return _PySeam_CodeExtraUsers(interp);
}

void
_PyDTrace_StacksApply(PyThreadState *tstate, int armed)
{
    PyInterpreterState *interp = tstate->interp;
    if (!_PySeam_IsMainInterp(interp) || !stacks.allowed) {
        return;
    }
    if (armed) {
        stacks_on(interp);
    }
    else {
        stacks_off(interp);
    }
}

int
_PyDTrace_StacksActivate(PyThreadState *tstate, const char *backend)
{
    if (!_PySeam_IsMainInterp(tstate->interp) || !stacks.owned
        || strcmp(backend, "perf") != 0)
    {
        return 0;
    }
    /* The program takes over the perf-map trampoline the marker keeps on:
     * it stays on after the tracer leaves. */
    stacks.owned = 0;
    return 1;
}

int
_PyDTrace_StacksDeactivate(PyThreadState *tstate)
{
    if (_PySeam_IsMainInterp(tstate->interp) && stacks.owned) {
        /* The program never turned it on: already off as far as it can
         * tell.  A trampoline the program turned on is turned off by
         * upstream's code, tracer or not. */
        return 1;
    }
    return 0;
}

int
_PyDTrace_StacksHidden(PyThreadState *tstate)
{
    return _PySeam_IsMainInterp(tstate->interp) && stacks.owned;
}

#elif defined(WITH_DTRACE)

void
_PyDTrace_StacksAllow(int Py_UNUSED(allowed))
{
}

Py_ssize_t
_PyDTrace_StacksCodeExtraIndex(PyThreadState *Py_UNUSED(tstate))
{
    return -1;
}

Py_ssize_t
_PyDTrace_StacksCodeExtraSize(PyInterpreterState *interp,
                              Py_ssize_t Py_UNUSED(index))
{
    return _PySeam_CodeExtraUsers(interp);
}

void
_PyDTrace_StacksApply(PyThreadState *Py_UNUSED(tstate), int Py_UNUSED(armed))
{
}

int
_PyDTrace_StacksActivate(PyThreadState *Py_UNUSED(tstate),
                         const char *Py_UNUSED(backend))
{
    return 0;
}

int
_PyDTrace_StacksDeactivate(PyThreadState *Py_UNUSED(tstate))
{
    return 0;
}

int
_PyDTrace_StacksHidden(PyThreadState *Py_UNUSED(tstate))
{
    return 0;
}

#endif  /* STACKS_SUPPORTED */
