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
 */

#include "Python.h"

#if !defined(__linux__) || !defined(__x86_64__)
#  error "_usdt supports x86-64 Linux only"
#endif

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ARGS 6
#define MAX_PROVIDER 64
#define MAX_NAME 128
/* The name of a traced function's probes, without "__return". */
#define MAX_TRACED_NAME (MAX_NAME - 8)
#define PAGE 4096

/* The registers of the first six integer arguments of a C call (SysV
 * x86-64 ABI), in order: the stub's caller loads them, the tracer reads
 * them at the stub's first instruction. */
static const char *const arg_registers[MAX_ARGS] = {
    "%rdi", "%rsi", "%rdx", "%rcx", "%r8", "%r9",
};

typedef void (*stub_func)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t);

/* Argument type codes, as in a site's types string. */
#define TYPE_INT 'i'
#define TYPE_STR 's'
#define TYPE_BYTES 'b'


/* ------------------------------------------------------------------------
 * The ELF shared object
 * ------------------------------------------------------------------------ */

struct elf_probe {
    const char *provider;
    const char *name;
    const char *types;          /* type codes, e.g. "si" */
    Elf64_Addr stub;            /* out: the stub's address in the object */
    Elf64_Addr semaphore;       /* out: the semaphore's address */
};

/* Section indices, in file order. */
enum {
    SEC_NULL, SEC_HASH, SEC_DYNSYM, SEC_DYNSTR, SEC_TEXT, SEC_BASE,
    SEC_DYNAMIC, SEC_PROBES, SEC_NOTE, SEC_SHSTRTAB, SEC_COUNT
};

static const char *const section_names[SEC_COUNT] = {
    "", ".hash", ".dynsym", ".dynstr", ".text", ".stapsdt.base",
    ".dynamic", ".probes", ".note.stapsdt", ".shstrtab",
};

enum { PH_TEXT, PH_DATA, PH_DYNAMIC, PH_STACK, PH_COUNT };

#define STUB_SIZE 16
#define DYNAMIC_COUNT 6
#define NOTE_NAME "stapsdt"
#define NT_STAPSDT 3

static size_t
align_up(size_t n, size_t alignment)
{
    return (n + alignment - 1) & ~(alignment - 1);
}

/* The argument string of a note, e.g. "-8@%rdi 8@%rsi": ints are signed
 * 8-byte values, str and bytes 8-byte pointers.  *buf* holds at least
 * MAX_ARGS * 10 bytes. */
static void
format_arguments(const char *types, char *buf)
{
    char *p = buf;
    *p = '\0';
    for (int i = 0; types[i] != '\0'; i++) {
        p += sprintf(p, "%s%s8@%s", i ? " " : "",
                     types[i] == TYPE_INT ? "-" : "", arg_registers[i]);
    }
}

/* Write the symbol name of a probe's stub ("usdt_PROVIDER_NAME") or of its
 * semaphore ("PROVIDER_NAME_semaphore", SystemTap's convention) into *p*;
 * return the number of bytes written, including the NUL. */
static size_t
symbol_name(char *p, const struct elf_probe *probe, int semaphore)
{
    int n;
    if (semaphore) {
        n = sprintf(p, "%s_%s_semaphore", probe->provider, probe->name);
    }
    else {
        n = sprintf(p, "usdt_%s_%s", probe->provider, probe->name);
    }
    return (size_t)n + 1;
}

/* Build the object holding *count* probes in a malloc()ed buffer; store
 * its size in *size*, and each probe's stub and semaphore addresses (as
 * linked at 0) in *probes*.  NULL if out of memory. */
