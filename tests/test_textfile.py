"""The text data parser: table-driven over tests/fixtures/data/{good,bad}/, plus generated files.

good/<case>.txt: the parsed values, asserted bit for bit (float32 of the decimal text).
bad/<case>.txt: the DataError message, asserted exactly (file, line, field, problem).
gzip, permission and size cases are generated into tmp_path. Every decoding path of the
parser (one word, two words, exponents, float() one by one, np.loadtxt in bulk) is checked
against numpy's own parsing of the same text.
"""

from __future__ import annotations

import bz2
import dataclasses
import errno
import gzip
import io
import lzma
import math
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from app.data.formats import files
from app.data.formats.textfile import (
    Span,
    blocks,
    is_gzip,
    iter_chunks,
    numpy_path,
    opener,
    parse_field,
    precise,
    probes,
    reader,
)
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
    "one_field_on_a_line": (":2: expected 6 fields (as on line 1), found 1", {}),
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
    if request.param == "compiled" and blocks.compiled is None:
        pytest.skip(
            "app.data.formats.textfile._fastparse is not built (no C compiler at install time)"
        )
    if request.param == "numpy":
        monkeypatch.setattr(blocks, "compiled", None)
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
    assert str(caught.value) == f"{path}: missing data file"


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        read_all(tmp_path)
    assert str(caught.value) == f"{tmp_path}: data file is a directory, not a regular file"


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


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="no /proc/self/mem (Linux)")
def test_a_file_of_the_kernels_interface_is_not_read() -> None:
    """/proc/self/mem (a read of offset 0 fails) and /proc/kmsg (a read waits for the
    kernel's next message, as root) are the kernel's, not data: refused unread."""
    for path in ("/proc/self/mem", "/proc/kmsg"):
        with pytest.raises(DataError) as caught:
            read_all(path)
        assert str(caught.value) == (
            f"{path}: data file is on the kernel's proc file system (the kernel's interface, "
            "not a file of data)"
        )


class _BadDisk:
    """A file whose reads fail, as on a failing disk; and its seeks, unless ``seeks``."""

    def __init__(self, seeks: bool = False) -> None:
        self.seeks = seeks

    def _fail(self, *args: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    read = readinto = _fail

    def seek(self, *args: object) -> int:
        if not self.seeks:
            self._fail()
        return 0


def test_an_io_failure_while_reading_names_the_file(tmp_path: Path) -> None:
    path = str(tmp_path / "train_features.txt")
    for call in (
        lambda: opener.read_into(_BadDisk(), memoryview(bytearray(8)), path),  # type: ignore[arg-type]
        lambda: opener.seek(_BadDisk(), 4, path),  # type: ignore[arg-type]
        lambda: probes._gzip_isize(_BadDisk(), 100, path),  # type: ignore[arg-type]
        lambda: probes._gzip_isize(_BadDisk(seeks=True), 100, path),  # type: ignore[arg-type]
    ):
        with pytest.raises(DataError) as caught:
            call()
        assert str(caught.value) == f"{path}: cannot read: Input/output error"


class _SeeksOnlyToTheStart(io.BufferedReader):
    """A file that reads, and seeks back to its start, but fails any other seek (EIO)."""

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset or whence:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return super().seek(offset, whence)


def test_a_failing_seek_past_the_start_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """To a gzip file's trailer (its size, sampled) and to the start of a span."""
    monkeypatch.setattr(files, "opened", lambda path: _SeeksOnlyToTheStart(io.FileIO(path)))
    packed = tmp_path / "train_features.txt.gz"
    packed.write_bytes(gzip.compress(lines_of(100, 4)))
    plain = tmp_path / "test_features.txt"
    plain.write_bytes(lines_of(100, 4))
    for path, call in (
        (packed, lambda: probes.sample_lines(packed)),
        (plain, lambda: read_all(plain, span=Span(start=len(lines_of(10, 4)), first_line=11))),
    ):
        with pytest.raises(DataError) as caught:
            call()
        assert str(caught.value) == f"{path}: cannot read: Input/output error"


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
    monkeypatch.setattr(opener, "MAX_LINE_BYTES", 100)
    path = tmp_path / "long.txt"
    path.write_bytes(b"1 2\n" + b"3 " * 60 + b"\n")
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}:2: line longer than 100 bytes"


