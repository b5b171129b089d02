/* USDT (DTrace / SystemTap) probe helpers (cpython-usdt): names.
 *
 * What the probes of several families pass: a str as a C string without
 * allocating (_PyDTrace_StrAsUTF8()), a code object's file and function
 * names, the line of an instruction (cached per thread), a type's module
 * and qualified name, and dotted names.  Used by Python/pydtrace_probes.c,
 * pydtrace_cfunction.c, pydtrace_exceptions.c, pydtrace_asyncio.c and
 * pydtrace_stacks.c; it uses no other file of the glue, so that the glue's
 * files call each other without a cycle (tests/test_build_facts.py).
 *
 * See Include/internal/pycore_dtrace.h for the rules every helper follows.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pydtrace_seam.h"        // CPython's internals

#include <string.h>

#define UNKNOWN "<unknown>"

/* ------------------------------------------------------------------------
 * str -> C string, without allocation
 * ------------------------------------------------------------------------ */

const char *
_PyDTrace_StrAsUTF8(PyObject *s, char *buf, size_t size)
{
    if (s == NULL || !PyUnicode_Check(s)) {
        return UNKNOWN;
    }
    if (PyUnicode_IS_COMPACT_ASCII(s)) {
        return (const char *)PyUnicode_DATA(s);
    }
    if (PyUnicode_IS_COMPACT(s)) {
        const char *utf8 = _PySeam_StrCachedUTF8(s);
        if (utf8 != NULL) {
            return utf8;
        }
    }
    if (buf == NULL || size == 0) {
        return UNKNOWN;
    }
    (void)_PyDTrace_EncodeUTF8(PyUnicode_KIND(s), PyUnicode_DATA(s),
                               PyUnicode_GET_LENGTH(s), buf, size);
    return buf;
}

#ifdef WITH_DTRACE

/* ------------------------------------------------------------------------
 * code objects and instructions
 * ------------------------------------------------------------------------ */

void
_PyDTrace_GetCodeNames(PyCodeObject *code, struct _PyDTrace_CodeNames *names)
{
    names->filename = _PyDTrace_StrAsUTF8(_PySeam_CodeFilename(code),
                                          names->filebuf,
                                          sizeof(names->filebuf));
    names->funcname = _PyDTrace_StrAsUTF8(_PySeam_CodeName(code),
                                          names->namebuf,
                                          sizeof(names->namebuf));
}

/* PyCode_Addr2Line() walks the code's location table from its start, which
 * was most of the work of a cfunction or exception probe hit.  Each thread
 * remembers the lines of the instructions it saw last: an entry is keyed
 * by the instruction's address and its code object's co_version, unique
 * per code object (0, once the counter is exhausted, is not cached), so a
 * code object freed and another made at the same address cannot match. */
#define LINE_CACHE_SIZE 128     /* a power of 2 */

static _Py_thread_local struct {
    _Py_CODEUNIT *instr;
    uint32_t version;
    int line;
} line_cache[LINE_CACHE_SIZE];

int
_PyDTrace_InstrLine(_PyInterpreterFrame *frame, _Py_CODEUNIT *instr)
{
    PyCodeObject *code = _PySeam_FrameCode(frame);
    uint32_t version = _PySeam_CodeVersion(code);
    size_t slot = ((uintptr_t)instr / sizeof(_Py_CODEUNIT))
                  & (LINE_CACHE_SIZE - 1);
    if (version != 0 && line_cache[slot].instr == instr
        && line_cache[slot].version == version)
    {
        return line_cache[slot].line;
    }
    int offset = _PySeam_InstrIndex(frame, instr);
    int line = PyCode_Addr2Line(code, offset * (int)sizeof(_Py_CODEUNIT));
    if (version != 0) {
        line_cache[slot].instr = instr;
        line_cache[slot].version = version;
        line_cache[slot].line = line;
    }
    return line;
}

/* ------------------------------------------------------------------------
 * types and dotted names
 * ------------------------------------------------------------------------ */

/* The module name of a heap type: its own __module__ entry.  The lookup is
 * only done in a dict whose keys are all exact str objects (a "unicode"
 * keys table: a str subclass key converts the table to the general kind),
 * where comparing keys never calls __eq__.  It neither sets nor clears an
 * exception. */
const char *
_PyDTrace_TypeModuleName(PyTypeObject *type, char *buf, size_t size)
{
    PyObject *dict = type->tp_dict;
    if (dict == NULL || !PyDict_CheckExact(dict)
        || !_PySeam_DictStrKeysOnly(dict))
    {
        return UNKNOWN;
    }
    PyObject *name = _PySeam_ID(__module__);
    Py_hash_t hash = _PySeam_StrCachedHash(name);
    if (hash == -1) {
        return UNKNOWN;
    }
    PyObject *mod = _PySeam_DictGetKnownHash(dict, name, hash);
    return _PyDTrace_StrAsUTF8(mod, buf, size);
}

/* Copy at most size - 1 bytes of *src* (len bytes) into *buf*, cut at a
 * UTF-8 character boundary; return the number of bytes copied. */
static size_t
copy_utf8(char *buf, size_t size, const char *src, size_t len)
{
    if (len >= size) {
        len = size - 1;
        /* Back up over continuation bytes of a cut character. */
        while (len > 0 && ((unsigned char)src[len] & 0xc0) == 0x80) {
            len--;
        }
    }
    memcpy(buf, src, len);
    buf[len] = '\0';
    return len;
}

const char *
_PyDTrace_JoinDotted(const char *a, const char *b, char *buf, size_t size)
{
    size_t pos = copy_utf8(buf, size, a, strlen(a));
    if (pos + 1 < size) {
        buf[pos++] = '.';
        copy_utf8(buf + pos, size - pos, b, strlen(b));
    }
    return buf;
}

void
_PyDTrace_TypeNames(PyTypeObject *type, char *modbuf, char *qualbuf,
                    const char **module, const char **qualname)
{
    if (type->tp_flags & Py_TPFLAGS_HEAPTYPE) {
        *module = _PyDTrace_TypeModuleName(type, modbuf, _PyDTrace_STRBUF_SIZE);
        *qualname = _PyDTrace_StrAsUTF8(((PyHeapTypeObject *)type)->ht_qualname,
                                        qualbuf, _PyDTrace_STRBUF_SIZE);
        return;
    }
    /* A static type: "module.qualname" in tp_name, as type.__module__ and
     * type.__qualname__ read it (Objects/typeobject.c). */
    const char *name = type->tp_name ? type->tp_name : UNKNOWN;
    const char *dot = strrchr(name, '.');
    if (dot == NULL) {
        *module = "builtins";
        *qualname = name;
        return;
    }
    copy_utf8(modbuf, _PyDTrace_STRBUF_SIZE, name, (size_t)(dot - name));
    *module = modbuf;
    *qualname = dot + 1;
}

#endif  /* WITH_DTRACE */
