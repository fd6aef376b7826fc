"""Data files are found by name, plain or .gz, and known by content (no TensorFlow)."""

from __future__ import annotations

import gzip
import os
import shutil
import socket
from pathlib import Path

import pytest

from app.data import synthetic
from app.data.formats.sources import ROLES, find, fingerprint
from app.errors import ConfigError, DataError
from tests.conftest import run_cli


def _gzip_all(src: Path, dst: Path) -> None:
    dst.mkdir()
    for role in ROLES:
        with open(src / f"{role}.txt", "rb") as f, gzip.open(dst / f"{role}.txt.gz", "wb") as g:
            shutil.copyfileobj(f, g)


def test_each_role_is_found_plain_or_gzip(tiny_data: Path, tmp_path: Path) -> None:
    packed = tmp_path / "gz"
    _gzip_all(tiny_data, packed)
    assert find(tiny_data, "train_labels") == tiny_data / "train_labels.txt"
    assert find(packed, "train_labels") == packed / "train_labels.txt.gz"


def test_an_explicit_name_wins(tiny_data: Path, tmp_path: Path) -> None:
    assert find(tmp_path, "test_labels", "my.labels") == tmp_path / "my.labels"


def test_two_candidates_are_a_usage_error_and_none_is_a_data_error(
    tiny_data: Path, tmp_path: Path
) -> None:
    shutil.copy(tiny_data / "train_labels.txt", tmp_path / "train_labels.txt")
    shutil.copy(tiny_data / "train_labels.txt", tmp_path / "train_labels.txt.gz")
    with pytest.raises(ConfigError, match=r"both train_labels\.txt and train_labels\.txt\.gz"):
        find(tmp_path, "train_labels")
    with pytest.raises(DataError, match=r"test_labels\.txt: missing data file .*\.gz"):
        find(tmp_path, "test_labels")


def test_the_cli_reports_two_candidates_in_one_line_exit_2(tiny_data: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    with (
        open(data / "test_features.txt", "rb") as f,
        gzip.open(data / "test_features.txt.gz", "wb") as g,
    ):
        shutil.copyfileobj(f, g)
    proc = run_cli("train", "--data", str(data), "--output", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "test_features.txt and test_features.txt.gz" in line and "--test-features" in line


def test_the_fingerprint_follows_content_and_modification_time(tmp_path: Path) -> None:
    path = tmp_path / "x.txt"
    path.write_bytes(b"1 2 3\n" * 100_000)
    first = fingerprint(path)
    link = tmp_path / "link.txt"
    link.symlink_to(path)  # the same file by another path (as a mount shows it): the same
    assert fingerprint(link) == first
    copy = tmp_path / "copy.txt"
    shutil.copy2(path, copy)  # same bytes, same mtime, but another file: converted again
    assert fingerprint(copy) != first
    assert {k: v for k, v in fingerprint(copy).items() if k != "ctime_ns"} == {
        k: v for k, v in first.items() if k != "ctime_ns"
    }
    size = len(path.read_bytes())
    data = bytearray(path.read_bytes())
    data[size * 8 // 17 + 10] = ord("9")  # inside one of the sampled blocks
    path.write_bytes(bytes(data))
    os.utime(path, ns=(first["mtime_ns"], first["mtime_ns"]))  # even with the old mtime
    assert fingerprint(path)["sample_sha256"] != first["sample_sha256"]
    # A change between the samples is told by the modification time an edit sets, and
    # by the status change time when the modification time is put back.
    os.utime(path, ns=(first["mtime_ns"] + 1, first["mtime_ns"] + 1))
    assert fingerprint(path) != first and fingerprint(path)["bytes"] == first["bytes"]
    big = tmp_path / "big.txt"
    big.write_bytes(b"1 2 3\n" * 1_000_000)  # 6 MB: most bytes lie between the samples
    before = fingerprint(big)
    with open(big, "r+b") as f:
        f.seek(100_000)  # after the first 64 KiB sample, before the second (at 6 MB / 17)
        f.write(b"7")
    os.utime(big, ns=(before["mtime_ns"], before["mtime_ns"]))  # as `touch -r` leaves it
    after = fingerprint(big)
    assert after["sample_sha256"] == before["sample_sha256"]
    assert after["mtime_ns"] == before["mtime_ns"] and after["ctime_ns"] != before["ctime_ns"]


def _special(path: Path, kind: str) -> None:
    """Make ``path`` a FIFO, a character device (a symlink to /dev/null) or a socket."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/null")
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()


@pytest.mark.parametrize(
    ("kind", "named"),
    [("fifo", "a FIFO"), ("device", "a character device"), ("socket", "a socket")],
)
def test_a_data_file_that_is_not_a_regular_file_is_refused_by_find(
    tmp_path: Path, kind: str, named: str
) -> None:
    _special(tmp_path / "train_labels.txt", kind)
    with pytest.raises(DataError, match=rf"labels\.txt: data file is {named}.*, not a regular"):
        find(tmp_path, "train_labels")
    with pytest.raises(DataError, match=rf"x\.lab: data file is {named}"):
        _special(tmp_path / "x.lab", kind)
        find(tmp_path, "train_labels", "x.lab")


def test_a_fifo_among_the_data_files_is_exit_3_in_one_line_before_it_is_opened(
    tiny_data: Path, tmp_path: Path
) -> None:
    """Opening a FIFO for reading blocks until a writer comes (forever, SIGTERM or not):
    the run refuses it from its stat, and nothing ever opened it (a writer would block)."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    (data / "test_labels.txt").unlink()
    os.mkfifo(data / "test_labels.txt")
    proc = run_cli("train", "--data", str(data), "--output", str(tmp_path / "o"), timeout=120)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"coretrain: {data / 'test_labels.txt'}: data file is a FIFO (named pipe), "
        "not a regular file"
    )
    with pytest.raises(OSError, match="No such device or address"):  # ENXIO: no reader
        os.close(os.open(data / "test_labels.txt", os.O_WRONLY | os.O_NONBLOCK))


def test_a_dangling_symlink_is_named_as_one(tmp_path: Path) -> None:
    data = tmp_path / "data"
    synthetic.generate(data, train=20, test=5, seed=0)
    (data / "train_labels.txt").unlink()
    (data / "train_labels.txt").symlink_to("/mnt/gone/labels.txt")
    proc = run_cli("train", "--data", str(data), "--output", str(tmp_path / "o"))
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == (
        f"coretrain: {data / 'train_labels.txt'}: a symlink to /mnt/gone/labels.txt, which "
        "does not exist"
    )