@pytest.mark.parametrize(("chunk_rows", "lines"), [(64, 5000), (1, 200)])
def test_chunks_are_bounded_and_in_order(tmp_path: Path, chunk_rows: int, lines: int) -> None:
    path = tmp_path / "many.txt"
    path.write_bytes(lines_of(lines, 3))
    sizes = []
    rows = []
    for chunk in iter_chunks(path, chunk_rows=chunk_rows):
        assert chunk.shape[1] == 3
        sizes.append(len(chunk))
        rows.append(chunk)
    assert max(sizes) <= chunk_rows
    assert sum(sizes) == lines and len(sizes) == -(-lines // chunk_rows)
    np.testing.assert_array_equal(
        np.concatenate(rows), np.arange(3 * lines, dtype=np.float32).reshape(lines, 3)
    )


SPANNED = b"1 2\n3 4\n\n\n5 6\n7 8\n"  # lines start at bytes 0, 4, 8, 9, 10, 14


@pytest.mark.parametrize(
    ("span", "rows", "after"),
    [
        (Span(), [[1, 2], [3, 4], [5, 6], [7, 8]], None),  # the whole file (its blank lines: error)
        (Span(10, first_line=5), [[5, 6], [7, 8]], Span(10, None, 5, None, 2, 2)),  # to the end
        (Span(4, 10, first_line=2), [[3, 4]], Span(4, 10, 2, 3, 3, 1)),  # ends in a blank run
        (Span(10, 10, first_line=5), [], Span(10, 10, 5, None, 0, 0)),  # empty: no error
    ],
)
def test_a_span_reads_its_lines_and_records_what_it_read(
    tmp_path: Path, span: Span, rows: list[list[float]], after: Span | None
) -> None:
    span = dataclasses.replace(span)  # (iter_chunks updates it)
    path = tmp_path / "spanned.txt"
    path.write_bytes(SPANNED)
    if after is None:  # the whole file: blank lines followed by data
        with pytest.raises(DataError, match=r":3: blank line followed by more data on line 5$"):
            list(iter_chunks(path, span=span, chunk_rows=1))
        return
    seen = []  # the rows the span records as each chunk is handed out
    got = []
    for chunk in iter_chunks(path, span=span, chunk_rows=1):
        got.extend(chunk.tolist())
        seen.append(span.rows)
    assert got == rows
    assert seen == list(range(1, len(rows) + 1))
    assert span == after


def test_a_span_after_a_blank_run_names_the_blank_line(tmp_path: Path) -> None:
    """The lines before the span ended in blank lines from line 3: data is an error there."""
    path = tmp_path / "spanned.txt"
    path.write_bytes(SPANNED)
    span = Span(10, first_line=5, blank_line=3)
    with pytest.raises(DataError) as caught:
        list(iter_chunks(path, span=span))
    assert str(caught.value) == f"{path}:3: blank line followed by more data on line 5"


def test_a_gzip_file_is_read_as_a_whole_only(tmp_path: Path) -> None:
    path = tmp_path / "data.txt.gz"
    path.write_bytes(gzip.compress(SPANNED))
    for span in (Span(0, 4), Span(4)):
        with pytest.raises(ValueError, match=f"^{path}: a gzip file can only be read as a whole$"):
            list(iter_chunks(path, span=span))


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
    ("fmt", "one_by_one", "bulk"),
    [("%.6g", 0, 0), ("%.9f", 0, 0), ("%.6e", 0, 0), ("%.18e", 0, 1)],
)
def test_which_path_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, one_by_one: int, bulk: int
) -> None:
    """%g, %e and %.9f text (long mantissas: two words) is decoded without a float() call
    per field; %.18e goes to np.loadtxt."""
    calls = _path_counts(monkeypatch)
    values = np.random.default_rng(2).standard_normal((64, 500)) * 3
    path = tmp_path / "data.txt"
    np.savetxt(path, values, fmt=fmt)
    got = read_all(path)
    assert calls == {"parse_field": one_by_one, "parse_block_slowly": 0, "_loadtxt": bulk}
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


def _write_fields(path: Path, lines: list[list[str]]) -> Path:
    """Write ``lines`` (the fields of each line) as space-separated text; return ``path``."""
    path.write_text("".join(" ".join(line) + "\n" for line in lines))
    return path


