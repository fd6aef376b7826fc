"""The streamed reader (app/data/input/stream.py) gives the order's rows, resumes exactly, shards.

No TensorFlow: the reader is numpy and ``preadv`` on a real converted cache.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.config import TrainConfig
from app.data.cache import DataCache
from app.data.cache.rows import runs
from app.data.input import order, stream
from app.errors import StorageError
from tests.conftest import prepare_cache


@pytest.fixture(scope="module")
def cache(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> DataCache:
    tmp = tmp_path_factory.mktemp("stream")
    return prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp, cache_dir=tmp / "c"))


def _expected(c: DataCache, ids: np.ndarray) -> tuple:
    x = np.asarray(c.features("train"))[ids]
    return x[..., None], np.asarray(c.labels("train"))[ids]


def _batch(reader: stream.Reader, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Step ``step``'s raw batch as the training step gathers it from its element."""
    x, y, at = reader.element(step)
    assert at.dtype == np.int64 and at.shape == (reader.batch_size,)
    return x[at], y[at]


def test_each_batch_is_the_orders_rows(cache: DataCache) -> None:
    # 240 rows, batch 10: a window of 80 positions, three windows an epoch; 60 steps is
    # two and a half epochs, so chunks cross the epoch boundary.
    reader = stream.Reader(cache, None, seed=3, batch_size=10, end_step=60)
    for step in range(60):
        x, y = _batch(reader, step)
        ex, ey = _expected(cache, order.batch_rows(3, step, 10, 240))
        assert np.array_equal(x, ex) and np.array_equal(y, ey), step
    reader.close()


def test_a_chunk_is_aligned_and_the_same_for_each_of_its_steps(cache: DataCache) -> None:
    reader = stream.Reader(cache, None, seed=3, batch_size=10, end_step=60)
    first = reader.element(0)
    for step in range(1, order.WINDOW_STEPS):
        x, y, _ = reader.element(step)
        assert x is first[0] and y is first[1]
    assert reader.element(order.WINDOW_STEPS)[0] is not first[0]
    for array in first[:2]:  # TensorFlow takes 64-byte aligned arrays without a copy
        assert array.ctypes.data % 64 == 0 and array.flags.c_contiguous


def test_a_chunks_memory_is_used_again_only_once_nothing_refers_to_it(cache: DataCache) -> None:
    reader = stream.Reader(cache, None, seed=5, batch_size=10, end_step=200)
    kept = reader.element(0)[0]  # as a tensor still in flight would
    before = kept.copy()
    addresses = {reader.element(step)[0].ctypes.data for step in range(8, 200, 8)}
    assert len(addresses) <= stream.CHUNKS_HELD + 1  # 24 chunks in a few buffers
    assert kept.ctypes.data not in addresses  # none in the one still referred to
    assert np.array_equal(kept, before)


def test_a_resumed_reader_sees_the_same_batches(cache: DataCache) -> None:
    straight = stream.Reader(cache, None, seed=1, batch_size=10, end_step=40)
    all_batches = [_batch(straight, s) for s in range(40)]
    resumed = stream.Reader(cache, None, seed=1, batch_size=10, end_step=40)
    for step in range(13, 40):  # resumed mid-chunk (chunks are 8 steps)
        x, y = _batch(resumed, step)
        assert np.array_equal(x, all_batches[step][0]) and np.array_equal(y, all_batches[step][1])


def test_worker_shards_are_positions_of_the_global_batch(cache: DataCache) -> None:
    readers = [
        stream.Reader(cache, None, seed=2, batch_size=6, end_step=30, workers=3, index=i)
        for i in range(3)
    ]
    one = stream.Reader(cache, None, seed=2, batch_size=18, end_step=30)
    for step in range(30):
        shards = [_batch(r, step)[1] for r in readers]
        whole = _batch(one, step)[1]  # sorted rows: worker i has positions i::3
        for i, ys in enumerate(shards):
            assert np.array_equal(ys, whole[i::3])


def test_a_subset_of_rows_is_read_by_position(cache: DataCache) -> None:
    rows = np.sort(np.random.default_rng(0).choice(240, 170, replace=False))
    reader = stream.Reader(cache, rows, seed=4, batch_size=17, end_step=25)
    seen = []
    for step in range(25):
        x, y = _batch(reader, step)
        ids = rows[order.batch_rows(4, step, 17, 170)]
        ex, ey = _expected(cache, ids)
        assert np.array_equal(x, ex) and np.array_equal(y, ey)
        seen.append(ids)
    for e in (0, 1):  # 10 steps an epoch: every row of the subset once in each
        assert np.array_equal(np.sort(np.concatenate(seen[10 * e : 10 * e + 10])), rows)


