"""Probe string arguments are valid C strings for any name.

Non-ASCII names arrive as UTF-8, unencodable characters (lone surrogates)
as '?', very long ASCII names whole, and very long non-ASCII names cut at a
character boundary to fit the 256-byte buffer.  gdb reads the strings
(bpftrace would cut them at BPFTRACE_STRLEN); it also arms the probes'
semaphores like any tracer.
"""

import os
import shutil
import unittest

from support import PYTHON, run_gdb

NAMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                     "probe_names.py")
GDB_SCRIPT = """\
set pagination off
set print thread-events off
set host-charset UTF-8
set target-charset UTF-8
break -probe-stap python:function__entry
commands 1
silent
printf "ENTRY\\t%s\\t%s\\t%d\\n", $_probe_arg0, $_probe_arg1, $_probe_arg2
continue
end
break -probe-stap python:instance__new__start
commands 2
silent
printf "NEW\\t%s\\t%s\\n", $_probe_arg0, $_probe_arg1
continue
end
run
"""


class ProbeArgumentsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        if shutil.which("gdb") is None:
            raise unittest.SkipTest("gdb not found (apt-get install gdb)")
        proc = run_gdb(GDB_SCRIPT, PYTHON, NAMES)
        out = proc.stdout.decode("utf-8")
        cls.entries = [line.split("\t")[1:] for line in out.splitlines()
                       if line.startswith("ENTRY\t")]
        cls.news = [line.split("\t")[1:] for line in out.splitlines()
                    if line.startswith("NEW\t")]
        cls.errors = proc.stderr.decode(errors="replace")

    def entry(self, funcname):
        self.assertTrue(self.entries, "gdb saw no probe: " + self.errors)
        found = [e for e in self.entries if e[1] == funcname]
        self.assertEqual(len(found), 1,
                         "%r in %r" % (funcname, self.entries[-12:]))
        return found[0]

    def test_non_ascii(self):
        filename, _, lineno = self.entry("données")
        self.assertEqual(filename, NAMES)
        with open(NAMES, encoding="utf-8") as f:
            def_line = f.read().splitlines().index("def données():") + 1
        self.assertEqual(lineno, str(def_line))

    def test_lone_surrogate_in_name(self):
        self.entry("bad?name")

    def test_lone_surrogate_in_filename(self):
        self.assertEqual(self.entry("g")[0], "surrogate?.py")

    def test_long_ascii_name_is_whole(self):
        self.assertEqual(self.entry("f" * 1000)[0], "long_ascii.py")

    def test_long_non_ascii_name_is_cut_at_a_character(self):
        # 200 two-byte characters do not fit in 255 bytes: 127 do.
        self.assertEqual(self.entry("é" * 127)[0], "long_utf8.py")

    def test_instance_names(self):
        self.assertTrue(self.news, "gdb saw no probe: " + self.errors)
        self.assertIn(["Ünïcode", "mödule?x"], self.news)


if __name__ == "__main__":
    unittest.main()