def _path_counts(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of float() one field at a time (either path), of the precise path and of
    np.loadtxt, counted from here on."""
    calls = {"parse_field": 0, "parse_block_slowly": 0, "_loadtxt": 0}
    for module, name in (
        (numpy_path, "parse_field"),
        (precise, "parse_field"),
        (numpy_path, "parse_block_slowly"),
        (numpy_path, "_loadtxt"),
    ):
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name):
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(module, name, counted)
    return calls


def _read_counting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[list[str]]
) -> dict[str, int]:
    """Write ``lines`` (the fields of each line) as space-separated text, read it back and
    require float32 of each field, bit for bit; return the paths' calls (_path_counts)."""
    path = tmp_path / "data.txt"
    _write_fields(path, lines)
    calls = _path_counts(monkeypatch)
    got = read_all(path)
    expected = numpy_float32([t for line in lines for t in line]).reshape(len(lines), -1)
    np.testing.assert_array_equal(bits(got), bits(expected))
    return calls


def _g_lines() -> list[list[str]]:
    """%.6g text with no exponent (no value below 1e-3): the vectorised decoders take it all."""
    values = np.round(np.random.default_rng(12).standard_normal((64, 500)) * 3, 3)
    return [[f"{v:.6g}" for v in row] for row in values]


@pytest.mark.parametrize(
    ("case", "one_by_one", "bulk"),
    [
        ("tabs", 0, 0),
        ("crlf", 0, 0),
        ("blank lines at the end", 0, 0),
        ("a few long fields", 5, 0),
        ("nan allowed", 3, 0),
        ("nan allowed in %.18e", 0, 1),
        ("one column in %.18e", 0, 1),
    ],
)
def test_which_path_decodes_files_a_little_off_the_common_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, one_by_one: int, bulk: int
) -> None:
    """Tab separators, CRLF line ends and blank lines ending the file are split without
    the precise path; a few fields the vectorised decoders leave (20 digits, nan) are
    decoded one by one, and allowed nan by np.loadtxt in bulk, as is one column of %.18e
    (np.savetxt's default for one label), the block not parsed again."""
    lines = _g_lines()
    if case == "nan allowed in %.18e":
        lines = [[f"{float(t):.18e}" for t in line] for line in lines]
    if case == "one column in %.18e":
        lines = [[f"{float(line[0]):.18e}"] for line in lines]
    sep, end = ("\t" if case == "tabs" else " "), ("\r\n" if case == "crlf" else "\n")
    if case == "a few long fields":
        for i in range(5):
            lines[9 * i + 3][77 * i] = "1234567890.123456789"
    if case.startswith("nan allowed"):
        for i in range(3):
            lines[20 * i + 1][100 * i + 5] = "nan"
    path = tmp_path / "data.txt"
    blank = "\n\n" if case == "blank lines at the end" else ""
    path.write_bytes(("".join(sep.join(line) + end for line in lines) + blank).encode())
    calls = _path_counts(monkeypatch)
    got = read_all(path, allow_nonfinite=case.startswith("nan allowed"))
    assert calls == {"parse_field": one_by_one, "parse_block_slowly": 0, "_loadtxt": bulk}
    expected = numpy_float32([t for line in lines for t in line]).reshape(got.shape)
    np.testing.assert_array_equal(bits(got), bits(expected))


def _with_small_values(lines: list[list[str]], where: list[tuple[int, int]]) -> list[list[str]]:
    """The %g lines with values below 1e-4 at ``where`` (row, field): %g writes them with
    an exponent, which the first pass over a mostly plain block leaves."""
    tiny = np.random.default_rng(14).standard_normal(len(where)) * 1e-6
    for (row, field), value in zip(where, tiny, strict=True):
        lines[row][field] = f"{value:.6g}"
    return lines