def test_steps_out_of_order_and_memory_held(cache: DataCache) -> None:
    reader = stream.Reader(cache, None, seed=0, batch_size=10, end_step=100)
    later = _batch(reader, 50)
    _batch(reader, 3)  # an earlier chunk again: read again, the same rows
    assert np.array_equal(_batch(reader, 50)[1], later[1])
    _batch(reader, 90)
    assert max(reader._chunks) <= 90 // order.WINDOW_STEPS + 1
    assert len(reader._chunks) <= 2


def test_a_held_splits_row_ids_are_the_orders_rows(cache: DataCache) -> None:
    rows = np.sort(np.random.default_rng(1).choice(240, 200, replace=False))
    ahead = stream.Ahead(cache, rows, seed=6, batch_size=10, end_step=50)
    for step in range(50):
        assert np.array_equal(ahead.ids(step), rows[order.batch_rows(6, step, 10, 200)])
    ahead.close()
    assert max(ahead._announced) == 49 // order.WINDOW_STEPS  # the next chunk, announced


def test_a_held_split_announces_the_rows_of_the_file_it_holds(
    cache: DataCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split held as other rows than the cache's float32 ones (the bfloat16 rows) has
    those rows announced, at their offsets: announcing the float32 file read rows nothing
    gathers. Only this thread pool's announcements are recorded: threads other tests left
    (their readers and pools) announce their own files meanwhile."""
    import os

    held = tmp_path / "rows.bf16"
    row = 2 * cache.height * cache.width
    held.write_bytes(bytes(row * cache.train_size))
    source = stream.Source((held, 0), np.dtype(np.uint16), standardized=True)
    advised: list[tuple[str, int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_WILLNEED and threading.get_ident() in mine:
            advised.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    ahead = stream.Ahead(cache, None, source, seed=6, batch_size=10, end_step=50)
    mine = {ahead._pool.submit(threading.get_ident).result()}  # its one thread
    ahead.ids(0)
    ahead._pool.shutdown(wait=True)  # the announcement made (close() would cancel it)
    ids, _ = ahead._chunk(1)  # the next chunk's rows, announced
    starts, ends = runs(ids)
    spans = zip(starts.tolist(), ends.tolist(), strict=True)
    expected = [(str(held), int(ids[a]) * row, (b - a) * row) for a, b in spans]
    assert advised == expected


def test_the_share_the_page_cache_holds_is_read_from_the_kernel(tmp_path: Path) -> None:
    import os

    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(64 * 4096))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages: dropped
    assert stream.cached_share((path, 0), 64 * 4096) < 0.5
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)  # no readahead
        f.read(32 * 4096)  # the first half is read into the page cache
    got = stream.cached_share((path, 32 * 4096), 32 * 4096)  # the second half only
    assert got < 0.5
    assert stream.cached_share((path, 0), 16 * 4096) == 1.0


def test_runs_of_consecutive_rows() -> None:
    starts, ends = runs(np.array([3, 4, 5, 9, 11, 12]))
    assert starts.tolist() == [0, 3, 4] and ends.tolist() == [3, 4, 6]
    assert [len(a) for a in runs(np.zeros(0, np.int64))] == [0, 0]


def test_a_truncated_cache_file_is_a_storage_error(cache: DataCache, tmp_path: Path) -> None:
    import dataclasses
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(cache.path, copy)
    with open(copy / "train_x.f32", "r+b") as f:
        f.truncate(4 * 20 * 195 * 100)  # 100 of 240 rows left
    short = dataclasses.replace(cache, path=copy)
    out = np.empty((2, 20, 195, 1), np.float32)
    with pytest.raises(StorageError) as caught:
        stream.read_features(short, np.array([10, 200]), out)
    assert str(caught.value) == (
        f"{copy / 'train_x.f32'}: cache file truncated to 1,560,000 bytes (its rows need "
        f"3,744,000) while this run read it; delete {copy}"
    )


def test_the_memory_estimate_counts_the_chunks_a_reader_holds() -> None:
    from app.training.admit import memory

    assert memory.STREAMED_BATCHES == stream.CHUNKS_HELD * order.WINDOW_STEPS + 3
