# Checks of an installed interpreter, shared by tools/check-install (a
# `make install` into a scratch prefix) and tools/check-deb (the .deb,
# installed with apt-get).  Sourced after lib.sh, not executed.
# shellcheck shell=bash

# system_python: what the system's python3 is; installing ours must not
# change it.
system_python() {
    for path in /usr/bin/python3 /usr/lib/python3 /usr/local/lib; do
        [ -e "$path" ] && stat -L -c '%n %s %Y' "$path"
    done
    true
}

# system_python_unchanged BEFORE: system_python is what the file BEFORE
# recorded earlier.
system_python_unchanged() {
    local now
    now=$(system_python)
    [ "$now" = "$(cat "$1")" ] ||
        die "the system's python3 changed: $(diff "$1" <(printf '%s\n' "$now"))"
}

# What a traced command may take before it is killed and said to hang.
CHECK_DEADLINE=${CHECK_DEADLINE:-300}

# count_calls OBJECT COMMAND...: bpftrace, attached to OBJECT (the file
# holding the probes), counts the calls of f that COMMAND makes.  Prints
# the count, or "skip: <bpftrace's reason>", or "no count: <output>".
# bpftrace attaches path-wide, before COMMAND starts, rather than with -c:
# bpftrace 0.17's -c looks the probes up in the child before it has loaded
# any library ("Error finding location for probe" for libpython3.13.so).
count_calls() {
    count_hits function__entry 'str(arg1) == "f"' "$@"
}

# count_hits PROBE PREDICATE OBJECT COMMAND...: as count_calls, the hits of
# python:PROBE in OBJECT for which the bpftrace PREDICATE holds.
count_hits() {
    local probe=$1 predicate=$2 object=$3 log tracer out failed=""
    shift 3
    log=$(mktemp)
    bpftrace -q -e "BEGIN { printf(\"attached\\n\"); }
        usdt:$object:python:$probe /$predicate/ { @calls = count(); }" \
        > "$log" 2>&1 &
    tracer=$!
    for _ in $(seq 300); do
        grep -qx attached "$log" && break
        kill -0 "$tracer" 2> /dev/null || break
        sleep 0.2
    done
    if grep -qx attached "$log"; then
        # A deadline: a command that hangs under the tracer is said so.
        timeout "$CHECK_DEADLINE" "$@" > /dev/null 2>&1 || case $? in
            124) failed="timeout: the command did not end within ${CHECK_DEADLINE} s: $*" ;;
            *) failed="the command failed: $*" ;;
        esac
        # bpftrace 0.17 now and then misses a SIGINT: send it until it
        # exits.
        for _ in $(seq 50); do
            kill -INT "$tracer" 2> /dev/null || break
            sleep 0.2
        done
    fi
    kill -KILL "$tracer" 2> /dev/null || true
    wait "$tracer" 2> /dev/null || true
    out=$(cat "$log")
    rm -f "$log"
    if [ -n "$failed" ]; then
        printf 'no count: %s\n' "$failed"
        return
    fi
    case $out in
        *"@calls: "*) printf '%s\n' "$out" | sed -n 's/^@calls: //p' ;;
        *"Operation not permitted"*|*"Could not"*|*"Error attaching"*)
            printf 'skip: %s\n' "$(printf '%s' "$out" | grep -v RLIMIT_MEMLOCK | head -n 3)" ;;
        *) printf 'no count: %s\n' "$out" ;;
    esac
}

# expect_100_calls WHAT OBJECT COMMAND...: count_calls must count 100, or
# skip for a reason bpftrace gave (fail under CI or REQUIRE_TRACER).
expect_100_calls() {
    expect_100_hits function__entry 'str(arg1) == "f"' "$@"
}