def test_many_exponents_close_together_are_decoded_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 small values in the last 20 of 64 lines (~64 KB, less than ~1 KiB per field):
    their exponents are decoded by one scan of those bytes, no float() call per field."""
    where = [(44 + i // 10, 50 * (i % 10) + i // 10) for i in range(200)]
    calls = _read_counting(tmp_path, monkeypatch, _with_small_values(_g_lines(), where))
    assert calls == {"parse_field": 0, "parse_block_slowly": 0, "_loadtxt": 0}


@pytest.mark.parametrize(
    "where",
    [
        [(0, i) for i in range(39)] + [(63, 499)],  # a run on the first line, one on the last
        [(0, 0)] + [(63, 461 + i) for i in range(39)],  # one on the first line, a run on the last
    ],
    ids=["run first", "run last"],
)
def test_exponents_spread_over_a_block_are_decoded_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parser: str, where: list[tuple[int, int]]
) -> None:
    """40 small values spanning the whole block (~200 KB, more than ~1 KiB per field): to
    the numpy path, scanning those bytes for exponents costs more than float() on each, so
    each is decoded by float() (the compiled parser decodes exponents as it goes)."""
    calls = _read_counting(tmp_path, monkeypatch, _with_small_values(_g_lines(), where))
    one_by_one = 40 if parser == "numpy" else 0
    assert calls == {"parse_field": one_by_one, "parse_block_slowly": 0, "_loadtxt": 0}


def test_up_to_32_fields_left_in_a_block_are_decoded_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parser: str
) -> None:
    """8 lines of 5 fields, 32 of them with an exponent: as few fields as that the numpy
    path leaves to float() one by one, neither scanned for exponents nor sent to
    np.loadtxt (the compiled parser decodes exponents as it goes)."""
    rng = np.random.default_rng(15)
    tokens = [f"{v:.4e}" for v in rng.standard_normal(32)] + [f"{v:.3f}" for v in rng.random(8)]
    calls = _read_counting(tmp_path, monkeypatch, [tokens[i : i + 5] for i in range(0, 40, 5)])
    one_by_one = 32 if parser == "numpy" else 0
    assert calls == {"parse_field": one_by_one, "parse_block_slowly": 0, "_loadtxt": 0}


@pytest.mark.parametrize("fmt", ["%.6e", "%.18e"])
def test_the_style_found_in_the_first_group_is_kept_for_the_rest_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parser: str, fmt: str
) -> None:
    """%e text is decoded exponents first, and %.18e text by np.loadtxt, from the end of
    the file's first group on: the one- and two-word decoder is not tried again in a later
    group of the block or in a later block."""
    if parser == "compiled" and fmt == "%.6e":
        pytest.skip("the compiled parser takes this %e text whole")
    calls = 0
    real = numpy_path.decode

    def counted(*args):
        nonlocal calls
        calls += 1
        return real(*args)

    monkeypatch.setattr(numpy_path, "decode", counted)
    values = np.random.default_rng(4).standard_normal((80, 500))
    path = tmp_path / "data.txt"
    np.savetxt(path, values, fmt=fmt)  # blocks of 40 lines: over ~256 KiB, two groups each
    got = read_all(path, chunk_rows=40)
    assert calls == 1
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


def test_a_block_is_parsed_a_group_of_lines_at_a_time(tmp_path: Path) -> None:
    """The numpy path's temporaries are those of ~256 KiB of lines whatever the block's
    size: a block of ~4 MB takes no more than one of ~1 MB (beyond the rows it returns)."""
    line = " ".join(_g_lines()[0]) + "\n"  # ~3 KB, decoded by the first pass alone
    temporaries = []
    for lines in (340, 1360):
        path = tmp_path / f"{lines}.txt"
        path.write_text(line * lines)
        for first_line, buf, begin, ends in reader.read_blocks(str(path), lines):
            state = precise.State(str(path), None, None, "", False)
            tracemalloc.start()
            try:
                rows = numpy_path.parse_block(state, buf, begin, first_line, ends)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert rows.shape == (lines, 500)
            temporaries.append(peak - rows.nbytes)
    assert temporaries[1] <= temporaries[0] + (1 << 20)


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


# Fields outside the grammar, and how a message quotes them: printable ASCII as is; quotes,
# backslashes, DEL and every other byte as \xNN.
NOT_NUMBERS = [
    (b".", "'.'"), (b"-.", "'-.'"), (b"+", "'+'"), (b",5", "',5'"), (b"5!", "'5!'"),
    (b"2\x0e", "'2\\x0e'"), (b"2\x7f", "'2\\x7f'"), (b"1e", "'1e'"), (b"e5", "'e5'"),
    (b"0X1F", "'0X1F'"), (b"1'5", "'1\\x275'"), (b"1\\5", "'1\\x5c5'"),
    (b"\xc3\xa9", "'\\xc3\\xa9'"), (b"1.5D+03", "'1.5D+03'"),
]  # fmt: skip


@pytest.mark.parametrize(("token", "shown"), NOT_NUMBERS)
def test_a_field_that_is_not_a_number_is_named_and_quoted(
    tmp_path: Path, token: bytes, shown: str
) -> None:
    path = tmp_path / "data.txt"
    path.write_bytes(b"1 2 3\n4 " + token + b" 6\n7 8 9\n")
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}:2: field 2: not a number: {shown}"


CONTROL = bytes([*range(9), *range(14, 32), 127])  # not whitespace to bytes.split()


def test_a_control_byte_is_never_taken_for_whitespace(tmp_path: Path) -> None:
    """Seeded random layouts (runs of spaces and tabs, blank lines before the data, the
    width given or not) with one control byte in a field, or alone on a line: the error is
    the precise path's, which splits at the whitespace of bytes.split() only."""
    rng = np.random.default_rng(13)
    path = tmp_path / "data.txt"
    for _ in range(300):
        width, lines = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        rows = [[b"%d" % rng.integers(0, 1000) for _ in range(width)] for _ in range(lines)]
        control = bytes([rng.choice(list(CONTROL))])
        line, field = int(rng.integers(lines)), int(rng.integers(width))
        if rng.random() < 0.2:
            rows[line] = [control]  # a line of only a control byte
        else:
            at = int(rng.integers(len(rows[line][field]) + 1))
            rows[line][field] = rows[line][field][:at] + control + rows[line][field][at:]
        seps = [b" ", b"  ", b"   ", b"\t", b" \t "]
        text = b"\n" * int(rng.integers(0, 2) * rng.integers(1, 3)) + b"".join(
            rng.choice(seps) * int(rng.integers(0, 2))
            + b"".join(f + rng.choice(seps) for f in row[:-1])
            + row[-1]
            + b"\n"
            for row in rows
        )
        path.write_bytes(text)
        given = width if rng.random() < 0.5 else None
        state = precise.State(str(path), given, None, "", False)
        ends = [i + 1 for i, byte in enumerate(text) if byte == 10]
        with pytest.raises(DataError) as expected:
            precise.parse_block_slowly(state, text, 1, ends)
        with pytest.raises(DataError) as caught:
            read_all(path, width=given)
        assert str(caught.value) == str(expected.value), text


