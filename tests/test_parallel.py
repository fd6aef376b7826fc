"""Parallel conversion (app.data.formats.textfile.parallel): byte ranges at line starts, parsed in
several
threads, give the bytes and the error messages of one pass, and leave no partial files.

Ranges are forced small (``min_range_bytes``) so that small files are cut into several;
every parallel call here really parses in a second thread (``Converted.threads``).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import itertools
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.config import TrainConfig
from app.data import synthetic
from app.data.formats import textfile
from app.data.formats.textfile import blocks, parallel, reader
from app.errors import DataError, Preempted
from tests.conftest import prepare_cache

DATA = Path(__file__).parent / "fixtures" / "data"
FIXTURES = sorted((DATA / "good").glob("*.txt")) + sorted((DATA / "bad").glob("*.txt"))


def lines_of(n: int, width: int) -> bytes:
    """n lines of ``width`` distinct integers."""
    return b"".join(
        b" ".join(b"%d" % (i * width + j) for j in range(width)) + b"\n" for i in range(n)
    )


def first_width(path: Path) -> int:
    """Fields on the first non-blank line (1 for a file without any)."""
    for line in path.read_bytes().removeprefix(b"\xef\xbb\xbf").splitlines():
        if line.split():
            return len(line.split())
    return 1


def convert(src: Path, dst: Path, threads: int, **kwargs) -> parallel.Converted | DataError:
    """convert_file's result, or the DataError it raised."""
    try:
        return parallel.convert_file(src, dst, threads=threads, **kwargs)
    except DataError as exc:
        return exc


def test_split_lines_cuts_at_line_starts_and_covers_the_file(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    text = lines_of(1000, 7)
    path.write_bytes(text)
    ranges = parallel.split_lines(path, 8, min_bytes=1000)
    assert len(ranges) == 8
    assert ranges[0][0] == 0 and ranges[-1][1] == len(text)
    for (_, stop), (start, _) in itertools.pairwise(ranges):
        assert stop == start
        assert text[start - 1 : start] == b"\n"  # each range starts a line
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) < 2 * max(len(line) for line in text.splitlines(True))


def test_split_lines_keeps_small_files_and_single_lines_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.txt"
    path.write_bytes(lines_of(100, 3))
    assert parallel.split_lines(path, 8) == [(0, path.stat().st_size)]  # < MIN_RANGE_BYTES
    path.write_bytes(b"1 " * 5000)  # no newline at all: nowhere to cut
    assert parallel.split_lines(path, 4, min_bytes=100) == [(0, 10000)]
    with pytest.raises(DataError, match="missing data file"):
        parallel.split_lines(tmp_path / "missing.txt", 2)


def test_parallel_result_is_bit_identical_to_one_process(tmp_path: Path) -> None:
    feats, _ = synthetic.make_samples(60, np.random.default_rng(3))
    rows = feats.reshape(60, -1)
    rows[::7, ::11] *= 1e-7  # exponents too (%.4g writes 1.234e-08)
    src = tmp_path / "train_features.txt"
    np.savetxt(src, rows, fmt="%.4g")
    one = parallel.convert_file(src, tmp_path / "one.f32", width=3900)
    two = parallel.convert_file(
        src, tmp_path / "two.f32", width=3900, threads=2, min_range_bytes=50_000
    )
    assert (one.threads, one.ranges) == (1, 1)
    assert two.threads == 2 and two.ranges == 2 * parallel.RANGES_PER_THREAD
    assert (tmp_path / "one.f32").read_bytes() == (tmp_path / "two.f32").read_bytes()
    expected = np.loadtxt(src, dtype=np.float32)
    got = np.fromfile(tmp_path / "two.f32", np.float32).reshape(60, 3900)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert two.rows == one.rows == 60
    # Column sums are added in another order: equal to float64 rounding.
    np.testing.assert_allclose(two.sums, one.sums, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(two.sums_sq, one.sums_sq, rtol=1e-12)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "one.f32",
        "train_features.txt",
        "two.f32",
    ]