static unsigned char *
build_object(struct elf_probe *probes, int count, size_t *size)
{
    char args[MAX_ARGS * 10];
    size_t nsyms = 1 + 2 * (size_t)count;

    /* Sizes of the variable parts. */
    size_t dynstr_size = 1;
    size_t note_size = 0;
    for (int i = 0; i < count; i++) {
        size_t names = strlen(probes[i].provider) + strlen(probes[i].name);
        dynstr_size += (names + sizeof("usdt__")) +
                       (names + sizeof("__semaphore"));
        format_arguments(probes[i].types, args);
        size_t desc = 3 * 8 + names + 2 + strlen(args) + 1;
        note_size += sizeof(Elf64_Nhdr) + align_up(sizeof(NOTE_NAME), 4)
                     + align_up(desc, 4);
    }
    size_t shstrtab_size = 0;
    for (int i = 0; i < SEC_COUNT; i++) {
        shstrtab_size += strlen(section_names[i]) + 1;
    }

    /* Layout.  Addresses equal file offsets in both segments, so no tool
     * can disagree about which file offset an address stands for.
     *   text segment (R X): ELF header, program headers, .hash, .dynsym,
     *       .dynstr, .text, .stapsdt.base
     *   data segment (RW, next page): .dynamic (ld.so relocates it in
     *       place), .probes (the semaphores; file-backed, since the kernel
     *       looks for them in a writable private mapping of the file)
     *   not loaded: .note.stapsdt, .shstrtab, section headers */
    Elf64_Off off[SEC_COUNT];
    Elf64_Xword sizes[SEC_COUNT];
    size_t pos = sizeof(Elf64_Ehdr) + PH_COUNT * sizeof(Elf64_Phdr);
    off[SEC_NULL] = 0;
    sizes[SEC_NULL] = 0;
    off[SEC_HASH] = pos = align_up(pos, 8);
    sizes[SEC_HASH] = (2 + 1 + nsyms) * sizeof(Elf64_Word);
    off[SEC_DYNSYM] = pos = align_up(pos + sizes[SEC_HASH], 8);
    sizes[SEC_DYNSYM] = nsyms * sizeof(Elf64_Sym);
    off[SEC_DYNSTR] = pos = pos + sizes[SEC_DYNSYM];
    sizes[SEC_DYNSTR] = dynstr_size;
    off[SEC_TEXT] = pos = align_up(pos + dynstr_size, STUB_SIZE);
    sizes[SEC_TEXT] = (size_t)count * STUB_SIZE;
    off[SEC_BASE] = pos = pos + sizes[SEC_TEXT];
    sizes[SEC_BASE] = 1;
    size_t text_end = pos + 1;
    off[SEC_DYNAMIC] = pos = align_up(text_end, PAGE);
    sizes[SEC_DYNAMIC] = DYNAMIC_COUNT * sizeof(Elf64_Dyn);
    off[SEC_PROBES] = pos = pos + sizes[SEC_DYNAMIC];
    sizes[SEC_PROBES] = (size_t)count * sizeof(uint16_t);
    size_t data_end = pos + sizes[SEC_PROBES];
    off[SEC_NOTE] = pos = align_up(data_end, 4);
    sizes[SEC_NOTE] = note_size;
    off[SEC_SHSTRTAB] = pos = pos + note_size;
    sizes[SEC_SHSTRTAB] = shstrtab_size;
    size_t shoff = align_up(pos + shstrtab_size, 8);
    *size = shoff + SEC_COUNT * sizeof(Elf64_Shdr);

    unsigned char *image = calloc(1, *size);
    if (image == NULL) {
        return NULL;
    }

    Elf64_Ehdr *eh = (Elf64_Ehdr *)image;
    memcpy(eh->e_ident, ELFMAG, SELFMAG);
    eh->e_ident[EI_CLASS] = ELFCLASS64;
    eh->e_ident[EI_DATA] = ELFDATA2LSB;
    eh->e_ident[EI_VERSION] = EV_CURRENT;
    eh->e_ident[EI_OSABI] = ELFOSABI_SYSV;
    eh->e_type = ET_DYN;
    eh->e_machine = EM_X86_64;
    eh->e_version = EV_CURRENT;
    eh->e_phoff = sizeof(Elf64_Ehdr);
    eh->e_shoff = shoff;
    eh->e_ehsize = sizeof(Elf64_Ehdr);
    eh->e_phentsize = sizeof(Elf64_Phdr);
    eh->e_phnum = PH_COUNT;
    eh->e_shentsize = sizeof(Elf64_Shdr);
    eh->e_shnum = SEC_COUNT;
    eh->e_shstrndx = SEC_SHSTRTAB;

    Elf64_Phdr *ph = (Elf64_Phdr *)(image + eh->e_phoff);
    ph[PH_TEXT].p_type = PT_LOAD;
    ph[PH_TEXT].p_flags = PF_R | PF_X;
    ph[PH_TEXT].p_filesz = ph[PH_TEXT].p_memsz = text_end;
    ph[PH_TEXT].p_align = PAGE;
    ph[PH_DATA].p_type = PT_LOAD;
    ph[PH_DATA].p_flags = PF_R | PF_W;
    ph[PH_DATA].p_offset = ph[PH_DATA].p_vaddr = ph[PH_DATA].p_paddr =
        off[SEC_DYNAMIC];
    ph[PH_DATA].p_filesz = ph[PH_DATA].p_memsz =
        data_end - off[SEC_DYNAMIC];
    ph[PH_DATA].p_align = PAGE;
    ph[PH_DYNAMIC].p_type = PT_DYNAMIC;
    ph[PH_DYNAMIC].p_flags = PF_R | PF_W;
    ph[PH_DYNAMIC].p_offset = ph[PH_DYNAMIC].p_vaddr =
        ph[PH_DYNAMIC].p_paddr = off[SEC_DYNAMIC];
    ph[PH_DYNAMIC].p_filesz = ph[PH_DYNAMIC].p_memsz = sizes[SEC_DYNAMIC];
    ph[PH_DYNAMIC].p_align = 8;
    /* Without PT_GNU_STACK, ld.so would make the thread stacks
     * executable for this object's sake. */
    ph[PH_STACK].p_type = PT_GNU_STACK;
    ph[PH_STACK].p_flags = PF_R | PF_W;
    ph[PH_STACK].p_align = 16;

    /* .dynstr and .dynsym: the null symbol, then each probe's stub and
     * semaphore. */
    char *dynstr = (char *)image + off[SEC_DYNSTR];
    Elf64_Sym *syms = (Elf64_Sym *)(image + off[SEC_DYNSYM]);
    size_t strpos = 1;
    for (int i = 0; i < count; i++) {
        Elf64_Addr stub = off[SEC_TEXT] + (Elf64_Addr)i * STUB_SIZE;
        Elf64_Addr sem = off[SEC_PROBES] + (Elf64_Addr)i * sizeof(uint16_t);
        probes[i].stub = stub;
        probes[i].semaphore = sem;

        Elf64_Sym *sym = &syms[1 + 2 * i];
        sym->st_name = (Elf64_Word)strpos;
        strpos += symbol_name(dynstr + strpos, &probes[i], 0);
        sym->st_info = ELF64_ST_INFO(STB_GLOBAL, STT_FUNC);
        sym->st_shndx = SEC_TEXT;
        sym->st_value = stub;
        sym->st_size = 2;
        sym++;
        sym->st_name = (Elf64_Word)strpos;
        strpos += symbol_name(dynstr + strpos, &probes[i], 1);
        sym->st_info = ELF64_ST_INFO(STB_GLOBAL, STT_OBJECT);
        sym->st_shndx = SEC_PROBES;
        sym->st_value = sem;
        sym->st_size = sizeof(uint16_t);

        /* The stub: nop (the probe's address), ret, int3 padding. */
        unsigned char *code = image + stub;
        memset(code, 0xcc, STUB_SIZE);
        code[0] = 0x90;
        code[1] = 0xc3;
    }
    assert(strpos == dynstr_size);

    /* .hash: one bucket chaining every symbol, which is valid whatever
     * each name hashes to. */
    Elf64_Word *hash = (Elf64_Word *)(image + off[SEC_HASH]);
    hash[0] = 1;
    hash[1] = (Elf64_Word)nsyms;
    hash[2] = (Elf64_Word)(nsyms - 1);
    for (size_t i = 1; i < nsyms; i++) {
        hash[3 + i] = (Elf64_Word)(i - 1);
    }

    Elf64_Dyn *dyn = (Elf64_Dyn *)(image + off[SEC_DYNAMIC]);
    dyn[0].d_tag = DT_HASH;
    dyn[0].d_un.d_ptr = off[SEC_HASH];
    dyn[1].d_tag = DT_STRTAB;
    dyn[1].d_un.d_ptr = off[SEC_DYNSTR];
    dyn[2].d_tag = DT_SYMTAB;
    dyn[2].d_un.d_ptr = off[SEC_DYNSYM];
    dyn[3].d_tag = DT_STRSZ;
    dyn[3].d_un.d_val = dynstr_size;
    dyn[4].d_tag = DT_SYMENT;
    dyn[4].d_un.d_val = sizeof(Elf64_Sym);
    dyn[5].d_tag = DT_NULL;

    /* The notes: pc, base (the address of .stapsdt.base, which lets tools
     * correct pc if the object was prelinked), semaphore, then provider,
     * name and arguments. */
    unsigned char *note = image + off[SEC_NOTE];
    for (int i = 0; i < count; i++) {
        format_arguments(probes[i].types, args);
        size_t lp = strlen(probes[i].provider) + 1;
        size_t ln = strlen(probes[i].name) + 1;
        size_t la = strlen(args) + 1;
        Elf64_Nhdr *nh = (Elf64_Nhdr *)note;
        nh->n_namesz = sizeof(NOTE_NAME);
        nh->n_descsz = (Elf64_Word)(3 * 8 + lp + ln + la);
        nh->n_type = NT_STAPSDT;
        note += sizeof(*nh);
        memcpy(note, NOTE_NAME, sizeof(NOTE_NAME));
        note += align_up(sizeof(NOTE_NAME), 4);
        unsigned char *desc = note;
        uint64_t addrs[3] = {probes[i].stub, off[SEC_BASE],
                             probes[i].semaphore};
        memcpy(desc, addrs, sizeof(addrs));
        desc += sizeof(addrs);
        memcpy(desc, probes[i].provider, lp);
        desc += lp;
        memcpy(desc, probes[i].name, ln);
        desc += ln;
        memcpy(desc, args, la);
        note += align_up(nh->n_descsz, 4);
    }
    assert(note == image + off[SEC_NOTE] + note_size);

    char *shstrtab = (char *)image + off[SEC_SHSTRTAB];
    Elf64_Shdr *sh = (Elf64_Shdr *)(image + shoff);
    size_t namepos = 0;
    for (int i = 0; i < SEC_COUNT; i++) {
        size_t len = strlen(section_names[i]) + 1;
        memcpy(shstrtab + namepos, section_names[i], len);
        sh[i].sh_name = (Elf64_Word)namepos;
        namepos += len;
        if (i == SEC_NULL) {
            continue;
        }
        sh[i].sh_offset = off[i];
        sh[i].sh_size = sizes[i];
        sh[i].sh_addralign = 1;
        if (i < SEC_NOTE) {
            sh[i].sh_addr = off[i];
            sh[i].sh_flags = SHF_ALLOC;
        }
    }
    sh[SEC_HASH].sh_type = SHT_HASH;
    sh[SEC_HASH].sh_link = SEC_DYNSYM;
    sh[SEC_HASH].sh_addralign = 8;
    sh[SEC_HASH].sh_entsize = sizeof(Elf64_Word);
    sh[SEC_DYNSYM].sh_type = SHT_DYNSYM;
    sh[SEC_DYNSYM].sh_link = SEC_DYNSTR;
    sh[SEC_DYNSYM].sh_info = 1;             /* the first global symbol */
    sh[SEC_DYNSYM].sh_addralign = 8;
    sh[SEC_DYNSYM].sh_entsize = sizeof(Elf64_Sym);
    sh[SEC_DYNSTR].sh_type = SHT_STRTAB;
    sh[SEC_TEXT].sh_type = SHT_PROGBITS;
    sh[SEC_TEXT].sh_flags |= SHF_EXECINSTR;
    sh[SEC_TEXT].sh_addralign = STUB_SIZE;
    sh[SEC_BASE].sh_type = SHT_PROGBITS;
    sh[SEC_DYNAMIC].sh_type = SHT_DYNAMIC;
    sh[SEC_DYNAMIC].sh_flags |= SHF_WRITE;
    sh[SEC_DYNAMIC].sh_link = SEC_DYNSTR;
    sh[SEC_DYNAMIC].sh_addralign = 8;
    sh[SEC_DYNAMIC].sh_entsize = sizeof(Elf64_Dyn);
    sh[SEC_PROBES].sh_type = SHT_PROGBITS;
    sh[SEC_PROBES].sh_flags |= SHF_WRITE;
    sh[SEC_PROBES].sh_addralign = sizeof(uint16_t);
    sh[SEC_NOTE].sh_type = SHT_NOTE;
    sh[SEC_NOTE].sh_addralign = 4;
    sh[SEC_SHSTRTAB].sh_type = SHT_STRTAB;
    return image;
}


