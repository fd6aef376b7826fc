"""The binary cache: converted once, reused while sources are unchanged, never partial, its
arrays checked against their digests; conversions of the same data into one cache directory
may overlap."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.atomic import open_dir
from app.config import TrainConfig
from app.data import cache
from app.data.cache import convert as cache_convert
from app.data.cache import marker as cache_marker
from app.data.cache import store as cache_store
from app.errors import DataError, Preempted
from app.training.admit.sources import find
from tests.conftest import cache_dir, prepare_cache


def _config(data: Path, tmp_path: Path) -> TrainConfig:
    return TrainConfig.of(data_dir=data, output_dir=tmp_path / "out")


def test_conversion_matches_the_text_and_statistics(tiny_data: Path, tmp_path: Path) -> None:
    c = prepare_cache(_config(tiny_data, tmp_path))
    x = np.loadtxt(tiny_data / "train_features.txt", dtype=np.float32).reshape(-1, 20, 195)
    y = np.loadtxt(tiny_data / "train_labels.txt", dtype=np.float32)
    assert np.array_equal(c.features("train"), x)
    assert np.array_equal(c.labels("train"), y)
    assert (c.train_size, c.test_size, c.num_outputs) == (240, 60, 3)
    np.testing.assert_allclose(c.feature_mean, x.astype(np.float64).mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(c.label_std, y.astype(np.float64).std(axis=0), rtol=1e-4)


def test_unchanged_sources_reuse_the_cache_and_changed_ones_convert_again(
    tiny_data: Path, tmp_path: Path
) -> None:
    data = shutil.copytree(tiny_data, tmp_path / "data")
    config = _config(data, tmp_path)
    first = prepare_cache(config)
    assert prepare_cache(config).path == first.path
    lines = (data / "test_labels.txt").read_text().splitlines()
    lines[0] = "1 2 3"
    (data / "test_labels.txt").write_text("\n".join(lines) + "\n")
    second = prepare_cache(config)
    assert second.path != first.path
    assert second.labels("test")[0].tolist() == [1.0, 2.0, 3.0]
    assert first.path.exists()  # another data set's cache: kept (--cache-keep 4)
    first.release()
    prepare_cache(config, keep=cache.Keep(1))
    assert not first.path.exists()  # beyond --cache-keep 1, and nobody uses it any more
    assert sorted(p.name for p in cache_dir(config).iterdir()) == [second.path.name]


def test_line_count_mismatch_names_both_files_and_leaves_no_cache(
    tiny_data: Path, tmp_path: Path
) -> None:
    data = shutil.copytree(tiny_data, tmp_path / "data")
    lines = (data / "train_labels.txt").read_text().splitlines()
    (data / "train_labels.txt").write_text("\n".join(lines[:-1]) + "\n")
    config = _config(data, tmp_path)
    with pytest.raises(DataError) as err:
        prepare_cache(config)
    assert str(data / "train_labels.txt") in str(err.value)
    assert str(data / "train_features.txt") in str(err.value)
    assert "239" in str(err.value) and "240" in str(err.value)
    assert list(cache_dir(config).iterdir()) == []


def test_a_stopped_conversion_keeps_its_finished_files_and_the_rerun_does_the_rest(
    tiny_data: Path, tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    config = _config(tiny_data, tmp_path)
    root = cache_dir(config)
    work = root / f"{cache.PARTIAL}{cache.source_key(find(config.data))}"
    # Stop as soon as the first file is done (its record is the last thing written).
    with pytest.raises(Preempted):
        prepare_cache(config, stop=lambda: (work / "train_features.json").exists())
    assert sorted(p.name for p in root.iterdir()) == [work.name]  # no final cache
    kept = sorted(p.name for p in work.iterdir())
    assert kept == [
        cache_marker.MARKER, cache.OWNER, "train_features.json", "train_features.npz",
        "train_x.f32",
    ]  # fmt: skip
    logged.clear()
    resumed = prepare_cache(config)
    records = list(logged)
    starts = [r for r in records if getattr(r, "event", "") == "cache" and hasattr(r, "resumed")]
    assert starts[0].resumed == ["train_features"]
    converted = [r.file for r in records if getattr(r, "file", None)]
    assert converted == ["train_labels", "test_features", "test_labels"]
    fresh = prepare_cache(_config(tiny_data, tmp_path / "fresh"))
    for split in ("train", "test"):
        assert np.array_equal(resumed.features(split), fresh.features(split))
        assert np.array_equal(resumed.labels(split), fresh.labels(split))
    assert np.array_equal(resumed.feature_std, fresh.feature_std)
    assert sorted(p.name for p in root.iterdir()) == [resumed.path.name]


def test_the_cache_is_keyed_by_content_not_by_where_the_data_are(
    tiny_data: Path, tmp_path: Path
) -> None:
    data = shutil.copytree(tiny_data, tmp_path / "data")
    moved = tmp_path / "elsewhere"
    moved.symlink_to(data)  # the same files at another path, as a container's mount
    shared = tmp_path / "cache"
    a = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp_path / "a", cache_dir=shared))
    b = prepare_cache(TrainConfig.of(data_dir=moved, output_dir=tmp_path / "b", cache_dir=shared))
    assert a.path == b.path
    # A copy, even with the same modification times (copytree keeps them), is other files:
    # converted again (their status change time is the copy's).
    copy = shutil.copytree(data, tmp_path / "copy")
    d = prepare_cache(TrainConfig.of(data_dir=copy, output_dir=tmp_path / "d", cache_dir=shared))
    assert d.path != a.path and d.checksums == a.checksums
    # A changed byte in the middle of a file changes the key (its mtime changes too).
    path = moved / "train_labels.txt"
    text = path.read_bytes()
    middle = len(text) // 2
    path.write_bytes(
        text[:middle] + (b"1" if text[middle : middle + 1] != b"1" else b"2") + text[middle + 1 :]
    )
    c = prepare_cache(TrainConfig.of(data_dir=moved, output_dir=tmp_path / "c", cache_dir=shared))
    assert c.path != a.path


def _mark_work(d: Path, key: str = "0123456789abcdef") -> None:
    """``d`` made and marked as a conversion's work directory, as app/data/cache/workdir.py
    does it."""
    d.mkdir(parents=True)
    (d / cache_marker.MARKER).write_bytes(cache_marker.content(cache_marker.WORK, key))


def test_temporary_dirs_of_dead_conversions_are_removed(tiny_data: Path, tmp_path: Path) -> None:
    config = _config(tiny_data, tmp_path)
    root = cache_dir(config)
    root.mkdir(parents=True)
    dead = root / ".0123456789abcdef.999999999.0000000a"  # pid 999999999 does not exist
    alive = root / f".0123456789abcdef.{os.getpid()}.0000000b"
    for d in (dead, alive):
        _mark_work(d)
    prepare_cache(config)
    assert not dead.exists() and alive.exists()


def test_read_rows_matches_the_memory_map(tiny_data: Path, tmp_path: Path) -> None:
    c = prepare_cache(_config(tiny_data, tmp_path))
    idx = np.array([0, 1, 2, 7, 7, 100, 239])  # runs, a repeat, the last row
    assert np.array_equal(c.read_rows("train", "features", idx), c.features("train")[idx])
    assert np.array_equal(c.read_rows("train", "labels", idx), c.labels("train")[idx])
    assert c.read_rows("test", "labels", np.arange(0)).shape == (0, 3)


# --- digests ------------------------------------------------------------------------------


def _digest(path: Path) -> str:
    with open_dir(path.parent) as directory:
        return cache_store.digest(directory, path.name)


def test_a_tampered_cache_array_is_detected_and_converted_again(
    tiny_data: Path, tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    config = TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "out")
    first = prepare_cache(config)
    original = (first.path / "train_x.f32").read_bytes()
    manifest = (first.path / "manifest.json").read_text()
    tampered = bytearray(original)
    tampered[1000] ^= 0x40  # one bit of one value: same size, same manifest
    (first.path / "train_x.f32").write_bytes(bytes(tampered))
    first.release()  # no run uses it any more: it may be removed
    logged.clear()
    second = prepare_cache(config)
    corrupt = [r for r in logged if getattr(r, "event", "") == "cache_corrupt"]
    assert len(corrupt) == 1 and corrupt[0].levelno == logging.WARNING
    assert corrupt[0].path == str(first.path / "train_x.f32")
    assert next(r for r in logged if getattr(r, "event", "") == "cache").reused is False
    assert (second.path / "train_x.f32").read_bytes() == original
    assert (second.path / "manifest.json").read_text() == manifest


def test_a_verified_cache_is_not_read_again_until_a_file_is_touched(
    tiny_data: Path, tmp_path: Path, logged: list[logging.LogRecord],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The conversion records each array's status as it digests it, so the first reuse
    reads only ``stats.npz`` and records it too; the next reuse of untouched files reads
    none of them. A file rewritten in place (same size, its modification time set back)
    has another change time, so it is read, and the change is found."""
    config = TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "out")
    prepare_cache(config).release()
    read: list[str] = []
    real = cache_store.digested

    def counted(directory: Any, name: str) -> tuple[str, list[int]]:
        read.append(name)
        return real(directory, name)

    monkeypatch.setattr(cache_store, "digested", counted)
    first = prepare_cache(config)  # the arrays were recorded by the conversion
    assert read == [cache_store.STATS]
    assert (first.path / cache_store.VERIFIED).is_file()
    first.release()
    read.clear()
    prepare_cache(config).release()
    assert read == []  # nothing touched since: nothing read
    path = first.path / "test_y.f32"  # the last array verified: the others are not read
    before = path.stat()
    tampered = bytearray(path.read_bytes())
    tampered[100] ^= 0x40
    path.write_bytes(bytes(tampered))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same size and mtime
    logged.clear()
    again = prepare_cache(config)
    assert read[0] == "test_y.f32"  # then the conversion's own digests
    corrupt = [r for r in logged if getattr(r, "event", "") == "cache_corrupt"]
    assert [r.path for r in corrupt] == [str(path)]
    assert _digest(again.path / "test_y.f32") == again.checksums["test_y.f32"]


