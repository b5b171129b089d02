"""usdt._elf, the one ELF reader of the toolkit: on files that this test
writes (whose every field it knows), on the interpreter against readelf,
and on damaged files, which must raise ElfError (a ValueError naming the
file and what is wrong), never struct.error."""

import os
import re
import struct
import subprocess
import tempfile
import unittest

from support import PYTHON, usdt_module

_elf = usdt_module("_elf")

SHT_PROGBITS, SHT_STRTAB, SHT_DYNAMIC = 1, 3, 6
PF_R = 4


def note(owner, ntype, desc):
    """An Elf64_Nhdr with its owner and description, each padded to 4."""
    def pad(data):
        return data + b"\0" * (-len(data) % 4)
    return (struct.pack("<III", len(owner), len(desc), ntype) + pad(owner)
            + pad(desc))


def strtab(*names):
    """A string table and {name: offset} of its names."""
    table, offsets = b"\0", {}
    for name in names:
        offsets[name] = len(table)
        table += name.encode() + b"\0"
    return table, offsets


def symbol(name, info, value, size):
    return struct.pack("<IBBHQQ", name, info, 0, 1, value, size)


class Writer:
    """An ELF64 little-endian file: the header, the sections' bytes, the
    program headers, then the section headers (.shstrtab last)."""

    def __init__(self):
        self.sections = []      # (name, type, addr, data, link, flags)
        self.segments = []      # (type, flags, section name, memsz extra)

    def add(self, name, stype, data, addr=0, link=0):
        self.sections.append((name, stype, addr, data, link))
        return len(self.sections)   # its index: 0 is the null section

    def bytes(self, machine=62):
        names, name_at = strtab(*[s[0] for s in self.sections],
                                ".shstrtab")
        sections = self.sections + [(".shstrtab", SHT_STRTAB, 0, names, 0)]
        body = bytearray(64)
        offsets = {}
        for name, _, _, data, _ in sections:
            offsets[name] = len(body)
            body += data
            body += b"\0" * (-len(body) % 8)
        phoff = len(body)
        by_name = {s[0]: s for s in sections}
        for ptype, flags, name, extra in self.segments:
            _, _, addr, data, _ = by_name[name]
            body += struct.pack("<IIQQQQQQ", ptype, flags, offsets[name],
                                addr, addr, len(data), len(data) + extra, 8)
        shoff = len(body)
        body += bytes(64)
        for name, stype, addr, data, link in sections:
            body += struct.pack("<IIQQQQIIQQ", name_at[name], stype, 0, addr,
                                offsets[name], len(data), link, 0, 8,
                                24 if stype in (2, 11) else 0)
        struct.pack_into("<4sBBBB8xHHIQQQIHHHHHH", body, 0, b"\x7fELF", 2, 1,
                         1, 0, 3, machine, 1, 0, phoff, shoff, 0, 64, 56,
                         len(self.segments), 64, len(sections) + 1,
                         len(sections))
        return bytes(body)


def sample():
    """A file with a text segment, stapsdt notes, a build ID, .dynsym
    and .symtab, and a dynamic section; and the facts it was made of."""
    w = Writer()
    text = b"\x90" * 16 + b"\x0f\x05" + b"\xc3"
    w.add(".text", SHT_PROGBITS, text, addr=0x1000)
    w.segments.append((_elf.PT_LOAD, PF_R | _elf.PF_X, ".text", 0))
    probes = [("myapp", "start", "-8@%rdi 8@%rsi", 0x1004, 0x2100, 0x3000),
              ("myapp", "stop", "", 0x1008, 0x2100, 0),
              ("caf\xe9", "x", "", 0x100c, 0x2100, 0)]
    notes = b""
    for provider, name, arguments, address, base, semaphore in probes:
        notes += note(b"stapsdt\0", 3, struct.pack(
            "<QQQ", address, base, semaphore) + provider.encode("latin-1")
            + b"\0" + name.encode() + b"\0" + arguments.encode() + b"\0")
    # Not probes: another owner, another type.
    notes += note(b"other\0", 3, bytes(40)) + note(b"stapsdt\0", 9, bytes(40))
    w.add(".note.stapsdt", _elf.SHT_NOTE, notes)
    build_id = bytes(range(1, 21))
    w.add(".note.gnu.build-id", _elf.SHT_NOTE, note(b"GNU\0", 3, build_id),
          addr=0x400)
    dynstr, dyn_at = strtab("libfoo.so.1", "libbar.so", "func", "dynonly")
    dynstr_index = w.add(".dynstr", SHT_STRTAB, dynstr)
    dynamic = struct.pack("<qQqQqQqQqQ", _elf.DT_NEEDED, dyn_at["libfoo.so.1"],
                          _elf.DT_DEBUG, 0, _elf.DT_NEEDED,
                          dyn_at["libbar.so"], _elf.DT_NULL, 0,
                          _elf.DT_NEEDED, dyn_at["func"])
    w.add(".dynamic", SHT_DYNAMIC, dynamic, addr=0x2000, link=dynstr_index)
    w.segments.append((_elf.PT_DYNAMIC, PF_R, ".dynamic", 0))
    w.add(".dynsym", _elf.SHT_DYNSYM,
          bytes(24) + symbol(dyn_at["func"], 0x12, 0x1000, 19)
          + symbol(dyn_at["dynonly"], 0x11, 0x2200, 8), link=dynstr_index)
    names, at = strtab("func", "local")
    strtab_index = w.add(".strtab", SHT_STRTAB, names)
    w.add(".symtab", _elf.SHT_SYMTAB,
          bytes(24) + symbol(at["func"], 0x12, 0x9999, 1)
          + symbol(at["local"], 0x02, 0x1010, 3), link=strtab_index)
    facts = dict(text=text, probes=probes, build_id=build_id,
                 needed=["libfoo.so.1", "libbar.so"])
    return w, facts