/* ------------------------------------------------------------------------
 * Sites: the probes of the process, their files
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
    const struct object *object;
    uint16_t *semaphore;
    stub_func stub;
};

/* Everything below is shared by all interpreters and threads, and guarded
 * by registry_lock. */
static PyMutex registry_lock;
static struct site **sites;
static size_t site_count, site_capacity;
static struct object **objects;
static size_t object_count, object_capacity;
static unsigned long object_serial;
/* The directory of this process's files, and the process that made it:
 * after fork(), the child's first probe makes its own. */
static char directory[PATH_MAX];
static pid_t directory_owner;
static int atexit_registered;

/* Remove the files this process wrote, then its directory (Py_AtExit). */
static void
remove_files(void)
{
    pid_t pid = getpid();
    PyMutex_Lock(&registry_lock);
    for (size_t i = 0; i < object_count; i++) {
        if (objects[i]->owner == pid) {
            (void)unlink(objects[i]->path);
        }
    }
    if (directory_owner == pid) {
        (void)rmdir(directory);
        directory_owner = 0;
    }
    PyMutex_Unlock(&registry_lock);
}

static struct site *
find_site(const char *provider, const char *name)
{
    for (size_t i = 0; i < site_count; i++) {
        if (strcmp(sites[i]->name, name) == 0
            && strcmp(sites[i]->provider, provider) == 0)
        {
            return sites[i];
        }
    }
    return NULL;
}

