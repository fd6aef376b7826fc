"""The text data parser: table-driven over tests/fixtures/data/{good,bad}/, plus generated files.

good/<case>.txt: the parsed values, asserted bit for bit (float32 of the decimal text).
bad/<case>.txt: the DataError message, asserted exactly (file, line, field, problem).
gzip, permission and size cases are generated into tmp_path. Every decoding path of the
parser (one word, two words, exponents, float() one by one, np.loadtxt in bulk) is checked
against numpy's own parsing of the same text.
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.data.textfile import fast, files, is_gzip, iter_chunks, numpy_path, parse_field, precise
from app.errors import DataError

DATA = Path(__file__).parent / "fixtures" / "data"
REPO = Path(__file__).resolve().parents[1]
NAN, INF = math.nan, math.inf
REJECTED = "(NaN/Inf are rejected unless allowed: --allow-nonfinite)"

# case -> (expected rows, iter_chunks keyword arguments)
GOOD: dict[str, tuple[list[list[float]], dict]] = {
    "plain": ([[0.5, -1.25, 3, 4, -0.0, 100], [7.125, 8, -9.5, 10, 11.75, 0.001]], {}),
    "crlf": ([[1, 2, 3, 4, 5, 6], [-1, -2, -3, -4, -5, -6]], {}),
    "whitespace": ([[1, 2, 3, 4, 5, 6], [-1, -2, -3, -4, -5, -6]], {}),
    "bom": ([[1.5, 2.5, 3.5, 4.5, 5.5, 6.5], [0, 0, 0, 0, 0, 1]], {}),
    "exponents": (
        [[1e-3, 2.5e2, -3, 0.45, 600, -72.5], [1e-10, 5, 0.5, 2000, 1, -0.0]],
        {"width": 6},
    ),
    "no_final_newline": ([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]], {}),
    "trailing_blank_lines": ([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]], {}),
    "nonfinite": ([[1, 2, 3, 4, 5, 6], [7, NAN, -INF, INF, NAN, INF]], {"allow_nonfinite": True}),
    "labels": ([[0, 1, 0], [1, 0, 0], [0, 0, 1], [0.25, 0.5, 0.25]], {}),
}

# case -> (message after the path, iter_chunks keyword arguments)
BAD: dict[str, tuple[str, dict]] = {
    "wrong_width": (":3: expected 6 fields (as on line 1), found 5", {}),
    "too_many_fields": (
        ":2: expected 6 fields (H×W = 2×3), found 7",
        {"width": 6, "width_hint": "H×W = 2×3"},
    ),
    "not_a_number": (":2: field 4: not a number: 'abc'", {}),
    "decimal_comma": (":2: field 5: not a number: '5,5'", {}),
    "nan": (f":2: field 3: non-finite value 'nan' in float32 {REJECTED}", {}),
    "inf": (f":3: field 1: non-finite value '-inf' in float32 {REJECTED}", {}),
    "float32_overflow": (f":2: field 5: non-finite value '3.5e38' in float32 {REJECTED}", {}),
    "empty": (": empty file (no data lines)", {}),
    "only_blank_lines": (": empty file (no data lines)", {}),
    "blank_line_then_data": (":3: blank line followed by more data on line 5", {}),
    "blank_line_then_bad_data": (":2: blank line followed by more data on line 3", {}),
    "control_byte": (":2: field 2: not a number: '2\\x01'", {}),
    "not_utf8": (":2: field 6: not a number: '\\xff6'", {}),
    "long_field": (":2: field 6: not a number: '" + "9" * 21 + "...'", {}),
}


@pytest.fixture(autouse=True, params=["compiled", "numpy"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the compiled fast path (when built) and with the numpy path alone."""
    if request.param == "compiled" and fast.compiled is None:
        pytest.skip("app.data._fastparse is not built (no C compiler at install time)")
    if request.param == "numpy":
        monkeypatch.setattr(fast, "compiled", None)
    return request.param