def test_an_error_in_the_second_range_names_its_line_in_the_file(tmp_path: Path) -> None:
    src = tmp_path / "train_features.txt"
    src.write_bytes(lines_of(400, 6))
    ranges = parallel.split_lines(src, 2 * parallel.RANGES_PER_THREAD, min_bytes=1000)
    start, stop = ranges[1]
    text = src.read_bytes()
    bad_line = text[:start].count(b"\n") + 3  # the third line of the second range
    lines = text.splitlines(True)
    fields = lines[bad_line - 1].split()
    token = fields[2][:-1] + b"x"  # the same length: the cuts stay where they were
    fields[2] = token
    lines[bad_line - 1] = b" ".join(fields) + b"\n"
    src.write_bytes(b"".join(lines))
    assert parallel.split_lines(src, 2 * parallel.RANGES_PER_THREAD, min_bytes=1000)[1] == (
        start,
        stop,
    )  # same cuts
    for threads in (2, 1):
        with pytest.raises(DataError) as caught:
            parallel.convert_file(
                src, tmp_path / "x.f32", width=6, threads=threads, min_range_bytes=1000
            )
        message = f"{src}:{bad_line}: field 3: not a number: '{token.decode()}'"
        assert str(caught.value) == message
        assert sorted(p.name for p in tmp_path.iterdir()) == ["train_features.txt"]


def test_a_blank_line_ending_one_range_before_data_in_the_next(tmp_path: Path) -> None:
    src = tmp_path / "f.txt"
    src.write_bytes(lines_of(400, 6))
    start, _ = parallel.split_lines(src, 8, min_bytes=1000)[2]
    text = src.read_bytes()
    blank = text[:start].count(b"\n")  # the last line of the second range becomes blank
    lines = text.splitlines(True)
    lines[blank - 1] = b" " * (len(lines[blank - 1]) - 1) + b"\n"  # the same length
    src.write_bytes(b"".join(lines))
    assert parallel.split_lines(src, 8, min_bytes=1000)[2][0] == start
    with pytest.raises(DataError) as caught:
        parallel.convert_file(src, tmp_path / "x.f32", width=6, threads=2, min_range_bytes=1000)
    assert (
        str(caught.value) == f"{src}:{blank}: blank line followed by more data on line {blank + 1}"
    )


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}-{p.stem}")
def test_every_fixture_gives_what_one_pass_gives(path: Path, tmp_path: Path) -> None:
    """Every line its own range (or nearly): BOM, CRLF, blank lines, no final newline..."""
    kwargs = {"width": first_width(path), "allow_nonfinite": path.stem == "nonfinite"}
    one = convert(path, tmp_path / "one.f32", 1, **kwargs)
    many = convert(path, tmp_path / "many.f32", 3, min_range_bytes=1, **kwargs)
    if isinstance(one, DataError):
        assert isinstance(many, DataError) and str(many) == str(one)
        assert list(tmp_path.iterdir()) == []
    else:
        assert isinstance(many, parallel.Converted), many
        assert many.rows == one.rows
        assert (tmp_path / "one.f32").read_bytes() == (tmp_path / "many.f32").read_bytes()


def test_gzip_is_read_in_one_pass(tmp_path: Path) -> None:
    src = tmp_path / "f.txt.gz"
    src.write_bytes(gzip.compress(lines_of(2000, 5)))
    done = parallel.convert_file(src, tmp_path / "x.f32", width=5, threads=2, min_range_bytes=1)
    assert (done.threads, done.ranges, done.rows) == (1, 1, 2000)
    got = np.fromfile(tmp_path / "x.f32", np.float32)
    np.testing.assert_array_equal(got, np.arange(10000, dtype=np.float32))
    with pytest.raises(ValueError, match="gzip"):
        next(textfile.iter_chunks(src, span=textfile.Span(100, 200)))


def test_a_stop_request_leaves_no_files(tmp_path: Path) -> None:
    src = tmp_path / "f.txt"
    src.write_bytes(lines_of(3000, 6))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(Preempted, match="stopped by signal during cache conversion"):
        parallel.convert_file(
            src, out / "x.f32", width=6, threads=2, min_range_bytes=1000, stop=lambda: True
        )
    assert list(out.iterdir()) == []