def test_a_cache_directory_that_cannot_be_written_is_verified_at_every_reuse(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "out")
    real = cache_store.Dir.write_json

    def refused(self: Any, name: str, obj: Any) -> None:
        if name == cache_store.VERIFIED:
            raise cache_store.StorageError("read-only file system")
        real(self, name, obj)

    monkeypatch.setattr(cache_store.Dir, "write_json", refused)
    for _ in range(3):  # the conversion, then two reuses
        reused = prepare_cache(config)
        assert not (reused.path / cache_store.VERIFIED).exists()
        reused.release()


def test_a_swapped_finished_file_of_a_stopped_conversion_is_converted_again(
    tiny_data: Path, tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    data = shutil.copytree(tiny_data, tmp_path / "data")
    config = TrainConfig.of(data_dir=data, output_dir=tmp_path / "out")
    done = prepare_cache(config)
    reference = (done.path / "train_x.f32").read_bytes()
    # What a conversion stopped after its first file leaves, with that file swapped.
    key = cache.source_key(find(config.data))
    partial = cache_dir(config) / f"{cache.PARTIAL}{key}"
    shutil.copytree(done.path, partial)
    shutil.rmtree(done.path)
    (partial / "train_features.json").write_text(
        f'{{"rows": 240, "threads": 1, "checksum": "{_digest(partial / "train_x.f32")}"}}'
    )
    np.savez(partial / "train_features.npz", sums=np.zeros(3900), sums_sq=np.zeros(3900))
    (partial / "train_x.f32").write_bytes(bytes(len(reference)))  # zeros, the same size
    logged.clear()
    again = prepare_cache(config)
    assert [r.path for r in logged if getattr(r, "event", "") == "cache_corrupt"] == [
        str(partial / "train_x.f32")
    ]
    assert (again.path / "train_x.f32").read_bytes() == reference


def test_a_temporary_file_a_killed_conversion_left_does_not_reach_the_cache(
    tiny_data: Path, tmp_path: Path
) -> None:
    config = TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "out")
    key = cache.source_key(find(config.data))
    partial = cache_dir(config) / f"{cache.PARTIAL}{key}"
    partial.mkdir(parents=True)
    stale = partial / ".train_features.npz.69a40875690a.tmp"  # killed mid atomic write
    stale.write_bytes(b"half a file")
    (partial / "notes.tmp").write_bytes(b"not a temporary of ours")  # not hidden: left
    done = prepare_cache(config)
    assert not (done.path / stale.name).exists() and not stale.exists()
    assert (done.path / "notes.tmp").read_bytes() == b"not a temporary of ours"


