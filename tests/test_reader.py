"""Reading a data file's lines (app/data/formats/textfile/reader.py): whole lines in blocks, read
as they are needed, through a buffer that moves and grows; the line limit at every read
boundary; the buffers kept from call to call; the bytes read, reported as progress.

The read and block sizes are 1 MiB and 64 MiB; tests that need a boundary inside a small
file make them a few bytes (``reader._READ_BYTES``, ``reader._CHUNK_BYTES``), as the line
limit is made 100 bytes (``opener.MAX_LINE_BYTES``).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from app.data.formats.textfile import Buffers, Span, blocks, iter_chunks, numpy_path, opener, reader
from app.errors import DataError


def _numbers(lines: int) -> bytes:
    """``lines`` lines of four integers counting from 0: ``0 1 2 3``, ``4 5 6 7``, ..."""
    return b"".join(
        b"%d %d %d %d\n" % (4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3) for i in range(lines)
    )


def _counting(lines: int) -> np.ndarray:
    return np.arange(4 * lines, dtype=np.float32).reshape(lines, 4)


def _read_all(path: Path, **kwargs) -> np.ndarray:
    return np.concatenate([chunk.copy() for chunk in iter_chunks(path, **kwargs)])


LINES = 130_000  # 3.4 MB of text: several reads, moves and growths of the buffer


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reader") / "big.txt"
    path.write_bytes(_numbers(LINES))
    return path


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("chunk_rows", [512, 1_000_000])  # many blocks; one block of it all
def test_a_file_several_times_the_read_size_is_read_whole(
    big: Path, tmp_path: Path, packed: bool, chunk_rows: int
) -> None:
    path = big
    if packed:
        path = tmp_path / "big.txt.gz"
        path.write_bytes(gzip.compress(big.read_bytes(), 1))
    got = _read_all(path, chunk_rows=chunk_rows)
    np.testing.assert_array_equal(got, _counting(LINES))


def test_the_numpy_path_decodes_a_large_file_without_the_precise_path(
    big: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocks after the buffer moved keep whitespace in front of them."""
    monkeypatch.setattr(blocks, "compiled", None)
    slowly = []
    real = numpy_path.parse_block_slowly
    monkeypatch.setattr(
        numpy_path, "parse_block_slowly", lambda *args: slowly.append(1) or real(*args)
    )
    got = _read_all(big, chunk_rows=1_000_000)
    np.testing.assert_array_equal(got, _counting(LINES))
    assert slowly == []


def test_buffers_are_kept_and_reused_from_call_to_call(big: Path, tmp_path: Path) -> None:
    """One Buffers per thread: the text buffer and the compiled path's rows are allocated
    when a call needs more than they hold, and kept for the next call, which reuses them
    (moving the data to the front of the kept buffer when it is large enough)."""
    small = tmp_path / "small.txt"
    small.write_bytes(_numbers(100))
    huge = tmp_path / "huge.txt"  # more than the buffer grown for one block of the big file
    huge.write_bytes(_numbers(2 * LINES))
    buffers = Buffers()
    kept = []
    calls = [(small, 512), (small, 512), (big, 512), (big, 1_000_000), (huge, 512)]
    for path, chunk_rows in calls:
        got = []
        for chunk in iter_chunks(path, chunk_rows=chunk_rows, buffers=buffers):
            if blocks.compiled is not None:  # its rows are the kept ones
                assert buffers.rows is not None and np.shares_memory(chunk, buffers.rows)
            got.append(chunk.copy())
        lines = {small: 100, big: LINES, huge: 2 * LINES}[path]
        np.testing.assert_array_equal(np.concatenate(got), _counting(lines))
        assert buffers.text is not None
        kept.append((buffers.text, buffers.rows))
    assert kept[1][0] is kept[0][0] and kept[1][1] is kept[0][1]  # the small file's, reused
    assert len(kept[3][0]) > reader.PAD + 2 * reader._READ_BYTES + 8  # grown for one block
    assert kept[4][0] is kept[3][0] and kept[4][1] is kept[3][1]  # and reused


