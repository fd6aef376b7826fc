"""Opening a data file for reading: plain or gzip, told by its magic bytes (so the ``.gz``
suffix is not required; multi-member gzip is read to the end), with every I/O, gzip and
line-length failure as a one-line DataError naming the file.

Also the two rules every reader of a data file applies: lines are at most
:data:`MAX_LINE_BYTES` long, and a UTF-8 :data:`BOM` is accepted at the start of a file.
"""

from __future__ import annotations

import gzip
import zlib
from typing import BinaryIO

from app.data.formats import files
from app.errors import DataError

#: A longer line is an error (a binary file, or no newlines); with ``chunk_rows`` this
#: bounds the memory of one chunk.
MAX_LINE_BYTES = 64 << 20
#: The UTF-8 byte order mark, accepted (as whitespace) at offset 0 of a file.
BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"


def open_data(path: str) -> tuple[BinaryIO, BinaryIO]:
    """(raw file, byte stream): the stream decompresses when the file starts with gzip magic.

    The caller closes both. Raises DataError: no such file, not a regular file, or it
    cannot be read (permissions, ...): app/data/formats/files.py.
    """
    raw = files.opened(path)
    try:
        magic = raw.read(len(_GZIP_MAGIC))
        raw.seek(0)
    except OSError as exc:
        raw.close()
        raise cannot_read(path, exc) from None
    if magic == _GZIP_MAGIC:
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw, raw


def seek(raw: BinaryIO, offset: int, path: str) -> None:
    """Seek a plain file to byte ``offset``; I/O failures become DataError."""
    try:
        raw.seek(offset)
    except OSError as exc:
        raise cannot_read(path, exc) from None


def read_into(stream: BinaryIO, view: memoryview, path: str) -> int:
    """One readinto() of ``stream`` into ``view``: the bytes read, 0 at the end. Truncated
    or corrupt gzip data and I/O failures become DataError."""
    try:
        return stream.readinto(view)  # type: ignore[attr-defined]
    except EOFError as exc:  # gzip: "Compressed file ended before the end-of-stream marker"
        raise DataError(f"{path}: truncated gzip data: {exc}") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{path}: corrupt gzip data: {exc}") from None
    except OSError as exc:
        raise cannot_read(path, exc) from None


def cannot_read(path: str, exc: OSError) -> DataError:
    """``<path>: cannot read: <reason>`` for an I/O failure."""
    return files.unreadable(path, exc)


def line_too_long(path: str, line: int) -> DataError:
    """``<path>:<line>: line longer than MAX_LINE_BYTES bytes``."""
    return DataError(f"{path}:{line}: line longer than {MAX_LINE_BYTES} bytes")
