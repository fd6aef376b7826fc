"""The compiled fast path (app/data/formats/textfile/_fastparse.c): built, exact, hands over what
it can't take."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.data.formats import textfile
from app.data.formats.textfile import blocks as fast_path
from app.data.formats.textfile import reader
from tests.conftest import REPO

fast = pytest.importorskip(
    "app.data.formats.textfile._fastparse",
    reason="app.data.formats.textfile._fastparse is not built (no C compiler at install)",
)


def test_built_wherever_a_compiler_is_present() -> None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) on this machine")
    assert fast_path.compiled is fast


def _parse(text: bytes, width: int) -> tuple[int, np.ndarray]:
    u = np.frombuffer(b" " * 16 + text + b" " * 8, np.uint8)
    out = np.full((text.count(b"\n"), width), -7.0, np.float32)
    return fast.parse_lines(u, 16, 16 + len(text), width, out), out


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        (b"1 2\n3 4\n", 2),
        (b"1 2\n3 x\n5 6\n", 1),  # not a number
        (b"1 2\n\n5 6\n", 1),  # blank line: the numpy path decides
        (b"1 2\n3\n", 1),  # too few fields
        (b"1 2\n3 4 5\n", 1),  # too many
        (b"1 nan\n", 0),
        (b"1 -inf\n", 0),
        (b"1 1e23\n", 0),  # beyond 10**22: not one exact operation
        (b"1 12345678901234567890\n", 0),  # 20 significant digits
        (b"1 9007199254740993\n", 0),  # 2**53 + 1: not exact in a double
        (b"1 1_0\n", 0),  # float() accepts it; left to the numpy path
        (b"1 2\x01\n", 0),  # control byte
        (b"1 .\n", 0),
        (b"1 1e\n", 0),
        (b"1 -\n", 0),
        (b"\t1\x0b2\x0c\r\n", 1),  # the bytes.split() whitespace set
    ],
)
def test_stops_at_the_first_line_it_does_not_take(text: bytes, rows: int) -> None:
    done, out = _parse(text, 2)
    assert done == rows
    taken = [[float(t) for t in line.split()] for line in text.split(b"\n")[:rows]]
    np.testing.assert_array_equal(out[:rows], np.array(taken, np.float32).reshape(rows, 2))


def test_rejects_text_that_does_not_end_a_line() -> None:
    u = np.frombuffer(b"1 2\n3 4", np.uint8)
    with pytest.raises(ValueError, match="text\\[stop-1\\]"):
        fast.parse_lines(u, 0, len(u), 2, np.empty((2, 2), np.float32))


def _token(rng: np.random.Generator, wide: bool) -> str:
    """A decimal of any shape the grammar allows; ``wide``: also beyond the exact range."""
    sign = rng.choice(["", "-", "+"])
    digits = "".join(rng.choice(list("0123456789"), int(rng.integers(1, 22 if wide else 16))))
    point = int(rng.integers(0, len(digits) + 1))
    zeros = "0." + "0" * int(rng.integers(0, 6)) + digits[:3]
    mantissa = rng.choice([digits, digits[:point] + "." + digits[point:], zeros])
    top = 30 if wide else 6
    exp = rng.choice(["", f"e{int(rng.integers(-top, top + 1))}", f"E+{int(rng.integers(0, top))}"])
    return f"{sign}{mantissa}{exp}"


@pytest.mark.parametrize("seed", range(4))
def test_random_decimals_match_float_and_the_numpy_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    wide = rng.random(400) < 0.2  # lines that may hold tokens beyond the exact range
    lines = [[_token(rng, bool(w)) for _ in range(8)] for w in wide]
    tokens = [t for line in lines for t in line]
    text = "".join(" ".join(line) + "\n" for line in lines)
    path = tmp_path / "random.txt"
    path.write_text(text)
    taken = sum(_parse((" ".join(line) + "\n").encode(), 8)[0] for line in lines)
    assert taken >= 0.7 * len(lines)  # most lines go through the compiled path
    compiled = np.concatenate(list(textfile.iter_chunks(path, chunk_rows=50, allow_nonfinite=True)))
    with np.errstate(over="ignore"):
        expected = np.array([float(t) for t in tokens], np.float64).astype(np.float32)
    assert np.array_equal(compiled.reshape(-1).view(np.uint32), expected.view(np.uint32))
    monkeypatch.setattr(fast_path, "compiled", None)
    numpy_path = np.concatenate(
        list(textfile.iter_chunks(path, chunk_rows=50, allow_nonfinite=True))
    )
    assert np.array_equal(compiled.view(np.uint32), numpy_path.view(np.uint32))


#: Fields of the grammar's shapes: plain ones of up to 10 digits a side (the vector path takes
#: up to 8), exponents and signs (the byte path), separators of every kind and width.
_FIELD = st.from_regex(r"[+-]?[0-9]{0,10}(\.[0-9]{0,10})?([eE][+-]?[0-9]{1,2})?", fullmatch=True)
_PLAIN = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")
_SEPARATOR = st.sampled_from([" ", "  ", "\t", " \r", "\x0b", "\x0c"])


@settings(max_examples=400, derandomize=True, deadline=None)
@given(
    st.lists(st.tuples(_FIELD, _SEPARATOR), min_size=1, max_size=6),
    st.integers(0, 40),
    st.integers(0, 24),
)
def test_a_field_has_its_value_wherever_it_lies_in_the_buffer(
    fields: list[tuple[str, str]], before: int, after: int
) -> None:
    """Fields near the buffer's ends take the byte path, the others the vector path (x86-64):
    shifting a line through the buffer's first and last 24 bytes must not change a value,
    nor whether the line is taken."""
    tokens = [t for t, _ in fields]
    line = "".join(t + sep for t, sep in fields).rstrip() + "\n"
    u = np.frombuffer(b" " * before + line.encode() + b" " * after, np.uint8)
    out = np.full((1, len(tokens)), -7.0, np.float32)
    taken = fast.parse_lines(u, before, before + len(line), len(tokens), out)
    if all(_PLAIN.fullmatch(t) and sum(c.isdigit() for c in t) <= 15 for t in tokens):
        assert taken == 1  # plain fields of at most 15 digits: always exact, always taken
    if taken:
        expected = np.array([float(t) for t in tokens], np.float64).astype(np.float32)
        assert np.array_equal(out[0].view(np.uint32), expected.view(np.uint32)), line


#: Parses lines laid against a page that can't be read (PROT_NONE), at the start and at the
#: end of a readable page: a read outside the buffer is a SIGSEGV, not a wrong value.
_GUARDED = """
import ctypes, mmap, sys
import numpy as np
from app.data.formats.textfile import _fastparse as fast

