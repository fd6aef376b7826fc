"""The SWAR kernel (app/data/formats/textfile/swar.py): its tables, built once at import, and its
decoders on fields laid out as the reader lays them out; tests/test_textfile.py checks the
values they give through whole files."""

from __future__ import annotations

import numpy as np
import pytest

from app.data.formats.textfile import swar
from app.data.formats.textfile.reader import PAD


@pytest.mark.parametrize("nbytes", [8, 16])
def test_the_keep_masks_keep_the_last_n_bytes_of_a_window(nbytes: int) -> None:
    masks = swar._keep_masks(nbytes)
    assert masks.dtype == swar.U64 and masks.shape == (nbytes + 1, nbytes // 8)
    for n in range(nbytes + 1):
        assert masks[n].tobytes() == bytes(nbytes - n) + b"\xff" * n


def _fields(tokens: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tokens on one line as the reader lays them out: (bytes u, u as words, starts,
    ends). PAD blanks before, the line's end 8-aligned and then only the 8 readable bytes
    the reader promises."""
    text = " ".join(tokens).encode()
    front = PAD + (-(PAD + len(text)) % 8)
    u = np.full(front + len(text) + 8, 32, np.uint8)
    u[front : front + len(text)] = np.frombuffer(text, np.uint8)
    starts, ends, at = [], [], front
    for token in tokens:
        starts.append(at)
        ends.append(at + len(token))
        at += len(token) + 1
    return u, u.view(swar.U64), np.array(starts), np.array(ends)


def _expected(tokens: list[str]) -> np.ndarray:
    """What numpy makes of the text: the correctly rounded double, then float32."""
    return np.array([float(t) for t in tokens], np.float64).astype(np.float32)


def test_a_field_ending_the_buffer_is_decoded_from_the_bytes_before_it() -> None:
    """The reader leaves 8 readable bytes after the last line: enough for both widths."""
    tokens = ["12.5", "-0.25", "7"]
    u, words, s, e = _fields(tokens)
    for nwords in (1, 2):
        values, slow = swar.decode(words, u, s, e, None, nwords)
        assert values.tolist() == _expected(tokens).tolist() and not slow.any()


@pytest.mark.parametrize("nwords", [1, 2, None])
def test_the_decoders_give_float32_values(nwords: int | None) -> None:
    """decode with one or two words, and decode_slices (None): samples are float32."""
    tokens = ["0.1", "-3.75", "1234.567"]
    u, words, s, e = _fields(tokens)
    if nwords is None:
        values, slow = swar.decode_slices(words, u, s, e, None)
    else:
        values, slow = swar.decode(words, u, s, e, None, nwords)
    assert values.dtype == np.float32 and not slow.any()
    np.testing.assert_array_equal(values, _expected(tokens))


def test_a_mantissa_of_2_to_the_53_is_exact_and_decoded() -> None:
    """2**53 is decoded; 2**53 + 1, not exact in float64, is left for the caller."""
    tokens = ["9007199254740992", "-9007199254740992", "9007199254740993"]
    u, words, s, e = _fields(tokens)
    values, slow = swar.decode(words, u, s, e, None, 2)
    assert slow.tolist() == [False, False, True]
    assert values[:2].tolist() == _expected(tokens[:2]).tolist()


# Exponents of 1 and 8 digits, |k| = 22 (the last exact power of ten), a mantissa of 10
# bytes with its sign (more than one word), alone or among short ones.
@pytest.mark.parametrize(
    "tokens",
    [
        ["1e5", "-2.5e-3", "5e00000007", "-4e-00000008"],
        ["7e22", "-7e22", "3e-22", "-12.5e+20"],
        ["-1.2345678e5"],
        ["1e1", "-1.2345678e-5", "9.87654321e+03"],
    ],
)
def test_exponents_at_the_edges_of_the_vectorised_pass_are_decoded(tokens: list[str]) -> None:
    u, words, s, e = _fields(tokens)
    values = np.zeros(len(tokens), np.float32)
    slow = np.ones(len(tokens), bool)
    swar.decode_exponents(words, u, s, e, values, slow)
    assert not slow.any()
    assert values.tolist() == _expected(tokens).tolist()
