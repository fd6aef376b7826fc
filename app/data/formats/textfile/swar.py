"""The numpy decoding kernel: many decimal fields at once, by SWAR arithmetic on 64-bit words.

Each field's mantissa is decoded from the one or two little-endian 64-bit words that end
at it: digit check, decimal point found and squeezed out, eight digits combined by three
multiply-shifts (D. Lemire, "Number parsing at a gigabyte per second", Software: Practice
and Experience 51(8), 2021; the same tricks as simdjson and fast_float). The integer
mantissa ``m <= 2**53`` times ``10**k`` with ``|k| <= 22`` is one correctly rounded float64
operation, both operands being exact (Clinger's fast path: W. D. Clinger, "How to read
floating point numbers accurately", PLDI 1990), then rounded to float32: the value numpy
gives for the text. Fields outside that range are marked ``slow`` for the caller
(:mod:`app.data.formats.textfile.numpy_path`) to decode otherwise.

The bytes are a uint8 buffer ``u`` (8-aligned, with padding before and after the data:
:mod:`app.data.formats.textfile.reader`) and ``words``, the same buffer viewed as uint64; fields
are given by their start and end offsets in it.
"""

from __future__ import annotations

import numpy as np

#: Fields decoded per call in the passes over a whole block (temporaries stay in cache).
SLICE = 32768

#: How ``words`` views the byte buffer: little-endian 64-bit words.
U64 = np.dtype("<u8")
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
    return masks.view(U64)


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


def decode(
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
    x = _load(words, me - size, nwords)  # x[0] holds the most significant digits
    slow = n > size
    point, points = _digits(x, np.minimum(n, size), slow)
    slow |= (points > 1) | (n <= points)  # two points, or no digit
    m, shift = _squeeze_point(x, point, points)
    if nwords > 1:
        slow |= m > _MAX_EXACT
    v = m.astype(np.float64)
    if k is None:  # value = m / 10**shift, the sign carried by the divisor
        v /= _SCALE[shift + neg.view(np.uint8) * np.uint8(len(_SCALE) // 2)]
    else:  # value = m * 10**(k - shift)
        slow |= _times_power_of_ten(v, k - shift, neg)
    return v.astype(np.float32), slow


def _digits(
    x: list[np.ndarray], nc: np.ndarray, slow: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray]:
    """Make the words ``x`` (each mantissa's last ``nc`` bytes at their end) digits 0..9,
    in place: the bytes before the mantissa and a '.' become 0. Sets ``slow`` where a
    byte is neither a digit nor a point. Returns (per word, 0x80 in the byte that was the
    point; per field, the number of points)."""
    points = np.zeros(len(nc), np.uint8)
    point = []
    for j, keep in enumerate(_KEEP[len(x)]):
        x[j] ^= _B30  # digits become 0..9, '.' becomes 0x1E
        x[j] &= keep[nc]  # bytes before the mantissa become 0
        y = x[j] ^ _B1E
        p = ~(((y & _B7F) + _B7F) | y) & _B80  # 0x80 where the byte was '.' (exact)
        x[j] ^= (p >> np.uint64(7)) * np.uint64(0x1E)  # the point becomes a 0
        slow |= _non_digits(x[j]) != 0
        points += np.bitwise_count(p)
        point.append(p)
    return point, points


def _squeeze_point(
    x: list[np.ndarray], point: list[np.ndarray], points: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The mantissas of the digit words ``x`` (in place: the bytes after the point move one
    byte down, over it) as (integers uint64, the power of ten to divide them by: the
    point and each digit after it, uint8)."""
    nwords = len(x)
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
    m = np.zeros(len(points), np.uint64)
    for j in range(nwords):
        x[j] |= moved[j] >> np.uint64(8)
        if j + 1 < nwords:
            x[j] |= moved[j + 1] << np.uint64(56)
        m = m * np.uint64(100_000_000) + _eight_digits(x[j])
    return m, shift


def _times_power_of_ten(v: np.ndarray, exponent: np.ndarray, neg: np.ndarray) -> np.ndarray:
    """Multiply the float64 ``v`` by ``10**exponent`` in place, negated where ``neg``; one
    correctly rounded operation (both factors exact) while ``|exponent| <= 22``. Returns
    where the exponent is out of that range (those values are garbage)."""
    row = (exponent + _MAX_POW).view(np.uint64)  # 0..44 when in range, else huge
    out_of_range = row > 2 * _MAX_POW
    np.minimum(row, 2 * _MAX_POW, out=row)
    row += neg.view(np.uint8) * np.uint8(len(_MUL) // 2)
    v *= _MUL[row]
    v /= _DIV[row]
    return out_of_range


def decode_slices(
    words: np.ndarray,
    u: np.ndarray,
    s: np.ndarray,
    me: np.ndarray,
    k: np.ndarray | None,
    nwords: int = 2,
) -> tuple[np.ndarray, np.ndarray]:
    """decode in slices of SLICE fields (temporaries stay in cache)."""
    values = np.empty(len(s), np.float32)
    slow = np.empty(len(s), bool)
    for i in range(0, len(s), SLICE):
        j = i + SLICE
        values[i:j], slow[i:j] = decode(
            words, u, s[i:j], me[i:j], None if k is None else k[i:j], nwords
        )
    return values, slow


def decode_exponents(
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
    values[tok], slow[tok] = decode_slices(words, u, start, pos, exponent, nwords)
