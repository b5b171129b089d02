"""The one reader of ELF files in this package: the header, the program
and section headers, notes (the GNU build ID, the stapsdt probes),
symbols (.symtab and .dynsym), the dynamic section, and the bytes of a
section (.eh_frame) or of a segment, with their addresses.

Only 64-bit little-endian files (x86-64's) are read.  A file that is not
one, or whose tables run past its end, raises ElfError, a ValueError
whose message names the file and what is wrong with it.

    elf = ElfFile(path)              # reads the whole file
    with open(path, "rb") as f:
        elf = ElfFile(path, f)       # reads only the parts asked for
"""

import collections
import struct

ELFMAG = b"\x7fELF"
ELFCLASS64, ELFDATA2LSB = 2, 1
ET_EXEC, ET_DYN = 2, 3
EM_X86_64 = 62
PT_LOAD, PT_DYNAMIC, PT_TLS = 1, 2, 7
PF_X = 1
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 7, 8, 11
STT_FUNC, STT_TLS = 2, 6
DT_NULL, DT_NEEDED, DT_DEBUG = 0, 1, 21
NT_STAPSDT = 3

# Elf64_Ehdr after e_ident, Elf64_Phdr, Elf64_Shdr, Elf64_Sym, Elf64_Dyn
# and Elf64_Nhdr.
_HEADER = struct.Struct("<HHIQQQIHHHHHH")
_HEADER_SIZE = 16 + _HEADER.size
_SEGMENT = struct.Struct("<IIQQQQQQ")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_DYNAMIC = struct.Struct("<qQ")
_NOTE = struct.Struct("<III")
# A stapsdt note's description: the probe's address, the address of
# .stapsdt.base when the note was written, the semaphore's address (0:
# none), then provider, name and arguments, each ending in a NUL.
_STAPSDT = struct.Struct("<QQQ")

Segment = collections.namedtuple(
    "Segment", "type flags offset vaddr paddr filesz memsz align")
Section = collections.namedtuple(
    "Section", "name type flags addr offset size link info align entsize")
Symbol = collections.namedtuple("Symbol", "value size type")
# desc_vaddr: the address of the description, for a note in an allocated
# section (0 + its offset in the section otherwise).
Note = collections.namedtuple("Note", "owner type desc desc_vaddr")
# value_vaddr: the address of the entry's value (d_un).
Dynamic = collections.namedtuple("Dynamic", "tag value value_vaddr")
StapsdtProbe = collections.namedtuple(
    "StapsdtProbe", "provider name arguments address base semaphore")


class ElfError(ValueError):
    """Not an ELF file this reader reads, or a damaged one."""


