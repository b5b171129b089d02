# Arm every USDT probe of an interpreter, path-wide, with one bpftrace for
# the length of a run: the "armed" half of `tools/regrtest OBJDIR armed`.
# Sourced after lib.sh, not executed.
# shellcheck shell=bash
#
# The bpftrace program has one clause per probe of the registry, each
# counting its hits, attached by path (usdt:/abs/path/python:PROVIDER:NAME,
# no -p and no -c): every process that runs that file, present or future,
# is armed, including regrtest's workers and the interpreters the tests
# start.  bpftrace runs in a session of its own (setsid), so that tests
# which signal their process group (SIGINT, SIGTERM) cannot stop it.
#
#   arm_start PYTHON DIR [PROBE...]
#                          start bpftrace and wait until a probe fired in a
#                          process started after it; its files go in DIR.
#                          Every probe is armed but the PROBEs named
#                          (PROVIDER:NAME, or NAME for python's).
#                          Returns 77 with ARM_SKIP set to bpftrace's own
#                          message when bpftrace cannot attach here (not
#                          root, no BPF, a stale uprobe of another tool);
#                          dies on anything else.
#   arm_stop               dies unless bpftrace is still running and every
#                          probe fired (with probes left out, it logs those
#                          that did not fire instead: a group of a few
#                          modules need not fire them all; the group with
#                          every probe armed must); stops it and logs the
#                          hit counts.
#                          The marker stacks__enable never fires, and does
#                          nothing in a process started without
#                          -X dtrace_stacks (the regrtest's): the proof that
#                          it was armed is a process started with
#                          PYTHONDTRACESTACKS=1 just before the disarm,
#                          which must find its trampoline on (its perf map
#                          is then removed).  Perf maps that processes of
#                          the interpreter left (-X perf tests) are counted
#                          and removed.

ARM_PID=
ARM_DIR=
ARM_SKIP=
ARM_LEFT_OUT=
ARM_MARK=cpython_usdt.armed

# bpftrace's stderr without its harmless RLIMIT_MEMLOCK notice.
arm_errors() {
    grep -v 'RLIMIT_MEMLOCK' "$1" 2>/dev/null | sed '/^[[:space:]]*$/d' || true
}

arm_alive() {
    local state
    [ -n "$ARM_PID" ] && [ -r "/proc/$ARM_PID/stat" ] || return 1
    state=$(awk '{ print $3 }' "/proc/$ARM_PID/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Kill bpftrace if we leave early (a failure, ^C): it is in its own session
# and would otherwise stay attached to the interpreter for good.
arm_cleanup() {
    if arm_alive; then
        kill -INT "$ARM_PID" 2>/dev/null || true
        for _ in $(seq 100); do arm_alive || break; sleep 0.1; done
        if arm_alive; then kill -KILL "$ARM_PID" 2>/dev/null || true; fi
    fi
    ARM_PID=
}

# PROVIDER:NAME of each probe of the registry (series/SERIES/probes.tsv:
# provider, name, kind, ...) armed, but those of ARM_LEFT_OUT.
arm_probes() {
    awk -F '\t' -v out=" $ARM_LEFT_OUT " '!/^#/ && NF {
        p = $1 ":" $2
        if (index(out, " " p " ") == 0) print p }' "$SERIES_DIR/probes.tsv"
}

# The probes armed that fire: not the markers, which are armed for their
# semaphores only.
arm_firing_probes() {
    awk -F '\t' -v out=" $ARM_LEFT_OUT " '!/^#/ && NF && $3 != "marker" {
        p = $1 ":" $2
        if (index(out, " " p " ") == 0) print p }' "$SERIES_DIR/probes.tsv"
}

