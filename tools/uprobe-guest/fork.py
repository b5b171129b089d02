"""The guest's Python workload for tools/uprobe-guest-7.3: calls hit() N
times, forks a child that calls it N times too, and prints, in both, the
bytes of the interpreter's marker site at file address SITE (the note's
address of python:function__entry) and whether [uprobes-trampoline] is
mapped.  Exits 1 if the child died of a signal.

usage: python -I -S fork.py SITE N
"""

import os
import sys


def hit():
    pass


def base():
    """The load address of the interpreter's file (0 unless it is PIE)."""
    with open(sys.executable, "rb") as f:
        if int.from_bytes(f.read(18)[16:18], "little") != 3:    # ET_DYN
            return 0
    executable = os.path.realpath(sys.executable)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if fields[-1] == executable and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
    raise SystemExit("no mapping of %s at offset 0" % executable)


def show(who, site):
    with open("/proc/self/maps") as f:
        mapped = "[uprobes-trampoline]" in f.read()
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        mem.seek(base() + site)
        code = mem.read(11)
    print("%s: site %s, [uprobes-trampoline] %s"
          % (who, code.hex(" "), "mapped" if mapped else "absent"),
          flush=True)


def main():
    site, n = int(sys.argv[1], 0), int(sys.argv[2])
    for _ in range(n):
        hit()
    show("parent", site)
    pid = os.fork()
    if pid == 0:
        show("child ", site)
        for _ in range(n):
            hit()
        show("child ", site)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        print("child killed by signal %d" % os.WTERMSIG(status))
        return 1
    print("child exited %d" % os.WEXITSTATUS(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
