"""The numpy path: a block of lines parsed with a few numpy passes, no Python per field.

Lines are taken ~:data:`_GROUP_BYTES` at a time (temporaries stay in cache) and split into
fields with a few passes over the bytes; each group's fields are then decoded by the SWAR
kernel (:mod:`app.data.formats.textfile.swar`) with one 64-bit word per field when they are short
on average, else two, or exponents first when the file is mostly exponents. What that
first pass leaves is decoded, for the whole block, with two words, then exponents when
there are many, then one by one with ``float()``
(:func:`~app.data.formats.textfile.precise.parse_field`)
-- or by ``np.loadtxt`` when most fields are like that (numpy's default ``%.18e``,
``repr()``). A block with any problem is parsed again by the precise path
(:mod:`app.data.formats.textfile.precise`), which names the first bad line and field.
"""

from __future__ import annotations

import numpy as np

from app.data.formats.textfile.precise import State, parse_block_slowly, parse_field
from app.data.formats.textfile.swar import U64, decode, decode_exponents, decode_slices

_GROUP_BYTES = 256 << 10  # lines decoded together (temporaries stay in cache)
_ONE_WORD_BYTES = 10  # bytes per field (with separator) below which one word is tried first
_FEW = 32  # up to this many undecoded fields in a block go straight to float()
_SCAN_PER_CALL = 1024  # bytes scanned for 'e' in about the time of one float() call
#: Fields a first pass left undecoded: (starts, ends, index in the block's flat rows).
Left = tuple[np.ndarray, np.ndarray, np.ndarray]


def parse_block(
    state: State, u: np.ndarray, begin: int, first_line: int, ends: np.ndarray
) -> np.ndarray:
    """The samples of the lines ``u[begin:ends[-1]]`` as float32 (rows, width), without
    the compiled parser; ``first_line``: the number of the line at ``begin``.

    ``u``: the reader's buffer (:func:`app.data.formats.textfile.reader.read_blocks`). Fields are
    found group by group (~_GROUP_BYTES of lines) and decoded with one word, then the
    block's leftovers with two words, with exponents, and one by one. Any surprise sends
    the whole block, with the state it started with, to the precise path, which raises
    the DataError naming the first problem, or returns the values when the surprise was
    only one the fast paths do not handle (a CR between fields). Updates ``state``
    (width, blank line, style).
    """
    blank_line = state.blank_line

    def slowly() -> np.ndarray:
        state.blank_line = blank_line
        blob = u[begin : ends[-1]].tobytes()
        return parse_block_slowly(state, blob, first_line, (ends - begin).tolist())

    width = state.infer_width(u[begin : ends[0]], first_line)
    if width is None:  # a blank first line
        return slowly()
    out = np.empty((len(ends), width), np.float32)
    found = _first_pass(state, u, begin, first_line, ends, out)
    if found is None:
        return slowly()
    rows, left = found
    done: bool | None = True
    if state.style == "bulk":
        done = None
    elif left:
        done = _decode_rest(u.view(U64), u, out.reshape(-1), left, state.allow_nonfinite)
    if done is None and rows:  # too many fields for float() one by one: numpy's parser
        state.style = "bulk"  # and for the rest of the file
        bulk = _loadtxt(u[begin : ends[rows - 1]].tobytes(), width, state.allow_nonfinite)
        if bulk is None:
            return slowly()
        out[:rows] = bulk
    elif done is False:
        return slowly()
    return out[:rows]


def _first_pass(
    state: State, u: np.ndarray, begin: int, first_line: int, ends: np.ndarray, out: np.ndarray
) -> tuple[int, list[Left]] | None:
    """Split the block's lines into fields, group by group (~_GROUP_BYTES of lines), and
    decode each group's fields into ``out`` (rows, width) as far as :func:`_decode_group`
    can.

    Returns (rows: the full lines, before a trailing run of blank lines; per group, the
    fields left undecoded); None asks for the precise path. Raises the DataError of data
    after a blank line that ended an earlier block.
    """
    width = out.shape[1]
    flat = out.reshape(-1)
    words = u.view(U64)
    left: list[Left] = []
    rows = 0
    lo = 0  # first line of the group
    start = begin  # where it starts in u
    while lo < len(ends):
        hi = max(int(np.searchsorted(ends, start + _GROUP_BYTES, "right")), lo + 1)
        fields_ = _split(u, start, ends[lo:hi])
        if fields_ is None:
            return None
        counts, s, e = fields_
        lines = _data_lines(state, counts, first_line + lo, rows)
        if lines is None:
            return None
        if lines and state.style != "bulk":
            values, slow = _decode_group(words, u, s, e, int(ends[lo + lines - 1]) - start, state)
            flat[rows * width : (rows + lines) * width] = values
            idx = np.flatnonzero(slow)
            if len(idx):
                left.append((s[idx], e[idx], idx + rows * width))
        rows += lines
        lo = hi
        start = int(ends[lo - 1])
    return rows, left