def test_a_failed_write_in_any_thread_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk in the middle (the third write, whichever thread makes it)."""
    import errno
    import os

    src = tmp_path / "f.txt"
    src.write_bytes(lines_of(3000, 6))
    out = tmp_path / "out"
    out.mkdir()
    real, calls = os.pwrite, []

    def pwrite(fd: int, data: object, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(OSError, match="No space left"):
        parallel.convert_file(src, out / "x.f32", width=6, threads=2, min_range_bytes=1000)
    assert len(calls) >= 3
    assert list(out.iterdir()) == []


def test_cache_with_two_threads_matches_one(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "MIN_RANGE_BYTES", 100_000)
    data = shutil.copytree(tiny_data, tmp_path / "data")
    one = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp_path / "one"))
    two = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp_path / "two"), threads=2)
    for name in ("train_x.f32", "train_y.f32", "test_x.f32", "test_y.f32"):
        assert (one.path / name).read_bytes() == (two.path / name).read_bytes()
    np.testing.assert_allclose(two.feature_mean, one.feature_mean, rtol=1e-6)
    np.testing.assert_allclose(two.feature_std, one.feature_std, rtol=1e-6)
    assert sorted(p.name for p in two.path.iterdir()) == sorted(p.name for p in one.path.iterdir())


def test_no_parsing_thread_outlives_the_call(tmp_path: Path) -> None:
    """Done, failed or stopped: the call returns only after its threads ended."""
    import threading

    src = tmp_path / "f.txt"
    src.write_bytes(lines_of(2000, 6))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(lines_of(1500, 6) + b"1 2 x 4 5 6\n" + lines_of(500, 6))
    runs = [
        (src, {}),
        (bad, {}),
        (src, {"stop": lambda: True}),
    ]
    for path, extra in runs:
        (tmp_path / "x.f32").unlink(missing_ok=True)  # the destination must be a new file
        with contextlib.suppress(DataError, Preempted):
            parallel.convert_file(
                path, tmp_path / "x.f32", width=6, threads=2, min_range_bytes=1000,
                hasher=hashlib.sha256, **extra,
            )  # fmt: skip
        assert [t.name for t in threading.enumerate() if t.name.startswith("parse-")] == []


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_the_destination_is_a_new_file_never_written_through(planted: str, tmp_path: Path) -> None:
    src = tmp_path / "f.txt"
    src.write_bytes(lines_of(100, 6))
    target = tmp_path / "target.txt"
    target.write_bytes(b"keep me\n")
    dst = tmp_path / "x.f32"
    if planted == "file":
        dst.write_bytes(b"old\n")
    else:
        dst.symlink_to(target)
    with pytest.raises(FileExistsError):
        parallel.convert_file(src, dst, width=6)
    assert target.read_bytes() == b"keep me\n"
    assert dst.is_symlink() if planted == "symlink" else dst.read_bytes() == b"old\n"


def test_written_bytes_are_reported_and_can_stop_the_conversion(tmp_path: Path) -> None:
    from app.errors import InputTooLarge

    src = tmp_path / "f.txt"
    src.write_bytes(lines_of(3000, 6))
    seen: list[int] = []

    def written(count: int) -> None:
        seen.append(count)
        if sum(seen) > 10_000:
            raise InputTooLarge("too large")

    for threads in (1, 2):
        seen.clear()
        dst = tmp_path / f"x{threads}.f32"
        with pytest.raises(InputTooLarge):
            parallel.convert_file(
                src, dst, width=6, threads=threads, min_range_bytes=1000, written=written
            )
        assert not dst.exists() and 10_000 < sum(seen) < 3000 * 6 * 4


def test_without_the_compiled_parser_threads_give_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blocks, "compiled", None)
    src = tmp_path / "f.txt"
    src.write_bytes(lines_of(2000, 6) + b"\n\n")
    one = parallel.convert_file(src, tmp_path / "one.f32", width=6)
    two = parallel.convert_file(src, tmp_path / "two.f32", width=6, threads=2, min_range_bytes=1000)
    assert two.threads == 2 and two.rows == one.rows == 2000
    assert (tmp_path / "one.f32").read_bytes() == (tmp_path / "two.f32").read_bytes()
    np.testing.assert_allclose(two.sums, one.sums, rtol=1e-12)
    np.testing.assert_allclose(two.sums_sq, one.sums_sq, rtol=1e-12)


def test_rows_are_written_from_the_first_range_on_and_ranges_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A range is counted just before it is parsed: a large file is read from the disk once,
    # and the first rows are written before the last range is counted (a first pass over
    # the whole file kept a 32 GB conversion at 0 MB/s for 20 s).
    src = tmp_path / "train_features.txt"
    src.write_bytes(lines_of(400, 50))
    seen: list[str] = []
    count, write = reader.Held.lines, parallel._write_rows
    monkeypatch.setattr(reader.Held, "lines", lambda *a: seen.append("count") or count(*a))
    monkeypatch.setattr(parallel, "_write_rows", lambda *a: seen.append("parse") or write(*a))
    many = 3 * 2 * parallel.RANGES_PER_THREAD  # more than the threads' share sets
    monkeypatch.setattr(parallel, "MAX_RANGE_BYTES", src.stat().st_size // many)
    got = parallel.convert_file(
        src, tmp_path / "two.f32", width=50, threads=2, min_range_bytes=1000
    )
    assert got.ranges >= many  # MAX_RANGE_BYTES, not the ranges per thread, set the count
    assert seen.count("count") == seen.count("parse") == got.ranges
    assert seen.index("parse") < len(seen) - 1 - seen[::-1].index("count")
    expected = np.arange(400 * 50, dtype=np.float32).reshape(400, 50)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "two.f32", np.float32), expected.ravel())


def test_the_text_read_is_left_out_of_the_page_cache(tmp_path: Path) -> None:
    """A text the conversion reads from the disk itself, as a text larger than the memory
    is, is left out of the page cache (read directly, or dropped once parsed: the rows made
    from it are what the training reads next); measured with mincore on the real file
    system."""
    from app.data.input.stream import cached_share

    src = tmp_path / "x.txt"
    with open(src, "wb") as f:
        f.write(lines_of(4000, 400))  # 11.7 MB
        f.flush()
        os.fsync(f.fileno())  # clean pages: the only ones the kernel drops
    size = src.stat().st_size
    if cached_share((src, 0), size) < 0.9:
        pytest.skip("this file system keeps no page cache of a file just written")

    def from_the_disk() -> None:
        with open(src, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert cached_share((src, 0), size) < 0.1

    from_the_disk()
    one = convert(src, tmp_path / "one.f32", 1, width=400)
    assert isinstance(one, parallel.Converted)
    assert cached_share((src, 0), size) > 0.9  # one pass: the pages stay
    from_the_disk()
    done = convert(src, tmp_path / "out.f32", 2, width=400, min_range_bytes=1 << 20)
    assert isinstance(done, parallel.Converted) and done.ranges > 2 and done.threads == 2
    assert cached_share((src, 0), size) < 0.1
    assert (tmp_path / "out.f32").read_bytes() == (tmp_path / "one.f32").read_bytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_the_rows_are_digested_as_they_are_written(threads: int, tmp_path: Path) -> None:
    """The digest the conversion computes of its output, ranges in any order, is the digest
    of the file it leaves; rows that do not follow each other (blank lines across ranges)
    give none, for the caller to read the file."""
    src = tmp_path / "x.txt"
    src.write_bytes(lines_of(3000, 40))
    done = parallel.convert_file(
        src, tmp_path / "x.f32", width=40, threads=threads, min_range_bytes=20_000,
        hasher=hashlib.sha256,
    )  # fmt: skip
    assert done.ranges == (1 if threads == 1 else 2 * parallel.RANGES_PER_THREAD)
    assert done.checksum == hashlib.sha256((tmp_path / "x.f32").read_bytes()).hexdigest()
    assert parallel.convert_file(src, tmp_path / "y.f32", width=40).checksum is None
    blank = tmp_path / "blank.txt"
    blank.write_bytes(lines_of(300, 40) + b"\n" * 40_000)  # whole ranges of blank lines
    done = parallel.convert_file(
        blank, tmp_path / "b.f32", width=40, threads=threads, min_range_bytes=20_000,
        hasher=hashlib.sha256,
    )  # fmt: skip
    assert done.rows == 300
    if threads == 1:
        assert done.checksum == hashlib.sha256((tmp_path / "b.f32").read_bytes()).hexdigest()
    else:
        assert done.ranges > 2 and done.checksum is None
