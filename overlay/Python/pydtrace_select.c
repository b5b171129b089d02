/* Selection of the code objects whose events fire the probes
 * (cpython-usdt).
 *
 * A tracer that asks for one module's functions should not pay for every
 * function of the process.  The selection block below is the contract: a
 * tracer (python -m usdt select, or usdt.tools -f) writes a text into it,
 * through /proc/PID/mem, found by the symbol _PyDTrace_Select; the
 * watcher thread (Python/pydtrace_arming.c) reads it at its next poll,
 * and while the selectable probes are armed only the code objects that
 * the text selects are instrumented for them.  Every other code object
 * runs as if nothing were attached.  docs/selection.md is the contract
 * in full; this comment is its summary.
 *
 * What a text selects: a code object whose file name (co_filename), name
 * (co_name) or qualified name (co_qualname) contains the text, byte for
 * byte in UTF-8, case-sensitive; a text with dots also selects a code
 * object whose file name contains it with each dot replaced by a slash,
 * so that a dotted module name selects its files.
 *
 * The block is untrusted input: it is read with a sequence number (odd
 * while a tracer writes; the text is used only if the number is the same,
 * and even, before and after the copy), its length is checked, and a text
 * with a NUL byte is refused.  The text is copied out of the block before
 * it is used, and nothing in the block is ever followed as a pointer.
 *
 * Lifetime, one selection at a time: a new sequence number makes the text
 * the pending selection; it takes effect at the first poll that finds a
 * selectable probe armed, and ends at the first poll after that which
 * finds none armed (a tracer that detaches, or is killed: the kernel
 * drops its semaphores).  A pending selection expires after
 * SELECT_EXPIRY_POLLS polls without an armed probe.  An empty text, or a
 * refused one, selects everything.  The interpreter writes what it did
 * with the last text into the block's state fields, for tools to read.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <string.h>

#ifdef WITH_DTRACE

/* A minute at one poll per second: time for a person to attach a script
 * by hand after python -m usdt select. */
#define SELECT_EXPIRY_POLLS 60

struct _PyDTrace_SelectBlock _PyDTrace_Select = {
    .magic = _PyDTrace_SELECT_MAGIC,
    .version = _PyDTrace_SELECT_VERSION,
    .size = sizeof(struct _PyDTrace_SelectBlock),
};

/* The selection in effect, read by the instrumentation hook and the
 * probes' filters in any thread: written in the slot that readers are not
 * told to use, then published by switching *current* (release), so a
 * reader sees either text whole.  Only the watcher (with its mutex held)
 * and start-up write. */
struct applied {
    size_t length;
    char text[_PyDTrace_SELECT_TEXT_MAX + 1];
    /* The text with each dot a slash, if it has a dot, else empty. */
    size_t slashed_length;
    char slashed[_PyDTrace_SELECT_TEXT_MAX + 1];
};

static struct {
    struct applied slots[2];
    int current;                /* the slot readers use */
    int active;                 /* a selection is in effect */
    /* Watcher side (its mutex held). */
    uint32_t last_seq;          /* the sequence number last read */
    int pending;                /* a text read, not in effect yet */
    int pending_polls;
    size_t pending_length;
    char pending_text[_PyDTrace_SELECT_TEXT_MAX];
} selection;

int
_PyDTrace_Selecting(void)
{
    return _Py_atomic_load_int_acquire(&selection.active);
}

static void
set_state(uint32_t state)
{
    _Py_atomic_store_uint32_relaxed(&_PyDTrace_Select.state, state);
}

/* Publish *text* (or no selection, for NULL) to the readers. */
static void
publish(const char *text, size_t length)
{
    if (text == NULL) {
        _Py_atomic_store_int_release(&selection.active, 0);
        return;
    }
    int next = !_Py_atomic_load_int_relaxed(&selection.current);
    struct applied *slot = &selection.slots[next];
    memcpy(slot->text, text, length);
    slot->text[length] = '\0';
    slot->length = length;
    slot->slashed_length = 0;
    slot->slashed[0] = '\0';
    if (memchr(text, '.', length) != NULL) {
        for (size_t i = 0; i < length; i++) {
            slot->slashed[i] = text[i] == '.' ? '/' : text[i];
        }
        slot->slashed[length] = '\0';
        slot->slashed_length = length;
    }
    _Py_atomic_store_int_release(&selection.current, next);
    _Py_atomic_store_int_release(&selection.active, 1);
}

/* Copy the block's text if a tracer has written a new one since the last
 * read: 1 with the text in *text* and *length* (0: everything), 0 if
 * nothing new (or a write in progress), -1 if the new contents are
 * refused. */