def _data_lines(state: State, counts: np.ndarray, first: int, before: int) -> int | None:
    """How many of a group's lines hold data: ``counts``, the fields on each line, line
    ``first`` first; ``before``: the data lines of the block's earlier groups. Full lines,
    then blank lines to the group's end are fine: the first of those is recorded in
    ``state``. None asks for the precise path: a line of another width, data after a blank
    line in this block (the earlier lines may hold a field not decoded yet, and the first
    problem is the one to report); raises the DataError of data after a blank line that
    ended an earlier block."""
    full = counts == state.width
    lines = len(counts)
    if not full.all():  # full lines, then blank lines: fine if only blank lines follow
        lines = int(np.argmin(full))  # the first line not full
        if (counts[lines:] != 0).any():
            return None
    if lines and state.blank_line is not None:
        if before:  # the blank line ended an earlier group of this block
            return None
        raise state.blank_error(first)
    if lines < len(counts) and state.blank_line is None:
        state.blank_line = first + lines
    return lines


def _decode_group(
    words: np.ndarray, u: np.ndarray, s: np.ndarray, e: np.ndarray, nbytes: int, state: State
) -> tuple[np.ndarray, np.ndarray]:
    """First pass over one group's fields [s, e) (spanning ``nbytes``): (values, slow).

    One word when the fields are short on average (%g style), else two; exponents first
    when the previous group was mostly exponents (%e style, ``state.style``).
    """
    if state.style == "exp":
        values = np.empty(len(s), np.float32)
        slow = np.ones(len(s), bool)
        decode_exponents(words, u, s, e, values, slow)
        idx = np.flatnonzero(slow)
        if len(idx) * 8 > len(s):
            state.style = "plain"
        return values, slow
    nwords = 1 if nbytes <= _ONE_WORD_BYTES * len(s) else 2
    values, slow = decode(words, u, s, e, None, nwords)
    idx = np.flatnonzero(slow)
    if len(idx) > _FEW and len(idx) * 8 > len(s):  # mostly exponents?
        decode_exponents(words, u, s, e, values, slow)
        # Mostly decoded now: %e style. Else mostly long mantissas (%.18e, repr()).
        state.style = "exp" if np.count_nonzero(slow) * 8 <= len(s) else "bulk"
    return values, slow


def _split(
    u: np.ndarray, start: int, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Find the fields of the lines ``u[start:ends[-1]]``: (fields per line, starts, ends).

    Field ends are exclusive offsets in ``u``. None asks for the precise path: a control
    byte outside the whitespace set (bytes.split() keeps it inside a field).
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
    return counts, s, e


def _decode_rest(
    words: np.ndarray,
    u: np.ndarray,
    flat: np.ndarray,
    left: list[Left],
    allow_nonfinite: bool,
) -> bool | None:
    """Decode the fields the first pass left, into ``flat``.

    ``left``: (starts, ends, index in flat) per group. Two words, then exponents when
    there are many, then parse_field one by one. Returns True when done; False for a
    field that is not a number, or NaN/Inf (also beyond float32) when not allowed; None
    when too many fields are left for parse_field.
    """
    s, e, at = (np.concatenate(parts) for parts in zip(*left, strict=True))
    values, slow = decode_slices(words, u, s, e, None)
    idx = np.flatnonzero(slow)
    # Exponents here cost a scan of the bytes these fields span: worth it for many.
    if len(idx) > _FEW and e[idx[-1]] - s[idx[0]] < len(idx) * _SCAN_PER_CALL:
        decode_exponents(words, u, s, e, values, slow)
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
    parse_field. It would also split on non-ASCII whitespace (it decodes latin-1: NEL,
    NBSP), which drops such a byte at a field's edge without changing the field count:
    text with a byte beyond ASCII, never part of a number, is left to the precise path.
    None: any doubt (the precise path then names the problem).
    """
    if not blob.isascii():
        return None
    try:
        values = np.loadtxt(
            blob.split(b"\n"), np.float32, comments=None, ndmin=2, encoding="latin-1"
        )
    except ValueError:
        return None
    if values.shape[1:] != (width,) or not (allow_nonfinite or np.isfinite(values).all()):
        return None
    return values
