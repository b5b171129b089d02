"""python -m usdt.pystack, deprecated: says so on stderr, then runs
python -m usdt.stacks with the same options (also by path, python3
LIBDIR/usdt/pystack, under another Python 3)."""

import os
import runpy
import sys

sys.stderr.write("usdt.pystack is deprecated and goes in the next release: "
                 "use python -m usdt.stacks\n")
if __package__:
    runpy.run_module("usdt.stacks", run_name="__main__", alter_sys=True)
else:
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0]) == here:
        del sys.path[0]
    runpy.run_path(os.path.join(os.path.dirname(here), "stacks"),
                   run_name="__main__")