def test_the_manifest_records_a_digest_of_every_array(tiny_data: Path, tmp_path: Path) -> None:
    import json

    c = prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "out"))
    manifest = json.loads((c.path / "manifest.json").read_text())
    assert manifest["checksum"] == cache_store.CHECKSUM
    names = {"train_x.f32", "train_y.f32", "test_x.f32", "test_y.f32", "stats.npz"}
    assert set(manifest["checksums"]) == names
    for name in names:
        assert manifest["checksums"][name] == _digest(c.path / name)


# --- overlapping conversions into one cache directory -------------------------------------
# (Overlapping runs of one output directory: the output lock, tests/test_lock.py.)


def test_two_conversions_of_the_same_data_into_one_cache_dir_both_succeed(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run B finishes the same conversion while run A is still converting: A's rename
    finds B's complete cache (ENOTEMPTY) and uses it instead of failing."""
    shared = tmp_path / "shared-cache"
    config_a = TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "a", cache_dir=shared)
    config_b = TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "b", cache_dir=shared)
    real = cache_convert.convert
    finished_b: list[cache.DataCache] = []

    def convert_while_b_finishes(run: Any) -> dict:
        manifest = real(run)
        if not finished_b:
            monkeypatch.setattr(cache_convert, "convert", real)
            finished_b.append(prepare_cache(config_b))
        return manifest

    monkeypatch.setattr(cache_convert, "convert", convert_while_b_finishes)
    a = prepare_cache(config_a)
    assert a.path == finished_b[0].path
    assert sorted(p.name for p in shared.iterdir()) == [a.path.name]  # A's temp dir is gone
    assert not (a.path / cache.OWNER).exists()
    assert np.array_equal(a.features("train"), finished_b[0].features("train"))


