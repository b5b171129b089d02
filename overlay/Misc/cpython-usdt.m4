dnl cpython-usdt's configure defaults, included by configure.ac (patch
dnl 0104).  `make` in the cpython-usdt repository and a plain
dnl `./configure --with-dtrace && make` in its source release both get them.

dnl CPYTHON_USDT_DEFAULTS: the compiler flags of cpython-usdt's builds,
dnl unless --without-usdt-defaults.  Called once the compiler and
dnl --enable-optimizations are known.  Each flag's reason is in
dnl docs/layout.md ("Compiler flags") of the cpython-usdt repository:
dnl
dnl   - frame pointers in CFLAGS, so that perf -g, bpftrace's ustack and gdb
dnl     walk native stacks through the interpreter without DWARF; CFLAGS also
dnl     reach sysconfig and C extensions built for this interpreter;
dnl   - the loop flags, read when configure runs from
dnl     Misc/cpython-usdt-loop-flags (the series' own, laid there by
dnl     tools/prepare): for the interpreter's own files (CFLAGS_NODIST:
dnl     -fno-gcse in 3.13: with frame pointers, GCC's GCSE leaves the loop's
dnl     `frame` in memory), for Python/ceval.o (USDT_CEVAL_CFLAGS, and more
dnl     with PGO) and, with PGO, for Modules/_sre/sre.o (USDT_SRE_CFLAGS).
dnl
dnl The loop flags are GCC's, and given to GCC only.
AC_DEFUN([CPYTHON_USDT_DEFAULTS], [
AC_MSG_CHECKING([for --with-usdt-defaults])
AC_ARG_WITH([usdt-defaults],
  [AS_HELP_STRING([--without-usdt-defaults],
    [cpython-usdt: leave out its compiler flags (frame pointers, -fno-gcse and the interpreter loop's flags) (default is with)])],
  [AS_CASE([$withval], [yes|no], [],
     [AC_MSG_ERROR([--with-usdt-defaults takes no value, not '$withval'])])],
  [with_usdt_defaults=yes])
AC_MSG_RESULT([$with_usdt_defaults])
USDT_CEVAL_CFLAGS=
USDT_SRE_CFLAGS=
AS_IF([test "$with_usdt_defaults" = yes], [
  AX_CHECK_COMPILE_FLAG([-fno-omit-frame-pointer],
    [CFLAGS="$CFLAGS -fno-omit-frame-pointer"], [], [-Werror])
  AX_CHECK_COMPILE_FLAG([-mno-omit-leaf-frame-pointer],
    [CFLAGS="$CFLAGS -mno-omit-leaf-frame-pointer"], [], [-Werror])
  AS_IF([test "$ac_cv_cc_name" = gcc], [
    usdt_loop_flags="$srcdir/Misc/cpython-usdt-loop-flags"
    AS_IF([test -f "$usdt_loop_flags"], [],
      [AC_MSG_ERROR([$usdt_loop_flags is missing (cpython-usdt's loop flags); --without-usdt-defaults builds without them])])
    CFLAGS_NODIST="$CFLAGS_NODIST `sed -n 's/^NODIST=//p' "$usdt_loop_flags"`"
    USDT_CEVAL_CFLAGS=`sed -n 's/^CEVAL=//p' "$usdt_loop_flags"`
    AS_IF([test "$Py_OPT" = true], [
      USDT_CEVAL_CFLAGS="$USDT_CEVAL_CFLAGS `sed -n 's/^CEVAL_PGO=//p' "$usdt_loop_flags"`"
      USDT_SRE_CFLAGS=`sed -n 's/^SRE_PGO=//p' "$usdt_loop_flags"`
    ])
  ])
])
AC_SUBST([USDT_CEVAL_CFLAGS])
AC_SUBST([USDT_SRE_CFLAGS])
])

dnl CPYTHON_USDT_BUILDINFO: in a source release (make dist), which has no
dnl .git, Misc/cpython-usdt-buildinfo holds what git gives in the
dnl repository's tree: its tag, commit and branch lines, so that
dnl sys.version and platform.python_build() name the same release.
AC_DEFUN([CPYTHON_USDT_BUILDINFO], [
AS_IF([test "$HAS_GIT" != found && test -f "$srcdir/Misc/cpython-usdt-buildinfo"], [
  GITTAG="sed -n 1p \$(srcdir)/Misc/cpython-usdt-buildinfo"
  GITVERSION="sed -n 2p \$(srcdir)/Misc/cpython-usdt-buildinfo"
  GITBRANCH="sed -n 3p \$(srcdir)/Misc/cpython-usdt-buildinfo"
])
])
