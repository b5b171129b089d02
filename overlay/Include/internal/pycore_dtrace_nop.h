/* The instruction under each USDT marker (cpython-usdt).
 *
 * Included by Include/pydtrace.h right after the generated
 * pydtrace_probes.h, which includes <sys/sdt.h>: every python: and
 * otel_memory: marker of the interpreter is expanded after this header,
 * so it decides what instruction the marker's note points to.
 *
 * sys/sdt.h puts each marker on a 1-byte nop, where the kernel handles a
 * uprobe with an int3 trap.  From Linux 6.18 on, x86-64 rewrites a uprobe
 * on a 5-byte nop (0f 1f 44 00 00) that does not cross a page into a call
 * to a trampoline, several times cheaper per hit (docs/tools-cost.md).
 * Kernels without the optimization trap on it as on the 1-byte nop.
 *
 *   - `.nops 5`, not `nopl 0(%rax,%rax,1)`, which gas shrinks to 4 bytes;
 *   - `.balign 8` before it, so that the nop never crosses a page.  The
 *     padding runs only when the marker is armed (the site is behind its
 *     semaphore), and the marker's label is placed again after it: the
 *     note takes the last `990:` before it, the nop's address;
 *   - no commas, which would split sys/sdt.h's macro arguments.
 *
 * sys/sdt.h defines _SDT_NOP without #ifndef (systemtap 4.8), so it is
 * replaced here, after the include, not before.
 *
 * The call the optimized uprobe makes writes below %rsp: the interpreter
 * is compiled with -mno-red-zone (Misc/cpython-usdt.m4), so that no
 * function keeps data there across a marker; tests/test_build_facts.py
 * checks both facts in the built binary. */

#ifndef Py_INTERNAL_DTRACE_NOP_H
#define Py_INTERNAL_DTRACE_NOP_H

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

#if defined(__x86_64__) && defined(_SDT_NOP)
#  undef _SDT_NOP
#  define _SDT_NOP .balign 8; 990: .nops 5
#endif

#endif   /* !Py_INTERNAL_DTRACE_NOP_H */
