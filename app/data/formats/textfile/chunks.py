"""A data file's samples as float32 chunks: the reader's blocks of lines, each parsed by the
fast path, with the state (width, blank lines, rows) carried from block to block."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from app.data.formats.textfile import blocks
from app.data.formats.textfile.precise import State
from app.data.formats.textfile.reader import Buffers, Held, read_blocks
from app.errors import DataError


@dataclass
class Span:
    """A part of a plain-text file, bytes ``[start, stop)``, that begins at a line start.

    For parsing one file in several threads (:mod:`app.data.formats.textfile.parallel`). Set by the
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
    text: Held | None = None,
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
    its last call, after every read (from the calling thread). ``text``: the span's bytes,
    read already (app/data/formats/textfile/ahead.py; a span is then required).

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
    state = State(os.fspath(path), width, None, width_hint, allow_nonfinite, buffers=buffers)
    part = span if span is not None else Span()
    state.blank_line = part.blank_line
    next_line = part.first_line
    for first_line, buf, begin, ends in read_blocks(
        state.path, chunk_rows, part.start, part.stop, part.first_line, buffers, progress, text
    ):
        next_line = first_line + len(ends)
        values = blocks.parse_block(state, buf, begin, first_line, ends)
        if len(values):
            state.rows += len(values)
            part.rows = state.rows
            yield values
    part.lines = next_line - part.first_line
    part.rows = state.rows
    part.blank_line = state.blank_line
    if state.rows == 0 and span is None:
        raise DataError(f"{state.path}: empty file (no data lines)")