# expect_100_hits PROBE PREDICATE WHAT OBJECT COMMAND...: count_hits must
# count 100, or skip for a reason bpftrace gave (fail under CI or
# REQUIRE_TRACER).
expect_100_hits() {
    local probe=$1 predicate=$2 what=$3 calls
    shift 3
    if ! command -v bpftrace > /dev/null; then
        skip_tracer "$what: bpftrace not found"
        return
    fi
    calls=$(count_hits "$probe" "$predicate" "$@")
    case $calls in
        100) log "$what: $probe fired 100 times, seen in $1" ;;
        skip:*) skip_tracer "$what: bpftrace: ${calls#skip: }" ;;
        *) die "$what: bpftrace on $1 did not count 100 hits of $probe /$predicate/: $calls" ;;
    esac
}

# expect_tools_calls PYTHON SCRIPT: python -m usdt.tools calls, with the
# ready scripts installed in usdt/scripts and the stack tool's program in
# usdt/stacks (make install copies only the directories that
# LIBSUBDIRS names), counts the 100 calls of f in SCRIPT;
# or skip for a reason bpftrace gave (fail under CI or REQUIRE_TRACER).
# Static builds only: bpftrace 0.17's -c cannot find the probes of a
# libpython that the child has not loaded yet.
expect_tools_calls() {
    local py=$1 script=$2 out package
    package=$("$py" -c 'import os, usdt; print(os.path.dirname(usdt.__file__))')
    [ -f "$package/scripts/top-functions.bt" ] ||
        die "top-functions.bt is not installed in $package/scripts"
    [ -f "$package/stacks/program.bt" ] ||
        die "the stack tool's program.bt is not installed in $package/stacks"
    if ! command -v bpftrace > /dev/null; then
        skip_tracer "usdt.tools: bpftrace not found"
        return
    fi
    out=$(timeout "$CHECK_DEADLINE" "$py" -m usdt.tools calls -c "$py $script" 2>&1) ||
        [ $? -ne 124 ] ||
        die "timeout: python3 -m usdt.tools calls did not end within ${CHECK_DEADLINE} s: $out"
    case $out in
        *"@calls[$script, f, 1]: 100"*) log "python3 -m usdt.tools calls: f() called 100 times" ;;
        *"Operation not permitted"*|*"Could not"*|*"Error attaching"*)
            skip_tracer "usdt.tools: bpftrace: $(printf '%s' "$out" | head -n 3)" ;;
        *) die "python3 -m usdt.tools calls did not count 100 calls of f: $out" ;;
    esac
}

# libpython_of BINARY: the libpython that BINARY loads, as ldd finds it.
libpython_of() {
    ldd "$1" | sed -n 's/^\s*libpython[^ ]* => \([^ ]*\) .*/\1/p'
}

# probes_of FILE: the names of the USDT probes in FILE's notes.
probes_of() {
    readelf -n "$1" | sed -n 's/^ *Name: //p' | sort -u
}

# build_embedding DIR WORK LDFLAGS...: WORK/embed, a C program that embeds
# the interpreter installed in DIR (python3-config --embed, then LDFLAGS),
# and runs WORK/calls.py and WORK/tasks.py with it.
build_embedding() {
    local dir=$1 work=$2 cflags ldflags
    shift 2
    log "a C program embedding the interpreter"
    cat > "$work/embed.c" <<'EOF'
#include <Python.h>

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCRIPT\n", argv[0]);
        return 2;
    }
    FILE *script = fopen(argv[1], "r");
    if (script == NULL) {
        perror(argv[1]);
        return 2;
    }
    Py_Initialize();
    int rc = PyRun_SimpleFile(script, argv[1]);
    fclose(script);
    if (Py_FinalizeEx() < 0) {
        rc = 1;
    }
    return rc != 0;
}
EOF
    cflags=$("$dir/bin/python3-config" --cflags --embed) ||
        die "python3-config --cflags --embed failed"
    ldflags=$("$dir/bin/python3-config" --ldflags --embed) ||
        die "python3-config --ldflags --embed failed"
    # shellcheck disable=SC2086  # lists of flags
    gcc $cflags -o "$work/embed" "$work/embed.c" $ldflags "$@" ||
        die "the embedding program did not compile"
    "$work/embed" "$work/calls.py" || die "the embedding program failed"
    "$work/embed" "$work/tasks.py" ||
        die "the embedding program failed to run asyncio's tasks"
}

