"""Call-frame information (.eh_frame) of an x86-64 ELF file, for stacks
that go through code without frame pointers (glibc's): the rule, at one
address, for the canonical frame address (CFA) and for where the
caller's rbp was saved.

Only what such an unwinder needs: the CFA as a register plus an offset,
and each register's rule as "saved at CFA + n", "same value" or
"undefined"; an expression (DW_CFA_def_cfa_expression, DW_CFA_expression)
makes the row unknown.  The format is DWARF's call-frame information as
.eh_frame keeps it (the LSB's "Exception Frames"); the pointer encodings
are DW_EH_PE_*.

usage (a check against readelf): python3 -m usdt._cfi FILE ADDRESS...
"""

import struct
import sys

from ._elf import PF_X, PT_LOAD, ElfFile

# DWARF register numbers of x86-64 (the psABI's table).
RBP, RSP, RA = 6, 7, 16

# Where a register's value is: saved at CFA + offset, or unchanged.
SAME = "same"
UNDEFINED = "undefined"


class CfiError(Exception):
    pass


class Row:
    """The unwinding rules at one address: the CFA (register, offset) or
    None (an expression), and {register: offset from the CFA, SAME,
    UNDEFINED or None (an expression)}."""

    def __init__(self, cfa, registers):
        self.cfa = cfa
        self.registers = registers

    def saved(self, register):
        """Where register was saved, as an offset from the CFA; SAME if it
        still holds the caller's value (no rule: x86-64's callee-saved
        registers are the same until a rule says otherwise); None if not
        known."""
        rule = self.registers.get(register, SAME)
        if rule is UNDEFINED:
            return None
        return rule

    def __repr__(self):
        return "Row(cfa=%r, registers=%r)" % (self.cfa, self.registers)


