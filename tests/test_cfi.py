"""usdt._cfi, the call-frame information reader for stacks through code
without frame pointers (glibc's), against readelf's own reading of the
same .eh_frame (--debug-dump=frames-interp): at each system-call site of
the libc that this interpreter runs on, the CFA, where rbp was saved and
where the return address is."""

import bisect
import re
import subprocess
import unittest

from support import usdt_module

_cfi = usdt_module("_cfi")
ElfFile = usdt_module("_elf").ElfFile

REGISTERS = {6: "rbp", 7: "rsp"}


def libc():
    """The path of the libc this process has mapped."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(None, 5)[-1].strip()
            if re.search(r"/libc\.so\.6$|/libc-[\d.]+\.so$", path):
                return path
    raise unittest.SkipTest("no libc mapped in this process")


def readelf_rows(path):
    """[(start, end, [(location, {column: rule})])] of each FDE, from
    readelf --debug-dump=frames-interp (an FDE without instructions has
    no table: the CIE's row, CFA rsp+8, return address at cfa-8)."""
    # readelf (binutils 2.40) exits 1 on bookworm's libc, silently, having
    # printed every table.
    proc = subprocess.run(["readelf", "--debug-dump=frames-interp", path],
                          capture_output=True, text=True)
    out = proc.stdout
    if "FDE" not in out:
        raise AssertionError("readelf printed no FDE: %s" % proc.stderr)
    tables, table, columns = [], None, None
    for line in out.splitlines():
        fde = re.match(r"^[0-9a-f]+ [0-9a-f]+ [0-9a-f]+ FDE cie=[0-9a-f]+ "
                       r"pc=([0-9a-f]+)\.\.([0-9a-f]+)", line)
        if fde:
            table = (int(fde.group(1), 16), int(fde.group(2), 16), [])
            tables.append(table)
            columns = None
        elif table is not None and line.split()[:1] == ["LOC"]:
            columns = line.split()[1:]
        elif table is not None and columns:
            row = re.match(r"^([0-9a-f]{16}) +(.*)$", line)
            if row:
                table[2].append((int(row.group(1), 16),
                                 dict(zip(columns, row.group(2).split()))))
    tables.sort()
    return tables


class CfiTest(unittest.TestCase):

    def test_syscall_sites_as_readelf_reads_them(self):
        path = libc()
        elf = ElfFile(path)
        frames = _cfi.EhFrame(elf)
        tables = readelf_rows(path)
        starts = [table[0] for table in tables]
        compared = 0
        for site in _cfi.syscall_sites(elf):
            i = bisect.bisect_right(starts, site) - 1
            if i < 0 or not tables[i][0] <= site < tables[i][1]:
                self.assertIsNone(frames.row(site), hex(site))
                continue
            rows = [rule for location, rule in tables[i][2]
                    if location <= site]
            theirs = rows[-1] if rows else {"CFA": "rsp+8", "ra": "c-8"}
            if any(re.match(r"^(r\d+|\(.*\)|exp)$", rule)
                   for rule in theirs.values()):
                continue  # a register in another: readelf's columns skew
            row = frames.row(site)
            self.assertIsNotNone(row, hex(site))
            self.assertIsNotNone(row.cfa, hex(site))
            cfa = "%s%+d" % (REGISTERS.get(row.cfa[0], "r%d" % row.cfa[0]),
                             row.cfa[1])
            rbp = row.saved(_cfi.RBP)
            ours = {"CFA": cfa, "ra": "c%+d" % row.saved(_cfi.RA),
                    "rbp": "u" if rbp is _cfi.SAME else "c%+d" % rbp}
            theirs = dict(theirs)
            theirs.setdefault("rbp", "u")
            if theirs["rbp"] == "s":
                theirs["rbp"] = "u"
            self.assertEqual(ours, {key: theirs.get(key)
                                    for key in ("CFA", "ra", "rbp")},
                             hex(site))
            compared += 1
        self.assertGreater(compared, 100)

    def test_send_multithreaded_path(self):
        # Where the stacks were lost: a threaded server's send(),
        # which saves rbp and then uses it for the cancellation state.
        # The row at its system call is what gdb unwinds with.
        path = libc()
        elf = ElfFile(path)
        symbols = elf.symbols()
        if "__send" not in symbols:
            self.skipTest("this libc has no __send")
        start, size, _ = symbols["__send"]
        frames = _cfi.EhFrame(elf)
        sites = [site for site in _cfi.syscall_sites(elf)
                 if start <= site < start + size]
        saved = [frames.row(site).saved(_cfi.RBP) for site in sites]
        # One path saves rbp (at CFA - 16), one leaves it alone.
        self.assertIn(-16, saved, sites)
        self.assertIn(_cfi.SAME, saved, sites)


if __name__ == "__main__":
    unittest.main()
