"""Deprecated: the stack tool is usdt.stacks (python -m usdt.stacks).

It was called pystack, which is also the name of Bloomberg's well-known
Python stack tool.  This alias says so and goes in the next release."""

import warnings

from usdt.stacks import *  # noqa: F401,F403
from usdt.stacks import __all__  # noqa: F401

warnings.warn("usdt.pystack is deprecated and goes in the next release: "
              "use usdt.stacks", DeprecationWarning, stacklevel=2)