/* *array* (of pointers, *capacity* of them) grown to hold *need*; NULL
 * if out of memory (then *array* is unchanged). */
static void *
grow(void *array, size_t *capacity, size_t need)
{
    if (need <= *capacity) {
        return array;
    }
    size_t cap = *capacity ? *capacity * 2 : 64;
    while (cap < need) {
        cap *= 2;
    }
    void *grown = realloc(array, cap * sizeof(void *));
    if (grown != NULL) {
        *capacity = cap;
    }
    return grown;
}

/* Why creating a site failed, for the caller to raise once the lock is
 * released. */
struct failure {
    PyObject *type;             /* NULL: no failure */
    int error;                  /* errno, for OSError */
    char message[PATH_MAX + 256];
};

static void
fail(struct failure *f, PyObject *type, int error, const char *format, ...)
{
    va_list va;
    f->type = type;
    f->error = error;
    va_start(va, format);
    vsnprintf(f->message, sizeof(f->message), format, va);
    va_end(va);
}

static void
raise_failure(const struct failure *f)
{
    if (f->type == PyExc_MemoryError) {
        PyErr_NoMemory();
    }
    else if (f->type == PyExc_OSError && f->error != 0) {
        PyObject *args = Py_BuildValue("(is)", f->error, f->message);
        if (args != NULL) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    }
    else {
        PyErr_SetString(f->type, f->message);
    }
}

