"""The text's ranges read ahead into memory (app/data/formats/textfile/ahead.py): from the
disk directly where the page cache lacks them, copied from it where it holds them, and the
conversions they feed, on the real file system under ``tmp_path``."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import numpy as np
import pytest

from app.data.formats import files, pagecache
from app.data.formats.textfile import ahead, parallel
from app.errors import DataError
from tests.test_parallel import lines_of


def _written(path: Path, data: bytes) -> None:
    """``data`` in ``path``, on the disk (clean pages, which the kernel may drop)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _drop(path: Path) -> None:
    with open(path, "rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _share(path: Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        return pagecache.cached_share(fd, 0, path.stat().st_size)
    finally:
        os.close(fd)


def _direct_reads(path: Path) -> bool:
    """Whether this file system reads ``path`` with O_DIRECT."""
    fd = files.open_fd(path)
    try:
        direct = ahead._open_direct(str(path), fd)
    finally:
        os.close(fd)
    if direct is None:
        return False
    try:
        buf = np.zeros(2 * ahead.ALIGN, np.uint8)
        view = buf[-buf.ctypes.data % ahead.ALIGN :][: ahead.ALIGN]
        os.preadv(direct, [view.data.cast("B")], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(direct)


def test_ranges_come_in_order_whole_and_from_where_they_are(tmp_path: Path) -> None:
    src = tmp_path / "x.txt"
    data = lines_of(3000, 100)  # ~1.4 MB, ranges off the 4 KiB grid
    _written(src, data)
    if _share(src) < 0.9:
        pytest.skip("this file system keeps no page cache of a file just written")
    ranges = parallel.split_lines(src, 7, min_bytes=1000)
    half = ranges[3][0]
    _drop(src)
    with open(src, "rb") as f:  # the second half in the page cache, the first not
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        f.seek(half)
        f.read()
    direct = _direct_reads(src)
    reader = ahead.Ahead(str(src), ranges, 2)
    try:
        for i, (start, stop) in enumerate(ranges):
            with reader.taken(i) as text:
                held = text.held
                assert held.buffer[held.begin : held.end].tobytes() == data[start:stop]
                assert held.lines(i == len(ranges) - 1) == data[start:stop].count(b"\n")
                assert text.direct == (direct and stop <= half + 4096)
    finally:
        reader.close()
    assert _share(src) < 0.1  # nothing read stays: direct reads skip it, copies are dropped


def test_a_file_system_refusing_direct_reads_gets_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "x.txt"
    _written(src, lines_of(4000, 400))  # 11.7 MB
    _drop(src)
    read = os.preadv
    refused: list[int] = []

    def preadv(fd: int, buffers: list, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return read(fd, buffers, offset)

    direct = _direct_reads(src)
    split = parallel.split_lines

    def then_dropped(*args, **kwargs):  # as a text larger than the memory: not cached
        ranges = split(*args, **kwargs)
        _drop(src)
        return ranges

    monkeypatch.setattr(parallel, "split_lines", then_dropped)
    monkeypatch.setattr(os, "preadv", preadv)
    two = parallel.convert_file(src, tmp_path / "two.f32", width=400, threads=2,
                                min_range_bytes=1 << 20)  # fmt: skip
    assert len(refused) == (1 if direct else 0)  # refused once, then every range copied
    assert _share(src) < 0.1  # and dropped once parsed
    one = parallel.convert_file(src, tmp_path / "one.f32", width=400, threads=1)
    assert two.ranges > 2 and one.rows == two.rows == 4000
    assert (tmp_path / "one.f32").read_bytes() == (tmp_path / "two.f32").read_bytes()


def test_a_file_cut_short_under_the_conversion_is_named_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "x.txt"
    _written(src, lines_of(2000, 80))
    split = parallel.split_lines

    def then_cut(*args, **kwargs):  # the ranges of the whole file, then the file cut
        ranges = split(*args, **kwargs)
        os.truncate(src, ranges[-1][0] + 10)
        return ranges

    monkeypatch.setattr(parallel, "split_lines", then_cut)
    with pytest.raises(DataError, match="changed while it was being converted") as got:
        parallel.convert_file(src, tmp_path / "out.f32", width=80, threads=2,
                              min_range_bytes=10_000)  # fmt: skip
    assert str(src) in str(got.value)
    assert not (tmp_path / "out.f32").exists()


def test_a_name_replaced_in_between_is_not_read_directly(tmp_path: Path) -> None:
    src, other = tmp_path / "x.txt", tmp_path / "y.txt"
    _written(src, b"1 2\n")
    _written(other, b"3 4\n")
    fd = files.open_fd(src)
    try:
        os.replace(other, src)  # the name now leads to another file
        assert ahead._open_direct(str(src), fd) is None
    finally:
        os.close(fd)


def test_the_read_ahead_memory_is_bounded_with_many_threads() -> None:
    assert parallel.largest_range(2) == parallel.MAX_RANGE_BYTES
    for threads in (8, 64, 512):
        largest = parallel.largest_range(threads)
        assert parallel.MIN_RANGE_BYTES <= largest <= parallel.MAX_RANGE_BYTES
        assert (threads + 1) * largest <= max(
            parallel.READ_AHEAD_BYTES, (threads + 1) * parallel.MIN_RANGE_BYTES
        )