HOLD_OWNER = """
import fcntl, sys, time
f = open(sys.argv[1], "rb")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def test_conversion_temp_dirs_live_by_their_owner_lock_not_their_pid(
    tiny_data: Path, tmp_path: Path
) -> None:
    """Containers sharing a cache volume have their own PID namespaces (both may be pid 7):
    a temporary dir is in use while its .owner file is flock-ed, whatever pid it names."""
    config = TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "out")
    root = cache_dir(config)
    live = root / ".0123456789abcdef.999999999.0000000c"  # no such pid here, but a live owner
    dead = root / f".0123456789abcdef.{os.getpid()}.0000000d"  # "our" pid, but nobody owns it
    for d in (live, dead):
        _mark_work(d)
        (d / cache.OWNER).write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OWNER, str(live / cache.OWNER)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        prepare_cache(config)
        assert live.exists() and not dead.exists()
    finally:
        holder.kill()
        holder.wait()
    prepare_cache(config)  # reused: the owner is gone now, so is its directory
    assert not live.exists()


def test_another_data_sets_stopped_conversion_is_kept_for_it_to_resume(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A stopped conversion of other data (its resumable .partial-<key>, nobody holding it)
    survives a run on these data; a dead private work directory is removed."""
    config = _config(tiny_data, tmp_path)
    root = cache_dir(config)
    root.mkdir(parents=True)
    other = "fedcba9876543210"
    resumable = root / f".partial-{other}"
    dead = root / f".{other}.999999999.0000000f"
    for d in (resumable, dead):
        d.mkdir()
        (d / cache_marker.MARKER).write_bytes(cache_marker.content(cache_marker.WORK, other))
    (resumable / "train_x.f32").write_bytes(b"finished part")
    prepare_cache(config)
    assert (resumable / "train_x.f32").read_bytes() == b"finished part"
    assert not dead.exists()
