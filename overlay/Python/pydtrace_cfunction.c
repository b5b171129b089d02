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
 * funcname is the __qualname__ of the builtin method a profile function
 * receives: ml_name, prefixed with the bound type for a classmethod, or
 * with the type of __self__ for other methods (so a list subclass L gives
 * "L.append", whether called as l.append(x) or list.append(l, x)).
 * modulename is the function's __module__ when that is a str, otherwise the
 * module of that type, otherwise "".
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
 * C_RETURN/C_RAISE then reaches the probe only.  A call is recorded once,
 * however often tools start watching while it runs.  A record is dropped
 * when its call's C_RETURN/C_RAISE comes, at the next CALL event of the
 * same instruction in the same frame (the call has ended: a frame runs one
 * call at a time, so a record for a call that was not in progress is
 * harmless), and when tools next start watching, if its frame no longer
 * runs that instruction (the frame's memory may be reused).
 *
 * The probes' slot can also be what gives a code object several tools.
 * With one tool, the interpreter keeps no per-instruction tool set
 * (Python/instrumentation.c, get_tools_for_instruction()): a tool that
 * returns DISABLE from a CALL event un-instruments the instruction, still
 * gets that call's C_RETURN, and no event of later calls there.  With
 * several, the instruction stays instrumented and the tool is dropped from
 * its set at once, so it would miss that C_RETURN.  For such code, each
 * thread keeps the tools of its CALL events in progress (a stack that
 * follows its frames), and a C_RETURN/C_RAISE goes to the tools that the
 * call's CALL event had, as without the probes.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

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
    if (!_PyDTrace_FrameSelected(frame, event)) {
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
        /* The legacy path binds it to self_arg (method_get()). */
        PyMethodDescrObject *descr = (PyMethodDescrObject *)callable;
        if (self_arg == _PySeam_MISSING
            || !PyObject_TypeCheck(self_arg, descr->d_common.d_type))
        {
            return;
        }
        owner = Py_TYPE(self_arg);
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

    PyCodeObject *code = _PySeam_FrameCode(frame);
    char filebuf[_PyDTrace_STRBUF_SIZE];
    const char *filename = _PyDTrace_StrAsUTF8(_PySeam_CodeFilename(code),
                                               filebuf, sizeof(filebuf));
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

/* The records form a hash set of (frame, instruction) pairs, with linear
 * probing and backward-shift deletion: a lookup on the C-call path touches
 * a slot or two, never the whole set.  The set is made anew, sized for what
 * it holds, each time calls are hidden (with the world stopped): a record
 * whose frame no longer runs that call instruction is dropped then, and a
 * pair is recorded once however many times a tool starts watching CALL
 * while its call runs.  Records of other interpreters are carried over as
 * they are: their threads may be running. */
struct hidden_call {
    _PyInterpreterFrame *frame;     /* NULL: an empty slot */
    _Py_CODEUNIT *instr;
    PyInterpreterState *interp;
};

static struct {
    PyMutex mutex;              /* guards everything below */
    Py_ssize_t count;           /* also read without the mutex */
    size_t mask;                /* slots - 1; the size is a power of 2 */
    struct hidden_call *slots;  /* NULL while count is 0 */
} hidden;

static size_t
hidden_hash(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    uint64_t h = (uint64_t)(uintptr_t)frame * 0x9E3779B97F4A7C15u;
    h ^= (uint64_t)(uintptr_t)instr + (h >> 29);
    h *= 0xBF58476D1CE4E5B9u;
    return (size_t)(h ^ (h >> 32));
}

/* The slot of (frame, instr) in *slots*, or of the empty slot where it
 * would go.  The set always has an empty slot (load at most 1/2). */
static size_t
hidden_slot(struct hidden_call *slots, size_t mask,
            _PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    size_t i = hidden_hash(frame, instr) & mask;
    while (slots[i].frame != NULL
           && (slots[i].frame != frame || slots[i].instr != instr))
    {
        i = (i + 1) & mask;
    }
    return i;
}

/* Remove the record of (frame, instr); return 1 if there was one. */
static int
take_hidden(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    int found = 0;
    PyMutex_Lock(&hidden.mutex);
    if (hidden.slots != NULL) {
        size_t mask = hidden.mask;
        struct hidden_call *slots = hidden.slots;
        size_t i = hidden_slot(slots, mask, frame, instr);
        if (slots[i].frame != NULL) {
            found = 1;
            /* Backward-shift deletion: move each following record of the
             * run whose home slot is not between the hole and it. */
            size_t j = i;
            for (;;) {
                j = (j + 1) & mask;
                if (slots[j].frame == NULL) {
                    break;
                }
                size_t home = hidden_hash(slots[j].frame,
                                          slots[j].instr) & mask;
                if (((j - home) & mask) >= ((j - i) & mask)) {
                    slots[i] = slots[j];
                    i = j;
                }
            }
            slots[i].frame = NULL;
            _Py_atomic_store_ssize_relaxed(&hidden.count, hidden.count - 1);
        }
    }
    PyMutex_Unlock(&hidden.mutex);
    return found;
}

/* Whether the code of *frame* has a per-instruction tool set only because
 * of the probes' slots *probes* (see above). */
static int
several_tools_by_probes(_PyInterpreterFrame *frame, uint8_t probes)
{
    PyCodeObject *code = _PySeam_FrameCode(frame);
    if (!_PySeam_HasToolsPerInstruction(code)) {
        return 0;
    }
    for (int e = 0; e < _PySeam_LOCAL_EVENTS; e++) {
        uint8_t others = _PySeam_ActiveTools(code, e) & ~probes;
        if (others & (others - 1)) {
            return 0;
        }
    }
    return 1;
}

/* The CALL events in progress in this thread, in code where
 * several_tools_by_probes(): one per frame, outermost first. */
#define CALL_STACK_DEPTH 32

static _Py_thread_local struct {
    int depth;
    struct {
        _PyInterpreterFrame *frame;
        _Py_CODEUNIT *instr;
        uint8_t tools;
    } calls[CALL_STACK_DEPTH];
} call_stack;

/* Index of the entry of *frame*, or -1.  Entries above it belong to calls
 * that have ended. */
static int
find_call(_PyInterpreterFrame *frame)
{
    for (int i = call_stack.depth - 1; i >= 0; i--) {
        if (call_stack.calls[i].frame == frame) {
            return i;
        }
    }
    return -1;
}

static void
push_call(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr, uint8_t tools)
{
    int i = find_call(frame);
    if (i >= 0) {
        call_stack.depth = i;
    }
    if (call_stack.depth < CALL_STACK_DEPTH) {
        i = call_stack.depth++;
        call_stack.calls[i].frame = frame;
        call_stack.calls[i].instr = instr;
        call_stack.calls[i].tools = tools;
    }
}

/* The tools that a C_RETURN/C_RAISE reaches without the probes. */
static uint8_t
unarmed_return_tools(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr,
                     uint8_t probes, uint8_t tools)
{
    int i = find_call(frame);
    if (i < 0 || call_stack.calls[i].instr != instr) {
        return tools;
    }
    uint8_t at_call = call_stack.calls[i].tools;
    call_stack.depth = i;
    uint8_t call_tools = _PySeam_ActiveTools(_PySeam_FrameCode(frame),
                                             PY_MONITORING_EVENT_CALL);
    return (tools & probes) | (call_tools & at_call & ~probes);
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
    uint8_t probes = _PyDTrace_ProbeOnlySlots(_PySeam_CurrentInterp());
    if ((tools & probes) && several_tools_by_probes(frame, probes)) {
        if (event == PY_MONITORING_EVENT_CALL) {
            push_call(frame, instr, tools);
        }
        else {
            tools = unarmed_return_tools(frame, instr, probes, tools);
        }
    }
    return tools;
}

static int
is_call_instruction(_PyInterpreterFrame *frame)
{
    PyCodeObject *code = _PySeam_FrameCode(frame);
    int offset = _PySeam_InstrIndex(frame, _PySeam_FrameInstr(frame));
    if (offset < 0 || offset >= _PySeam_CodeUnits(code)) {
        return 0;
    }
    return _PySeam_IsCallOpcode(_PySeam_BaseOpcode(code, offset));
}

/* Whether frame *f* is running a call instruction now. */
static int
in_call(_PyInterpreterFrame *f)
{
    return _PySeam_FrameHasCode(f) && is_call_instruction(f);
}

static int
was_hidden(_PyInterpreterFrame *f)
{
    return hidden.slots != NULL
        && hidden.slots[hidden_slot(hidden.slots, hidden.mask, f,
                                    _PySeam_FrameInstr(f))].frame != NULL;
}

/* Record the calls in progress in the frames (of *code*, or all) of every
 * thread of *interp*, keep the records of its calls that are still in
 * progress, and drop its other records.  Called with the world stopped. */
static void
hide_calls_in_progress(PyInterpreterState *interp, PyCodeObject *code)
{
    PyMutex_Lock(&hidden.mutex);
    _PySeam_HeadLock(interp);
    /* Count what the new set may hold: this interpreter's calls in
     * progress and the other interpreters' records. */
    size_t wanted = 0;
    for (PyThreadState *ts = _PySeam_FirstThread(interp); ts != NULL;
         ts = _PySeam_NextThread(ts))
    {
        for (_PyInterpreterFrame *f = _PySeam_ThreadFrame(ts); f != NULL;
             f = _PySeam_FramePrevious(f))
        {
            wanted += in_call(f);
        }
    }
    if (hidden.slots != NULL) {
        for (size_t i = 0; i <= hidden.mask; i++) {
            wanted += (hidden.slots[i].frame != NULL
                       && hidden.slots[i].interp != interp);
        }
    }
    size_t size = 16;
    while (size < 2 * wanted) {
        size *= 2;
    }
    struct hidden_call *slots = NULL;
    if (wanted > 0) {
        slots = PyMem_RawCalloc(size, sizeof(*slots));
    }
    if (wanted > 0 && slots == NULL) {
        /* Out of memory (the set needs 48 bytes per call in progress):
         * keep the set as it is.  The calls in progress that it lacks
         * deliver a C_RETURN that the unarmed interpreter would not. */
    }
    else {
        size_t mask = size - 1;
        Py_ssize_t count = 0;
        if (hidden.slots != NULL) {
            for (size_t i = 0; i <= hidden.mask; i++) {
                struct hidden_call *c = &hidden.slots[i];
                if (c->frame != NULL && c->interp != interp) {
                    slots[hidden_slot(slots, mask, c->frame, c->instr)] = *c;
                    count++;
                }
            }
        }
        for (PyThreadState *ts = _PySeam_FirstThread(interp); ts != NULL;
             ts = _PySeam_NextThread(ts))
        {
            for (_PyInterpreterFrame *f = _PySeam_ThreadFrame(ts); f != NULL;
                 f = _PySeam_FramePrevious(f))
            {
                if (!in_call(f)
                    || !((code == NULL || _PySeam_FrameCode(f) == code)
                         || was_hidden(f)))
                {
                    continue;
                }
                size_t i = hidden_slot(slots, mask, f,
                                       _PySeam_FrameInstr(f));
                if (slots[i].frame == NULL) {
                    slots[i].frame = f;
                    slots[i].instr = _PySeam_FrameInstr(f);
                    slots[i].interp = interp;
                    count++;
                }
            }
        }
        PyMem_RawFree(hidden.slots);
        hidden.slots = count > 0 ? slots : NULL;
        if (count == 0) {
            PyMem_RawFree(slots);
        }
        hidden.mask = size - 1;
        _Py_atomic_store_ssize_relaxed(&hidden.count, count);
    }
    _PySeam_HeadUnlock(interp);
    PyMutex_Unlock(&hidden.mutex);
}

void
_PyDTrace_CallToolsChanging(PyInterpreterState *interp, PyCodeObject *code,
                            int tool_id, uint32_t events)
{
    const uint8_t profile = 1 << PY_MONITORING_SYS_PROFILE_ID;
    uint8_t before = _PySeam_GlobalTools(interp, PY_MONITORING_EVENT_CALL);
    if (code != NULL && _PySeam_CodeMonitored(code)) {
        before |= _PySeam_LocalTools(code, PY_MONITORING_EVENT_CALL);
    }
    /* With a selection in effect, the probes' CALL events are the
     * selected code objects' own (Python/pydtrace_select.c): calls in
     * progress there deliver a C_RETURN too. */
    if (_PyDTrace_Selecting() && (PyDTrace_CFUNCTION_ENTRY_ENABLED()
                                  || PyDTrace_CFUNCTION_RETURN_ENABLED()))
    {
        before |= profile;
    }
    int wants_call = (events >> PY_MONITORING_EVENT_CALL) & 1;
    /* Does the profile slot watch CALL for a sys.setprofile() function, or
     * only for the probes? */
    int was_profiling;
    if (tool_id == PY_MONITORING_SYS_PROFILE_ID) {
        int profiling = _PySeam_ProfilingThreads(interp) > 0;
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
