/* The instructions at every USDT marker of the interpreter (cpython-usdt).
 *
 * sys/sdt.h puts each marker on a 1-byte nop, which a tracer replaces with
 * an int3: every hit traps.  Here the 1-byte nop is followed by a 10-byte
 * nop, 66 2e 0f 1f 84 00 00 00 00 00 (nopw %cs:0x0(%rax,%rax,1)): the pair
 * that Linux 7.3's optimized uprobes expect.  The note still points at the
 * 1-byte nop.  A kernel that optimizes ("uprobes/x86: Move optimized uprobe
 * from nop5 to nop10") rewrites a uprobe on the 10-byte nop into
 * `lea -0x80(%rsp),%rsp; call` into [uprobes-trampoline], which keeps the
 * red zone and which a forked child keeps too; libbpf attaches there only
 * when the kernel says it optimizes, and at the 1-byte nop otherwise, as
 * every other tool does (docs/marker-sites.md).
 *
 * Included by Include/pydtrace.h right after pydtrace_probes.h, which
 * includes sys/sdt.h.  sys/sdt.h defines _SDT_NOP whatever was defined
 * before, so it is redefined after it: each probe site expands _SDT_NOP
 * where the PyDTrace_<PROBE>() macro is used, and gets this definition.
 * The 10 bytes are .byte directives separated by ';' because the site's
 * asm text goes through a macro argument (a comma would split it) and has
 * operands (a '%' would have to be doubled).  The _usdt extension writes
 * the same bytes into its stubs (Modules/_usdt/elf.c).
 */

#ifndef Py_INTERNAL_DTRACE_SITE_H
#define Py_INTERNAL_DTRACE_SITE_H

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

#if defined(__x86_64__) && defined(_SDT_NOP)
#  undef _SDT_NOP
#  define _SDT_NOP nop; .byte 0x66; .byte 0x2e; .byte 0x0f; .byte 0x1f; \
    .byte 0x84; .byte 0x00; .byte 0x00; .byte 0x00; .byte 0x00; .byte 0x00
#endif

#endif   /* !Py_INTERNAL_DTRACE_SITE_H */
