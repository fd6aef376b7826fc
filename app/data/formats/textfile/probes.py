"""What the start of a data file says before it is parsed: gzip or not, the fields on its
first line, its size in bytes and lines (a gzip file's size from its trailer).

For the bounds checked before a conversion (app/data/cache/bounds.py) and the choice of one pass
or several threads (app/data/formats/textfile/parallel.py). Each reads a bounded amount, never the
file.
"""

from __future__ import annotations

import os
from typing import BinaryIO

import numpy as np

from app.data.formats.textfile import opener, precise
from app.errors import DataError

_FIRST_LINE_READ = 1 << 16  # bytes read at a time when counting the first line's fields
_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True  # what bytes.split() splits on


def is_gzip(path: str | os.PathLike[str]) -> bool:
    """True when the file starts with the gzip magic bytes. Raises DataError (unreadable)."""
    raw, stream = opener.open_data(os.fspath(path))
    with raw, stream:
        return stream is not raw


def first_line_fields(path: str | os.PathLike[str], limit: int) -> int | None:
    """The number of fields on the first line of ``path`` (plain or gzip), counted as it is
    read: None as soon as there are more than ``limit`` (the rest is not read); 0 for a
    blank first line. Memory: one 64 KiB read. Raises DataError (unreadable, corrupt gzip,
    a first line over MAX_LINE_BYTES, lines ended by a lone carriage return)."""
    name = os.fspath(path)
    raw, stream = opener.open_data(name)
    buf = bytearray(_FIRST_LINE_READ)
    count, inside, seen = 0, False, 0
    with raw, stream:
        while got := opener.read_into(stream, memoryview(buf), name):
            block = bytes(buf[:got])
            if seen == 0:
                block = block.removeprefix(opener.BOM)
            end = block.find(b"\n")
            line = block if end < 0 else block[:end]
            if precise.lone_cr(line):  # every row would be one line: K would be all fields
                raise DataError(f"{name}:1:" + precise.LONE_CR_HINT.removeprefix(";"))
            count, inside = _count_fields(line, count, inside)
            if count > limit:
                return None
            if end >= 0:
                break
            seen += got
            if seen > opener.MAX_LINE_BYTES:
                raise opener.line_too_long(name, 1)
    return count


def _count_fields(block: bytes, count: int, inside: bool) -> tuple[int, bool]:
    """Fields starting in ``block`` added to ``count``; ``inside``: the byte before the
    block was in a field. Returns the new count and whether the block ends in a field."""
    solid = ~_WHITESPACE[np.frombuffer(block, np.uint8)]
    if not len(solid):
        return count, inside
    starts = int(np.count_nonzero(solid[1:] & ~solid[:-1])) + int(solid[0] and not inside)
    return count + starts, bool(solid[-1])


def sample_lines(path: str | os.PathLike[str], nbytes: int = 1 << 20) -> tuple[int, int, int]:
    """What the start of ``path`` says about its size: ``(bytes, lines, total)``.

    ``bytes``: the text read from the start (decompressed for gzip), up to ``nbytes`` and
    cut after its last newline (the whole read when it has none); ``lines``: the newlines
    in it; ``total``: the text's size in bytes as far as it can be known without reading
    it all -- a plain file's size; for gzip the size the trailer records (ISIZE: the last
    member's size modulo 2**32, RFC 1952), raised to the bytes already read. A caller must
    treat a gzip ``total`` as an estimate. Raises DataError (unreadable, corrupt gzip).
    """
    name = os.fspath(path)
    raw, stream = opener.open_data(name)
    buf = bytearray(nbytes)
    with raw, stream:
        got = 0
        while got < nbytes and (n := opener.read_into(stream, memoryview(buf)[got:], name)):
            got += n
        gzip_file = stream is not raw
        size = os.fstat(raw.fileno()).st_size
        total = _gzip_isize(raw, size, name) if gzip_file else size
    text = bytes(buf[:got])
    cut = text.rfind(b"\n") + 1 or got
    return cut, text.count(b"\n", 0, cut), max(total, got)


def _gzip_isize(raw: BinaryIO, size: int, path: str) -> int:
    """The uncompressed size a gzip file's trailer records (its last 4 bytes, little
    endian); 0 for a file too short to have one."""
    if size < 18:  # a gzip header (10) and trailer (8) at least
        return 0
    opener.seek(raw, size - 4, path)
    try:
        return int.from_bytes(raw.read(4), "little")
    except OSError as exc:
        raise opener.cannot_read(path, exc) from None
