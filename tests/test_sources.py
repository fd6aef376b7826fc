"""Data files are found by name, plain or .gz, and known by content (no TensorFlow)."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from app.data.sources import ROLES, find, fingerprint
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
    copy = tmp_path / "copy.txt"
    shutil.copy2(path, copy)  # same bytes, same mtime: the same data
    assert fingerprint(copy) == first
    size = len(path.read_bytes())
    data = bytearray(path.read_bytes())
    data[size * 8 // 17 + 10] = ord("9")  # inside one of the sampled blocks
    path.write_bytes(bytes(data))
    os.utime(path, ns=(first["mtime_ns"], first["mtime_ns"]))  # even with the old mtime
    assert fingerprint(path)["sample_sha256"] != first["sample_sha256"]
    # A change between the samples is told by the modification time an edit sets.
    os.utime(path, ns=(first["mtime_ns"] + 1, first["mtime_ns"] + 1))
    assert fingerprint(path) != first and fingerprint(path)["bytes"] == first["bytes"]
