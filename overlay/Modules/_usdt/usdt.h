/* _usdt: USDT probes defined by Python code at run time (cpython-usdt).
 *
 * The C accelerator of Lib/usdt/.  See docs/usdt-module.md for the design.
 *
 * A tracer finds USDT probes by reading the .note.stapsdt notes of the ELF
 * files mapped into a process, so each new probe needs a mapped file with
 * a note.  For every batch of probes created together (one for a Probe,
 * two for a traced function) this module writes a tiny ELF shared object
 * into a private directory of the process and dlopen()s it:
 *
 *   - a text stub per probe, "nop; ret", called as a C function whose
 *     arguments (at most 6) are in the registers the note names; a tracer
 *     puts its uprobe on the nop;
 *   - a .note.stapsdt note per probe (provider, name, the stub's address,
 *     its semaphore's address, the argument string), the .stapsdt.base
 *     section the notes refer to, and section headers, so that bpftrace,
 *     bcc, gdb and readelf read the notes as they do in any binary;
 *   - a 2-byte semaphore per probe in the writable .probes section: the
 *     kernel increments it in this process when a tracer's uprobe arrives
 *     (its file offset is the uprobe's ref_ctr_offset), and decrements it
 *     when the uprobe goes.  bool(probe) reads it;
 *   - the dynamic section, symbol table and hash table that glibc's dlopen
 *     needs (and gdb and perf use to name the stubs).
 *
 * Probes ("sites") live until the process exits: a tracer may hold
 * uprobes on them, and their addresses must stay valid for every Probe
 * object, in every interpreter, that refers to them.  The files are
 * removed by the process that wrote them when its interpreter exits.
 *
 * x86-64 Linux only (the stub, the registers and the ELF machine).
 *
 * The files of Modules/_usdt/, and what each one owns:
 *   elf.c     the ELF object, built in memory;
 *   sites.c   the sites of the process: its directory and files, dlopen(),
 *             the registry, the removal of the files at exit;
 *   probe.c   names and types, firing, the Probe type;
 *   traced.c  the traced function type and the traced() decorator;
 *   module.c  the module state and definition, PyInit__usdt().
 * This header is the one map of what they share.
 */

#ifndef USDT_H
#define USDT_H

#include "Python.h"

#if !defined(__linux__) || !defined(__x86_64__)
#  error "_usdt supports x86-64 Linux only"
#endif

#include <elf.h>                /* Elf64_Addr */
#include <stdint.h>
#include <sys/types.h>          /* pid_t */


/* ------------------------------------------------------------------------
 * Limits and argument types
 * ------------------------------------------------------------------------ */

/* The most arguments a probe takes: the integer argument registers of a C
 * call (SysV x86-64 ABI). */
#define MAX_ARGS 6
/* The longest provider name, in characters. */
#define MAX_PROVIDER 64
/* The longest probe name, in characters. */
#define MAX_NAME 128
/* The name of a traced function's probes, without "__return". */
#define MAX_TRACED_NAME (MAX_NAME - 8)
/* The size of a buffer for a note's argument string (see
 * _PyUsdt_FormatArguments()). */
#define ARGUMENTS_SIZE (MAX_ARGS * 10)

/* Argument type codes, as in a site's types string. */
#define TYPE_INT 'i'
#define TYPE_STR 's'
#define TYPE_BYTES 'b'

/* A probe's stub, called with the probe's arguments in the registers its
 * note names (unused ones are 0). */
typedef void (*stub_func)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t);


/* ------------------------------------------------------------------------
 * The ELF object (elf.c)
 * ------------------------------------------------------------------------ */

/* A probe to put into an object: what _PyUsdt_BuildObject() reads, and
 * where it placed the probe's stub and semaphore. */
struct elf_probe {
    const char *provider;
    const char *name;
    const char *types;          /* type codes, e.g. "si" */
    Elf64_Addr stub;            /* out: the stub's address in the object */
    Elf64_Addr semaphore;       /* out: the semaphore's address */
};