/* Make this process's directory: $TMPDIR (if absolute) or /tmp, then
 * "python-usdt-PID-XXXXXX", mode 0700. */
static int
make_directory(struct failure *f)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] != '/') {
        tmp = "/tmp";
    }
    pid_t pid = getpid();
    int n = snprintf(directory, sizeof(directory),
                     "%s/python-usdt-%ld-XXXXXX", tmp, (long)pid);
    if (n < 0 || (size_t)n >= sizeof(directory)) {
        fail(f, PyExc_OSError, ENAMETOOLONG,
             "usdt: TMPDIR is too long: %s", tmp);
        return -1;
    }
    if (mkdtemp(directory) == NULL) {
        fail(f, PyExc_OSError, errno,
             "usdt: cannot create a directory for the probes' files in "
             "%s: %s", tmp, strerror(errno));
        return -1;
    }
    directory_owner = pid;
    if (!atexit_registered) {
        if (Py_AtExit(remove_files) < 0) {
            /* Too many exit functions: the files would stay behind. */
            (void)rmdir(directory);
            directory_owner = 0;
            fail(f, PyExc_RuntimeError, 0,
                 "usdt: cannot register the removal of its files at exit");
            return -1;
        }
        atexit_registered = 1;
    }
    return 0;
}

static int
write_file(const char *path, const unsigned char *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        return -1;
    }
    while (size > 0) {
        ssize_t n = write(fd, data, size);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            int saved = errno;
            close(fd);
            errno = saved;
            return -1;
        }
        data += n;
        size -= (size_t)n;
    }
    return close(fd);
}