def _exponent_rows(width: int, rows: int) -> list[list[str]]:
    """%.6e text (exponents from -15 to +15): rows the numpy path decodes exponents of
    together, in one vectorised pass."""
    rng = np.random.default_rng(11)
    values = rng.standard_normal((rows, width)) * 10.0 ** rng.integers(-15, 16, (rows, width))
    return [[f"{v:.6e}" for v in row] for row in values]


# At the edges of that pass: 1 to 8 exponent digits (more: float()), |k| <= 22 (one exact
# operation) and beyond, a mantissa of 2**53 and one above it (rounded twice if not left).
EXPONENTS = [
    "1e0", "1e+0", "-1e-0", "2.5e9", "1e10", "1e15", "-2.5e+15", "3e-12", "7E22", "7e-22",
    "1e23", "1e-23", "5e00000007", "4e-00000008", "1e000000001", "5e-100000001",
    "9007199254740992e-15", "9007199764251709e-15", "-12345678.9e-3", ".5e1", "5.e-1",
]  # fmt: skip


def test_exponents_decoded_together_match_numpy(tmp_path: Path) -> None:
    rows = _exponent_rows(len(EXPONENTS), 20)
    rows[7] = EXPONENTS
    path = tmp_path / "exponents.txt"
    _write_fields(path, rows)
    got = read_all(path)
    expected = numpy_float32([t for row in rows for t in row]).reshape(got.shape)
    np.testing.assert_array_equal(bits(got), bits(expected))


