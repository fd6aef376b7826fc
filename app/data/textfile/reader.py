"""Reading a data file's whole lines, in blocks, into one padded, 8-aligned buffer.

A block is up to ``chunk_rows`` lines and about :data:`_CHUNK_BYTES` of them, read 1 MiB at
a time from the (possibly gzip) stream straight into a numpy buffer that has :data:`PAD`
whitespace bytes in front of the data and at least 8 readable bytes after it, so the
parsers can load 8- and 16-byte windows ending anywhere in a line. Line ends are found with
one numpy pass per read; a line over MAX_LINE_BYTES is an error as soon as it is seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from app.data.textfile import files

_READ_BYTES = 1 << 20  # one readinto() from the (possibly gzip) stream
_CHUNK_BYTES = 64 << 20  # a chunk ends early once its lines hold this many bytes
#: Whitespace bytes in front of the data, so 16-byte windows stay in the buffer.
PAD = 16


class Buffers:
    """Memory :func:`app.data.textfile.iter_chunks` keeps between chunks and calls: the
    text read buffer and the rows of the compiled path. Reusing them spares a fresh
    allocation, and the page faults of first touching it, per chunk and per call (their
    kernel time grows when threads fault in the same process at once). One per thread."""

    def __init__(self) -> None:
        self.text: np.ndarray | None = None
        self.rows: np.ndarray | None = None


def read_blocks(
    path: str,
    chunk_rows: int,
    start: int = 0,
    stop: int | None = None,
    first_line: int = 1,
    buffers: Buffers | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, np.ndarray, int, np.ndarray]]:
    """Yield (first line number, buffer, begin, line ends) for up to chunk_rows whole lines.

    ``buffer``: uint8, 8-aligned; the lines are ``buffer[begin:ends[-1]]``, with at least
    PAD bytes in front ending in whitespace and at least 8 readable bytes after; valid
    until the next item is requested. ``ends``: int64 offsets just past each line's newline
    (one is added to a last line without it). A UTF-8 BOM at offset 0 becomes whitespace.
    Only bytes ``[start, stop)`` are read (``stop`` None: to the end), lines numbered from
    ``first_line``. ``buffers``: the text buffer to reuse (and keep). ``progress``: called
    with the file's bytes (compressed bytes for gzip) read since its last call, after every
    read. Raises DataError; ValueError for a range of a gzip file other than the whole file.
    """
    raw, stream = files.open_data(path)
    with raw, stream:
        if start or stop is not None:
            if stream is not raw:
                raise ValueError(f"{path}: a gzip file can only be read as a whole")
            files.seek(raw, start, path)
        left = None if stop is None else max(0, stop - start)  # bytes to read
        bom = start == 0  # the next read is the file's first
        buf = buffers.text if buffers is not None else None
        if buf is None or len(buf) < PAD + 2 * _READ_BYTES + 8:
            buf = np.full(PAD + 2 * _READ_BYTES + 8, 32, np.uint8)
        buf[:PAD] = 32  # (a reused buffer holds old text)
        if buffers is not None:
            buffers.text = buf
        begin = end = PAD  # unconsumed data: buf[begin:end]
        nls = np.empty(0, np.int64)  # offsets just past the newlines in there
        eof = False
        line = first_line
        position = raw.tell()
        while True:
            while (
                not eof
                and len(nls) < chunk_rows
                and (not len(nls) or nls[-1] - begin < _CHUNK_BYTES)
            ):
                if end - (int(nls[-1]) if len(nls) else begin) > files.MAX_LINE_BYTES:
                    raise files.line_too_long(path, line + len(nls))
                if end + _READ_BYTES + 9 > len(buf):  # move the data to the front, or grow
                    size = max(len(buf), (end - begin + PAD + _READ_BYTES + 16) // 8 * 16)
                    moved = np.full(size, 32, np.uint8) if size > len(buf) else buf
                    if buffers is not None:
                        buffers.text = moved
                    moved[PAD : PAD + end - begin] = buf[begin:end].copy()
                    nls = nls - (begin - PAD)
                    buf, begin, end = moved, PAD, PAD + end - begin
                want = _READ_BYTES if left is None else min(_READ_BYTES, left)
                got = files.read_into(stream, buf.data[end : end + want], path) if want else 0
                if left is not None:
                    left -= got
                if progress is not None:
                    now = raw.tell()
                    progress(now - position)
                    position = now
                if bom and buf[PAD : PAD + 3].tobytes() == files.BOM:
                    buf[PAD : PAD + 3] = 32
                bom = False
                found = np.flatnonzero(buf[end : end + got] == 10) + (end + 1)
                if len(found):
                    lengths = np.diff(found, prepend=int(nls[-1]) if len(nls) else begin) - 1
                    if lengths.max() > files.MAX_LINE_BYTES:
                        where = line + len(nls) + int(np.argmax(lengths > files.MAX_LINE_BYTES))
                        raise files.line_too_long(path, where)
                    nls = np.concatenate([nls, found])
                end += got
                eof = got == 0
            if eof and len(nls) < chunk_rows and end > (nls[-1] if len(nls) else begin):
                buf[end] = 10  # the last line has no newline: give it one
                end += 1
                nls = np.append(nls, end)
            if not len(nls):
                return
            take = min(chunk_rows, len(nls))
            take = max(1, min(take, int(np.searchsorted(nls, begin + _CHUNK_BYTES, "right"))))
            ends = nls[:take]
            yield line, buf, begin, ends
            line += take
            begin = int(ends[-1])
            nls = nls[take:]