class ElfTestCase(unittest.TestCase):

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def write(self, data, name="file"):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path


class ReaderTest(ElfTestCase):

    def setUp(self):
        super().setUp()
        self.writer, self.facts = sample()
        self.path = self.write(self.writer.bytes())

    def check(self, elf):
        self.assertEqual(elf.type, _elf.ET_DYN)
        self.assertEqual(elf.machine, _elf.EM_X86_64)
        load, dynamic = elf.segments
        self.assertEqual((load.type, load.vaddr, load.filesz),
                         (_elf.PT_LOAD, 0x1000, len(self.facts["text"])))
        self.assertEqual(elf.segment_data(load), self.facts["text"])
        self.assertEqual(elf.read_vaddr(0x1010, 2), b"\x0f\x05")
        self.assertEqual([s.name for s in elf.sections],
                         ["", ".text", ".note.stapsdt", ".note.gnu.build-id",
                          ".dynstr", ".dynamic", ".dynsym", ".strtab",
                          ".symtab", ".shstrtab"])
        self.assertEqual(elf.section(".dynamic").addr, 0x2000)
        self.assertIsNone(elf.section(".eh_frame"))
        self.assertEqual(elf.section_data(".text"), self.facts["text"])
        self.assertEqual(elf.section_data(".eh_frame"), b"")
        self.assertEqual(
            [tuple(p) for p in elf.stapsdt_probes()],
            [(provider.encode("latin-1").decode("utf-8", "replace"), name,
              arguments, address, base, semaphore)
             for provider, name, arguments, address, base, semaphore
             in self.facts["probes"]])
        build_id = elf.build_id()
        self.assertEqual(build_id.owner, b"GNU")
        self.assertEqual(build_id.desc, self.facts["build_id"])
        # After the note's header (12 bytes) and "GNU\0".
        self.assertEqual(build_id.desc_vaddr, 0x400 + 16)
        self.assertEqual(elf.needed(), self.facts["needed"])
        self.assertEqual([(e.tag, e.value_vaddr) for e in elf.dynamic()],
                         [(_elf.DT_NEEDED, 0x2008), (_elf.DT_DEBUG, 0x2018),
                          (_elf.DT_NEEDED, 0x2028)])
        # .dynsym comes first: its func wins.
        self.assertEqual(elf.symbols(), {
            "func": (0x1000, 19, _elf.STT_FUNC),
            "dynonly": (0x2200, 8, 1),
            "local": (0x1010, 3, _elf.STT_FUNC)})

    def test_whole_file(self):
        self.check(_elf.ElfFile(self.path))

    def test_parts_from_an_open_file(self):
        with open(self.path, "rb") as f:
            self.check(_elf.ElfFile(self.path, f))

    def test_symbols_is_a_new_dict(self):
        elf = _elf.ElfFile(self.path)
        elf.symbols()["func"] = None
        self.assertIsNotNone(elf.symbols()["func"])

    def test_address_outside_the_file(self):
        elf = _elf.ElfFile(self.path)
        with self.assertRaisesRegex(_elf.ElfError, re.escape(
                "%s: address 0x5000 is not in the file" % self.path)):
            elf.read_vaddr(0x5000, 1)


