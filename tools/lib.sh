# Shared helpers for the build driver scripts.  Sourced, not executed.
# shellcheck shell=bash

set -euo pipefail

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# SERIES as make exports it, or, for a script run alone, the default that
# series/DEFAULT names, the file the Makefile reads too.
SERIES=${SERIES:-$(cat "$TOP/series/DEFAULT")}
# BUILD holds what is shared between series: the downloads (dl/), the
# private apt state (apt/) and the pristine trees, one per tarball
# (pristine/SHA256/).  Each series' own trees (src, stage, obj, release,
# ...) are under SBUILD, BUILD/SERIES.
BUILD=${BUILD:-$TOP/build}
SBUILD=$BUILD/$SERIES
# Everything that is specific to one CPython series (docs/layout.md).
SERIES_DIR=$TOP/series/$SERIES

die() {
    printf '%s: error: %s\n' "${0##*/}" "$*" >&2
    exit 1
}

log() {
    printf '%s: %s\n' "${0##*/}" "$*" >&2
}

# check_series: stop with one line when series/$SERIES does not exist.
check_series() {
    [ -f "$SERIES_DIR/pin" ] || die "no series '$SERIES': series/$SERIES/pin \
does not exist (the series are: $(cd "$TOP/series" && ls -d -- */ 2>/dev/null |
        tr -d / | tr '\n' ' '| sed 's/ $//'))"
}

# load_pin: read series/$SERIES/pin into PIN_* shell variables, and set
# PRISTINE, the pristine tree of its tarball.
load_pin() {
    check_series
    local pin=$SERIES_DIR/pin key value
    while IFS='=' read -r key value; do
        case $key in
            ''|'#'*) continue ;;
            *[!A-Z0-9_]*) die "$pin: bad key '$key'" ;;
        esac
        printf -v "PIN_$key" '%s' "$value"
    done < "$pin"
    : "${PIN_VERSION:?}" "${PIN_RELEASE:?}" "${PIN_TARBALL:?}" "${PIN_SHA256:?}"
    : "${PIN_REGEN_PYTHON:?}"
    PRISTINE=$BUILD/pristine/$PIN_SHA256
}

# loop_flag NAME: the value of NAME in series/$SERIES/loop-flags (empty
# where it has none); stops when the series has no such file.
loop_flag() {
    local file=$SERIES_DIR/loop-flags
    [ -f "$file" ] || die "$file does not exist: every series names its loop \
flags there (docs/layout.md)"
    sed -n "s/^$1=//p" "$file"
}

# verify_sha256 FILE EXPECTED: stop with a clear message on a mismatch.
verify_sha256() {
    local file=$1 expected=$2 found
    [ -f "$file" ] || die "$file: no such file"
    found=$(sha256sum "$file" | cut -d' ' -f1)
    if [ "$found" != "$expected" ]; then
        die "sha256 mismatch for $file
  expected: $expected
  found:    $found
Refusing to unpack it.  Remove it or pass the genuine tarball."
    fi
}

# The Debian package of tools/deb, checked by tools/check-deb: its name,
# where it installs, and deb_file DIR ARCH: its file in DIR, and
# deb_testsuite_file DIR ARCH: its test suite's (load_pin
# first).
# shellcheck disable=SC2034  # used by tools/deb and tools/check-deb
PACKAGE=cpython-usdt
# shellcheck disable=SC2034
PACKAGE_PREFIX=/opt/cpython-usdt
deb_file() {
    printf '%s/%s_%s_%s.deb\n' "$1" "$PACKAGE" "$PIN_RELEASE" "$2"
}
deb_testsuite_file() {
    printf '%s/%s-testsuite_%s_%s.deb\n' "$1" "$PACKAGE" "$PIN_RELEASE" "$2"
}

# Deterministic git identity and dates for the scratch trees, so that the
# same inputs always give the same commits.
export GIT_AUTHOR_NAME=cpython-usdt GIT_AUTHOR_EMAIL=build@cpython-usdt.invalid
export GIT_COMMITTER_NAME=cpython-usdt GIT_COMMITTER_EMAIL=build@cpython-usdt.invalid
export GIT_AUTHOR_DATE='2000-01-01T00:00:00Z' GIT_COMMITTER_DATE='2000-01-01T00:00:00Z'
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null