@pytest.mark.parametrize("packed", [False, True])
def test_progress_counts_every_byte_read(big: Path, tmp_path: Path, packed: bool) -> None:
    """The bytes of the file (compressed for gzip) read since the last call, after every
    read: they add up to the file's size, or to a span's."""
    path = big
    if packed:
        path = tmp_path / "big.txt.gz"
        path.write_bytes(gzip.compress(big.read_bytes(), 1))
    reported: list[int] = []
    rows = sum(len(chunk) for chunk in iter_chunks(path, progress=reported.append))
    assert rows == LINES
    assert len(reported) > 2 and min(reported) >= 0
    assert sum(reported) == path.stat().st_size
    if not packed:
        start, stop = len(_numbers(1000)), len(_numbers(90_000))  # line starts
        reported.clear()
        span = Span(start, stop, first_line=1001)
        rows = sum(len(chunk) for chunk in iter_chunks(path, span=span, progress=reported.append))
        assert rows == 89_000 and sum(reported) == stop - start


DIGITS = b"0\n1\n2\n3\n4\n5\n6\n7\n8\n9\n"  # lines of two bytes


@pytest.mark.parametrize(
    ("read_bytes", "chunk_bytes", "chunk_rows", "blocks"),
    [
        # Reads of two lines; blocks of three lines, each handed out as soon as it is read.
        (
            4,
            1 << 20,
            3,
            [(8, 1, b"0\n1\n2\n"), (12, 4, b"3\n4\n5\n"), (20, 7, b"6\n7\n8\n"), (20, 10, b"9\n")],
        ),
        # Reads of one line; blocks of two lines (4 bytes) are full: no read more.
        (
            2,
            4,
            100,
            [
                (4, 1, b"0\n1\n"),
                (8, 3, b"2\n3\n"),
                (12, 5, b"4\n5\n"),
                (16, 7, b"6\n7\n"),
                (20, 9, b"8\n9\n"),
            ],
        ),
        # Reads of four lines; blocks of up to 4 bytes: two lines each, read or not.
        (
            8,
            4,
            100,
            [
                (8, 1, b"0\n1\n"),
                (8, 3, b"2\n3\n"),
                (16, 5, b"4\n5\n"),
                (16, 7, b"6\n7\n"),
                (20, 9, b"8\n9\n"),
            ],
        ),
        # A line a block.
        (
            4,
            1 << 20,
            1,
            [
                (4, 1, b"0\n"),
                (4, 2, b"1\n"),
                (8, 3, b"2\n"),
                (8, 4, b"3\n"),
                (12, 5, b"4\n"),
                (12, 6, b"5\n"),
                (16, 7, b"6\n"),
                (16, 8, b"7\n"),
                (20, 9, b"8\n"),
                (20, 10, b"9\n"),
            ],
        ),
    ],
)
def test_blocks_are_read_as_they_are_needed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    read_bytes: int,
    chunk_bytes: int,
    chunk_rows: int,
    blocks: list[tuple[int, int, bytes]],
) -> None:
    """A block is up to chunk_rows lines holding up to _CHUNK_BYTES bytes, handed out as
    soon as the reads have brought that much: (bytes read by then, its first line, its
    text)."""
    monkeypatch.setattr(reader, "_READ_BYTES", read_bytes)
    monkeypatch.setattr(reader, "_CHUNK_BYTES", chunk_bytes)
    path = tmp_path / "digits.txt"
    path.write_bytes(DIGITS)
    read = [0]

    def progress(count: int) -> None:
        read[0] += count

    got = [
        (read[0], first, bytes(buf[begin : ends[-1]]))
        for first, buf, begin, ends in reader.read_blocks(str(path), chunk_rows, progress=progress)
    ]
    assert got == blocks