class DamagedTest(ElfTestCase):
    """Every damage is an ElfError (a ValueError) naming the file."""

    def assertDamaged(self, data, message):
        path = self.write(data)
        for opener in (self.whole, self.parts):
            with self.subTest(opener=opener.__name__):
                with self.assertRaises(_elf.ElfError) as caught:
                    elf = opener(path)
                    elf.symbols()
                    elf.stapsdt_probes()
                    elf.needed()
                self.assertIsInstance(caught.exception, ValueError)
                self.assertIn(path, str(caught.exception))
                self.assertRegex(str(caught.exception), message)

    @staticmethod
    def whole(path):
        return _elf.ElfFile(path)

    def parts(self, path):
        f = open(path, "rb")
        self.addCleanup(f.close)
        return _elf.ElfFile(path, f)

    def test_empty(self):
        self.assertDamaged(b"", "is not an ELF file")

    def test_not_elf(self):
        self.assertDamaged(b"#!/bin/sh\necho hello\n" * 10,
                           "is not an ELF file")

    def test_32_bit(self):
        data = bytearray(sample()[0].bytes())
        data[4] = 1     # ELFCLASS32
        self.assertDamaged(bytes(data), "only 64-bit little-endian")

    def test_big_endian(self):
        data = bytearray(sample()[0].bytes())
        data[5] = 2     # ELFDATA2MSB
        self.assertDamaged(bytes(data), "only 64-bit little-endian")

    def test_truncated_header(self):
        self.assertDamaged(sample()[0].bytes()[:40],
                           "truncated: its ELF header")

    def test_truncated_tables(self):
        data = sample()[0].bytes()
        self.assertDamaged(data[:-10], "truncated: the section header table")
        phoff, = struct.unpack_from("<Q", data, 32)
        self.assertDamaged(data[:phoff + 20],
                           "truncated: the program header table")

    def test_section_past_the_end(self):
        data = bytearray(sample()[0].bytes())
        shoff, = struct.unpack_from("<Q", data, 40)
        # .symtab (index 8): its size.
        struct.pack_into("<Q", data, shoff + 8 * 64 + 32, 1 << 40)
        self.assertDamaged(bytes(data), "truncated: section .symtab")

    def test_small_entries(self):
        data = bytearray(sample()[0].bytes())
        struct.pack_into("<H", data, 58, 32)    # e_shentsize
        self.assertDamaged(bytes(data), "section header entries are 32 bytes")

    def test_note_past_its_section(self):
        w = Writer()
        w.add(".note.stapsdt", _elf.SHT_NOTE,
              struct.pack("<III", 8, 400, 3) + b"stapsdt\0" + bytes(8))
        self.assertDamaged(w.bytes(), "a note runs past the end of section "
                           r"\.note\.stapsdt")

    def test_name_without_nul(self):
        w = Writer()
        w.add(".strtab", SHT_STRTAB, b"\0abc")
        w.add(".symtab", _elf.SHT_SYMTAB, bytes(24) + symbol(1, 0x12, 1, 1),
              link=1)
        self.assertDamaged(w.bytes(), "symbol at 0x1 of its string table")


class InterpreterTest(unittest.TestCase):
    """The interpreter under test, as readelf reads it."""

    def readelf(self, *options):
        try:
            proc = subprocess.run(["readelf", "-W", *options, PYTHON],
                                  capture_output=True, text=True)
        except FileNotFoundError as error:
            self.skipTest("no readelf: %s" % error)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stdout

    def test_stapsdt_notes(self):
        theirs = []
        for block in re.findall(
                r"Provider: (\S+)\s+Name: (\S+)\s+Location: (0x[0-9a-f]+), "
                r"Base: (0x[0-9a-f]+), Semaphore: (0x[0-9a-f]+)\s+"
                r"Arguments: ?([^\n]*)", self.readelf("-n")):
            provider, name, location, base, semaphore, arguments = block
            theirs.append((provider, name, arguments.strip(),
                           int(location, 16), int(base, 16),
                           int(semaphore, 16)))
        self.assertGreater(len(theirs), 10)
        ours = [tuple(p) for p in _elf.ElfFile(PYTHON).stapsdt_probes()]
        self.assertEqual(ours, theirs)

    def test_segments_and_sections(self):
        elf = _elf.ElfFile(PYTHON)
        out = self.readelf("-lS")
        loads = [(int(offset, 16), int(vaddr, 16), int(filesz, 16))
                 for offset, vaddr, filesz in re.findall(
                     r"^\s+LOAD\s+(0x[0-9a-f]+) (0x[0-9a-f]+) 0x[0-9a-f]+ "
                     r"(0x[0-9a-f]+)", out, re.M)]
        self.assertEqual([(s.offset, s.vaddr, s.filesz) for s in elf.segments
                          if s.type == _elf.PT_LOAD], loads)
        sections = re.findall(r"^\s+\[\s*\d+\] (\S+)\s+\S+\s+([0-9a-f]{16}) "
                              r"([0-9a-f]+) ([0-9a-f]+)", out, re.M)
        self.assertEqual([(s.name, s.addr, s.offset, s.size)
                          for s in elf.sections[1:]],
                         [(name, int(a, 16), int(o, 16), int(s, 16))
                          for name, a, o, s in sections])

    def test_symbols(self):
        symbols = _elf.ElfFile(PYTHON).symbols()
        functions = 0
        for value, size, kind, name in re.findall(
                r"^\s+\d+: ([0-9a-f]{16})\s+(0x[0-9a-f]+|\d+) (FUNC)"
                r"\s+\S+\s+\S+\s+\S+ "
                r"(\w+)$", self.readelf("-s"), re.M):
            if name in ("Py_Initialize", "_PyEval_EvalFrameDefault",
                        "PyObject_GetAttr"):
                self.assertEqual(symbols[name], (int(value, 16), int(size, 0),
                                                 _elf.STT_FUNC), name)
                functions += 1
        self.assertGreaterEqual(functions, 3)


if __name__ == "__main__":
    unittest.main()