/* Write and load an object for the probes *specs*, and publish a site for
 * each.  Called with registry_lock held. */
static int
load_object(struct elf_probe *specs, int count, struct site **out,
            struct failure *f)
{
    struct site **grown_sites = grow(sites, &site_capacity,
                                     site_count + count);
    if (grown_sites != NULL) {
        sites = grown_sites;
    }
    struct object **grown_objects = grow(objects, &object_capacity,
                                         object_count + 1);
    if (grown_objects != NULL) {
        objects = grown_objects;
    }
    if (grown_sites == NULL || grown_objects == NULL) {
        fail(f, PyExc_MemoryError, 0, "");
        return -1;
    }
    if (directory_owner != getpid() && make_directory(f) < 0) {
        return -1;
    }
    char path[PATH_MAX];
    int n = snprintf(path, sizeof(path), "%s/%lu-%s-%s.so", directory,
                     ++object_serial, specs[0].provider, specs[0].name);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        fail(f, PyExc_OSError, ENAMETOOLONG,
             "usdt: the path of a probe's file is too long (directory %s)",
             directory);
        return -1;
    }
    struct object *object = malloc(sizeof(*object) + (size_t)n + 1);
    struct site *new_sites = calloc(count, sizeof(*new_sites));
    size_t size;
    unsigned char *image = build_object(specs, count, &size);
    if (object == NULL || new_sites == NULL || image == NULL) {
        fail(f, PyExc_MemoryError, 0, "");
        goto error;
    }
    memcpy(object->path, path, (size_t)n + 1);
    if (write_file(object->path, image, size) < 0) {
        fail(f, PyExc_OSError, errno, "usdt: cannot write %s: %s",
             object->path, strerror(errno));
        (void)unlink(object->path);
        goto error;
    }
    /* Never closed: tracers may hold uprobes on the stubs, and Probe
     * objects in any interpreter refer to them until exit. */
    void *handle = dlopen(object->path, RTLD_NOW | RTLD_LOCAL);
    struct link_map *map = NULL;
    if (handle == NULL || dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0) {
        const char *why = dlerror();
        fail(f, PyExc_OSError, 0,
             "usdt: cannot load %s: %s (a directory mounted noexec? set "
             "TMPDIR to another one)", object->path, why ? why : "?");
        (void)unlink(object->path);
        goto error;
    }
    object->owner = getpid();
    objects[object_count++] = object;
    for (int i = 0; i < count; i++) {
        struct site *site = &new_sites[i];
        strcpy(site->provider, specs[i].provider);
        strcpy(site->name, specs[i].name);
        strcpy(site->types, specs[i].types);
        site->object = object;
        site->semaphore = (uint16_t *)(map->l_addr + specs[i].semaphore);
        site->stub = (stub_func)(map->l_addr + specs[i].stub);
        sites[site_count++] = site;
        out[i] = site;
    }
    free(image);
    return 0;

error:
    free(object);
    free(new_sites);
    free(image);
    return -1;
}

/* The sites for probes (provider, names[i]) with types[i]: existing ones if
 * their types match (ValueError if not), new ones for the others, created
 * together in one object. */
