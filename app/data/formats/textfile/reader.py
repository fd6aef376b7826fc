"""Reading a data file's whole lines, in blocks, into one padded, 8-aligned buffer.

A block is up to ``chunk_rows`` lines and about :data:`_CHUNK_BYTES` of them, read 1 MiB at
a time from the (possibly gzip) stream straight into a numpy buffer that has :data:`PAD`
whitespace bytes in front of the data and at least 8 readable bytes after it, so the
parsers can load 8- and 16-byte windows ending anywhere in a line. Line ends are found in
each read by one ``memchr`` pass of the compiled module (:func:`newline_offsets`; numpy
without it); a line over MAX_LINE_BYTES is an error as soon as it is seen. A range of a
plain file read already (:class:`Held`: app/data/formats/textfile/ahead.py) is not read
again: its own buffer, with room around the bytes, becomes the blocks' buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import BinaryIO

import numpy as np

from app.data.formats.textfile import opener

_compiled: ModuleType | None  # app/data/formats/textfile/blocks.py; None: numpy alone
try:
    from app.data.formats.textfile import _fastparse as _compiled
except ImportError:
    _compiled = None

_READ_BYTES = 1 << 20  # one readinto() from the (possibly gzip) stream
_CHUNK_BYTES = 64 << 20  # a chunk ends early once its lines hold this many bytes
#: Whitespace bytes in front of the data, so 16-byte windows stay in the buffer.
PAD = 16
#: One block of whole lines: (number of its first line, buffer, begin, line ends); see
#: :func:`read_blocks`.
Block = tuple[int, np.ndarray, int, np.ndarray]


@dataclass(frozen=True)
class Held:
    """Bytes of a file read already: ``buffer[begin:end]`` (uint8, 8-aligned), with at least
    :data:`PAD` bytes before ``begin`` and :data:`PAD` after ``end`` that the reader may
    overwrite, and ``newlines``, the offsets of their ``b"\\n"`` bytes from ``begin``
    (:func:`newline_offsets`, found once: they count the lines and end them;
    app/data/formats/textfile/ahead.py)."""

    buffer: np.ndarray
    begin: int
    end: int
    newlines: np.ndarray

    @classmethod
    def of(cls, buffer: np.ndarray, begin: int, end: int) -> Held:
        """``buffer[begin:end]``, its newlines found."""
        return cls(buffer, begin, end, newline_offsets(buffer[begin:end]))

    def lines(self, last: bool) -> int:
        """Its lines: newlines, plus an unterminated last line of the file (``last``: the
        bytes end the file)."""
        open_end = last and self.end > self.begin and self.buffer[self.end - 1] != 10
        return len(self.newlines) + (1 if open_end else 0)


class Buffers:
    """Memory :func:`app.data.formats.textfile.iter_chunks` keeps between chunks and calls: the
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
    text: Held | None = None,
) -> Iterator[Block]:
    """Yield (first line number, buffer, begin, line ends) for up to chunk_rows whole lines.

    ``buffer``: uint8, 8-aligned; the lines are ``buffer[begin:ends[-1]]``, with at least
    PAD bytes in front ending in whitespace and at least 8 readable bytes after; valid
    until the next item is requested. ``ends``: int64 offsets just past each line's newline
    (one is added to a last line without it). A UTF-8 BOM at offset 0 becomes whitespace.
    Only bytes ``[start, stop)`` are read (``stop`` None: to the end), lines numbered from
    ``first_line``. ``buffers``: the text buffer to reuse (and keep). ``progress``: called
    with the file's bytes (compressed bytes for gzip) read since its last call, after every
    read. ``text``: bytes ``[start, stop)`` of the plain file, read already
    (app/data/formats/textfile/ahead.py): the blocks are made in its buffer, the file is not
    opened. Raises DataError; ValueError for a range of a gzip file other than the whole file.
    """
    if text is not None:
        yield from _Lines.held(path, text, first_line, start == 0, progress).blocks(chunk_rows)
        return
    raw, stream = opener.open_data(path)
    with raw, stream:
        if start or stop is not None:
            if stream is not raw:
                raise ValueError(f"{path}: a gzip file can only be read as a whole")
            opener.seek(raw, start, path)
        left = None if stop is None else max(0, stop - start)
        lines = _Lines(path, raw, stream, left, first_line, start == 0, buffers, progress)
        yield from lines.blocks(chunk_rows)