class ElfFile:
    """One ELF64 little-endian file: its type and machine, its segments
    (program headers) and sections, and what is in them.

    With file (an open binary file, which the caller keeps open while it
    uses this object), only the parts asked for are read; without it the
    whole file is read at once, and the object needs nothing open."""

    def __init__(self, path, file=None):
        self.path = path
        self._file = file
        self._data = None
        if file is None:
            with open(path, "rb") as f:
                self._data = f.read()
            self._size = len(self._data)
        else:
            file.seek(0, 2)
            self._size = file.tell()
        ident = self._read(0, min(16, self._size))
        if ident[:4] != ELFMAG:
            raise ElfError("%s is not an ELF file" % path)
        if len(ident) < 6 or ident[4] != ELFCLASS64 or ident[5] != ELFDATA2LSB:
            raise ElfError("%s: only 64-bit little-endian ELF is supported"
                           % path)
        header = self._read(16, _HEADER_SIZE - 16, "its ELF header")
        (self.type, self.machine, _, _, phoff, shoff, _, _, phentsize,
         phnum, shentsize, shnum, shstrndx) = _HEADER.unpack(header)
        self.segments = [Segment._make(entry) for entry in self._table(
            phoff, phnum, phentsize, _SEGMENT, "program header")]
        raw = self._table(shoff, shnum, shentsize, _SECTION, "section header")
        self.sections = [Section._make(entry) for entry in raw]
        if shstrndx < len(self.sections):
            names = self.section_data(self.sections[shstrndx])
            self.sections = [
                section._replace(name=self._cstring(names, section.name,
                                                    "section name"))
                for section in self.sections]
        else:
            self.sections = [section._replace(name="")
                             for section in self.sections]

    def _read(self, offset, size, what=None):
        """size bytes at file offset offset; with what (what they are),
        an ElfError unless they are all in the file."""
        if what is not None and (offset < 0 or offset + size > self._size):
            raise ElfError("%s: truncated: %s (%d bytes at %#x) ends past "
                           "the end of the file (%d bytes)"
                           % (self.path, what, size, offset, self._size))
        if self._data is not None:
            return self._data[offset:offset + size]
        self._file.seek(offset)
        return self._file.read(size)

    def _table(self, offset, count, entsize, layout, what):
        if count == 0:
            return []
        if entsize < layout.size:
            raise ElfError("%s: its %s entries are %d bytes, not %d"
                           % (self.path, what, entsize, layout.size))
        data = self._read(offset, count * entsize, "the %s table" % what)
        return [layout.unpack_from(data, i * entsize) for i in range(count)]

    def _cstring(self, table, offset, what):
        end = table.find(b"\0", offset)
        if end == -1:
            raise ElfError("%s: a %s at %#x of its string table does not "
                           "end in it" % (self.path, what, offset))
        return table[offset:end].decode("utf-8", "replace")

    def section(self, name):
        """The first section named name, or None."""
        for section in self.sections:
            if section.name == name:
                return section
        return None

    def section_data(self, section):
        """The bytes of a section (a Section or a name); b"" for a section
        that has none in the file (SHT_NOBITS) or a name it lacks."""
        if isinstance(section, str):
            section = self.section(section)
            if section is None:
                return b""
        if section.type == SHT_NOBITS:
            return b""
        return self._read(section.offset, section.size,
                          "section %s" % (section.name or "?"))

    def segment_data(self, segment):
        """The bytes of a segment that the file holds (p_filesz)."""
        return self._read(segment.offset, segment.filesz, "a segment")

    def read_vaddr(self, vaddr, size):
        """size bytes of the file image at virtual address vaddr."""
        for segment in self.segments:
            if (segment.type == PT_LOAD
                    and segment.vaddr <= vaddr < segment.vaddr
                    + segment.filesz):
                return self._read(segment.offset + vaddr - segment.vaddr,
                                  size, "address %#x" % vaddr)
        raise ElfError("%s: address %#x is not in the file"
                       % (self.path, vaddr))

    def symbols(self):
        """{name: Symbol(value, size, type)} of .symtab and .dynsym: the
        first of each name, in the order of the sections; a new dict at
        each call."""
        found = {}
        for section in self.sections:
            if section.type not in (SHT_SYMTAB, SHT_DYNSYM):
                continue
            if section.link >= len(self.sections):
                raise ElfError("%s: section %s links to no string table"
                               % (self.path, section.name))
            names = self.section_data(self.sections[section.link])
            data = self.section_data(section)
            for at in range(0, len(data) - _SYMBOL.size + 1, _SYMBOL.size):
                name, info, _, _, value, size = _SYMBOL.unpack_from(data, at)
                if name:
                    found.setdefault(self._cstring(names, name, "symbol"),
                                     Symbol(value, size, info & 0xf))
        return found

    def notes(self, section):
        """[Note] of a note section (a Section or a name; [] if none)."""
        if isinstance(section, str):
            section = self.section(section)
            if section is None:
                return []
        data = self.section_data(section)
        notes = []
        at = 0
        while at + _NOTE.size <= len(data):
            namesz, descsz, ntype = _NOTE.unpack_from(data, at)
            owner_at = at + _NOTE.size
            desc_at = owner_at + ((namesz + 3) & ~3)
            at = desc_at + ((descsz + 3) & ~3)
            if desc_at + descsz > len(data):
                raise ElfError("%s: a note runs past the end of section %s"
                               % (self.path, section.name))
            owner = data[owner_at:owner_at + namesz]
            notes.append(Note(owner.rstrip(b"\0"), ntype,
                              data[desc_at:desc_at + descsz],
                              section.addr + desc_at))
        return notes

    def build_id(self):
        """The note of .note.gnu.build-id (its desc is the ID), or None."""
        notes = self.notes(".note.gnu.build-id")
        return notes[0] if notes else None

    def stapsdt_probes(self):
        """[StapsdtProbe] of the .note.stapsdt sections, in file order;
        the strings decoded as UTF-8 (an undecodable byte as U+FFFD)."""
        probes = []
        for section in self.sections:
            if section.type != SHT_NOTE or section.name != ".note.stapsdt":
                continue
            for note in self.notes(section):
                if (note.type != NT_STAPSDT or note.owner != b"stapsdt"
                        or len(note.desc) < _STAPSDT.size + 3):
                    continue
                address, base, semaphore = _STAPSDT.unpack_from(note.desc)
                fields = note.desc[_STAPSDT.size:].split(b"\0")
                if len(fields) < 3:
                    continue
                provider, name, arguments = (
                    field.decode("utf-8", "replace") for field in fields[:3])
                probes.append(StapsdtProbe(provider, name, arguments,
                                           address, base, semaphore))
        return probes

    def dynamic(self):
        """[Dynamic] of the .dynamic section, up to DT_NULL ([] if none)."""
        section = self.section(".dynamic")
        if section is None:
            return []
        data = self.section_data(section)
        entries = []
        for at in range(0, len(data) - _DYNAMIC.size + 1, _DYNAMIC.size):
            tag, value = _DYNAMIC.unpack_from(data, at)
            if tag == DT_NULL:
                break
            entries.append(Dynamic(tag, value, section.addr + at + 8))
        return entries

    def needed(self):
        """The names of the libraries the file needs (DT_NEEDED)."""
        section = self.section(".dynamic")
        if section is None or section.link >= len(self.sections):
            return []
        names = self.section_data(self.sections[section.link])
        return [self._cstring(names, entry.value, "library name")
                for entry in self.dynamic() if entry.tag == DT_NEEDED]