page = mmap.PAGESIZE
area = mmap.mmap(-1, 3 * page)
base = ctypes.addressof(ctypes.c_char.from_buffer(area))
libc = ctypes.CDLL(None, use_errno=True)
for guard in (base, base + 2 * page):
    assert libc.mprotect(ctypes.c_void_p(guard), page, 0) == 0
rng = np.random.default_rng(int(sys.argv[1]))
checked = 0
for _ in range(3000):
    width = int(rng.integers(1, 5))
    values = rng.choice([0.0, 1.0, 1e-3, 1e3], width) * rng.standard_normal(width)
    fmt = str(rng.choice(["%.6g", "%.8f", "%.1f", "%d"]))
    line = (" ".join(fmt % v if fmt != "%d" else str(int(v)) for v in values) + "\\n").encode()
    for at_start in (True, False):
        offset = page if at_start else 2 * page - len(line)
        area[offset : offset + len(line)] = line
        text = np.frombuffer(area, np.uint8, count=len(line), offset=offset)
        out = np.zeros((1, width), np.float32)
        assert fast.parse_lines(text, 0, len(line), width, out) == 1, line
        expected = np.array([float(t) for t in line.split()], np.float64).astype(np.float32)
        assert np.array_equal(out.view(np.uint32), expected[None].view(np.uint32)), line
        checked += 1
print(checked)
"""


@pytest.mark.parametrize("seed", range(2))
def test_never_reads_outside_the_buffer(seed: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _GUARDED, str(seed)],
        cwd=REPO, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["6000"]


def test_a_file_mixing_both_paths_in_one_block(tmp_path: Path) -> None:
    """Plain lines, a NaN line (numpy path from there), plain lines again: one block, in order."""
    path = tmp_path / "mixed.txt"
    path.write_text("1 2 3\n4 5 6\n7 nan 9\n10 11 12\n")
    got = np.concatenate(list(textfile.iter_chunks(path, allow_nonfinite=True)))
    expected = np.array([[1, 2, 3], [4, 5, 6], [7, np.nan, 9], [10, 11, 12]], np.float32)
    np.testing.assert_array_equal(got, expected)


def test_newline_offsets_are_numpys_whatever_the_room() -> None:
    """The compiled offsets equal ``flatnonzero(u == 10)``: no newline, all newlines, random
    densities, a view into a larger buffer; and the reader's wrapper, whose first guess of
    room (one line in 4 KiB) is too small for short lines, retries with the count."""
    rng = np.random.default_rng(7)
    cases = [b"", b"abc", b"\n", b"\n" * 5000, b"a\nb\n\nc"]
    cases += [bytes(rng.choice([10, 32, 48], size=n, p=[p, 0.5, 0.5 - p])) for n, p in
              [(1, 0.5), (4097, 0.001), (100_000, 0.01), (100_000, 0.3)]]  # fmt: skip
    for text in cases:
        u = np.frombuffer(text, np.uint8)
        expected = np.flatnonzero(u == 10)
        out = np.full(len(expected) + 2, -1, np.int64)
        assert fast.newline_offsets(u, out) == len(expected)
        assert out[: len(expected)].tolist() == expected.tolist() and out[-2:].tolist() == [-1, -1]
        small = np.full(1, -1, np.int64)  # room for one: the first written, all counted
        assert fast.newline_offsets(u, small) == len(expected)
        assert small.tolist() == expected[:1].tolist() + [-1] * (len(expected) == 0)
        got = reader.newline_offsets(u)
        assert got.dtype == np.int64 and got.tolist() == expected.tolist()
    wide = np.frombuffer(b"xx\nyy\n\nzz", np.uint8)
    assert reader.newline_offsets(wide[3:]).tolist() == [2, 3]


def test_column_sums_are_numpys() -> None:
    values = np.random.default_rng(4).standard_normal((300, 7)).astype(np.float32)
    sums, sums_sq = np.ones(7), np.zeros(7)
    fast.add_column_sums(values, 7, sums, sums_sq)
    np.testing.assert_array_equal(sums, 1 + values.sum(axis=0, dtype=np.float64))
    np.testing.assert_array_equal(sums_sq, np.einsum("ij,ij->j", values, values, dtype=np.float64))
    with pytest.raises(ValueError, match="add_column_sums"):
        fast.add_column_sums(values, 6, sums, sums_sq)
