"""Bounds from the budget: the cache's size against the free space and --max-cache-bytes,
label columns, and the peak memory against a real cgroup memory limit.

The CLI runs here stop before TensorFlow is imported (the bounds are checked first), in
a second or two; the one run that trains inside a memory limit is marked slow.
"""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.atomic import file_system
from app.budget.memory import MIB
from app.data.cache import bounds
from app.data.formats import textfile
from app.data.formats.base import Shape
from app.data.formats.sources import ROLES, Sources
from app.data.formats.text import TextArray
from app.data.formats.textfile import opener, reader
from app.errors import DataError, InputTooLarge
from app.training.admit import memory as memory_rule
from benchmarks.cgroup_run import MEMORY_MOUNT, MemoryCgroup, memory_cgroup, unavailable_reason
from tests.conftest import REPO, SMALLEST, TINY_TRAIN_ARGS, events, json_lines, run_cli, widen
from tests.runs import mount_tmpfs, umount

LINE = b"0.5 -1.25 3 4.0 -0 100\n"  # six fields
ROW = widen(LINE)  # features of --height 8 --width 55 (SMALLEST), for the runs below
MEMORY_REASON = unavailable_reason(MEMORY_MOUNT, "memory")


def _labels(path: Path) -> Sources:
    """A data set whose training labels are ``path``."""
    return Sources(dict.fromkeys(ROLES, path), height=1, width=1)


def _small_data(directory: Path, lines: int = 4) -> Path:
    directory.mkdir(parents=True)
    for split in ("train", "test"):
        (directory / f"{split}_features.txt").write_bytes(ROW * lines)
        (directory / f"{split}_labels.txt").write_bytes(b"1 2 3\n" * lines)
    return directory


