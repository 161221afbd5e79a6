"""A walk over a tar file's headers: member names, data offsets and sizes, seeking past data.

Reads POSIX ustar, GNU and pax archives as Python's ``tarfile`` (and so webdataset's
``TarWriter``) and GNU tar write them: a 512-byte header per member, its data padded to 512
bytes, two zero blocks at the end. Long names come from a GNU ``L`` record or a pax ``path``
(pax ``size`` too); pax global headers, directories, links and other non-regular members are
passed over. Every header's checksum is verified.

The walk reads :data:`CHUNK` bytes at each header it does not hold yet (``os.pread`` on a local
file, ``seek`` + ``read`` on a file object), so small members following a header (a ``.cls``
label and the next header) cost no extra read; the contents of members up to
:data:`SMALL_MEMBER_BYTES` are kept (labels, captions, JSON) unless the caller's ``keep`` says
otherwise (images are only located).

A file that is not a tar (bad checksum at offset 0), or a truncated one (a header or data
running past the end of the file), raises :class:`TarFormatError` naming the shard, the member
and its byte offset; the members found before the damage are in the error's ``members``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

BLOCK = 512
#: Members up to this size (bytes) are read during the walk, for labels and captions.
SMALL_MEMBER_BYTES = 64 << 10
#: Bytes one read of the walk fetches (a header, and what follows it if that is small).
CHUNK = 4096
_REGULAR = (b"0", b"\0", b"7")
_SKIP_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6", b"g", b"V", b"M", b"D", b"S", b"N")

#: (offset, length) -> bytes, a positioned read of a shard (shorter at the end of the file).
ReadAt = Callable[[int, int], bytes]


class TarFormatError(ValueError):
    """A shard is not a tar, or is damaged; names the shard, the member and the byte offset.

    ``members``: what the walk found before the damage (complete members only); ``reason``:
    ``"not-a-tar"`` or ``"truncated"``.
    """

    def __init__(self, message: str, reason: str, members: Members) -> None:
        super().__init__(message)
        self.reason = reason
        self.members = members


@dataclass
class Members:
    """The regular members of one shard, in archive order."""

    names: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)  # byte offset of each member's data
    sizes: list[int] = field(default_factory=list)
    small: dict[int, bytes] = field(default_factory=dict)  # member number -> contents

    def header_offset(self, i: int) -> int:
        """Byte offset of member ``i``'s own header (the 512 bytes before its data)."""
        return self.offsets[i] - BLOCK

    def as_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, sizes) as int64 arrays."""
        return np.asarray(self.offsets, np.int64), np.asarray(self.sizes, np.int64)


def local_reader(fd: int) -> ReadAt:
    """Positioned reads of an open file descriptor."""
    return lambda offset, length: os.pread(fd, length, offset)


def file_reader(f: object) -> ReadAt:
    """Positioned reads of a seekable binary file object (an fsspec file: its read-ahead
    cache makes the walk one streaming pass over the object)."""
    def read_at(offset: int, length: int) -> bytes:
        f.seek(offset)  # type: ignore[attr-defined]
        return bytes(f.read(length))  # type: ignore[attr-defined]
    return read_at


def parse_number(field_bytes: bytes) -> int:
    """A tar numeric field: octal text, or GNU base-256 (first byte 0x80/0xff)."""
    if field_bytes and field_bytes[0] in (0x80, 0xFF):
        value = int.from_bytes(field_bytes[1:], "big")
        return value - (1 << (8 * (len(field_bytes) - 1))) if field_bytes[0] == 0xFF else value
    text = field_bytes.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def checksum_ok(header: bytes) -> bool:
    """Whether a 512-byte header's checksum field matches its bytes (unsigned or signed sum)."""
    field_bytes = header[148:156]
    try:
        stored = parse_number(field_bytes)
    except ValueError:
        return False
    # adler32's low half is (1 + the byte sum) mod 65521: the sum in C, exact for sums (at most
    # 512 * 255) within 65521 of the stored value, i.e. any plausible header
    if (1 + stored + sum(field_bytes) - 8 * 32) % 65521 == zlib.adler32(header) & 0xFFFF:
        return True
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + header[156:512]) + 256
    return stored == signed


