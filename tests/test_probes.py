"""What the start of a data file says before it is parsed (app/data/formats/textfile/probes.py): the
fields of its first line, counted as it is read 64 KiB at a time; its size in bytes and lines
from its first MiB (a gzip file's size from its trailer)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from app.data.formats.textfile import first_line_fields, opener, sample_lines
from app.errors import DataError

BOM = opener.BOM
READ = 1 << 16  # probes._FIRST_LINE_READ


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        (b"1 2 3\n4\n", 3),
        (b"1\t2\x0b3\x0c4\r\n5\n", 4),  # the whitespace of bytes.split()
        (b"1 2 3", 3),  # no newline
        (BOM + b"1 2\n", 2),
        (BOM + b" 1 2\n", 2),  # a BOM, then a blank
        (BOM + b"\n1 2\n", 0),  # a BOM on a blank first line
        (b"", 0),
        (b"\n" + b"1 2\n" * 20_000, 0),  # blank, and more than a read after it
        (b" " * (READ - 1) + b"12 3\n", 2),  # a field across two reads
        (b"1 " * 40_000 + b"\n" + b"1 2\n" * 20_000, 40_000),  # a line over two reads
        (b"1" * READ + b"\n" + b"1 2 " * 40_000 + b"\n", 1),  # the newline opens a read
    ],
)
@pytest.mark.parametrize("packed", [False, True])
def test_the_first_lines_fields_are_counted_as_it_is_read(
    tmp_path: Path, text: bytes, fields: int, packed: bool
) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes(gzip.compress(text, 1) if packed else text)
    assert first_line_fields(path, 100_000) == fields


def test_the_count_stops_past_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "labels.txt"
    path.write_bytes(b"1 2 3\n")
    assert first_line_fields(path, 3) == 3
    assert first_line_fields(path, 2) is None


def test_a_first_line_may_be_max_line_bytes_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading stops once more than MAX_LINE_BYTES were read without a newline."""
    monkeypatch.setattr(opener, "MAX_LINE_BYTES", 2 * READ)
    path = tmp_path / "labels.txt"
    path.write_bytes(b"1" * (2 * READ) + b"\n")
    assert first_line_fields(path, 10) == 1
    path.write_bytes(b"1" * (3 * READ + 1))
    with pytest.raises(DataError) as caught:
        first_line_fields(path, 10)
    assert str(caught.value) == f"{path}:1: line longer than {2 * READ} bytes"


def test_a_truncated_gzip_first_line_names_the_file(tmp_path: Path) -> None:
    packed = gzip.compress(b"1 " * 300_000 + b"\n")
    path = tmp_path / "labels.txt.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataError) as caught:
        first_line_fields(path, 1_000_000)
    assert str(caught.value).startswith(f"{path}: truncated gzip data: ")


@pytest.mark.parametrize(
    ("text", "nbytes", "sample"),
    [
        (b"1 2\n3 4\n5", 1 << 20, (8, 2, 9)),  # cut after the last newline
        (b"\n1 2\n", 1 << 20, (5, 2, 5)),  # a blank first line is a line
        (b"1 2 3", 1 << 20, (5, 0, 5)),  # no newline: the whole read
        (b"", 1 << 20, (0, 0, 0)),
        (b"1 2\n3 4\n5 6\n", 6, (4, 1, 12)),  # the first nbytes only
    ],
)
def test_a_sample_is_the_whole_lines_of_the_first_bytes(
    tmp_path: Path, text: bytes, nbytes: int, sample: tuple[int, int, int]
) -> None:
    path = tmp_path / "data.txt"
    path.write_bytes(text)
    assert sample_lines(path, nbytes) == sample


def test_a_gzip_files_size_is_its_trailers_raised_to_what_was_read(tmp_path: Path) -> None:
    path = tmp_path / "data.txt.gz"
    path.write_bytes(gzip.compress(b"1 2\n" * 1000))
    assert sample_lines(path, 6) == (4, 1, 4000)  # the size the trailer records
    path.write_bytes(gzip.compress(b"1 2\n" * 1000) + gzip.compress(b"3 4\n"))
    assert sample_lines(path, 6) == (4, 1, 6)  # the last member's: 4 bytes, below those read