static int
read_block(char *text, size_t *length)
{
    volatile struct _PyDTrace_SelectBlock *block = &_PyDTrace_Select;
    uint32_t seq = _Py_atomic_load_uint32_acquire(&_PyDTrace_Select.seq);
    if ((seq & 1) || seq == selection.last_seq) {
        return 0;
    }
    uint32_t n = block->length;
    size_t copied = n <= _PyDTrace_SELECT_TEXT_MAX
                    ? n : _PyDTrace_SELECT_TEXT_MAX;
    for (size_t i = 0; i < copied; i++) {
        text[i] = block->text[i];
    }
    _Py_atomic_fence_acquire();
    if (_Py_atomic_load_uint32_relaxed(&_PyDTrace_Select.seq) != seq) {
        return 0;               /* torn: read it again at the next poll */
    }
    selection.last_seq = seq;
    _Py_atomic_store_uint32_relaxed(&_PyDTrace_Select.seen_seq, seq);
    if (n > _PyDTrace_SELECT_TEXT_MAX || memchr(text, '\0', n) != NULL) {
        return -1;
    }
    *length = n;
    return 1;
}

int
_PyDTrace_SelectPoll(int armed)
{
    int was_active = _Py_atomic_load_int_relaxed(&selection.active);
    char text[_PyDTrace_SELECT_TEXT_MAX];
    size_t length = 0;
    switch (read_block(text, &length)) {
        case 1:
            if (length > 0) {
                memcpy(selection.pending_text, text, length);
                selection.pending_length = length;
                selection.pending = 1;
                selection.pending_polls = 0;
                set_state(_PyDTrace_SELECT_PENDING);
            }
            else {
                selection.pending = 0;
                publish(NULL, 0);
                set_state(_PyDTrace_SELECT_NONE);
            }
            break;
        case -1:
            selection.pending = 0;
            publish(NULL, 0);
            set_state(_PyDTrace_SELECT_REFUSED);
            break;
        default:
            break;
    }
    if (selection.pending) {
        if (armed) {
            selection.pending = 0;
            publish(selection.pending_text, selection.pending_length);
            _Py_atomic_store_uint32_relaxed(&_PyDTrace_Select.applied_seq,
                                            selection.last_seq);
            set_state(_PyDTrace_SELECT_APPLIED);
            return 1;
        }
        if (++selection.pending_polls >= SELECT_EXPIRY_POLLS) {
            selection.pending = 0;
            set_state(_PyDTrace_SELECT_EXPIRED);
        }
    }
    else if (_Py_atomic_load_int_relaxed(&selection.active) && !armed) {
        publish(NULL, 0);
        set_state(_PyDTrace_SELECT_ENDED);
    }
    return was_active != _Py_atomic_load_int_relaxed(&selection.active);
}

int
_PyDTrace_SelectFromStartup(const char *text)
{
    size_t length = strlen(text);
    if (length > _PyDTrace_SELECT_TEXT_MAX) {
        return -1;
    }
    /* As a tracer writes it. */
    uint32_t seq = _PyDTrace_Select.seq;
    _PyDTrace_Select.seq = (seq | 1) + 1;
    _PyDTrace_Select.length = (uint32_t)length;
    memcpy(_PyDTrace_Select.text, text, length);
    return 0;
}

/* Whether *needle* occurs in the string *s* (UTF-8, as the probes pass
 * it). */
static int
contains(PyObject *s, const char *needle, size_t length)
{
    char buf[_PyDTrace_STRBUF_SIZE];
    const char *haystack = _PyDTrace_StrAsUTF8(s, buf, sizeof(buf));
    size_t n = strlen(haystack);
    if (length == 0 || length > n) {
        return length == 0;
    }
    return memmem(haystack, n, needle, length) != NULL;
}

int
_PyDTrace_CodeSelected(PyCodeObject *code)
{
    int index = _Py_atomic_load_int_acquire(&selection.current);
    const struct applied *slot = &selection.slots[index];
    PyObject *filename = _PySeam_CodeFilename(code);
    return (contains(filename, slot->text, slot->length)
            || contains(_PySeam_CodeName(code), slot->text, slot->length)
            || contains(_PySeam_CodeQualname(code), slot->text,
                        slot->length)
            || (slot->slashed_length > 0
                && contains(filename, slot->slashed,
                            slot->slashed_length)));
}

int
_PyDTrace_FrameSelected(_PyInterpreterFrame *frame, int event)
{
    if (!_PyDTrace_Selecting()) {
        return 1;
    }
    PyCodeObject *code = _PySeam_FrameCode(frame);
    int tool = PY_MONITORING_SYS_PROFILE_ID;
    switch (event) {
        case PY_MONITORING_EVENT_LINE:
        case PY_MONITORING_EVENT_JUMP:
            tool = PY_MONITORING_SYS_TRACE_ID;
            break;
        case PY_MONITORING_EVENT_C_RETURN:
        case PY_MONITORING_EVENT_C_RAISE:
            event = PY_MONITORING_EVENT_CALL;
            break;
        default:
            break;
    }
    if (event < _PySeam_LOCAL_EVENTS) {
        /* The events that instrument code: the code objects that the
         * selection instruments for the probes' slot (the slot can have
         * them everywhere for a sys.setprofile() function). */
        return (_PySeam_CodeMonitored(code)
                && (_PySeam_LocalTools(code, event) & (1 << tool)));
    }
    /* The global events (exceptions, PY_UNWIND, PY_THROW). */
    return _PyDTrace_CodeSelected(code);
}

#endif  /* WITH_DTRACE */