def header_name(header: bytes) -> str:
    """The member name of a ustar header (prefix + name), decoded as tarfile does."""
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax_records(data: bytes) -> dict[str, str]:
    out = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        length = int(data[pos:space])
        record = data[space + 1: pos + length - 1]
        key, _, value = record.partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


class _Buffered:
    """Positioned reads through a :data:`CHUNK` buffer: headers and small members that follow
    each other closely cost one read between them."""

    def __init__(self, read_at: ReadAt) -> None:
        self.read_at = read_at
        self.start, self.data = 0, b""

    def __call__(self, offset: int, length: int) -> bytes:
        end = offset + length
        if not (self.start <= offset and end <= self.start + len(self.data)):
            if length > CHUNK:
                return self.read_at(offset, length)
            self.start, self.data = offset, self.read_at(offset, CHUNK)
        return self.data[offset - self.start:end - self.start]


def walk(read_at: ReadAt, size: int, shard: str,
         keep: Callable[[str], bool] | None = None) -> Members:
    """Every regular member of the tar shard ``shard`` (``size`` bytes, read by ``read_at``);
    the contents of members up to :data:`SMALL_MEMBER_BYTES` are kept where ``keep(name)``
    (default: all)."""
    found = Members()
    offset = 0
    long_name: str | None = None
    pax: dict[str, str] = {}
    read_at = _Buffered(read_at)
    while offset + BLOCK <= size:
        chunk = read_at(offset, min(2 * BLOCK, size - offset))
        header = chunk[:BLOCK]
        if len(header) < BLOCK:
            break
        if header == bytes(BLOCK):
            return found  # the end-of-archive marker
        if not checksum_ok(header):
            what = ("is not a tar file (no valid tar header at byte offset 0)" if offset == 0
                    else f"has a damaged tar header at byte offset {offset}")
            after = f" after member {found.names[-1]!r}" if found.names else ""
            raise TarFormatError(f"tar shard {shard!r} {what}{after}", "not-a-tar"
                                 if offset == 0 else "truncated", found)
        kind = header[156:157]
        size_field = header[124:136]
        length = (int(size_field.strip(b" \0") or b"0", 8) if size_field[0] < 0x80
                  else parse_number(size_field))
        if pax and "size" in pax:
            length = int(pax["size"])
        if long_name is not None:
            name = long_name
        elif pax and "path" in pax:
            name = pax["path"]
        elif header[345] == 0 or header[257:262] != b"ustar":  # no prefix field in use
            nul = header.find(b"\0", 0, 100)
            name = header[:100 if nul < 0 else nul].decode("utf-8", "surrogateescape")
        else:
            name = header_name(header)
        data_at = offset + BLOCK
        end = data_at + length
        if end > size:
            raise TarFormatError(
                f"tar shard {shard!r} is truncated: member {name!r} (header at byte offset "
                f"{offset}) has {length} bytes of data from byte offset {data_at}, but the "
                f"file ends at byte {size}. Copy or write the shard again.", "truncated", found)
        if kind in (b"L", b"x"):
            body = chunk[BLOCK:BLOCK + length] if length <= BLOCK else read_at(data_at, length)
            if kind == b"L":
                long_name = body.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            else:
                pax = _pax_records(body)
        elif kind in _REGULAR or kind not in _SKIP_TYPES:
            if kind in _REGULAR:
                i = len(found.names)
                found.names.append(name)
                found.offsets.append(data_at)
                found.sizes.append(length)
                if length <= SMALL_MEMBER_BYTES and (keep is None or keep(name)):
                    found.small[i] = (chunk[BLOCK:BLOCK + length] if length <= BLOCK
                                      else read_at(data_at, length))
            long_name, pax = None, {}
        else:
            long_name, pax = None, {}
        offset = data_at + -(-length // BLOCK) * BLOCK
    if offset < size and size - offset < BLOCK:
        raise TarFormatError(f"tar shard {shard!r} is truncated: {size - offset} stray bytes "
                             f"at byte offset {offset} (a tar is whole 512-byte blocks)",
                             "truncated", found)
    return found  # ended without the zero blocks: tolerated, as tarfile does