def _gzip_of_repeats(path: Path, block: bytes, times: int) -> None:
    """A single-member gzip file of ``block`` repeated ``times`` times, made by repeating one
    compressed segment: ``Z_FULL_FLUSH`` resets the compressor, so the segment decodes on
    its own anywhere in the stream. Costs one pass of zlib.crc32 over the text."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(times):
        crc = zlib.crc32(block, crc)
    size = len(block) * times
    with open(path, "wb") as f:
        f.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")  # RFC 1952 header
        for _ in range(times):
            f.write(segment)
        f.write(packer.flush(zlib.Z_FINISH))
        f.write(crc.to_bytes(4, "little") + (size % (1 << 32)).to_bytes(4, "little"))


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _arrays(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.f32*"))


def test_the_repeat_gzip_helper_makes_a_valid_file(tmp_path: Path) -> None:
    _gzip_of_repeats(tmp_path / "x.gz", LINE * 1000, 50)
    assert gzip.decompress((tmp_path / "x.gz").read_bytes()) == LINE * 50_000


def test_a_2_gib_gzip_is_refused_before_converting_on_a_small_file_system(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "volume"
    skip = mount_tmpfs(volume, "size=16m")
    if skip:
        pytest.skip(skip)
    try:
        data = _small_data(tmp_path / "data")
        (data / "train_features.txt").unlink()
        packed = data / "train_features.txt.gz"
        _gzip_of_repeats(packed, ROW * (1 << 10), (2 << 30) // (len(ROW) << 10))
        assert packed.stat().st_size < 20 << 20  # a 2 GiB text (3.9 GiB as float32) in a few MB
        out = volume / "out"
        proc = run_cli("train", "--data", str(data), "--output", str(out), *SMALLEST)
        written = _arrays(out)
    finally:
        umount(volume)
    assert proc.returncode == 3, proc.stderr
    line = _one_line(proc)
    assert re.match(
        rf"coretrain: {re.escape(str(packed))}: the data cache would take about [34]\.\d GiB", line
    )
    assert f"free on the file system {volume} (tmpfs)" in line
    assert written == []  # refused before converting
    assert events(json_lines(proc.stdout), "end")[-1]["exit_code"] == 3


def test_max_cache_bytes_refuses_before_converting(tmp_path: Path) -> None:
    data = _small_data(tmp_path / "data", lines=100)
    out = tmp_path / "out"
    args = ["--data", str(data), "--output", str(out), *SMALLEST, "--max-cache-bytes", "1000"]
    proc = run_cli("train", *args)
    assert proc.returncode == 3, proc.stderr
    assert "more than --max-cache-bytes 1000" in _one_line(proc)
    assert list((out / "cache").iterdir()) == []


def test_a_gzip_whose_trailer_understates_is_stopped_while_converting(tmp_path: Path) -> None:
    """A multi-member file: the trailer holds only the last (tiny) member's size, so the
    estimate passes; the bytes written pass the bound and the conversion stops."""
    data = _small_data(tmp_path / "data", lines=10)
    (data / "train_features.txt").unlink()
    packed = data / "train_features.txt.gz"
    packed.write_bytes(gzip.compress(ROW * 4_000) + gzip.compress(ROW))
    out = tmp_path / "out"
    limit = 3_000_000  # above the estimate (the first MiB read), below the 7 MB written
    args = ["--data", str(data), "--output", str(out), *SMALLEST, "--max-cache-bytes", str(limit)]
    proc = run_cli("train", *args)
    assert proc.returncode == 3, proc.stderr
    line = _one_line(proc)
    assert line.startswith(f"coretrain: {packed}: the data cache passed ")
    assert "while converting" in line
    assert [p for p in _arrays(out) if p.endswith(".part")] == []


def test_a_labels_file_with_an_absurd_column_count_is_refused_on_its_first_line(
    tmp_path: Path,
) -> None:
    data = _small_data(tmp_path / "data")
    labels = data / "train_labels.txt"
    labels.write_bytes(b"1 " * 30_000_000 + b"\n")  # 30 million columns, 60 MB
    out = tmp_path / "out"
    proc = run_cli("train", "--data", str(data), "--output", str(out), *SMALLEST)
    assert proc.returncode == 3, proc.stderr
    assert _one_line(proc) == (
        f"coretrain: {labels}:1: more than {bounds.MAX_OUTPUTS} label columns (the limit, "
        "app/data/cache/bounds.py): not a label file?"
    )
    assert _arrays(out) == []


def test_the_estimate_of_a_plain_and_a_gzip_file_is_their_cache_size(tmp_path: Path) -> None:
    plain = tmp_path / "x.txt"
    plain.write_bytes(LINE * 100_000)
    _gzip_of_repeats(tmp_path / "x.gz", LINE * 1000, 100)
    assert TextArray(plain).estimate(Shape(6)) == 100_000 * 6 * 4
    assert TextArray(tmp_path / "x.gz").estimate(Shape(6)) == 100_000 * 6 * 4


# --- the bounds, in process ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (0, "0 KiB"), (12 << 10, "12 KiB"), ((1 << 20) - 1, "1024 KiB"), (1 << 20, "1.0 MiB"),
        (300 << 20, "300.0 MiB"), ((1 << 30) - (1 << 20), "1023.0 MiB"), (1 << 30, "1.0 GiB"),
        (3 << 29, "1.5 GiB"), (5 << 30, "5.0 GiB"),
    ],
)  # fmt: skip
def test_sizes_in_messages_are_in_gib_mib_or_kib(count: int, shown: str) -> None:
    assert bounds._size(count) == shown


def test_the_bound_is_the_free_space_or_max_cache_bytes_when_smaller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The blocks free to unprivileged users times their size (4,096,000 bytes here)."""
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=1000, f_frsize=4096))
    free = bounds.Bound(4_096_000, f"the 3.9 MiB free on the file system {file_system(tmp_path)}")
    assert bounds.bound(tmp_path, None) == free
    assert bounds.bound(tmp_path, 4_096_001) == free
    assert bounds.bound(tmp_path, 4_096_000) == free  # as small: the file system's is the bound
    assert bounds.bound(tmp_path, 4_095_999) == bounds.Bound(4_095_999, "--max-cache-bytes 4095999")