# check_installed DIR VARIANT WORK: the interpreter installed in DIR
# (VARIANT static, or shared: libpython3.13.so) works, using the scratch
# directory WORK.
check_installed() {
    local dir=$1 variant=$2 work=$3
    local py version prefix pip_version includes suffix answer venv_answer
    local binary lib expected cflags ldflags
    py=$dir/bin/python3
    [ -x "$py" ] || die "no $py"
    version=$("$py" -VV)
    log "installed: $version"
    case $version in
        *"(tags/cpython-usdt-$PIN_RELEASE:"*) ;;
        *) die "$py -VV does not name cpython-usdt $PIN_RELEASE: $version" ;;
    esac
    prefix=$("$py" -c 'import sys; print(sys.prefix)')
    [ "$prefix" = "$dir" ] || die "sys.prefix is $prefix, not $dir"

    log "venv with pip"
    "$py" -m venv "$work/venv" || die "python3 -m venv failed"
    pip_version=$("$work/venv/bin/pip" --version) || die "pip --version failed in the venv"
    case $pip_version in
        *"$work/venv/"*) log "venv pip: $pip_version" ;;
        *) die "the venv's pip is not the venv's: $pip_version" ;;
    esac

    log "C extension against the installed headers"
    includes=$("$dir/bin/python3-config" --includes) || die "python3-config --includes failed"
    case $includes in
        *"-I$dir/include/python"*) ;;
        *) die "python3-config --includes names other headers: $includes" ;;
    esac
    suffix=$("$dir/bin/python3-config" --extension-suffix)
    cat > "$work/usdt_install_ext.c" <<'EOF'
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *
answer(PyObject *module, PyObject *Py_UNUSED(arg))
{
    return PyLong_FromLong(42);
}

static PyMethodDef methods[] = {
    {"answer", answer, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "usdt_install_ext", NULL, 0, methods,
};

PyMODINIT_FUNC
PyInit_usdt_install_ext(void)
{
    return PyModule_Create(&module);
}
EOF
    # shellcheck disable=SC2086  # $includes is a list of flags
    gcc -shared -fPIC $includes -o "$work/usdt_install_ext$suffix" \
        "$work/usdt_install_ext.c" || die "the C extension did not compile"
    answer=$(cd "$work" && "$py" -c 'import usdt_install_ext; print(usdt_install_ext.answer())')
    [ "$answer" = 42 ] || die "the C extension did not import: $answer"
    venv_answer=$(cd "$work" && "$work/venv/bin/python" -c 'import usdt_install_ext; print(usdt_install_ext.answer())')
    [ "$venv_answer" = 42 ] || die "the C extension did not import in the venv: $venv_answer"

    printf 'def f():\n    return 1\nfor _ in range(100):\n    f()\n' > "$work/calls.py"

    # 50 tasks of the C implementation (_asyncio), 2 steps each.
    cat > "$work/tasks.py" <<'EOF'
import asyncio
import _asyncio

async def step():
    await asyncio.sleep(0)

async def main():
    tasks = [asyncio.create_task(step()) for _ in range(50)]
    assert all(isinstance(t, _asyncio.Task) for t in tasks)
    await asyncio.gather(*tasks)

asyncio.run(main())
EOF

    binary=$(readlink -f "$py")
    if [ "$variant" = static ]; then
        expect_100_calls "the installed binary" "$binary" "$binary" "$work/calls.py"
        expect_tools_calls "$py" "$work/calls.py"
        # A program linked against the static libpython gets only the
        # archive members it references, and the shared extension modules
        # need more (_asyncio: Python/pydtrace_asyncio.o).
        # shellcheck disable=SC2046  # LINKFORSHARED is a list of flags
        build_embedding "$dir" "$work" $("$py" -c 'import sysconfig; print(sysconfig.get_config_var("LINKFORSHARED"))')
        [ -z "$(libpython_of "$work/embed")" ] ||
            die "the embedding program loads $(libpython_of "$work/embed"), not the static library"
        expect_100_calls "the embedding program (static)" "$work/embed" "$work/embed" "$work/calls.py"
        expect_100_hits task__step__start 'str(arg1) == "step"' \
            "asyncio in the embedding program (static)" "$work/embed" "$work/embed" "$work/tasks.py"
    else
        log "libpython holds the probes"
        lib=$dir/lib/libpython${PIN_VERSION%.*}.so.1.0
        [ -f "$lib" ] || die "no $lib after make install-shared"
        [ "$(libpython_of "$binary")" = "$lib" ] ||
            die "$binary loads '$(libpython_of "$binary")', not $lib"
        expected=$(awk -F '\t' '!/^#/ && NF { print $2 }' "$SERIES_DIR/probes.tsv" | sort -u)
        [ "$(probes_of "$lib")" = "$expected" ] ||
            die "the probes in $lib differ from the registry (series/$SERIES/probes.tsv): $(diff <(probes_of "$lib") <(printf '%s\n' "$expected"))"
        [ -z "$(probes_of "$binary")" ] ||
            die "$binary has probes of its own: $(probes_of "$binary")"
        expect_100_calls "python3 (shared)" "$lib" "$binary" "$work/calls.py"
        expect_100_calls "the venv's python (shared)" "$lib" "$work/venv/bin/python" "$work/calls.py"

        build_embedding "$dir" "$work" -Wl,-rpath,"$dir/lib"
        [ "$(libpython_of "$work/embed")" = "$lib" ] ||
            die "the embedding program loads '$(libpython_of "$work/embed")', not $lib"
        expect_100_calls "the embedding program" "$lib" "$work/embed" "$work/calls.py"
        expect_100_hits task__step__start 'str(arg1) == "step"' \
            "asyncio in the embedding program" "$lib" "$work/embed" "$work/tasks.py"
    fi
}