def bits(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns: tells -0.0 from 0.0 and compares NaN exactly."""
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def read_all(path: Path | str, **kwargs) -> np.ndarray:
    chunks = list(iter_chunks(path, **kwargs))
    for chunk in chunks:
        assert chunk.dtype == np.float32 and chunk.ndim == 2
    return np.concatenate(chunks)


def numpy_float32(tokens: list[str]) -> np.ndarray:
    """What numpy makes of the text: the correctly rounded double, then float32."""
    with np.errstate(over="ignore"):
        return np.array([float(t) for t in tokens], np.float64).astype(np.float32)


def test_every_fixture_has_a_case() -> None:
    assert sorted(p.stem for p in (DATA / "good").iterdir()) == sorted(GOOD)
    assert sorted(p.stem for p in (DATA / "bad").iterdir()) == sorted(BAD)


@pytest.mark.parametrize("chunk_rows", [1, 2, 512])
@pytest.mark.parametrize("case", sorted(GOOD))
def test_good_file(case: str, chunk_rows: int) -> None:
    rows, kwargs = GOOD[case]
    expected = np.array(rows, np.float64).astype(np.float32)
    got = read_all(DATA / "good" / f"{case}.txt", chunk_rows=chunk_rows, **kwargs)
    assert got.shape == expected.shape
    np.testing.assert_array_equal(bits(got), bits(expected))


@pytest.mark.parametrize("chunk_rows", [1, 2, 3, 512])  # 3: a block ending in a blank line
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_file(case: str, chunk_rows: int) -> None:
    message, kwargs = BAD[case]
    path = DATA / "bad" / f"{case}.txt"
    with pytest.raises(DataError) as caught:
        read_all(path, chunk_rows=chunk_rows, **kwargs)
    assert str(caught.value) == f"{path}{message}"
    assert caught.value.exit_code == 3


def test_nonfinite_fixture_is_rejected_by_default() -> None:
    path = DATA / "good" / "nonfinite.txt"
    with pytest.raises(DataError, match=r"nonfinite\.txt:2: field 2: non-finite value 'nan'"):
        read_all(path)


def test_wrong_width_on_the_first_line_when_width_is_given() -> None:
    path = DATA / "good" / "plain.txt"
    with pytest.raises(DataError) as caught:
        read_all(path, width=5)
    assert str(caught.value) == f"{path}:1: expected 5 fields, found 6"


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "train_features.txt"
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}: no such file"


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        read_all(tmp_path)
    assert str(caught.value) == f"{tmp_path}: cannot read: Is a directory"


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root reads files whatever their mode; the directory case covers unreadable paths",
)
def test_file_without_read_permission(tmp_path: Path) -> None:
    path = tmp_path / "secret.txt"
    path.write_bytes(b"1 2 3\n")
    path.chmod(0)
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}: cannot read: Permission denied"


def lines_of(n: int, width: int) -> bytes:
    return b"".join(
        b" ".join(b"%d" % (i * width + j) for j in range(width)) + b"\n" for i in range(n)
    )


@pytest.mark.parametrize("name", ["data.txt.gz", "data.txt"])  # gzip is told by its magic
def test_multi_member_gzip(tmp_path: Path, name: str) -> None:
    text = lines_of(3000, 4)
    path = tmp_path / name
    path.write_bytes(gzip.compress(text[:7001]) + gzip.compress(text[7001:]))
    got = read_all(path, chunk_rows=100)
    np.testing.assert_array_equal(got, np.arange(12000, dtype=np.float32).reshape(3000, 4))


def test_truncated_gzip(tmp_path: Path) -> None:
    packed = gzip.compress(lines_of(3000, 4))
    path = tmp_path / "train_labels.txt.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == (
        f"{path}: truncated gzip data: "
        "Compressed file ended before the end-of-stream marker was reached"
    )


def test_a_gzip_file_is_read_as_gzip_whatever_its_name(tiny_data: Path, tmp_path: Path) -> None:
    odd = tmp_path / "labels.dat"
    with open(tiny_data / "train_labels.txt", "rb") as f, gzip.open(odd, "wb") as g:
        shutil.copyfileobj(f, g)
    assert is_gzip(odd)
    rows = sum(len(c) for c in iter_chunks(odd))
    assert rows == len((tiny_data / "train_labels.txt").read_text().splitlines())


def test_corrupt_gzip(tmp_path: Path) -> None:
    packed = bytearray(gzip.compress(lines_of(3000, 4)))
    packed[100:140] = bytes(40)
    path = tmp_path / "test_labels.txt.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value).startswith(f"{path}: corrupt gzip data: ")
    assert "\n" not in str(caught.value)


def test_line_longer_than_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_LINE_BYTES", 100)
    path = tmp_path / "long.txt"
    path.write_bytes(b"1 2\n" + b"3 " * 60 + b"\n")
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}:2: line longer than 100 bytes"


def test_chunks_are_bounded_and_in_order(tmp_path: Path) -> None:
    path = tmp_path / "many.txt"
    path.write_bytes(lines_of(5000, 3))
    sizes = []
    rows = []
    for chunk in iter_chunks(path, chunk_rows=64):
        assert chunk.shape[1] == 3
        sizes.append(len(chunk))
        rows.append(chunk)
    assert max(sizes) <= 64
    assert sum(sizes) == 5000 and len(sizes) == -(-5000 // 64)
    np.testing.assert_array_equal(
        np.concatenate(rows), np.arange(15000, dtype=np.float32).reshape(5000, 3)
    )


def test_chunks_stream_before_a_later_error(tmp_path: Path) -> None:
    path = tmp_path / "late_error.txt"
    path.write_bytes(lines_of(1000, 3) + b"1 2 x\n")
    chunks = iter_chunks(path, chunk_rows=100)
    first = next(chunks)
    np.testing.assert_array_equal(first[0], [0, 1, 2])
    with pytest.raises(DataError) as caught:
        list(chunks)
    assert str(caught.value) == f"{path}:1001: field 3: not a number: 'x'"


def test_chunk_rows_and_width_must_be_positive() -> None:
    path = DATA / "good" / "plain.txt"
    with pytest.raises(ValueError, match="chunk_rows"):
        next(iter_chunks(path, chunk_rows=0))
    with pytest.raises(ValueError, match="width"):
        next(iter_chunks(path, width=0))


# Tokens chosen to reach each branch of the decoder: short and long mantissas, the 2**53
# and 10**22 limits of the exact path, exponents, float32 rounding of doubles.
EDGE_TOKENS = [
    "0", "-0", "+0.0", "0.", ".0", "1.", ".5", "-.5", "+.5", "007", "-0.000",
    "0.1", "0.2", "0.3", "3.14159265", "-2.718281828459045", "123456789012345",
    "1234567890123456", "9007199254740992", "9007199254740993", "9999999999999999",
    "12345678.87654321", "1234567.8901234", "00000000000000000000001.5",
    "1e22", "1e23", "1e-22", "1e-23", "123.456e-5", "-9.87654E+03", "1e0000000001",
    "1.7976931348623157e308", "4.9e-324", "1e-400", "2.2250738585072014e-308",
    "3.4028234663852886e38", "1.1754943508222875e-38", "1.401298464324817e-45",
    "1.000000059604644775390625000000000001",  # double rounding: float32(double) is 1
    "16777217", "0.000123457", "-1.23457e-05", "65504.0001", "99999999", "100000000",
]  # fmt: skip


@pytest.mark.parametrize("chunk_rows", [1, 512])
def test_edge_tokens_match_numpy(tmp_path: Path, chunk_rows: int) -> None:
    path = tmp_path / "edge.txt"
    path.write_text("".join(f"{t} {t}\n" for t in EDGE_TOKENS))
    got = read_all(path, chunk_rows=chunk_rows, allow_nonfinite=True)  # 1.79e308 -> Inf
    expected = numpy_float32(EDGE_TOKENS)
    np.testing.assert_array_equal(bits(got[:, 0]), bits(expected))
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


FORMATS = {
    "%.6g": 600,  # one word per field (the common case)
    "%.4g": 600,
    "%d": 600,
    "%.9f": 600,  # two words
    "%.6e": 600,  # exponents, decoded vectorised
    "%.17g": 600,  # repr-like: beyond the exact fast path
    "%.18e": 600,  # numpy.savetxt's default: np.loadtxt in bulk
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_formats_match_numpy_bit_for_bit(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(7)
    values = rng.standard_normal((40, 60)) * 10.0 ** rng.integers(-6, 7, (40, 60))
    if fmt == "%d":
        values = np.round(values)
    path = tmp_path / "data.txt"
    np.savetxt(path, values, fmt=fmt)
    got = read_all(path, chunk_rows=16)
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


@pytest.mark.parametrize(
    ("fmt", "one_by_one", "bulk"), [("%.6g", 0, 0), ("%.6e", 0, 0), ("%.18e", 0, 1)]
)
def test_which_path_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, one_by_one: int, bulk: int
) -> None:
    """%g and %e text is decoded without a float() call per field; %.18e goes to np.loadtxt."""
    calls = {"parse_field": 0, "_loadtxt": 0}
    for module, name in (
        (numpy_path, "parse_field"),
        (precise, "parse_field"),
        (numpy_path, "_loadtxt"),
    ):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(module, name, counted)
    values = np.random.default_rng(2).standard_normal((64, 500)) * 3
    path = tmp_path / "data.txt"
    np.savetxt(path, values, fmt=fmt)
    got = read_all(path)
    assert calls == {"parse_field": one_by_one, "_loadtxt": bulk}
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


def test_styles_change_within_a_file(tmp_path: Path) -> None:
    """%e rows, then %.18e rows, then %g rows: each block decodes right whatever came first."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal((90, 400))
    path = tmp_path / "mixed.txt"
    with path.open("w") as out:
        for i, row in enumerate(values):
            fmt = "%.6e" if i < 30 else "%.18e" if i < 60 else "%.6g"
            out.write(" ".join(fmt % v for v in row) + "\n")
    got = read_all(path, chunk_rows=10)
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


def test_long_lines_span_several_groups(tmp_path: Path) -> None:
    """Seed-sized lines (3,900 fields, ~35 KB): groups and blocks cut between lines."""
    rng = np.random.default_rng(5)
    values = (rng.standard_normal((24, 3900)) * 3).astype(np.float32)
    path = tmp_path / "features.txt"
    np.savetxt(path, values, fmt="%.6g")
    got = read_all(path, chunk_rows=10, width=3900, width_hint="H×W = 20×195")
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


def test_error_position_in_a_later_block(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    path = tmp_path / "bad_late.txt"
    lines = [" ".join(f"{v:.6g}" for v in rng.standard_normal(50)) for _ in range(300)]
    fields = lines[257].split()
    fields[41] = "1.2.3"
    lines[257] = " ".join(fields)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as caught:
        read_all(path, chunk_rows=32)
    assert str(caught.value) == f"{path}:258: field 42: not a number: '1.2.3'"


WIDE = " ".join(["1"] * 50_000)  # a 100 KB line: the numpy path decodes ~256 KiB of lines together


@pytest.mark.parametrize(
    ("text", "chunk_rows", "message"),
    [
        # A field that is not a number on line 1, then a blank line ending the first group
        # and data after it: line 1 is the first problem, and the one reported.
        (f"{WIDE[:-1]}x\n{WIDE}\n\n{WIDE}\n", 512, ":1: field 50000: not a number: 'x'"),
        # A blank line ending the block's second group, data in the next block.
        (f"{WIDE}\n" * 3 + f"\n{WIDE}\n", 4, ":4: blank line followed by more data on line 5"),
    ],
)
def test_a_blank_line_ending_a_group_of_wide_lines(
    tmp_path: Path, text: str, chunk_rows: int, message: str
) -> None:
    path = tmp_path / "wide.txt"
    path.write_text(text)
    with pytest.raises(DataError) as caught:
        read_all(path, chunk_rows=chunk_rows)
    assert str(caught.value) == f"{path}{message}"


@pytest.mark.parametrize(
    ("token", "value"),
    [
        (b"1", 1.0), (b"-2.5", -2.5), (b".5", 0.5), (b"5.", 5.0), (b"1e-3", 1e-3),
        (b"2.5E+02", 250.0), (b"inf", INF), (b"-Infinity", -INF), (b"+nan", NAN),
        (b"1_000", None), (b"1e", None), (b".", None), (b"-", None), (b"e5", None),
        (b"0x10", None), (b"1.2.3", None), (b"1,5", None), (b"--1", None), (b"nan(1)", None),
        (b"\xef\xbc\x91", None),  # a full-width digit: float() would take the str form
    ],
)  # fmt: skip
def test_parse_field_grammar(token: bytes, value: float | None) -> None:
    got = parse_field(token)
    if value is None:
        assert got is None
    elif math.isnan(value):
        assert got is not None and math.isnan(got)
    else:
        assert got == value


def test_textfile_does_not_import_tensorflow() -> None:
    code = (
        "import sys, app.data.textfile as t; "
        "list(t.iter_chunks(sys.argv[1])); "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(DATA / "good" / "plain.txt")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