def test_a_data_set_past_the_bound_is_refused_naming_its_largest_file(tmp_path: Path) -> None:
    sources = Sources({role: tmp_path / f"{role}.txt" for role in ROLES}, height=2, width=3)
    estimates = {
        "train_features": 3 << 29,  # the largest, not the last name in order
        "train_labels": 1 << 20,
        "test_features": 300 << 20,
        "test_labels": 12 << 10,
    }
    total = sum(estimates.values())
    bounds.check(sources, estimates, bounds.Bound(total, "the limit"))  # up to it: converted
    with pytest.raises(InputTooLarge) as caught:
        bounds.check(sources, estimates, bounds.Bound(total - 1, "--max-cache-bytes N"))
    assert str(caught.value) == (
        f"{tmp_path / 'train_features.txt'}: the data cache would take about 1.8 GiB (this "
        "file 1.5 GiB), more than --max-cache-bytes N; refusing to convert (raise "
        "--max-cache-bytes)"
    )
    with pytest.raises(InputTooLarge) as caught:  # the free space: the option can't help
        bounds.check(sources, estimates, bounds.Bound(total - 1, "the 1.0 GiB free on /c"))
    assert str(caught.value).endswith(
        "more than the 1.0 GiB free on /c; refusing to convert (free space there, or name "
        "another file system with --cache-dir)"
    )


def test_the_byte_guard_adds_what_each_block_wrote_and_stops_past_the_bound(
    tmp_path: Path,
) -> None:
    guard = bounds.Guard(bounds.Bound(10 << 20, "--max-cache-bytes 10485760"))
    guard.path = tmp_path / "train_features.txt"
    for _ in range(5):
        guard.add(2 << 20)  # 10 MiB in all: up to the bound
    assert guard.written == 10 << 20
    with pytest.raises(InputTooLarge) as caught:
        guard.add(1)
    assert str(caught.value) == (
        f"{guard.path}: the data cache passed 10.0 MiB while converting, more than "
        "--max-cache-bytes 10485760 (the file expands more than its size and first lines "
        "said); stopped"
    )


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        (LINE * 4, 4),
        (LINE[:-1], 1),  # no newline in the sample: one line of its size
        (b"12 3\n4 5\n6", 3),  # a short last line: the lines are rounded up
        (b"1\n\n\n\n", 4),  # blank lines are lines
        (b"", 0),
    ],
)
def test_the_cache_estimate_is_the_lines_times_the_width_in_float32(
    tmp_path: Path, text: bytes, lines: int
) -> None:
    """The lines: the file's size over the bytes per line of its first MiB."""
    paths = {role: tmp_path / f"{role}.txt" for role in ROLES}
    for path in paths.values():
        path.write_bytes(text)
    sources = Sources(paths, height=2, width=3)
    assert TextArray(paths["train_labels"]).estimate(Shape(5)) == lines * 5 * 4
    assert bounds.estimate(sources, 2, ("train_features", "test_labels")) == {
        "train_features": lines * 6 * 4,
        "test_labels": lines * 2 * 4,
    }


def test_label_columns_are_counted_on_the_first_line_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "train_labels.txt"
    path.write_bytes(b"1 " * bounds.MAX_OUTPUTS + b"\n")
    assert bounds.label_width(_labels(path)) == bounds.MAX_OUTPUTS
    path.write_bytes(b"1 " * (bounds.MAX_OUTPUTS + 1) + b"\n")
    with pytest.raises(DataError) as caught:
        bounds.label_width(_labels(path))
    assert str(caught.value) == (
        f"{path}:1: more than {bounds.MAX_OUTPUTS} label columns (the limit, "
        "app/data/cache/bounds.py): not a label file?"
    )


# --- memory -------------------------------------------------------------------------------


@pytest.mark.skipif(MEMORY_REASON is not None, reason=f"no real memory cgroup: {MEMORY_REASON}")
def test_a_run_that_cannot_fit_the_memory_limit_ends_with_exit_8_not_137(
    tiny_data: Path, tmp_path: Path
) -> None:
    # Between what any run of this shape takes (the floor, checked before converting) and
    # the estimate with this data: refused only because the data's part is counted.
    tiny = memory_rule.peak(
        rows=240, height=20, width=195, outputs=3, batch_size=40, memory_limit=1 << 30
    )
    least = memory_rule.floor(height=20, width=195, outputs=3, batch_size=40)
    limit = (least.total + tiny.total) // 2 // 4096 * 4096  # the kernel keeps whole pages
    assert least.total < limit < tiny.total
    mib = MIB
    out = tmp_path / "out"
    with memory_cgroup(limit, prefix="coretrain-test-memory") as group:
        proc = _run_in(group, ["--data", str(tiny_data), "--output", str(out), *TINY_TRAIN_ARGS])
        assert group.failcnt() == 0  # never reached the limit: refused, not killed
    assert proc.returncode == 8, proc.stderr
    line = _one_line(proc)
    assert line.startswith(f"coretrain: the run would need about {tiny.total / mib:,.0f} MiB")
    assert f"more than the memory limit of {limit / mib:,.0f} MiB; lower --batch-size" in line
    records = json_lines(proc.stdout)
    (memory,) = events(records, "memory")
    assert memory["memory_limit"] == limit and memory["peak_bytes"] > limit
    assert events(records, "end")[-1]["exit_code"] == 8
    assert events(records, "input") == []  # refused before TensorFlow


