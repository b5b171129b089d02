"""python -m usdt.stacks; under any other Python 3, python3 PATH, where
PATH is this directory (LIBDIR/usdt/stacks, or the source tree's
Lib/usdt/stacks)."""

import os
import signal
import sys

if __package__:
    from .cli import interrupt, main
else:
    # Run by its path, under a Python whose usdt (if any) is not this
    # one: the package usdt is loaded from the directory above, which is
    # not put on sys.path (it is another Python's standard library), and
    # this directory is taken off it (its modules would hide the standard
    # library's of the same name).
    import runpy
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0]) == here:
        del sys.path[0]
    package = os.path.dirname(here)
    runpy.run_path(os.path.join(package, "_frompath.py"))["load"](package)
    from usdt.stacks.cli import interrupt, main

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, interrupt)
    # SIGINT stops tracing and prints (Ctrl-C, kill -INT): also in a
    # process started with SIGINT ignored, as a shell script starts its
    # background jobs, where Python would leave it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
