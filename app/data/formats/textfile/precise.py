"""The precise path: one field at a time, and the error messages of every path.

A block the fast paths can't take whole (a field that is not a number, NaN/Inf when not
allowed, a wrong number of fields, data after a blank line) is parsed again here, line by
line, to raise the DataError naming the first bad line and field: ``<path>:<line>:``
with `` field <n>:`` (1-based) and the field quoted (escaped, truncated) where one field is
to blame. :class:`State` carries what is known about the file so far (its width, the blank
line a run of blank lines began at, the decoding style) from block to block, for every path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from app.data.formats.textfile.reader import Buffers
from app.errors import DataError

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
class State:
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

    def infer_width(self, line: np.ndarray, number: int) -> int | None:
        """The width; when it is not known yet, taken from ``line`` (the bytes of line
        ``number``, uint8) if that line has fields. None: still unknown (a blank line)."""
        if self.width is None:
            fields = len(line.tobytes().split())
            if fields:
                self.width, self.width_line = fields, number
        return self.width

    def where(self, line: int, field: int | None = None) -> str:
        """``<path>:<line>:``, with `` field <n>:`` when given."""
        place = f"{self.path}:{line}:"
        return place if field is None else f"{place} field {field}:"

    def width_error(self, line: int, found: int, text: bytes = b"") -> DataError:
        """A line with the wrong number of fields (``text``: the line, for a hint)."""
        if self.width_hint:
            why = f" ({self.width_hint})"
        elif self.width_line is not None:
            why = f" (as on line {self.width_line})"
        else:
            why = ""
        return DataError(
            f"{self.where(line)} expected {self.width} fields{why}, found {found}"
            + looks_like(text)
        )

    def blank_error(self, line: int) -> DataError:
        """Data on ``line`` after a blank line (the message names the blank line)."""
        blank = self.blank_line if self.blank_line is not None else line
        return DataError(f"{self.where(blank)} blank line followed by more data on line {line}")

    def not_a_number(self, line: int, field: int, token: bytes, text: bytes = b"") -> DataError:
        """A field outside the grammar of parse_field (``text``: the line, for a hint)."""
        return DataError(
            f"{self.where(line, field)} not a number: {_shown(token)}{looks_like(text or token)}"
        )

    def nonfinite_error(self, line: int, field: int, token: bytes) -> DataError:
        """NaN/Inf, or a value beyond float32's range, when not allowed."""
        return DataError(
            f"{self.where(line, field)} non-finite value {_shown(token)} in float32 "
            "(NaN/Inf are rejected unless allowed: --allow-nonfinite)"
        )


#: A carriage return that ends a line by itself (old Mac OS text): one before a field. A
#: CR before a newline, another CR or a space is whitespace the parser skips.
_LONE_CR = re.compile(rb"\r[^\s]")
#: The hint for such a file (the parser reads it as one line of every row's fields).
LONE_CR_HINT = (
    "; its lines end in a lone carriage return (\\r, as old Mac OS wrote them), not a "
    "newline: convert them (e.g. tr '\\r' '\\n' < FILE)"
)


def lone_cr(text: bytes) -> bool:
    """Whether ``text`` holds a carriage return that ends a line by itself."""
    return _LONE_CR.search(text) is not None


#: The start of files that are not this text format, and what they are.
_MAGIC = (
    (b"\x93NUMPY", "a NumPy .npy file, not text (numbers separated by whitespace)"),
    (b"PK\x03\x04", "a .npz (zip) archive, not text (numbers separated by whitespace)"),
    (b"BZh", "a bzip2-compressed file: decompress it (gzip is read as it is)"),
    (b"\xfd7zXZ\x00", "an xz-compressed file: decompress it (gzip is read as it is)"),
    (b"\xff\xfe", "UTF-16 text: the format is ASCII or UTF-8 (iconv -f UTF-16 -t UTF-8)"),
    (b"\xfe\xff", "UTF-16 text: the format is ASCII or UTF-8 (iconv -f UTF-16 -t UTF-8)"),
)


def looks_like(text: bytes) -> str:
    """A hint for a line of a file that is not whitespace-separated text: a NumPy ``.npy``
    or ``.npz`` file, bzip2 or xz compression, UTF-16 (by their first bytes: numpy's, zip's,
    bzip2's and xz's magic numbers, a UTF-16 byte order mark), lines ended by a lone
    carriage return, or numbers separated by commas or semicolons (a CSV file); "" when
    the line looks like none of them."""
    start = text.removeprefix(b"\xef\xbb\xbf")
    for magic, what in _MAGIC:
        if start.startswith(magic):
            return f"; this looks like {what}"
    if lone_cr(start):
        return LONE_CR_HINT
    for sep in (b",", b";"):
        parts = [p.strip() for p in start.split(sep)]
        if len(parts) > 1 and all(parse_field(p) is not None for p in parts if p):
            return (
                f"; the fields look {'comma' if sep == b',' else 'semicolon'}-separated: the "
                f"text format separates them by whitespace (e.g. tr '{sep.decode()}' ' ' < FILE)"
            )
    return ""


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


def parse_block_slowly(
    state: State, blob: bytes, first_line: int, line_ends: list[int]
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
            text, begin = blob[begin:end], end
            fields = text.split()
            if not fields:
                if state.blank_line is None:
                    state.blank_line = line
                continue
            if state.blank_line is not None:
                raise state.blank_error(line)
            if state.width is None:
                state.width, state.width_line = len(fields), line
            if len(fields) != state.width:
                raise state.width_error(line, len(fields), text)
            row = np.empty(state.width, np.float32)
            for j, field in enumerate(fields):
                value = parse_field(field)
                if value is None:
                    raise state.not_a_number(line, j + 1, field, text)
                row[j] = value
                if not state.allow_nonfinite and not np.isfinite(row[j]):
                    raise state.nonfinite_error(line, j + 1, field)
            rows.append(row)
    if not rows:
        return np.empty((0, state.width or 0), np.float32)
    return np.stack(rows)