# The perf maps that processes of $ARM_PYTHON wrote since arm_start and
# left behind (the interpreter never removes them): counted, then removed.
# Maps of processes still alive are left alone.
arm_perf_maps() {
    local lib map pid maps=0
    lib=$("$ARM_PYTHON" -c 'import os; print(os.path.dirname(os.__file__))')
    for map in $(find /tmp -maxdepth 1 -name 'perf-*.map' -newer "$ARM_DIR/since"); do
        pid=${map#/tmp/perf-}; pid=${pid%.map}
        [ ! -e "/proc/$pid" ] || continue
        grep -qF ":$lib/" "$map" || continue
        maps=$((maps + 1))
        rm -f "$map"
    done
    log "armed: $maps processes left a perf map (removed)"
}

# The marker stacks__enable is armed: a process that allows it
# (PYTHONDTRACESTACKS=1) has its trampoline on within the watcher's poll.
arm_check_marker() {
    local out
    out=$(env PYTHONDTRACESTACKS=1 "$ARM_PYTHON" -c '
import os, sys, sysconfig, time
def work():
    pass
deadline = time.monotonic() + 3
while time.monotonic() < deadline:
    work()
path = "/tmp/perf-%d.map" % os.getpid()
listed = os.path.exists(path) and "py::" in open(path).read()
if os.path.exists(path):
    os.unlink(path)
print("free-threaded" if sysconfig.get_config_var("Py_GIL_DISABLED")
      else "on" if listed else "off")') ||
        die "the stacks__enable check failed to run: $out"
    log "armed: stacks__enable: a process started with PYTHONDTRACESTACKS=1 has its trampoline $out"
    case $out in
        on|free-threaded) ;;   # the marker does nothing in the free-threaded build
        *) die "stacks__enable armed, but a process that allows it did not turn its trampoline on" ;;
    esac
}