/* Build the object holding *count* probes in a malloc()ed buffer; store
 * its size in *size*, and each probe's stub and semaphore addresses (as
 * linked at 0) in *probes*.  NULL if out of memory. */
extern unsigned char *_PyUsdt_BuildObject(struct elf_probe *probes,
                                          int count, size_t *size);

/* The argument string of a note, e.g. "-8@%rdi 8@%rsi", for the type
 * codes *types*, into *buf* (ARGUMENTS_SIZE bytes); also shown by
 * repr(probe). */
extern void _PyUsdt_FormatArguments(const char *types, char *buf);


/* ------------------------------------------------------------------------
 * Sites: the probes of the process, their files (sites.c)
 * ------------------------------------------------------------------------ */

/* A loaded object: its file, and the process that wrote it (and removes it
 * at exit; a forked child maps the same file but leaves it alone). */
struct object {
    pid_t owner;
    char path[];
};

/* A probe of the process.  Immutable once published in the registry, and
 * never freed. */
struct site {
    char provider[MAX_PROVIDER + 1];
    char name[MAX_NAME + 1];
    char types[MAX_ARGS + 1];
    Py_ssize_t ntypes;          /* strlen(types), for the calls */
    const struct object *object;
    uint16_t *semaphore;
    stub_func stub;
};

/* The sites for probes (provider, names[i]) with types[i], count at most
 * 2, into *out*: existing ones if their types match (ValueError if not),
 * new ones for the others, created together in one object.  -1 with an
 * exception set on failure. */
extern int _PyUsdt_GetSites(const char *provider, const char *const *names,
                            const char *const *types, int count,
                            struct site **out);

/* Whether a tracer has armed the probe of *semaphore*: one load, inline
 * since the traced wrapper tests it on every call. */
static inline int
_PyUsdt_IsArmed(const uint16_t *semaphore)
{
    return _Py_atomic_load_uint16_relaxed(semaphore) != 0;
}


/* ------------------------------------------------------------------------
 * Names and the Probe type (probe.c)
 * ------------------------------------------------------------------------ */

/* A usdt.Probe: a Python handle on a site. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    uint16_t *semaphore;        /* site->semaphore, one load away */
    const struct site *site;
    PyObject *provider;
    PyObject *name;
    PyObject *types;
    PyObject *path;
} ProbeObject;

/* Copy the provider or probe name *obj* into *out* (maxlen + 1 bytes) if
 * it is a C identifier of at most *maxlen* characters; else raise, with
 * *hint* at the end of the message.  Shared by Probe() and traced(). */
extern int _PyUsdt_CheckIdentifier(const char *what, PyObject *obj,
                                   size_t maxlen, char *out,
                                   const char *hint);

/* A new Probe object of *type* for *site*; a traced function makes its
 * entry_probe and return_probe with it. */
extern PyObject *_PyUsdt_ProbeFromSite(PyTypeObject *type,
                                       const struct site *site);

/* The spec of usdt.Probe, for the module to create the type from. */
extern PyType_Spec _PyUsdt_ProbeSpec;


/* ------------------------------------------------------------------------
 * traced (traced.c)
 * ------------------------------------------------------------------------ */

/* The specs of usdt.TracedFunction and of the decorator that
 * usdt.traced() returns, for the module to create the types from. */
extern PyType_Spec _PyUsdt_TracedSpec;
extern PyType_Spec _PyUsdt_DecoratorSpec;

/* usdt.traced(provider, name=None), a module function, and its
 * docstring. */
extern PyObject *_PyUsdt_Traced(PyObject *module, PyObject *args,
                                PyObject *kwargs);
extern const char _PyUsdt_TracedDoc[];


/* ------------------------------------------------------------------------
 * The module (module.c)
 * ------------------------------------------------------------------------ */

/* The state of each _usdt module object (one per interpreter): the types
 * it created. */
typedef struct {
    PyTypeObject *probe_type;
    PyTypeObject *traced_type;
    PyTypeObject *decorator_type;
} module_state;

/* The state of the module that defined *type* (a type of this module). */
extern module_state *_PyUsdt_StateOfType(PyTypeObject *type);

#endif /* !USDT_H */
