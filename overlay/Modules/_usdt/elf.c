/* _usdt: the ELF object that carries a batch of probes, built in memory
 * (see usdt.h for the whole module, docs/usdt-module.md for the layout).
 */

#include "Python.h"

#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "usdt.h"

#define PAGE 4096

/* The registers of the first six integer arguments of a C call (SysV
 * x86-64 ABI), in order: the stub's caller loads them, the tracer reads
 * them at the stub's first instruction. */
static const char *const arg_registers[MAX_ARGS] = {
    "%rdi", "%rsi", "%rdx", "%rcx", "%r8", "%r9",
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

static const unsigned char marker_pair[] = {
    0x90, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00,
};
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
 * ARGUMENTS_SIZE bytes. */
void
_PyUsdt_FormatArguments(const char *types, char *buf)
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
unsigned char *
_PyUsdt_BuildObject(struct elf_probe *probes, int count, size_t *size)
{
    char args[ARGUMENTS_SIZE];
    size_t nsyms = 1 + 2 * (size_t)count;

    /* Sizes of the variable parts. */
    size_t dynstr_size = 1;
    size_t note_size = 0;
    for (int i = 0; i < count; i++) {
        size_t names = strlen(probes[i].provider) + strlen(probes[i].name);
        dynstr_size += (names + sizeof("usdt__")) +
                       (names + sizeof("__semaphore"));
        _PyUsdt_FormatArguments(probes[i].types, args);
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
        sym->st_size = sizeof(marker_pair) + 1;
        sym++;
        sym->st_name = (Elf64_Word)strpos;
        strpos += symbol_name(dynstr + strpos, &probes[i], 1);
        sym->st_info = ELF64_ST_INFO(STB_GLOBAL, STT_OBJECT);
        sym->st_shndx = SEC_PROBES;
        sym->st_value = sem;
        sym->st_size = sizeof(uint16_t);

        /* The stub: the interpreter's marker pair (a 1-byte nop, the
         * probe's address, then the 10-byte nop that Linux 7.3 optimizes:
         * Include/internal/pycore_dtrace_site.h), ret, int3 padding. */
        unsigned char *code = image + stub;
        memset(code, 0xcc, STUB_SIZE);
        memcpy(code, marker_pair, sizeof(marker_pair));
        code[sizeof(marker_pair)] = 0xc3;
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
        _PyUsdt_FormatArguments(probes[i].types, args);
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