arm_start() {
    local python=$1 dir=$2 probe errors known
    shift 2
    ARM_DIR=$dir ARM_SKIP= ARM_PYTHON=$python ARM_LEFT_OUT=
    known=$(arm_probes)   # ARM_LEFT_OUT is empty here: every probe
    for probe in "$@"; do
        case $probe in *:*) ;; *) probe=python:$probe ;; esac
        grep -qxF "$probe" <<<"$known" ||
            die "arm_start: $probe is not a probe of the registry (series/$SERIES/probes.tsv)"
        ARM_LEFT_OUT+=" $probe"
    done
    mkdir -p "$dir"
    touch "$dir/since"
    rm -f "$dir/bpftrace.out" "$dir/bpftrace.err"
    case $python in
        /*) ;;
        *) die "arm_start: $python is not an absolute path" ;;
    esac
    case $python in
        *[!A-Za-z0-9_./+-]*) die "bpftrace cannot name $python in a probe (only [A-Za-z0-9_./+-] are safe in a usdt: path)" ;;
    esac
    if ! command -v bpftrace >/dev/null 2>&1; then
        ARM_SKIP="bpftrace not found (apt-get install bpftrace)"
        return 77
    fi

    # Can bpftrace attach a USDT probe of this interpreter at all?  The same
    # check as tests/support.py's, so both skip for the same reasons.
    local rc=0
    timeout 120 bpftrace -e "usdt:$python:python:audit { } END { printf(\"attached\\n\"); }" \
        -c "$python -c pass" > "$dir/check.out" 2> "$dir/check.err" || rc=$?
    if [ $rc -ne 0 ] || ! grep -q attached "$dir/check.out"; then
        errors=$(arm_errors "$dir/check.err")
        ARM_SKIP="bpftrace cannot attach to $python: ${errors:-exit status $rc}"
        return 77
    fi

    {
        printf 'BEGIN { printf("cpython-usdt: BEGIN\\n"); }\n'
        while read -r probe; do
            printf 'usdt:%s:%s { @hits["%s"] = count(); }\n' \
                "$python" "$probe" "$probe"
        done < <(arm_probes)
        # Readiness: this line appears once a process started after bpftrace
        # runs sys.audit(ARM_MARK) with the probes attached.
        # (strncmp: `==` on str(arg0) draws an "Addrspace mismatch"
        # warning from bpftrace 0.17.)
        printf 'usdt:%s:python:audit /strncmp(str(arg0), "%s", %d) == 0/ { printf("cpython-usdt: armed\\n"); }\n' \
            "$python" "$ARM_MARK" "${#ARM_MARK}"
    } > "$dir/armed.bt"

    trap arm_cleanup EXIT
    trap 'exit 130' INT TERM
    # -B line: the markers reach the file at once.  Not a child of our
    # process group: setsid, and stdin from /dev/null.
    setsid bpftrace -B line "$dir/armed.bt" \
        > "$dir/bpftrace.out" 2> "$dir/bpftrace.err" < /dev/null &
    ARM_PID=$!
    log "armed: bpftrace pid $ARM_PID, $(arm_probes | wc -l) probes of $python${ARM_LEFT_OUT:+ (all but$ARM_LEFT_OUT)} (program: $dir/armed.bt)"

    for _ in $(seq 1200); do
        grep -q '^cpython-usdt: BEGIN' "$dir/bpftrace.out" && break
        arm_alive || break
        sleep 0.1
    done
    if ! grep -q '^cpython-usdt: BEGIN' "$dir/bpftrace.out"; then
        errors=$(arm_errors "$dir/bpftrace.err")
        arm_cleanup
        if grep -q 'Error attaching probe' <<<"$errors"; then
            ARM_SKIP="bpftrace cannot attach every probe of $python: $errors"
            # The kernel's reason, for this file's inode.
            local mismatch
            mismatch=$(dmesg 2>/dev/null | grep "ref_ctr_offset mismatch. inode: 0x$(stat -L -c %i "$python" | xargs printf %x) " | tail -n 1) || true
            if [ -n "$mismatch" ]; then
                ARM_SKIP+="
dmesg: $mismatch
(a uprobe left by another tool on this file has another semaphore offset)"
            fi
            return 77
        fi
        die "bpftrace did not start (program $dir/armed.bt): ${errors:-no message}"
    fi

    # BEGIN is no proof that the uprobes are in place: wait until a new
    # process's sys.audit() reaches bpftrace.
    for _ in $(seq 60); do
        env -i "$python" -I -c "import sys; sys.audit('$ARM_MARK')" || true
        sleep 0.5
        grep -q '^cpython-usdt: armed' "$dir/bpftrace.out" && break
        arm_alive || break
    done
    if ! grep -q '^cpython-usdt: armed' "$dir/bpftrace.out"; then
        errors=$(arm_errors "$dir/bpftrace.err")
        arm_cleanup
        die "bpftrace started but the audit probe of a new $python process never reached it (30 s); bpftrace said: ${errors:-nothing}"
    fi
    log "armed: probes fire in new processes"
}

arm_stop() {
    local dir=$ARM_DIR pid=$ARM_PID probe count missing=() counts=()
    if ! arm_alive; then
        die "bpftrace (pid $pid) is gone: the run was not armed to its end.
bpftrace's stderr ($dir/bpftrace.err):
$(arm_errors "$dir/bpftrace.err")"
    fi
    case " $ARM_LEFT_OUT " in
        *" python:stacks__enable "*) ;;
        *) arm_check_marker ;;
    esac
    # bpftrace 0.17 can miss a SIGINT (it then runs on, armed): another
    # follows each second, as tests/support.py's interrupt() sends them.
    # One that comes while it prints does no harm.
    for i in $(seq 600); do
        arm_alive || break
        [ $((i % 10)) -ne 1 ] || kill -INT "$pid" 2>/dev/null || true
        sleep 0.1
    done
    if arm_alive; then
        arm_cleanup
        die "bpftrace (pid $pid) did not exit within 60 s of SIGINT"
    fi
    wait "$pid" 2>/dev/null || true
    ARM_PID=
    trap - EXIT INT TERM
    while read -r probe; do
        count=$(sed -n "s/^@hits\\[$probe\\]: *\\([0-9]*\\)\$/\\1/p" "$dir/bpftrace.out")
        counts+=("$probe=${count:-0}")
        [ "${count:-0}" -gt 0 ] || missing+=("$probe")
    done < <(arm_firing_probes)
    log "armed: hits ${counts[*]}"
    arm_perf_maps
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ -n "$ARM_LEFT_OUT" ]; then
        log "armed: not fired by this group's modules: ${missing[*]} (the group with every probe armed must fire them)"
        return 0
    fi
    die "probes armed but never fired during the run: ${missing[*]} (bpftrace output: $dir/bpftrace.out)"
}