# tracer_required: true where a tracer that cannot trace (bpftrace missing,
# not root, cannot attach) is a failure rather than a skip: CI is set
# (non-empty), or REQUIRE_TRACER is set to anything but 0 (make check
# REQUIRE_TRACER=1).  The same rule as tests/support.py's.
tracer_required() {
    [ -n "${CI:-}" ] ||
        { [ -n "${REQUIRE_TRACER:-}" ] && [ "$REQUIRE_TRACER" != 0 ]; }
}

# tier_name N: the name of make check's tier N in tools/tiers, the table
# of tiers.
tier_name() {
    local name
    name=$(awk -F '\t' -v n="$1" '$1 == n { print $2 }' "$TOP/tools/tiers")
    [ -n "$name" ] || die "tools/tiers has no tier $1"
    printf '%s\n' "$name"
}

# skip_tracer MESSAGE: a check that cannot run because it cannot trace (or
# lacks root) says "SKIPPED MESSAGE"; where tracer_required, it fails with
# MESSAGE instead.
skip_tracer() {
    if tracer_required; then
        die "$* (CI or REQUIRE_TRACER is set: this must not be skipped)"
    fi
    log "SKIPPED $*"
}

# mount_tracefs: tracefs on /sys/kernel/tracing, where bpftrace looks for
# uprobe_events and tracepoints, and which a fresh machine (and most
# containers) has unmounted: mounted, as root, if it is not; fails if it
# is not mounted when done.
mount_tracefs() {
    local tracefs=/sys/kernel/tracing
    [ ! -e "$tracefs/events" ] || return 0
    [ "$(id -u)" = 0 ] || return 1
    log "mounting tracefs on $tracefs (bpftrace needs it)"
    mount -t tracefs nodev "$tracefs"
}

# mirror_for_label LABEL: the machine's Debian mirror for the archives
# labelled LABEL ("Debian", "Debian-Security"), as apt itself resolved
# them (no host name is written down anywhere in this repository).
mirror_for_label() {
    apt-get indextargets --format '$(LABEL) $(REPO_URI)' 2>/dev/null |
        awk -v label="$1" '$1 == label { print $2; exit }'
}

# require COMMAND PACKAGE: fail early, naming the Debian package to install.
require() {
    command -v "$1" >/dev/null 2>&1 ||
        die "$1 not found; install it with: apt-get install $2"
}

# apply_series PATCHDIR: `git am` each patch named in PATCHDIR/series onto
# the current directory's repository, in order.  git am applies without
# fuzz; stop at the first patch that fails, naming it.
apply_series() {
    local dir=$1 patch rest
    [ -f "$dir/series" ] || die "no series file in $dir"
    while read -r patch rest; do
        case $patch in ''|'#'*) continue ;; esac
        [ -z "$rest" ] || die "$dir/series: unexpected text after $patch"
        [ -f "$dir/$patch" ] || die "$dir/series names missing $patch"
        if ! git am -q --whitespace=nowarn "$dir/$patch" >&2; then
            git am --abort >/dev/null 2>&1 || true
            die "patch $patch does not apply to upstream (git am refuses \
fuzz); rebase it with tools/patch-queue"
        fi
        log "applied $patch"
    done < "$dir/series"
}

# installed_packages ROOT [PATTERN...]: "PACKAGE VERSION" of each package
# installed in ROOT ("" for this machine), of those matching the
# dpkg-query PATTERNs (default: all), without their architecture.
installed_packages() {
    local admin=${1:-}/var/lib/dpkg
    shift
    dpkg-query --admindir="$admin" -W \
        -f '${db:Status-Status} ${Package} ${Version}\n' "$@" 2>/dev/null |
        sed -n 's/^installed //p' | sed 's/:[a-z0-9]* / /'
}

# toolchain_versions [ROOT]: the versions of bpftrace and of the libraries
# that decide which programs the kernel accepts, libbpf and LLVM (those
# installed: forky's bpftrace 0.27 carries its own libbpf, and depends on
# none), in ROOT (default: this machine), on one line:
# "bpftrace 0.27.0-1, libbpf1 1:1.7.0-1, libllvm21 1:21.1.8-13, ...".
toolchain_versions() {
    installed_packages "${1:-}" bpftrace 'libbpf[0-9]*' 'libllvm[0-9]*' \
        'libclang-cpp[0-9]*' | paste -s -d ',' | sed 's/,/, /g'
}