# expect_every_tool PYTHON WORK: every tool of `PYTHON -m usdt.tools`
# traces a workload that gives each something to find (WORK/tools.py:
# calls, exceptions, C calls, a collection, imports, threads, asyncio
# tasks, allocations, CPU time, a usdt module probe), with -c, and two
# with -p on it running (ccalls, and list); each must exit 0, print no
# traceback and find what the workload did.  Or skip for a reason bpftrace
# gave (fail under CI or REQUIRE_TRACER).  For tools/check-deb --all-tools
# (tools/check-deb-trixie: with the bpftrace of another release).
expect_every_tool() {
    local py=$1 work=$2 script tool out rc pid
    script=$work/tools.py
    if ! command -v bpftrace > /dev/null; then
        skip_tracer "usdt.tools, every tool: bpftrace not found"
        return
    fi
    log "every tool of usdt.tools, with $(bpftrace --version 2>&1 | head -n 1)"
    cat > "$script" <<'PY'
import asyncio
import gc
import sys
import threading
import time

import usdt

tick = usdt.Probe("check", "tick", (int,))


def f():
    return 1


def fails():
    raise ValueError("check")


def spin(seconds):
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += len(str(n))
    return n


async def step():
    await asyncio.sleep(0)


async def steps():
    await asyncio.gather(*[asyncio.create_task(step()) for _ in range(10)])


def main():
    for _ in range(5000):
        f()
    for _ in range(200):
        try:
            fails()
        except ValueError:
            pass
    gc.collect()
    import usdt_check_module
    try:
        import usdt_check_missing
    except ImportError:
        pass
    threads = [threading.Thread(target=spin, args=(0.3,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    asyncio.run(steps())
    blobs = [bytearray(4096) for _ in range(20000)]
    del blobs
    if sys.argv[2:] == ["ready"]:
        print("ready", flush=True)
    spin(float(sys.argv[1]))


main()
PY
    echo 'X = 1' > "$work/usdt_check_module.py"
    # run_tool TOOL ARGS...: its output (stdout and stderr) in
    # WORK/TOOL.out; stops on a failure, a traceback or a timeout.
    run_tool() {
        local tool=$1
        shift
        out=$work/$tool.out
        rc=0
        (cd "$work" && timeout "$CHECK_DEADLINE" "$py" -m usdt.tools "$tool" "$@") \
            > "$out" 2>&1 || rc=$?
        [ "$rc" -ne 124 ] ||
            die "timeout: usdt.tools $tool did not end within ${CHECK_DEADLINE} s"
        if grep -q -E 'Operation not permitted|Could not|Error attaching' "$out"; then
            skip_tracer "usdt.tools $tool: bpftrace: $(head -n 3 "$out")"
            return 1
        fi
        if [ "$rc" -ne 0 ] || grep -q '^Traceback' "$out"; then
            die "usdt.tools $tool $* failed (exit $rc): $(grep -v '^ ' "$out" | tail -n 5)"
        fi
    }
    # A regular expression for a path, and what each tool must find.
    local at=${script//./\\.}
    local -A expect=(
        [calls]="^@calls\[$at, f, [0-9]+\]: 5000$"
        [latency]="^@ns\[$at, f, [0-9]+\]: count 5000,"
        [lines]="^@lines\[$at, [0-9]+\]: 5000$"
        [exceptions]="^@raised\[ValueError, $at, [0-9]+\]: 200$"
        [ccalls]="^@total_ns\[builtins, len\]: [0-9]+$"
        [gc]="^@collections\[2\]: [0-9]+$"
        [imports]="^@import_us\[usdt_check_missing\]: [0-9]+$"
        [gil]="^all threads: wait [0-9]+ ns, hold [0-9]+ ns"
        [threads]="^[0-9]+ +stop +[0-9]+ +[0-9]+ +[0-9]+$"
        [tasks]="^@max_ns\[step\]: [0-9]+$"
        [alloc]=" $at:[0-9]+ \(main\)$"
        [profile]="spin \($at:[0-9]+\)"
        [stacks]="main \($at:[0-9]+\)"
    )
    for tool in calls latency lines exceptions ccalls gc imports gil threads \
            tasks alloc profile stacks; do
        # The tools print their top 20 entries: the workload's are there.
        local args=()
        case $tool in
            imports) args=(-f usdt_check) ;;
            profile) args=(-o "$work/profile.folded") ;;
            stacks) args=(--probe usdt:PYTHON:python:gc__start) ;;
        esac
        run_tool "$tool" "${args[@]}" -c "$py $script 1" || return 0
        [ "$tool" != profile ] || cat "$work/profile.folded" >> "$out"
        grep -q -E "${expect[$tool]}" "$out" ||
            die "usdt.tools $tool did not find what $script did (/${expect[$tool]}/): $(head -n 5 "$out")"
        log "usdt.tools $tool: $(grep -m 1 -E "${expect[$tool]}" "$out")"
    done
    run_tool flamegraph "$work/profile.folded" -o "$work/profile.svg" || return 0
    grep -q 'spin (' "$work/profile.svg" ||
        die "usdt.tools flamegraph: no spin() in $work/profile.svg"
    log "usdt.tools flamegraph: $(wc -c < "$work/profile.svg") bytes of SVG"

    # With -p: the workload running, its probe defined.
    (cd "$work" && exec "$py" "$script" 60 ready) > "$work/running.out" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
        grep -q ready "$work/running.out" && break
        sleep 0.2
    done
    if ! grep -q ready "$work/running.out"; then
        kill "$pid" 2> /dev/null || true
        die "the workload did not start: $(cat "$work/running.out")"
    fi
    run_tool list "$pid" || { kill "$pid"; return 0; }
    grep -q -E "^$pid +check:tick " "$out" ||
        { kill "$pid"; die "usdt.tools list $pid did not list check:tick: $(cat "$out")"; }
    log "usdt.tools list: $(grep -E "^$pid +check:tick " "$out")"
    run_tool ccalls -p "$pid" -d 3 || { kill "$pid"; return 0; }
    kill "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
    grep -q -E "${expect[ccalls]}" "$out" ||
        die "usdt.tools ccalls -p did not see len(): $(head -n 5 "$out")"
    log "usdt.tools ccalls -p: $(grep -m 1 -E "${expect[ccalls]}" "$out")"
}