@pytest.mark.slow
@pytest.mark.skipif(MEMORY_REASON is not None, reason=f"no real memory cgroup: {MEMORY_REASON}")
def test_in_a_real_memory_limit_the_estimate_covers_the_measured_peak(
    tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with memory_cgroup(1 << 30, prefix="coretrain-test-memory") as group:
        proc = _run_in(group, ["--data", str(tiny_data), "--output", str(out), "--max-steps", "6",
                               *TINY_TRAIN_ARGS])  # fmt: skip
        charged = group.peak()
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = json_lines(proc.stdout)
    (memory,) = events(records, "memory")
    peak_rss = events(records, "end")[-1]["peak_rss_bytes"]
    print(f"estimate {memory['peak_bytes'] >> 20} MiB, peak RSS {peak_rss >> 20} MiB, "
          f"cgroup peak {charged >> 20} MiB")  # fmt: skip
    assert memory["memory_limit"] == 1 << 30
    assert peak_rss <= memory["peak_bytes"] and charged <= memory["peak_bytes"]


def _run_in(group: MemoryCgroup, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    return subprocess.run(
        group.command([sys.executable, "-m", "app", "train", *args]),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty file (no data lines)"),
        (b" \t\r\n\n", "empty file (no data lines)"),
        (b"\xef\xbb\xbf", "empty file (no data lines)"),
        (b"\n1 2 3\n", "1: blank line followed by more data on line 2"),
    ],
)
@pytest.mark.parametrize("packed", [False, True])
def test_labels_without_a_first_line_are_bad_data_naming_the_file(
    tmp_path: Path, content: bytes, problem: str, packed: bool
) -> None:
    path = tmp_path / ("train_labels.txt.gz" if packed else "train_labels.txt")
    path.write_bytes(gzip.compress(content) if packed else content)
    with pytest.raises(DataError) as caught:
        bounds.label_width(_labels(path))
    separator = "" if problem[0].isdigit() else " "
    assert str(caught.value) == f"{path}:{separator}{problem}"


def test_a_blank_first_label_line_is_named_before_the_lines_after_its_data_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The labels are read a line at a time past a blank first line, up to the first line
    of data: its problem is the one named, not that of a later line (over the line limit
    here; reads of 4 bytes, a limit of 100)."""
    monkeypatch.setattr(reader, "_READ_BYTES", 4)
    monkeypatch.setattr(opener, "MAX_LINE_BYTES", 100)
    path = tmp_path / "train_labels.txt"
    path.write_bytes(b"\n\n1 2\n" + b"1" * 200 + b"\n")
    with pytest.raises(DataError) as caught:
        bounds.label_width(_labels(path))
    assert str(caught.value) == f"{path}:1: blank line followed by more data on line 3"


def test_a_first_label_line_longer_than_the_line_limit_is_refused(tmp_path: Path) -> None:
    """The first line is counted as it is read, and stops at MAX_LINE_BYTES without a
    newline (64 MiB of blanks after one field: a small gzip file)."""
    path = tmp_path / "train_labels.txt.gz"
    path.write_bytes(gzip.compress(b"1" + b" " * (textfile.MAX_LINE_BYTES + 1), 1))
    with pytest.raises(DataError) as caught:
        bounds.label_width(_labels(path))
    assert str(caught.value) == f"{path}:1: line longer than {textfile.MAX_LINE_BYTES} bytes"


def test_an_empty_labels_file_is_exit_3_in_one_line(tmp_path: Path) -> None:
    data = _small_data(tmp_path / "data")
    (data / "train_labels.txt").write_bytes(b"")
    proc = run_cli("train", "--data", str(data), "--output", str(tmp_path / "out"), *SMALLEST)
    assert proc.returncode == 3, proc.stderr
    assert _one_line(proc) == f"coretrain: {data / 'train_labels.txt'}: empty file (no data lines)"