class _Lines:
    """One file's lines as they are read: the buffer and what in it is not handed out yet.

    ``buf[begin:end]``: the data read and not yet handed out, the line numbered ``line``
    at ``begin``; ``nls``: offsets just past the newlines in there. Each read appends up
    to _READ_BYTES at ``end``, after moving the data to the front of the buffer (or to a
    larger one) when they would not fit.
    """

    def __init__(
        self,
        path: str,
        raw: BinaryIO,
        stream: BinaryIO,
        left: int | None,
        first_line: int,
        bom: bool,
        buffers: Buffers | None,
        progress: Callable[[int], None] | None,
    ) -> None:
        self.path, self.raw, self.stream = path, raw, stream
        self.left = left  # bytes still to read; None: to the end of the file
        self.bom = bom  # the next read is the file's first: a BOM there becomes blanks
        self.buffers, self.progress = buffers, progress
        self.buf = self._first_buffer()
        self.begin = self.end = PAD
        self.nls = np.empty(0, np.int64)
        self.eof = False
        self.line = first_line
        self.position = raw.tell()  # for progress: where the last read ended

    @classmethod
    def held(
        cls, path: str, text: Held, first_line: int, bom: bool,
        progress: Callable[[int], None] | None,
    ) -> _Lines:  # fmt: skip
        """The lines of ``text``, read already: its buffer is theirs (no copy), blanked for
        :data:`PAD` bytes before them, all its newlines found at once; a BOM at its start
        becomes whitespace when ``bom`` (the text begins the file)."""
        lines = cls.__new__(cls)
        buf, begin, end = text.buffer, text.begin, text.end
        buf[begin - PAD : begin] = 32
        if bom and buf[begin : begin + 3].tobytes() == opener.BOM:
            buf[begin : begin + 3] = 32
        lines.path, lines.left, lines.bom = path, 0, False
        lines.buffers, lines.progress = None, None
        lines.buf, lines.begin, lines.end = buf, begin, begin
        lines.nls, lines.line = np.empty(0, np.int64), first_line
        lines._add_newlines(text.newlines + (begin + 1))
        lines.end, lines.eof = end, True
        if end - lines._last_end() > opener.MAX_LINE_BYTES:
            raise opener.line_too_long(path, first_line + len(lines.nls))
        if progress is not None:
            progress(end - begin)
        return lines

    def blocks(self, chunk_rows: int) -> Iterator[Block]:
        """The items of :func:`read_blocks`, read until each block is full or the file ends."""
        while True:
            while not self.eof and self._wants_more(chunk_rows):
                self._read()
            if self.eof and self.end > self._last_end():
                self._end_last_line()
            if not len(self.nls):
                return
            yield self._take(chunk_rows)

    def _first_buffer(self) -> np.ndarray:
        """The kept buffer if it is large enough, else a new one; its padding blanked."""
        buf = self.buffers.text if self.buffers is not None else None
        if buf is None or len(buf) < PAD + 2 * _READ_BYTES + 8:
            buf = np.full(PAD + 2 * _READ_BYTES + 8, 32, np.uint8)
        buf[:PAD] = 32  # (a reused buffer holds old text)
        if self.buffers is not None:
            self.buffers.text = buf
        return buf

    def _last_end(self) -> int:
        """Where the last whole line read ends (``begin`` when there is none)."""
        return int(self.nls[-1]) if len(self.nls) else self.begin

    def _wants_more(self, chunk_rows: int) -> bool:
        """Whether the next block is short of ``chunk_rows`` lines and of _CHUNK_BYTES."""
        nls = self.nls
        return len(nls) < chunk_rows and (not len(nls) or nls[-1] - self.begin < _CHUNK_BYTES)

    def _read(self) -> None:
        """One read after the data, its newlines found; at the end of the file, ``eof``."""
        if self.end - self._last_end() > opener.MAX_LINE_BYTES:
            raise opener.line_too_long(self.path, self.line + len(self.nls))
        if self.end + _READ_BYTES + 9 > len(self.buf):
            self._make_room()
        got = self._read_into_buffer()
        if self.bom and self.buf[PAD : PAD + 3].tobytes() == opener.BOM:
            self.buf[PAD : PAD + 3] = 32
        self.bom = False
        self._find_newlines(got)
        self.end += got
        self.eof = got == 0

    def _make_room(self) -> None:
        """Move the data to the front of the buffer, or into a larger one."""
        buf, begin, end = self.buf, self.begin, self.end
        size = max(len(buf), (end - begin + PAD + _READ_BYTES + 16) // 8 * 16)
        moved = np.full(size, 32, np.uint8) if size > len(buf) else buf
        if self.buffers is not None:
            self.buffers.text = moved
        moved[PAD : PAD + end - begin] = buf[begin:end].copy()
        self.nls = self.nls - (begin - PAD)
        self.buf, self.begin, self.end = moved, PAD, PAD + end - begin

    def _read_into_buffer(self) -> int:
        """Read up to _READ_BYTES (and no more than is left) at ``end``; the bytes read."""
        want = _READ_BYTES if self.left is None else min(_READ_BYTES, self.left)
        view = self.buf.data[self.end : self.end + want]
        got = opener.read_into(self.stream, view, self.path) if want else 0
        if self.left is not None:
            self.left -= got
        if self.progress is not None:
            now = self.raw.tell()
            self.progress(now - self.position)
            self.position = now
        return got

    def _find_newlines(self, got: int) -> None:
        """Add the newlines of the ``got`` bytes just read; raise for a line too long."""
        self._add_newlines(newline_offsets(self.buf[self.end : self.end + got]) + (self.end + 1))

    def _add_newlines(self, found: np.ndarray) -> None:
        """Add line ends ``found`` (offsets in the buffer just past each newline, after the
        last one known); raise for a line too long."""
        if len(found):
            lengths = np.diff(found, prepend=self._last_end()) - 1
            if lengths.max() > opener.MAX_LINE_BYTES:
                where = self.line + len(self.nls) + int(np.argmax(lengths > opener.MAX_LINE_BYTES))
                raise opener.line_too_long(self.path, where)
            self.nls = np.concatenate([self.nls, found])

    def _end_last_line(self) -> None:
        """Give the last line, which has no newline, one."""
        self.buf[self.end] = 10
        self.end += 1
        self.nls = np.append(self.nls, self.end)

    def _take(self, chunk_rows: int) -> Block:
        """Hand out the next block: up to ``chunk_rows`` lines, about _CHUNK_BYTES at most."""
        take = min(chunk_rows, len(self.nls))
        take = max(1, min(take, int(np.searchsorted(self.nls, self.begin + _CHUNK_BYTES, "right"))))
        ends = self.nls[:take]
        block = (self.line, self.buf, self.begin, ends)
        self.line += take
        self.begin = int(ends[-1])
        self.nls = self.nls[take:]
        return block


def newline_offsets(u: np.ndarray) -> np.ndarray:
    """Offsets of the ``b"\\n"`` bytes of the uint8 array ``u``: (n,) int64, ascending. With
    the compiled module one ``memchr`` pass with room for a newline in 4 KiB (a features
    file's lines are longer), and a second one, with room for all, where there are more (a
    labels file's short lines); else ``flatnonzero(u == 10)``. The same offsets either way
    (tests/test_fastparse.py)."""
    if _compiled is None:
        return np.flatnonzero(u == 10)
    out = np.empty(16 + len(u) // 4096, np.int64)
    count = _compiled.newline_offsets(u, out)
    if count > len(out):
        out = np.empty(count, np.int64)
        _compiled.newline_offsets(u, out)
    return out[:count]