def _leb128(data, at, signed):
    """(value, next offset) of the LEB128 number at data[at]."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7f) << shift
        shift += 7
        if byte < 0x80:
            if signed and byte & 0x40:
                value -= 1 << shift
            return value, at


def _uleb(data, at):
    return _leb128(data, at, False)


def _sleb(data, at):
    return _leb128(data, at, True)


# DW_EH_PE_* value formats: struct format, size.
_FORMATS = {0x00: ("<Q", 8), 0x01: None, 0x02: ("<H", 2), 0x03: ("<I", 4),
            0x04: ("<Q", 8), 0x09: None, 0x0a: ("<h", 2), 0x0b: ("<i", 4),
            0x0c: ("<q", 8)}


def _pointer(data, at, encoding, vaddr_of):
    """(value, next offset) of a pointer encoded as *encoding* at file
    offset at; vaddr_of(offset) is the address of a file offset (for
    DW_EH_PE_pcrel)."""
    if encoding == 0xff:  # DW_EH_PE_omit
        return None, at
    form = encoding & 0x0f
    if form == 0x01:
        value, end = _uleb(data, at)
    elif form == 0x09:
        value, end = _sleb(data, at)
    elif form in _FORMATS and _FORMATS[form]:
        fmt, size = _FORMATS[form]
        value, = struct.unpack_from(fmt, data, at)
        end = at + size
    else:
        raise CfiError("pointer encoding %#x" % encoding)
    application = encoding & 0x70
    if application == 0x10:  # DW_EH_PE_pcrel
        value += vaddr_of(at)
    elif application not in (0x00,):
        raise CfiError("pointer application %#x" % encoding)
    return value & 0xffffffffffffffff, end


class EhFrame:
    """The FDEs of one file's .eh_frame, sorted by address; row(vaddr)
    runs the CIE's and the FDE's instructions up to vaddr."""

    def __init__(self, elf):
        section = elf.section(".eh_frame")
        if section is None:
            raise CfiError("%s has no .eh_frame" % elf.path)
        # Offsets from here on are in the section's bytes.
        self.data = elf.section_data(section)
        addr = section.addr
        self.start, self.end = 0, len(self.data)

        def vaddr_of(offset):
            return addr + offset

        self.vaddr_of = vaddr_of
        self.cies = {}
        self.fdes = []
        at = self.start
        while at + 4 <= self.end:
            length, = struct.unpack_from("<I", self.data, at)
            if length == 0:
                break  # the terminator
            if length == 0xffffffff:
                raise CfiError("64-bit .eh_frame entries are not read")
            body = at + 4
            next_entry = body + length
            cie_id, = struct.unpack_from("<I", self.data, body)
            if cie_id == 0:
                self.cies[at] = self._cie(body + 4, next_entry)
            else:
                cie = self.cies.get(body - cie_id)
                if cie is None:
                    cie = self.cies[body - cie_id] = self._cie(
                        body - cie_id + 8, self._end_of(body - cie_id))
                start, p = _pointer(self.data, body + 4, cie["fde_encoding"],
                                    vaddr_of)
                size, p = _pointer(self.data, p, cie["fde_encoding"] & 0x0f,
                                   vaddr_of)
                if cie["augmented"]:
                    skip, p = _uleb(self.data, p)
                    p += skip
                self.fdes.append((start, start + size, p, next_entry, cie))
            at = next_entry
        self.fdes.sort(key=lambda fde: fde[0])
        self.starts = [fde[0] for fde in self.fdes]
        # row()'s answers by address: an unwinder asks for the same
        # return addresses again and again.
        self.rows = {}

    def _end_of(self, entry):
        length, = struct.unpack_from("<I", self.data, entry)
        return entry + 4 + length

    def _cie(self, at, end):
        data = self.data
        version = data[at]
        at += 1
        augmentation = data[at:data.index(b"\0", at)].decode("ascii")
        at += len(augmentation) + 1
        if "eh" in augmentation:
            at += 8
        code_align, at = _uleb(data, at)
        data_align, at = _sleb(data, at)
        if version == 1:
            ra, at = data[at], at + 1
        else:
            ra, at = _uleb(data, at)
        cie = dict(code_align=code_align, data_align=data_align, ra=ra,
                   fde_encoding=0x00, augmented=augmentation.startswith("z"))
        if cie["augmented"]:
            size, at = _uleb(data, at)
            aug_end = at + size
            for letter in augmentation[1:]:
                if letter == "R":
                    cie["fde_encoding"], at = data[at], at + 1
                elif letter == "L":
                    at += 1
                elif letter == "P":
                    encoding, at = data[at], at + 1
                    _, at = _pointer(data, at, encoding, self.vaddr_of)
                elif letter in "SB":
                    pass
                else:
                    break  # unknown: the size says where the data end
            at = aug_end
        cie["instructions"] = (at, end)
        return cie

    def fde(self, vaddr):
        """The FDE (start, end, instructions, end of them, CIE) whose
        range holds vaddr, or None."""
        import bisect
        i = bisect.bisect_right(self.starts, vaddr) - 1
        if i >= 0 and self.fdes[i][0] <= vaddr < self.fdes[i][1]:
            return self.fdes[i]
        return None

    def row(self, vaddr):
        """The Row in effect at vaddr, or None if no FDE covers it."""
        if vaddr not in self.rows:
            self.rows[vaddr] = self._row(vaddr)
        return self.rows[vaddr]

    def _row(self, vaddr):
        fde = self.fde(vaddr)
        if fde is None:
            return None
        start, _, at, end, cie = fde
        state = _State()
        self._run(state, cie, *cie["instructions"], start, None)
        state.initial = (state.cfa, dict(state.registers))
        self._run(state, cie, at, end, start, vaddr)
        return Row(state.cfa, state.registers)

    def _run(self, state, cie, at, end, loc, target):
        """Run CFA instructions from at to end, from location loc, stopping
        before the first advance past target (None: run them all)."""
        data = self.data
        code_align, data_align = cie["code_align"], cie["data_align"]
        while at < end:
            op = data[at]
            at += 1
            high, low = op >> 6, op & 0x3f
            delta = None
            if high == 1:
                delta = low * code_align
            elif high == 2:
                offset, at = _uleb(data, at)
                state.registers[low] = offset * data_align
                continue
            elif high == 3:
                state.restore(low)
                continue
            elif op == 0x00:  # DW_CFA_nop
                continue
            elif op == 0x01:  # DW_CFA_set_loc
                new, at = _pointer(data, at, cie["fde_encoding"],
                                   self.vaddr_of)
                delta = new - loc
            elif op == 0x02:
                delta, at = data[at] * code_align, at + 1
            elif op == 0x03:
                delta = struct.unpack_from("<H", data, at)[0] * code_align
                at += 2
            elif op == 0x04:
                delta = struct.unpack_from("<I", data, at)[0] * code_align
                at += 4
            elif op in (0x05, 0x11):  # offset_extended(_sf)
                register, at = _uleb(data, at)
                offset, at = (_uleb if op == 0x05 else _sleb)(data, at)
                state.registers[register] = offset * data_align
            elif op == 0x06:  # restore_extended
                register, at = _uleb(data, at)
                state.restore(register)
            elif op == 0x07:  # undefined
                register, at = _uleb(data, at)
                state.registers[register] = UNDEFINED
            elif op == 0x08:  # same_value
                register, at = _uleb(data, at)
                state.registers[register] = SAME
            elif op == 0x09:  # register: in another register; not followed
                register, at = _uleb(data, at)
                _, at = _uleb(data, at)
                state.registers[register] = None
            elif op == 0x0a:  # remember_state
                state.stack.append((state.cfa, dict(state.registers)))
            elif op == 0x0b:  # restore_state
                state.cfa, state.registers = state.stack.pop()
            elif op == 0x0c:  # def_cfa
                register, at = _uleb(data, at)
                offset, at = _uleb(data, at)
                state.cfa = (register, offset)
            elif op == 0x0d:  # def_cfa_register
                register, at = _uleb(data, at)
                state.cfa = (register, state.cfa[1] if state.cfa else 0)
            elif op == 0x0e:  # def_cfa_offset
                offset, at = _uleb(data, at)
                state.cfa = (state.cfa[0] if state.cfa else RSP, offset)
            elif op == 0x0f:  # def_cfa_expression
                size, at = _uleb(data, at)
                at += size
                state.cfa = None
            elif op in (0x10, 0x16):  # expression, val_expression
                register, at = _uleb(data, at)
                size, at = _uleb(data, at)
                at += size
                state.registers[register] = None
            elif op == 0x12:  # def_cfa_sf
                register, at = _uleb(data, at)
                offset, at = _sleb(data, at)
                state.cfa = (register, offset * data_align)
            elif op == 0x13:  # def_cfa_offset_sf
                offset, at = _sleb(data, at)
                state.cfa = (state.cfa[0], offset * data_align)
            elif op in (0x14, 0x15):  # val_offset(_sf): not a saved value
                register, at = _uleb(data, at)
                _, at = (_uleb if op == 0x14 else _sleb)(data, at)
                state.registers[register] = None
            elif op == 0x2e:  # GNU_args_size
                _, at = _uleb(data, at)
            elif op == 0x2f:  # GNU_negative_offset_extended
                register, at = _uleb(data, at)
                offset, at = _uleb(data, at)
                state.registers[register] = -offset * data_align
            else:
                raise CfiError("CFA instruction %#x at %#x" % (op, at - 1))
            if delta is not None:
                if target is not None and loc + delta > target:
                    return
                loc += delta


class _State:
    def __init__(self):
        self.cfa = None
        self.registers = {}
        self.stack = []
        self.initial = (None, {})

    def restore(self, register):
        initial = self.initial[1]
        if register in initial:
            self.registers[register] = initial[register]
        else:
            self.registers.pop(register, None)


def syscall_sites(elf):
    """The addresses right after each `syscall` (0f 05) in the executable
    segments of elf: where the user's instruction pointer is at a
    system call's entry.  A byte pair inside another instruction may be
    among them; such an address is never an instruction pointer there."""
    sites = []
    for segment in elf.segments:
        if segment.type != PT_LOAD or not segment.flags & PF_X:
            continue
        data = elf.segment_data(segment)
        at = data.find(b"\x0f\x05")
        while at != -1:
            sites.append(segment.vaddr + at + 2)
            at = data.find(b"\x0f\x05", at + 1)
    return sites


def main(argv):
    frames = EhFrame(ElfFile(argv[1]))
    for address in argv[2:]:
        print(hex(int(address, 0)), frames.row(int(address, 0)))


if __name__ == "__main__":
    main(sys.argv)
