"""Functions and classes with awkward names, for tests/test_probe_args.py.

Each name is one a probe must pass as a valid C string: non-ASCII,
unencodable (a lone surrogate), or very long.
"""


def données():
    pass


def renamed():
    pass


renamed.__code__ = renamed.__code__.replace(co_name="bad\udc80name")

LONG_ASCII = "f" * 1000
LONG_UTF8 = "é" * 200
namespace = {}
exec(compile("def %s(): pass\n%s()\n" % (LONG_ASCII, LONG_ASCII),
             "long_ascii.py", "exec"), namespace)
exec(compile("def %s(): pass\n%s()\n" % (LONG_UTF8, LONG_UTF8),
             "long_utf8.py", "exec"), namespace)
exec(compile("def g(): pass\ng()\n", "surrogate\udcff.py", "exec"),
     namespace)


class Ünïcode:
    __module__ = "mödule\udc80x"


données()
renamed()
Ünïcode()
