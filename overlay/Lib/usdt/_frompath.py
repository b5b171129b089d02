"""Import the package usdt from a directory, under any Python 3.

usdt.stacks runs by its path under a Python whose usdt, if it has one, is not
this one (python3 LIBDIR/usdt/stacks), and the tests import the source
tree's copy: neither may put the directory above usdt on sys.path, for it
is another Python's standard library.  Both reach this file by its path
(runpy.run_path), before any of the package is imported, and call
load().
"""

import importlib.util
import os
import sys


def load(package):
    """Import the directory *package* as the package usdt, replacing any
    usdt already imported (and its submodules), and return it."""
    for name in list(sys.modules):
        if name == "usdt" or name.startswith("usdt."):
            del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "usdt", os.path.join(package, "__init__.py"),
        submodule_search_locations=[package])
    module = importlib.util.module_from_spec(spec)
    sys.modules["usdt"] = module
    spec.loader.exec_module(module)
    return module