static int
get_sites(const char *provider, const char *const *names,
          const char *const *types, int count, struct site **out)
{
    struct failure f = {NULL};
    struct elf_probe specs[2];
    int missing[2];
    int nmissing = 0;
    assert(count <= 2);

    PyMutex_Lock(&registry_lock);
    for (int i = 0; i < count; i++) {
        struct site *site = find_site(provider, names[i]);
        if (site == NULL) {
            specs[nmissing].provider = provider;
            specs[nmissing].name = names[i];
            specs[nmissing].types = types[i];
            missing[nmissing++] = i;
        }
        else if (strcmp(site->types, types[i]) != 0) {
            fail(&f, PyExc_ValueError, 0,
                 "probe %s:%s already exists in this process with other "
                 "argument types", provider, names[i]);
            break;
        }
        else {
            out[i] = site;
        }
    }
    if (f.type == NULL && nmissing > 0) {
        struct site *created[2];
        if (load_object(specs, nmissing, created, &f) == 0) {
            for (int j = 0; j < nmissing; j++) {
                out[missing[j]] = created[j];
            }
        }
    }
    PyMutex_Unlock(&registry_lock);
    if (f.type != NULL) {
        raise_failure(&f);
        return -1;
    }
    return 0;
}


/* ------------------------------------------------------------------------
 * Names and types
 * ------------------------------------------------------------------------ */

/* Copy the provider or probe name *obj* into *out* (maxlen + 1 bytes) if
 * it is a C identifier of at most *maxlen* characters; else raise, with
 * *hint* at the end of the message. */
static int
check_identifier(const char *what, PyObject *obj, size_t maxlen, char *out,
                 const char *hint)
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

static inline int
is_armed(const uint16_t *semaphore)
{
    return _Py_atomic_load_uint16_relaxed(semaphore) != 0;
}

/* The UTF-8 bytes of one code point into *out*, with the rule of the
 * interpreter's own probes (_PyDTrace_StrAsUTF8() in
 * Python/pydtrace_probes.c, which this shared module cannot link to): a
 * lone surrogate, which UTF-8 cannot encode, becomes '?'. */