def test_exponents_beside_a_label_column_are_decoded_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """%e features and an integer label per line: the exponents are still decoded in one
    vectorised pass, without float() per field or np.loadtxt."""
    rng = np.random.default_rng(13)
    values = rng.standard_normal((64, 40)) * 10.0 ** rng.integers(-9, 10, (64, 40))
    rows = [[f"{v:.6e}" for v in row] + [str(i % 3)] for i, row in enumerate(values)]
    calls = _read_counting(tmp_path, monkeypatch, rows)
    assert calls == {"parse_field": 0, "parse_block_slowly": 0, "_loadtxt": 0}


@pytest.mark.parametrize("token", ["1e", "1e+", "1e-", "1ex", "1e5e5", "1e1.5", "1.5D+03"])
def test_a_bad_exponent_among_many_is_named(tmp_path: Path, token: str) -> None:
    rows = _exponent_rows(40, 20)
    rows[7][5] = token
    path = tmp_path / "exponents.txt"
    _write_fields(path, rows)
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}:8: field 6: not a number: '{token}'"


def test_a_field_with_two_exponents_beside_a_field_without_one_is_named(tmp_path: Path) -> None:
    """As many 'e' as fields in the file, but not one in each field: the field with two is
    named."""
    rows = _exponent_rows(40, 20)
    rows[7][2] = "7"
    rows[7][5] = "1e5e5"
    path = tmp_path / "exponents.txt"
    _write_fields(path, rows)
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}:8: field 6: not a number: '1e5e5'"


def test_exponent_rows_then_blank_lines_read_a_line_at_a_time(tmp_path: Path) -> None:
    path = tmp_path / "exponents.txt"
    path.write_text("".join(" ".join(row) + "\n" for row in _exponent_rows(40, 3)) + "\n\n")
    got = read_all(path, chunk_rows=1)
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


def test_a_line_longer_than_the_numpy_paths_group(tmp_path: Path) -> None:
    """Lines of ~360 KB: each is a group of its own (~256 KiB of lines are decoded together)."""
    values = np.random.default_rng(6).standard_normal((2, 40_000)).astype(np.float32)
    path = tmp_path / "wide.txt"
    np.savetxt(path, values, fmt="%.6g")
    got = read_all(path)
    np.testing.assert_array_equal(bits(got), bits(np.loadtxt(path, dtype=np.float32)))


@pytest.mark.filterwarnings("error")  # a numpy warning would reach the user's terminal
@pytest.mark.parametrize("fmt", ["%.6g", "%.18e"])  # float() one by one, np.loadtxt in bulk
def test_a_value_beyond_float32_is_inf_or_an_error_without_a_warning(
    tmp_path: Path, fmt: str
) -> None:
    values = np.random.default_rng(8).standard_normal((20, 40))
    lines = [[fmt % v for v in row] for row in values]
    lines[7][39] = "3.5e38"
    path = tmp_path / "data.txt"
    _write_fields(path, lines)
    got = read_all(path, allow_nonfinite=True)
    assert np.isposinf(got[7, 39])
    expected = numpy_float32([t for line in lines for t in line]).reshape(20, 40)
    np.testing.assert_array_equal(bits(got), bits(expected))
    with pytest.raises(DataError) as caught:
        read_all(path)
    problem = f"non-finite value '3.5e38' in float32 {REJECTED}"
    assert str(caught.value) == f"{path}:8: field 40: {problem}"


def test_np_loadtxt_in_bulk_takes_only_whole_fields(tmp_path: Path) -> None:
    """%.18e text (np.loadtxt decodes it): a field holding '#' is no number, nor a comment."""
    values = np.random.default_rng(9).standard_normal((20, 40))
    lines = [[f"{v:.18e}" for v in row] for row in values]
    lines[7][39] = "3#5"
    path = tmp_path / "data.txt"
    _write_fields(path, lines)
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}:8: field 40: not a number: '3#5'"


def test_a_carriage_return_between_fields_of_bulk_text_is_whitespace(tmp_path: Path) -> None:
    """%.18e text (np.loadtxt decodes it, and ends a line at a CR): a CR between two fields
    separates them, as any whitespace; the block's values are read one field at a time."""
    values = np.random.default_rng(10).standard_normal((20, 40))
    lines = [[f"{v:.18e}" for v in row] for row in values]
    path = tmp_path / "data.txt"
    text = "".join(" ".join(line) + "\n" for line in lines)
    path.write_bytes(text.replace(" ", "\r", 1).encode())
    got = read_all(path)
    expected = numpy_float32([t for line in lines for t in line]).reshape(20, 40)
    np.testing.assert_array_equal(bits(got), bits(expected))


