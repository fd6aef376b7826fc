"""Parse whitespace-separated float text files into float32 chunks, with exact error positions.

Format (docs/architecture.md, "Data directory"): one sample per line, fields separated by ASCII
whitespace (space, tab, CR, LF, VT, FF: the set ``bytes.split()`` uses), each field a decimal
float (``1``, ``-2.5``, ``.5``, ``3.``, ``1e-3``, ``2.5E+02``) or ``nan`` / ``inf`` /
``infinity`` (any case, optional sign). A file may be gzip, recognised by its magic bytes
(so the ``.gz`` suffix is not required); multi-member gzip is read to the end. A UTF-8 BOM,
CRLF line ends, a last line without a newline and blank lines at the end are accepted; a
blank line followed by more data is an error naming the blank line.

Values are exactly what numpy gives for the text: the decimal is rounded once to float64
(correctly, as ``float()`` and ``np.loadtxt`` do) and that double is rounded to float32.

How it is fast (no Python per field on the happy path): lines are read straight into an
8-aligned numpy buffer; ~``_GROUP_BYTES`` of lines at a time are split into fields with a
few numpy passes over the bytes; each field's mantissa is then decoded from the one or two
little-endian 64-bit words that end at it, by SWAR arithmetic: digit check, decimal point
found and squeezed out, eight digits combined by three multiply-shifts (D. Lemire, "Number
parsing at a gigabyte per second", Software: Practice and Experience 51(8), 2021; the same
tricks as simdjson and fast_float). The integer mantissa ``m <= 2**53`` times ``10**k`` with
``|k| <= 22`` is one correctly rounded float64 operation, both operands being exact
(Clinger's fast path: W. D. Clinger, "How to read floating point numbers accurately", PLDI
1990). Fields outside that range (over 15 significant digits, large exponents, nan/inf) are
parsed one by one with ``float()``, or by ``np.loadtxt`` when most fields are like that
(numpy's default ``%.18e``, ``repr()``); a block with any problem is parsed again line by
line to name the first bad line and field.

No TensorFlow here (docs/architecture.md: data.textfile never imports it).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import BinaryIO

import numpy as np

from app.errors import DataError

#: The compiled fast path (:mod:`app.data._fastparse`, built from _fastparse.c by setup.py
#: where a C compiler is present); None: the numpy path alone.
compiled: ModuleType | None
try:
    from app.data import _fastparse as compiled
except ImportError:  # no compiler at install time: the numpy path alone
    compiled = None

__all__ = [
    "MAX_LINE_BYTES",
    "Buffers",
    "Span",
    "first_line_fields",
    "is_gzip",
    "iter_chunks",
    "parse_field",
    "sample_lines",
]

#: A longer line is an error (a binary file, or no newlines); with ``chunk_rows`` this
#: bounds the memory of one chunk.
MAX_LINE_BYTES = 64 << 20

_READ_BYTES = 1 << 20  # one readinto() from the (possibly gzip) stream
_CHUNK_BYTES = 64 << 20  # a chunk ends early once its lines hold this many bytes
_GROUP_BYTES = 256 << 10  # lines decoded together (temporaries stay in cache)
_PAD = 16  # whitespace bytes in front of the data, so 16-byte windows stay in the buffer
_BOM = b"\xef\xbb\xbf"
_GZIP_MAGIC = b"\x1f\x8b"
_ONE_WORD_BYTES = 10  # bytes per field (with separator) below which one word is tried first
_FEW = 32  # up to this many undecoded fields in a block go straight to float()
_SLICE = 32768  # fields decoded per call in the passes over a whole block
_SCAN_PER_CALL = 1024  # bytes scanned for 'e' in about the time of one float() call
_SHOWN = 24  # characters of an offending field quoted in a message (a float has fewer)

# One field: what float() accepts, without "_" separators or surrounding whitespace.
_FIELD = re.compile(
    rb"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|(?i:inf|infinity|nan))"
)


def parse_field(token: bytes) -> float | None:
    """The float64 value of one field, or None when it is not a number.

    ``token``: the field's bytes, no surrounding whitespace. Accepted: ``[+-]? (digits
    [. digits] | . digits) [(e|E) [+-] digits]`` and ``inf``, ``infinity``, ``nan`` in any
    case with an optional sign: ``float()``'s grammar without ``_`` separators. The value
    is correctly rounded (it is ``float(token)``).
    """
    if _FIELD.fullmatch(token) is None:
        return None
    return float(token)


@dataclass
class Span:
    """A part of a plain-text file, bytes ``[start, stop)``, that begins at a line start.

    For parsing one file in several threads (:mod:`app.data.parallel`). Set by the
    caller: ``start`` / ``stop`` byte offsets (``stop`` None: to the end of the file);
    ``first_line``, the 1-based number of the line at ``start``; ``blank_line``, the
    first line of the run of blank lines that ends just before ``start`` (None when the
    line before is not blank) -- the state the lines before ``start`` leave, so that
    messages match reading the whole file. Updated by :func:`iter_chunks` as it reads:
    ``lines`` (lines read, blank ones included), ``rows`` (samples) and ``blank_line``
    (first line of the blank run at the end of the span, or None).
    """

    start: int = 0
    stop: int | None = None
    first_line: int = 1
    blank_line: int | None = None
    lines: int = 0
    rows: int = 0


def is_gzip(path: str | os.PathLike[str]) -> bool:
    """True when the file starts with the gzip magic bytes. Raises DataError (unreadable)."""
    raw, stream = _open(os.fspath(path))
    with raw, stream:
        return stream is not raw


def iter_chunks(
    path: str | os.PathLike[str],
    *,
    width: int | None = None,
    allow_nonfinite: bool = False,
    chunk_rows: int = 512,
    width_hint: str = "",
    span: Span | None = None,
    buffers: Buffers | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[np.ndarray]:
    """Yield the file's samples as float32 arrays of shape (rows <= chunk_rows, width), in order.

    ``path``: a text file, plain or gzip. ``width``: fields per line; None infers it from
    the first line. ``allow_nonfinite``: accept NaN and Inf (also a finite decimal beyond
    float32's range, which becomes Inf); by default they are errors. ``chunk_rows``: at
    most this many samples per array (fewer when that many lines exceed 64 MiB).
    ``width_hint``: added in parentheses to a wrong-width message, e.g. ``"H×W = 20×195"``.
    ``span``: read only that part of a plain (not gzip) file, numbering lines from
    ``span.first_line``; the span records the lines, rows and trailing blank run it read,
    and an empty span is no error. A UTF-8 BOM is only recognised at offset 0.
    ``buffers``: memory to keep and reuse across chunks and calls (one :class:`Buffers` per
    thread); the arrays then share memory, each valid only until the next is requested.
    ``progress``: called with the bytes of the file (compressed bytes for gzip) read since
    its last call, after every read (from the calling thread).

    Memory: one chunk of lines as bytes (plus a 1 MiB read), its float32 array and
    temporaries for ~256 KiB of lines (a copy of the chunk on the np.loadtxt and error
    paths); never the whole file.

    Raises DataError, one line: ``<path>:<line>: <problem>`` -- with ``field <n>:`` (1-based)
    and the field quoted (escaped, truncated) where one field is to blame -- for a wrong
    number of fields, a field that is not a number, NaN/Inf when not allowed, data after a
    blank line (named: the blank line), a line over MAX_LINE_BYTES; ``<path>: <problem>``
    for a missing, unreadable (permissions, a directory) or empty file, and truncated or
    corrupt gzip data. ValueError for ``chunk_rows < 1`` or ``width < 1``, and for a span
    of a gzip file other than the whole file.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if width is not None and width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    state = _State(os.fspath(path), width, None, width_hint, allow_nonfinite, buffers=buffers)
    part = span if span is not None else Span()
    state.blank_line = part.blank_line
    next_line = part.first_line
    blocks = _read_blocks(state.path, chunk_rows, part, buffers, progress)
    for first_line, buf, begin, ends in blocks:
        next_line = first_line + len(ends)
        values = _parse_block(state, buf, begin, first_line, ends)
        if len(values):
            state.rows += len(values)
            part.rows = state.rows
            yield values
    part.lines = next_line - part.first_line
    part.rows = state.rows
    part.blank_line = state.blank_line
    if state.rows == 0 and span is None:
        raise DataError(f"{state.path}: empty file (no data lines)")


class Buffers:
    """Memory :func:`iter_chunks` keeps between chunks and calls: the text read buffer and
    the rows of the compiled path. Reusing them spares a fresh allocation, and the page
    faults of first touching it, per chunk and per call (their kernel time grows when
    threads fault in the same process at once). One per thread."""

    def __init__(self) -> None:
        self.text: np.ndarray | None = None
        self.rows: np.ndarray | None = None


@dataclass
class _State:
    """What is known about the file so far; shared by the fast and the precise path."""

    path: str
    width: int | None
    width_line: int | None  # the line the width was inferred from; None: the caller's
    width_hint: str
    allow_nonfinite: bool
    rows: int = 0
    blank_line: int | None = None  # first blank line of the run at the end of what was read
    style: str = "plain"  # how fields were best decoded so far: "plain", "exp", "bulk"
    buffers: Buffers | None = None

    def where(self, line: int, field: int | None = None) -> str:
        """``<path>:<line>:``, with `` field <n>:`` when given."""
        place = f"{self.path}:{line}:"
        return place if field is None else f"{place} field {field}:"

    def width_error(self, line: int, found: int) -> DataError:
        """A line with the wrong number of fields."""
        if self.width_hint:
            why = f" ({self.width_hint})"
        elif self.width_line is not None:
            why = f" (as on line {self.width_line})"
        else:
            why = ""
        return DataError(f"{self.where(line)} expected {self.width} fields{why}, found {found}")

    def blank_error(self, line: int) -> DataError:
        """Data on ``line`` after a blank line (the message names the blank line)."""
        blank = self.blank_line if self.blank_line is not None else line
        return DataError(f"{self.where(blank)} blank line followed by more data on line {line}")

    def not_a_number(self, line: int, field: int, token: bytes) -> DataError:
        """A field outside the grammar of parse_field."""
        return DataError(f"{self.where(line, field)} not a number: {_shown(token)}")

    def nonfinite_error(self, line: int, field: int, token: bytes) -> DataError:
        """NaN/Inf, or a value beyond float32's range, when not allowed."""
        return DataError(
            f"{self.where(line, field)} non-finite value {_shown(token)} in float32 "
            "(NaN/Inf are rejected unless allowed: --allow-nonfinite)"
        )


def _shown(token: bytes) -> str:
    """A field quoted for a one-line message: at most _SHOWN characters between the quotes,
    printable ASCII as is and every other byte (quotes and backslashes included) as
    ``\\xNN``, so no content of a wrong file reaches a log beyond a short excerpt."""
    text = ""
    for byte in token:
        piece = chr(byte) if 32 <= byte < 127 and byte not in b"'\\" else f"\\x{byte:02x}"
        if len(text) + len(piece) > _SHOWN - 3:
            return f"'{text}...'"
        text += piece
    return f"'{text}'"


def first_line_fields(path: str | os.PathLike[str], limit: int) -> int | None:
    """The number of fields on the first line of ``path`` (plain or gzip), counted as it is
    read: None as soon as there are more than ``limit`` (the rest is not read); 0 for a
    blank first line. Memory: one 64 KiB read. Raises DataError (unreadable, corrupt gzip,
    a first line over MAX_LINE_BYTES)."""
    name = os.fspath(path)
    raw, stream = _open(name)
    buf = bytearray(1 << 16)
    count, inside, seen = 0, False, 0
    with raw, stream:
        while got := _read_into(stream, memoryview(buf), name):
            block = bytes(buf[:got])
            if seen == 0:
                block = block.removeprefix(_BOM)
            end = block.find(b"\n")
            count, inside = _count_fields(block if end < 0 else block[:end], count, inside)
            if count > limit:
                return None
            if end >= 0:
                break
            seen += got
            if seen > MAX_LINE_BYTES:
                raise DataError(f"{name}:1: line longer than {MAX_LINE_BYTES} bytes")
    return count


_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[[9, 10, 11, 12, 13, 32]] = True  # what bytes.split() splits on


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
    raw, stream = _open(name)
    buf = bytearray(nbytes)
    with raw, stream:
        got = 0
        while got < nbytes and (n := _read_into(stream, memoryview(buf)[got:], name)):
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
    _seek(raw, size - 4, path)
    try:
        return int.from_bytes(raw.read(4), "little")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


# --- reading ------------------------------------------------------------------------------


def _open(path: str) -> tuple[BinaryIO, BinaryIO]:
    """(raw file, byte stream): the stream decompresses when the file starts with gzip magic."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as exc:  # permissions, a directory, ...
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        magic = raw.read(len(_GZIP_MAGIC))
        raw.seek(0)
    except OSError as exc:
        raw.close()
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if magic == _GZIP_MAGIC:
        return raw, gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw, raw


def _seek(raw: BinaryIO, offset: int, path: str) -> None:
    """Seek a plain file; I/O failures become DataError."""
    try:
        raw.seek(offset)
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _read_into(stream: BinaryIO, view: memoryview, path: str) -> int:
    """One readinto(); 0 at the end. gzip and I/O failures become DataError."""
    try:
        return stream.readinto(view)  # type: ignore[attr-defined]
    except EOFError as exc:  # gzip: "Compressed file ended before the end-of-stream marker"
        raise DataError(f"{path}: truncated gzip data: {exc}") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{path}: corrupt gzip data: {exc}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _read_blocks(
    path: str,
    chunk_rows: int,
    span: Span,
    buffers: Buffers | None = None,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, np.ndarray, int, np.ndarray]]:
    """Yield (first line number, buffer, begin, line ends) for up to chunk_rows whole lines.

    ``buffer``: uint8, 8-aligned; the lines are ``buffer[begin:ends[-1]]``, with at least
    _PAD bytes in front ending in whitespace and at least 8 readable bytes after; valid
    until the next item is requested. ``ends``: int64 offsets just past each line's newline
    (one is added to a last line without it). A UTF-8 BOM at offset 0 becomes whitespace.
    Only ``span``'s bytes are read, lines numbered from its first line. Raises DataError;
    ValueError for a span of a gzip file other than the whole file.
    """
    raw, stream = _open(path)
    with raw, stream:
        if span.start or span.stop is not None:
            if stream is not raw:
                raise ValueError(f"{path}: a gzip file can only be read as a whole")
            _seek(raw, span.start, path)
        left = None if span.stop is None else max(0, span.stop - span.start)  # bytes to read
        bom = span.start == 0  # the next read is the file's first
        buf = buffers.text if buffers is not None else None
        if buf is None or len(buf) < _PAD + 2 * _READ_BYTES + 8:
            buf = np.full(_PAD + 2 * _READ_BYTES + 8, 32, np.uint8)
        buf[:_PAD] = 32  # (a reused buffer holds old text)
        if buffers is not None:
            buffers.text = buf
        begin = end = _PAD  # unconsumed data: buf[begin:end]
        nls = np.empty(0, np.int64)  # offsets just past the newlines in there
        eof = False
        line = span.first_line
        position = raw.tell()
        while True:
            while (
                not eof
                and len(nls) < chunk_rows
                and (not len(nls) or nls[-1] - begin < _CHUNK_BYTES)
            ):
                if end - (int(nls[-1]) if len(nls) else begin) > MAX_LINE_BYTES:
                    raise DataError(
                        f"{path}:{line + len(nls)}: line longer than {MAX_LINE_BYTES} bytes"
                    )
                if end + _READ_BYTES + 9 > len(buf):  # move the data to the front, or grow
                    size = max(len(buf), (end - begin + _PAD + _READ_BYTES + 16) // 8 * 16)
                    moved = np.full(size, 32, np.uint8) if size > len(buf) else buf
                    if buffers is not None:
                        buffers.text = moved
                    moved[_PAD : _PAD + end - begin] = buf[begin:end].copy()
                    nls = nls - (begin - _PAD)
                    buf, begin, end = moved, _PAD, _PAD + end - begin
                want = _READ_BYTES if left is None else min(_READ_BYTES, left)
                got = _read_into(stream, buf.data[end : end + want], path) if want else 0
                if left is not None:
                    left -= got
                if progress is not None:
                    now = raw.tell()
                    progress(now - position)
                    position = now
                if bom and buf[_PAD : _PAD + 3].tobytes() == _BOM:
                    buf[_PAD : _PAD + 3] = 32
                bom = False
                found = np.flatnonzero(buf[end : end + got] == 10) + (end + 1)
                if len(found):
                    lengths = np.diff(found, prepend=int(nls[-1]) if len(nls) else begin) - 1
                    if lengths.max() > MAX_LINE_BYTES:
                        where = line + len(nls) + int(np.argmax(lengths > MAX_LINE_BYTES))
                        raise DataError(f"{path}:{where}: line longer than {MAX_LINE_BYTES} bytes")
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


# --- the fast path ------------------------------------------------------------------------


def _parse_block(
    state: _State, u: np.ndarray, begin: int, first_line: int, ends: np.ndarray
) -> np.ndarray:
    """The samples of the lines ``u[begin:ends[-1]]`` as float32 (rows, width).

    The compiled parser (:mod:`app.data._fastparse`, when built) takes the lines it can,
    all of them in a well-formed file of plain decimals; the numpy path below parses the
    rest from the first line it did not take (same values, and the precise errors).
    """
    if state.width is None:
        fields = len(u[begin : ends[0]].tobytes().split())
        if fields:  # (a blank first line is the numpy path's to report)
            state.width, state.width_line = fields, first_line
    if compiled is None or state.width is None or state.blank_line is not None:
        return _parse_block_numpy(state, u, begin, first_line, ends)
    out = _rows_out(state, len(ends))
    done = compiled.parse_lines(u, begin, int(ends[-1]), state.width, out)
    if done == len(ends):
        return out
    rest = _parse_block_numpy(
        state, u, begin if not done else int(ends[done - 1]), first_line + done, ends[done:]
    )
    return np.concatenate([out[:done], rest]) if done else rest


def _rows_out(state: _State, rows: int) -> np.ndarray:
    """A (rows, width) float32 array for the compiled path: in ``state.buffers`` if any."""
    assert state.width is not None
    held = state.buffers
    if held is None:
        return np.empty((rows, state.width), np.float32)
    if held.rows is None or held.rows.size < rows * state.width:
        held.rows = np.empty(rows * state.width, np.float32)
    return held.rows[: rows * state.width].reshape(rows, state.width)


def _parse_block_numpy(
    state: _State, u: np.ndarray, begin: int, first_line: int, ends: np.ndarray
) -> np.ndarray:
    """:func:`_parse_block` without the compiled parser.

    Fields are found group by group (~_GROUP_BYTES of lines) and decoded with one word,
    then the block's leftovers with two words, with exponents, and one by one. Any
    surprise sends the whole block, with the state it started with, to the precise path
    (which raises the DataError).
    """
    blank_line = state.blank_line

    def slowly() -> np.ndarray:
        state.blank_line = blank_line
        blob = u[begin : ends[-1]].tobytes()
        return _parse_block_slowly(state, blob, first_line, (ends - begin).tolist())

    if state.width is None:
        fields = len(u[begin : ends[0]].tobytes().split())
        if fields == 0:  # a blank first line
            return slowly()
        state.width, state.width_line = fields, first_line
    width = state.width
    words = u.view(_U64)
    out = np.empty((len(ends), width), np.float32)
    flat = out.reshape(-1)
    left: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # undecoded: s, e, flat index
    rows = 0
    lo = 0  # first line of the group
    start = begin  # where it starts in u
    while lo < len(ends):
        hi = max(int(np.searchsorted(ends, start + _GROUP_BYTES, "right")), lo + 1)
        fields_ = _split(u, start, ends[lo:hi], width)
        if fields_ is None:
            return slowly()
        counts, s, e = fields_
        full = counts == width
        lines = len(counts)
        if not full.all():  # full lines, then blank lines: fine if only blank lines follow
            lines = int(np.argmin(full))  # the first blank line
            if (counts[lines:] != 0).any() or (lines > 0 and state.blank_line is not None):
                return slowly()
        if lines and state.blank_line is not None:
            raise state.blank_error(first_line + lo)
        if lines < len(counts) and state.blank_line is None:
            state.blank_line = first_line + lo + lines
        if lines and state.style != "bulk":
            values, slow = _decode_group(words, u, s, e, int(ends[lo + lines - 1]) - start, state)
            flat[rows * width : (rows + lines) * width] = values
            idx = np.flatnonzero(slow)
            if len(idx):
                left.append((s[idx], e[idx], idx + rows * width))
        rows += lines
        lo = hi
        start = int(ends[lo - 1])
    done: bool | None = True
    if state.style == "bulk":
        done = None
    elif left:
        done = _decode_rest(words, u, flat, left, state.allow_nonfinite)
    if done is None and rows:  # too many fields for float() one by one: numpy's parser
        state.style = "bulk"  # and for the rest of the file
        bulk = _loadtxt(u[begin : ends[rows - 1]].tobytes(), width, state.allow_nonfinite)
        if bulk is None:
            return slowly()
        out[:rows] = bulk
    elif done is False:
        return slowly()
    return out[:rows]


def _decode_group(
    words: np.ndarray, u: np.ndarray, s: np.ndarray, e: np.ndarray, nbytes: int, state: _State
) -> tuple[np.ndarray, np.ndarray]:
    """First pass over one group's fields [s, e) (spanning ``nbytes``): (values, slow).

    One word when the fields are short on average (%g style), else two; exponents first
    when the previous group was mostly exponents (%e style, ``state.style``).
    """
    if state.style == "exp":
        values = np.empty(len(s), np.float32)
        slow = np.ones(len(s), bool)
        _decode_exponents(words, u, s, e, values, slow)
        idx = np.flatnonzero(slow)
        if len(idx) * 8 > len(s):
            state.style = "plain"
        return values, slow
    nwords = 1 if nbytes <= _ONE_WORD_BYTES * len(s) else 2
    values, slow = _decode(words, u, s, e, None, nwords)
    idx = np.flatnonzero(slow)
    if len(idx) > _FEW and len(idx) * 8 > len(s):  # mostly exponents?
        _decode_exponents(words, u, s, e, values, slow)
        # Mostly decoded now: %e style. Else mostly long mantissas (%.18e, repr()).
        state.style = "exp" if np.count_nonzero(slow) * 8 <= len(s) else "bulk"
    return values, slow


def _split(
    u: np.ndarray, start: int, ends: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Find the fields of the lines ``u[start:ends[-1]]``: (fields per line, starts, ends).

    Field ends are exclusive offsets in ``u``. None asks for the precise path: a control
    byte outside the whitespace set (bytes.split() keeps it inside a field) or a line with
    neither ``width`` nor zero fields.
    """
    stop = int(ends[-1])
    seg = u[start - 1 : stop]  # from the newline (or padding) before the group
    solid = seg > 32
    blanks = len(seg) - np.count_nonzero(solid)
    newlines = len(ends) + int(seg[0] == 10)
    if (
        blanks != np.count_nonzero(seg == 32) + newlines  # tabs, CRs or other bytes <= 32
        and ((seg < 9) | ((seg > 13) & (seg < 32))).any()
    ):
        return None
    edges = np.flatnonzero(solid[1:] != solid[:-1])
    s = edges[0::2] + start
    e = edges[1::2] + start
    before = np.searchsorted(s, ends)  # fields before each line end
    counts = before.copy()
    counts[1:] -= before[:-1]
    if len(s) != len(ends) * width and not ((counts == width) | (counts == 0)).all():
        return None
    return counts, s, e


def _decode_rest(
    words: np.ndarray,
    u: np.ndarray,
    flat: np.ndarray,
    left: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    allow_nonfinite: bool,
) -> bool | None:
    """Decode the fields the first pass left, into ``flat``.

    ``left``: (starts, ends, index in flat) per group. Two words, then exponents when
    there are many, then parse_field one by one. Returns True when done; False for a
    field that is not a number, or NaN/Inf (also beyond float32) when not allowed; None
    when too many fields are left for parse_field.
    """
    s, e, at = (np.concatenate(parts) for parts in zip(*left, strict=True))
    values, slow = _decode_slices(words, u, s, e, None)
    idx = np.flatnonzero(slow)
    # Exponents here cost a scan of the bytes these fields span: worth it for many.
    if len(idx) > _FEW and e[idx[-1]] - s[idx[0]] < len(idx) * _SCAN_PER_CALL:
        _decode_exponents(words, u, s, e, values, slow)
        idx = np.flatnonzero(slow)
    flat[at] = values
    if len(idx) > max(_FEW, len(flat) // 64):
        return None
    if len(idx):
        with np.errstate(over="ignore"):  # beyond float32: Inf, checked below
            for i in idx.tolist():
                value = parse_field(u[s[i] : e[i]].tobytes())
                if value is None:
                    return False
                flat[at[i]] = value
        if not allow_nonfinite and not np.isfinite(flat[at[idx]]).all():
            return False
    return True


def _loadtxt(blob: bytes, width: int, allow_nonfinite: bool) -> np.ndarray | None:
    """The lines of ``blob`` parsed by np.loadtxt as float32 (rows, width), or None.

    For text whose fields mostly need full-precision decimal conversion (e.g. numpy's
    default ``%.18e``). np.loadtxt converts each field with CPython's correctly rounded
    strtod and rejects a field unless all of it is a number, the same grammar as
    parse_field. It also splits on non-ASCII whitespace (it decodes latin-1), which
    changes the field count -- caught by the shape check. None: any doubt (the precise
    path then names the problem).
    """
    try:
        values = np.loadtxt(
            blob.split(b"\n"), np.float32, comments=None, ndmin=2, encoding="latin-1"
        )
    except ValueError:
        return None
    if values.shape[1:] != (width,) or not (allow_nonfinite or np.isfinite(values).all()):
        return None
    return values


# --- SWAR decoding (see the module docstring) ---------------------------------------------

_U64 = np.dtype("<u8")
_ALL = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_B30 = np.uint64(0x3030_3030_3030_3030)  # '0' in every byte
_B1E = np.uint64(0x1E1E_1E1E_1E1E_1E1E)  # '.' ^ '0'
_B7F = np.uint64(0x7F7F_7F7F_7F7F_7F7F)
_B76 = np.uint64(0x7676_7676_7676_7676)  # 0x7F - 9
_B80 = np.uint64(0x8080_8080_8080_8080)
_LANE8 = np.uint64(0x00FF_00FF_00FF_00FF)
_LANE16 = np.uint64(0x0000_FFFF_0000_FFFF)
_MAX_EXACT = np.uint64(1 << 53)  # larger integers are not all exact in float64
_MAX_POW = 22  # 10**22 is the largest power of ten exact in float64


def _keep_masks(nbytes: int) -> np.ndarray:
    """(nbytes + 1, nbytes // 8) uint64: row n keeps the last n bytes of an nbytes window."""
    masks = np.zeros((nbytes + 1, nbytes), np.uint8)
    for n in range(nbytes + 1):
        masks[n, nbytes - n :] = 0xFF
    return masks.view(_U64)


# _KEEP[w][j][n]: word j of the mask keeping the last n bytes of a (8 * w)-byte window.
_KEEP = {w: [_keep_masks(8 * w)[:, j].copy() for j in range(w)] for w in (1, 2)}
_P10 = 10.0 ** np.arange(_MAX_POW + 1)
# value = m / _SCALE[f] (f <= 16 digits after the point), row 17 + f for a negative sign.
_SCALE = np.concatenate([_P10[:17], -_P10[:17]])
# value = m * _MUL[22 + k] / _DIV[22 + k] for |k| <= 22 (one factor is 1); rows 45.. negate.
_MUL = np.concatenate([np.ones(_MAX_POW), _P10])
_DIV = np.concatenate([_P10[:0:-1], np.ones(_MAX_POW + 1)])
_MUL = np.concatenate([_MUL, -_MUL])
_DIV = np.concatenate([_DIV, _DIV])


def _load(words: np.ndarray, pos: np.ndarray, count: int) -> list[np.ndarray]:
    """``count`` consecutive little-endian 64-bit words starting at byte offsets ``pos``.

    ``words``: an 8-aligned byte buffer viewed as uint64; two aligned gathers and shifts
    per word are several times faster here than gathering from an unaligned view.
    """
    q = pos >> 3
    shift = ((pos & 7) << 3).view(np.uint64)
    back = np.uint64(64) - shift  # numpy defines x << 64 as 0: no special case for shift 0
    parts = [words[q + i] for i in range(count + 1)]
    return [(parts[i] >> shift) | (parts[i + 1] << back) for i in range(count)]


def _eight_digits(x: np.ndarray) -> np.ndarray:
    """uint64 words of eight digits 0..9 (the first in the lowest byte) -> their values."""
    x = x * np.uint64(10) + (x >> np.uint64(8))  # pairs
    x = ((x & _LANE8) * np.uint64(100 * (1 << 16) + 1)) >> np.uint64(16)  # quads
    return ((x & _LANE16) * np.uint64(10000 * (1 << 32) + 1)) >> np.uint64(32)


def _non_digits(x: np.ndarray) -> np.ndarray:
    """0x80 in each byte of ``x`` that is greater than 9 (exact: no carry leaves a byte)."""
    return (((x & _B7F) + _B76) | x) & _B80


def _decode(
    words: np.ndarray,
    u: np.ndarray,
    s: np.ndarray,
    me: np.ndarray,
    k: np.ndarray | None,
    nwords: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Decode the fields starting at ``s`` with mantissa ending at ``me``, times 10**k.

    ``u``: the bytes (uint8, 8-aligned), ``words``: the same as uint64. ``k``: decimal
    exponents, None for 0. ``nwords``: 1 or 2; a mantissa, point included, must fit in
    8 * nwords bytes. Returns (values float32, slow bool), shapes like ``s``; ``slow``
    marks fields not of the form ``[+-](digits[.digits]|.digits)`` or outside Clinger's
    fast path -- their values are garbage.
    """
    size = 8 * nwords
    first = u[s]
    neg = first == 45  # '-'
    n = me - s  # mantissa bytes, point included
    n -= neg | (first == 43)  # '+'
    nc = np.minimum(n, size)
    x = _load(words, me - size, nwords)  # x[0] holds the most significant digits
    slow = n > size
    points = np.zeros(len(s), np.uint8)
    point = []
    for j, keep in enumerate(_KEEP[nwords]):
        x[j] ^= _B30  # digits become 0..9, '.' becomes 0x1E
        x[j] &= keep[nc]  # bytes before the mantissa become 0
        y = x[j] ^ _B1E
        p = ~(((y & _B7F) + _B7F) | y) & _B80  # 0x80 where the byte was '.' (exact)
        x[j] ^= (p >> np.uint64(7)) * np.uint64(0x1E)  # the point becomes a 0
        slow |= _non_digits(x[j]) != 0
        points += np.bitwise_count(p)
        point.append(p)
    slow |= (points > 1) | (n <= points)  # two points, or no digit
    # Squeeze the point out: the bytes after it move one byte down, over it. The point
    # and each digit after it are a division by ten.
    shift = points
    moved = []
    seen = None  # the point was in an earlier word
    for j in range(nwords):
        after = ~((point[j] << np.uint64(1)) - np.uint64(1))  # bytes above the point, or 0
        if seen is None:
            seen = point[j] != 0
        else:
            after = np.where(seen, _ALL, after)
            seen |= point[j] != 0
        shift = shift + (np.bitwise_count(after) >> 3)
        moved.append(x[j] & after)
        x[j] ^= moved[j]
    m = np.zeros(len(s), np.uint64)
    for j in range(nwords):
        x[j] |= moved[j] >> np.uint64(8)
        if j + 1 < nwords:
            x[j] |= moved[j + 1] << np.uint64(56)
        m = m * np.uint64(100_000_000) + _eight_digits(x[j])
    if nwords > 1:
        slow |= m > _MAX_EXACT
    v = m.astype(np.float64)
    if k is None:  # value = m / 10**shift, the sign carried by the divisor
        v /= _SCALE[shift + neg.view(np.uint8) * np.uint8(len(_SCALE) // 2)]
    else:  # value = m * 10**(k - shift)
        row = (k - shift + _MAX_POW).view(np.uint64)  # 0..44 when in range, else huge
        slow |= row > 2 * _MAX_POW
        np.minimum(row, 2 * _MAX_POW, out=row)
        row += neg.view(np.uint8) * np.uint8(len(_MUL) // 2)
        v *= _MUL[row]
        v /= _DIV[row]
    return v.astype(np.float32), slow


def _decode_slices(
    words: np.ndarray,
    u: np.ndarray,
    s: np.ndarray,
    me: np.ndarray,
    k: np.ndarray | None,
    nwords: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """_decode in slices of _SLICE fields (temporaries stay in cache)."""
    values = np.empty(len(s), np.float32)
    slow = np.empty(len(s), bool)
    for i in range(0, len(s), _SLICE):
        j = i + _SLICE
        values[i:j], slow[i:j] = _decode(
            words, u, s[i:j], me[i:j], None if k is None else k[i:j], nwords
        )
    return values, slow


def _decode_exponents(
    words: np.ndarray,
    u: np.ndarray,
    s: np.ndarray,
    e: np.ndarray,
    values: np.ndarray,
    slow: np.ndarray,
) -> None:
    """Decode again, in place, the ``slow`` fields [s, e) (sorted) that hold one 'e'/'E'.

    Exponents of the form ``[+-]? 1..8 digits`` are decoded vectorised; the other fields
    keep ``slow`` set.
    """
    idx = np.flatnonzero(slow)
    lo, hi = int(s[idx[0]]), int(e[idx[-1]])
    pos = np.flatnonzero((u[lo:hi] | 0x20) == ord("e")) + lo
    if len(pos) == len(s) and ((s < pos) & (pos < e)).all():
        tok = np.arange(len(s))  # one 'e' in every field (%e style)
    else:
        tok = np.searchsorted(s, pos, "right") - 1  # the field each 'e' may be in
        keep = (pos < e[tok]) & slow[tok]
        keep[1:] &= tok[1:] != tok[:-1]  # fields with two 'e' stay slow
        keep[:-1] &= tok[:-1] != tok[1:]
        tok, pos = tok[keep], pos[keep]
    end = e[tok]
    sign = u[pos + 1]
    negative = sign == 45
    digits = end - pos - 1
    digits -= negative | (sign == 43)
    (x,) = _load(words, end - 8, 1)
    x ^= _B30
    x &= _KEEP[1][0][np.minimum(digits, 8)]
    ok = (_non_digits(x) == 0) & (digits >= 1) & (digits <= 8)
    exponent = _eight_digits(x).view(np.int64)
    np.negative(exponent, out=exponent, where=negative)
    tok, pos, exponent = tok[ok], pos[ok], exponent[ok]
    start = s[tok]
    nwords = 1 if len(tok) and (pos - start).max() <= 9 else 2  # %.6e: 8 + a sign
    values[tok], slow[tok] = _decode_slices(words, u, start, pos, exponent, nwords)


# --- the precise path ---------------------------------------------------------------------


def _parse_block_slowly(
    state: _State, blob: bytes, first_line: int, line_ends: list[int]
) -> np.ndarray:
    """Parse the lines of ``blob`` one field at a time; raise at the first problem.

    ``line_ends``: offsets just past each line. Updates ``state`` like the fast path.
    Returns float32 (rows, width).
    """
    rows: list[np.ndarray] = []
    begin = 0
    with np.errstate(over="ignore"):  # beyond float32: Inf, checked below
        for i, end in enumerate(line_ends):
            line = first_line + i
            fields = blob[begin:end].split()
            begin = end
            if not fields:
                if state.blank_line is None:
                    state.blank_line = line
                continue
            if state.blank_line is not None:
                raise state.blank_error(line)
            if state.width is None:
                state.width, state.width_line = len(fields), line
            if len(fields) != state.width:
                raise state.width_error(line, len(fields))
            row = np.empty(state.width, np.float32)
            for j, field in enumerate(fields):
                value = parse_field(field)
                if value is None:
                    raise state.not_a_number(line, j + 1, field)
                row[j] = value
                if not state.allow_nonfinite and not np.isfinite(row[j]):
                    raise state.nonfinite_error(line, j + 1, field)
            rows.append(row)
    if not rows:
        return np.empty((0, state.width or 0), np.float32)
    return np.stack(rows)