static size_t
encode_utf8(Py_UCS4 ch, char *out)
{
    if (ch < 0x80) {
        out[0] = (char)ch;
        return 1;
    }
    if (ch < 0x800) {
        out[0] = (char)(0xc0 | (ch >> 6));
        out[1] = (char)(0x80 | (ch & 0x3f));
        return 2;
    }
    if (ch >= 0xd800 && ch <= 0xdfff) {
        out[0] = '?';
        return 1;
    }
    if (ch < 0x10000) {
        out[0] = (char)(0xe0 | (ch >> 12));
        out[1] = (char)(0x80 | ((ch >> 6) & 0x3f));
        out[2] = (char)(0x80 | (ch & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (ch >> 18));
    out[1] = (char)(0x80 | ((ch >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((ch >> 6) & 0x3f));
    out[3] = (char)(0x80 | (ch & 0x3f));
    return 4;
}

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
    if ((size_t)len >= (STRBUF_SIZE - 1) / most) {
        if ((size_t)len > (PY_SSIZE_T_MAX - 1) / most) {
            PyErr_NoMemory();
            return NULL;
        }
        out = *heap = PyMem_Malloc((size_t)len * most + 1);
        if (out == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    size_t pos = 0;
    for (Py_ssize_t i = 0; i < len; i++) {
        pos += encode_utf8(PyUnicode_READ(kind, data, i), out + pos);
    }
    out[pos] = '\0';
    return out;
}

/* Check *args* against the types of *site* and fire it.  Raises TypeError
 * for a wrong count or type, OverflowError for an int outside int64. */
static int
fire(const struct site *site, PyObject *const *args, Py_ssize_t nargs,
     PyObject *kwnames)
{
    Py_ssize_t ntypes = (Py_ssize_t)strlen(site->types);
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
 * Module state and the Probe type
 * ------------------------------------------------------------------------ */

typedef struct {
    PyTypeObject *probe_type;
    PyTypeObject *traced_type;
    PyTypeObject *decorator_type;
} module_state;

static struct PyModuleDef usdt_module;

static module_state *
state_of_type(PyTypeObject *type)
{
    PyObject *module = PyType_GetModuleByDef(type, &usdt_module);
    assert(module != NULL);
    return PyModule_GetState(module);
}

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
static PyObject *
probe_from_site(PyTypeObject *type, const struct site *site)
{
    ProbeObject *self = (ProbeObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = probe_vectorcall;
    self->semaphore = site->semaphore;
    self->site = site;
    self->provider = PyUnicode_InternFromString(site->provider);
    self->name = PyUnicode_InternFromString(site->name);
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
    if (check_identifier("provider", provider_obj, MAX_PROVIDER,
                         provider, "") < 0
        || check_identifier("probe name", name_obj, MAX_NAME, name, "") < 0
        || (types_obj != NULL && parse_types(types_obj, types) < 0))
    {
        return NULL;
    }
    const char *names[1] = {name};
    const char *typelist[1] = {types};
    struct site *site;
    if (get_sites(provider, names, typelist, 1, &site) < 0) {
        return NULL;
    }
    return probe_from_site(type, site);
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
    return is_armed(((ProbeObject *)op)->semaphore);
}

static PyObject *
probe_get_armed(PyObject *op, void *closure)
{
    return PyBool_FromLong(is_armed(((ProbeObject *)op)->semaphore));
}

static PyObject *
probe_repr(PyObject *op)
{
    ProbeObject *self = (ProbeObject *)op;
    char args[MAX_ARGS * 10];
    format_arguments(self->site->types, args);
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

static PyType_Spec probe_spec = {
    .name = "usdt.Probe",
    .basicsize = sizeof(ProbeObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = probe_slots,
};


/* ------------------------------------------------------------------------
 * traced: the decorator and the functions it wraps
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
    if (is_armed(self->entry_semaphore)) {
        self->entry_stub(0, 0, 0, 0, 0, 0);
    }
    PyObject *result = PyObject_Vectorcall(self->func, args, nargsf,
                                           kwnames);
    if (is_armed(self->return_semaphore)) {
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

static PyType_Spec traced_spec = {
    .name = "usdt.TracedFunction",
    .basicsize = sizeof(TracedObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION | Py_TPFLAGS_HAVE_GC
             | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = traced_slots,
};

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
    module_state *state = state_of_type(Py_TYPE(op));
    char provider[MAX_PROVIDER + 1];
    char base[MAX_TRACED_NAME + 1];
    if (check_identifier("provider", self->provider, MAX_PROVIDER,
                         provider, "") < 0)
    {
        return NULL;
    }
    if (self->name != Py_None) {
        if (check_identifier("probe name", self->name,
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
        int rc = check_identifier("the function's __name__", name,
                                  MAX_TRACED_NAME, base,
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
    if (get_sites(provider, names, types, 2, found) < 0) {
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
    traced->entry_probe = probe_from_site(state->probe_type, found[0]);
    if (traced->entry_probe == NULL) {
        goto done;
    }
    traced->return_probe = probe_from_site(state->probe_type, found[1]);
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

static PyType_Spec decorator_spec = {
    .name = "usdt._TracedDecorator",
    .basicsize = sizeof(DecoratorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE
             | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = decorator_slots,
};

PyDoc_STRVAR(traced_doc,
"traced(provider, name=None)\n\
--\n\
\n\
A decorator: calls of the function fire the probes\n\
PROVIDER:NAME__entry() before and PROVIDER:NAME__return(raised) after\n\
(raised is 1 if the call raised an exception, else 0), each only while a\n\
tracer has armed it.  NAME defaults to the function's __name__.");

static PyObject *
usdt_traced(PyObject *module, PyObject *args, PyObject *kwargs)
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
    if (check_identifier("provider", provider, MAX_PROVIDER, buf, "") < 0
        || (name != Py_None
            && check_identifier("probe name", name,
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


/* ------------------------------------------------------------------------
 * The module
 * ------------------------------------------------------------------------ */

static PyMethodDef usdt_methods[] = {
    {"traced", (PyCFunction)(void (*)(void))usdt_traced,
     METH_VARARGS | METH_KEYWORDS, traced_doc},
    {NULL}
};

static int
usdt_exec(PyObject *module)
{
    module_state *state = PyModule_GetState(module);
    state->probe_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &probe_spec, NULL);
    if (state->probe_type == NULL
        || PyModule_AddType(module, state->probe_type) < 0)
    {
        return -1;
    }
    state->traced_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &traced_spec, NULL);
    if (state->traced_type == NULL
        || PyModule_AddType(module, state->traced_type) < 0)
    {
        return -1;
    }
    state->decorator_type = (PyTypeObject *)PyType_FromModuleAndSpec(
        module, &decorator_spec, NULL);
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