@pytest.mark.parametrize(
    ("token", "shown"), [(b"\xa03.5", "'\\xa03.5'"), (b"3.5\x85", "'3.5\\x85'")]
)
def test_np_loadtxt_in_bulk_takes_no_field_beside_a_non_ascii_space(
    tmp_path: Path, token: bytes, shown: str
) -> None:
    """%.18e text: a field with a non-breaking space or NEL (latin-1) at its edge is no
    number, as in any other text, though latin-1 counts those bytes as whitespace."""
    values = np.random.default_rng(9).standard_normal((20, 40))
    lines = [[b"%.18e" % v for v in row] for row in values]
    lines[7][39] = token
    path = tmp_path / "data.txt"
    path.write_bytes(b"".join(b" ".join(line) + b"\n" for line in lines))
    with pytest.raises(DataError) as caught:
        read_all(path)
    assert str(caught.value) == f"{path}:8: field 40: not a number: {shown}"


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
        "import sys, app.data.formats.textfile as t; "
        "list(t.iter_chunks(sys.argv[1])); "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(DATA / "good" / "plain.txt")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def _npy(array: np.ndarray, compressed: bool = False) -> bytes:
    out = io.BytesIO()
    if compressed:
        np.savez(out, features=array)
    else:
        np.save(out, array)
    return out.getvalue()


def test_labels_with_lone_carriage_returns_are_refused_at_their_first_line(tmp_path: Path) -> None:
    # Else K would be every row's fields, and the test labels blamed for having fewer.
    path = tmp_path / "train_labels.txt"
    path.write_bytes(b"0.5 1.5\r2.5 3.5\r")
    with pytest.raises(DataError) as caught:
        probes.first_line_fields(path, 100)
    assert str(caught.value) == (
        f"{path}:1: its lines end in a lone carriage return (\\r, as old Mac OS wrote them), "
        "not a newline: convert them (e.g. tr '\\r' '\\n' < FILE)"
    )
    path.write_bytes(b"0.5 1.5\r\n2.5 3.5\r\n")  # Windows line ends: two labels
    assert probes.first_line_fields(path, 100) == 2


@pytest.mark.parametrize(
    "content, width, hint",
    [
        (b"1.5,2,3\n4,5,6\n", 3, "; the fields look comma-separated: the text format separates"),
        (b"1.5,2,3\n4,5,6\n", None, "; the fields look comma-separated"),  # not a number
        (b"\xef\xbb\xbf1;2;3\n", 3, "; the fields look semicolon-separated"),
        (_npy(np.zeros((4, 3), np.float32)), 3, "; this looks like a NumPy .npy file, not text"),
        (_npy(np.zeros((4, 3)), compressed=True), 3, "; this looks like a .npz (zip) archive"),
        (b"1 2 3\r4 5 6\r", 3, "; its lines end in a lone carriage return (\\r, as old Mac OS"),
        ("1 2 3\n".encode("utf-16"), 3, "; this looks like UTF-16 text: the format is ASCII"),
        (bz2.compress(b"1 2 3\n"), 3, "; this looks like a bzip2-compressed file: decompress"),
        (lzma.compress(b"1 2 3\n"), 3, "; this looks like an xz-compressed file: decompress"),
        (b"1 2 3\r\r\n4 5 6\r \n", 4, None),  # CRs before a newline or a space: whitespace
        (b"1 2 3\n4 5,5 6\n", 3, None),  # a decimal comma in whitespace-separated text
        (b"1 2 abc\n", 3, None),
    ],
)
def test_a_file_in_another_format_gets_a_hint(
    tmp_path: Path, content: bytes, width: int | None, hint: str | None
) -> None:
    path = tmp_path / "train_features.txt"
    path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        read_all(path, width=width)
    message = str(caught.value)
    assert message.startswith(f"{path}:")
    if hint is None:
        assert ";" not in message.split(": not a number")[0] and "look" not in message
    else:
        assert hint in message and "\n" not in message