@pytest.mark.parametrize(
    ("read_bytes", "chunk_rows", "lengths", "final_newline"),
    [
        (5, 2, [5, 20], False),  # the data outgrow the first buffer
        (50, 1, [47, 2, 140, 39, 181], True),  # lines of several reads, moved and grown
    ],
)
def test_lines_longer_than_a_read_keep_8_readable_bytes_after_them(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    read_bytes: int,
    chunk_rows: int,
    lengths: list[int],
    final_newline: bool,
) -> None:
    """The buffer moves and grows to take a whole read after the data it holds, so every
    block is handed out whole with at least 8 readable bytes after its last line (the
    parsers load 8-byte windows ending anywhere in a line)."""
    monkeypatch.setattr(reader, "_READ_BYTES", read_bytes)
    lines = [b"7" * length + b"\n" for length in lengths]
    path = tmp_path / "long.txt"
    path.write_bytes(b"".join(lines) if final_newline else b"".join(lines)[:-1])
    got = []
    for _, buf, begin, ends in reader.read_blocks(str(path), chunk_rows):
        assert len(buf) - ends[-1] >= 8
        got.append(bytes(buf[begin : ends[-1]]))
    assert b"".join(got) == b"".join(lines)


def test_the_last_line_without_a_newline_gets_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader, "_READ_BYTES", 4)
    path = tmp_path / "digits.txt"
    path.write_bytes(b"0\n1\n2")
    got = [
        (first, bytes(buf[begin : ends[-1]]))
        for first, buf, begin, ends in reader.read_blocks(str(path), 3)
    ]
    assert got == [(1, b"0\n1\n2\n")]


LONG = b"0" * 99 + b"1"  # a line of exactly the limit (a number: 1)


@pytest.mark.parametrize("read_bytes", [50, 1 << 20])  # a read boundary inside the line, or not
def test_a_line_may_be_max_line_bytes_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_bytes: int
) -> None:
    monkeypatch.setattr(opener, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(reader, "_READ_BYTES", read_bytes)
    path = tmp_path / "long.txt"
    path.write_bytes(LONG + b"\n" + b"7\n" * 30)
    got = _read_all(path)
    np.testing.assert_array_equal(got[:, 0], np.array([float(LONG)] + [7] * 30, np.float32))


@pytest.mark.parametrize(
    ("text", "read_bytes", "line"),
    [
        (b"7\n" + LONG + b"1\n", 1 << 20, 2),
        (
            b"7\n" + LONG + b"\n" + LONG + b"1\n",
            1 << 20,
            3,
        ),  # the long one, not the one at the limit
        (b"7\n" * 40 + LONG + b"1\n", 64, 41),  # found two reads after lines not handed out yet
        (b"7\n7\n" + LONG + b"1" * 50, 1 << 20, 3),  # no newline: too long before its end is read
    ],
)
def test_a_line_over_max_line_bytes_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: bytes, read_bytes: int, line: int
) -> None:
    monkeypatch.setattr(opener, "MAX_LINE_BYTES", 100)
    monkeypatch.setattr(reader, "_READ_BYTES", read_bytes)
    path = tmp_path / "long.txt"
    path.write_bytes(text)
    with pytest.raises(DataError) as caught:
        _read_all(path)
    assert str(caught.value) == f"{path}:{line}: line longer than 100 bytes"


def test_a_bom_is_whitespace_at_the_start_of_the_file_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also when a later line starts where the buffer's data was moved to (reads of 4 bytes)."""
    monkeypatch.setattr(reader, "_READ_BYTES", 4)
    path = tmp_path / "bom.txt"
    path.write_bytes(opener.BOM + b"1\n2\n")
    np.testing.assert_array_equal(_read_all(path, chunk_rows=1), [[1], [2]])
    path.write_bytes(b"1\n" + opener.BOM + b"2\n")
    with pytest.raises(DataError) as caught:
        _read_all(path, chunk_rows=1)
    assert str(caught.value) == f"{path}:2: field 1: not a number: '\\xef\\xbb\\xbf2'"


def test_the_readers_newline_offsets_without_the_compiled_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reader, "_compiled", None)
    u = np.frombuffer(b"1 2\n3 4\n\n5", np.uint8)
    assert reader.newline_offsets(u).tolist() == [3, 7, 8]
