"""The training rows rounded to bfloat16 (app/data/cache/rounded.py): the bits a bfloat16 step
computes on, kept beside the cache, made again when they no longer hold, and streamed.

The rounding is compared with TensorFlow's own operations in a subprocess (its thread
settings, among them the denormal flags, are process-global).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from app.config import TrainConfig
from app.data.cache import DataCache, rounded
from app.data.input import order, stream
from app.errors import StorageError
from tests.conftest import REPO, prepare_cache


@pytest.fixture
def cache(tiny_data: Path, tmp_path: Path) -> DataCache:
    return prepare_cache(
        TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path, cache_dir=tmp_path / "c")
    )


def _events(logged: list[logging.LogRecord], name: str) -> list[logging.LogRecord]:
    return [r for r in logged if getattr(r, "event", "") == name]


def _expected(c: DataCache) -> np.ndarray:
    """Every training row as a bfloat16 step computes on it (numpy; no denormals here)."""
    x = (np.asarray(c.features("train")) - c.feature_mean) * (1.0 / c.feature_std).astype(
        np.float32
    )
    return x.astype(rounded.DTYPE)


@pytest.mark.parametrize("threads", [1, 3])
def test_made_once_then_found_and_read_as_rounded_rows(
    cache: DataCache, logged: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch,
    threads: int,
) -> None:  # fmt: skip
    monkeypatch.setattr(rounded, "PIECE_BYTES", 7 * 4 * 20 * 195)  # 35 pieces, the last short
    assert rounded.find(cache, True) is None  # none yet, and nothing to warn of
    path = rounded.make(cache, True, threads=threads)
    assert path == cache.path / rounded.NAME
    (made,) = _events(logged, "input_rounded")
    assert made.bytes == 240 * 20 * 195 * 2 == path.stat().st_size
    got = np.fromfile(path, rounded.DTYPE).reshape(240, 20, 195)
    assert np.array_equal(got.view(np.uint16), _expected(cache).view(np.uint16))
    record = json.loads((cache.path / rounded.RECORD).read_text())
    st = path.stat()  # the status after the rename (it sets the ctime): not digested again
    assert record["status"] == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    with monkeypatch.context() as patched:
        patched.setattr(rounded, "digested", lambda *a: pytest.fail("digested again"))
        assert rounded.find(cache, True) == path
    assert not _events(logged, "cache_corrupt")
    assert [n for n in os.listdir(cache.path) if n.endswith(".tmp")] == []


def test_rows_made_for_other_statistics_or_changed_are_made_again(
    cache: DataCache, logged: list[logging.LogRecord]
) -> None:
    path = rounded.make(cache, True)
    assert rounded.find(cache, False) is None  # made standardised: not the raw rows
    (other,) = _events(logged, "cache_corrupt")
    assert "other rows or statistics" in other.getMessage()
    with open(path, "r+b") as f:  # one value changed in place: its status changes
        f.seek(1000)
        f.write(b"\x7f")
    assert rounded.find(cache, True) is None
    message = _events(logged, "cache_corrupt")[-1].getMessage()
    assert message.endswith(
        "bfloat16 do not match their recorded blake2b-256 digest; not used (made again where "
        "that pays)"
    )
    rounded.make(cache, True)
    assert rounded.find(cache, True) == path


def test_a_touched_file_with_the_same_bytes_is_digested_and_kept(cache: DataCache) -> None:
    path = rounded.make(cache, True)
    os.utime(path)  # a new status, the same content: digested, kept, the status renewed
    assert rounded.find(cache, True) == path
    record = json.loads((cache.path / rounded.RECORD).read_text())
    st = path.stat()
    assert record["status"] == [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def test_a_missing_file_or_damaged_record_is_made_again(
    cache: DataCache, logged: list[logging.LogRecord]
) -> None:
    path = rounded.make(cache, True)
    (cache.path / rounded.RECORD).write_text("{not json")
    assert rounded.find(cache, True) is None
    path.unlink()
    rounded.make(cache, True)
    (cache.path / rounded.NAME).unlink()
    assert rounded.find(cache, True) is None
    assert len(_events(logged, "cache_corrupt")) == 2


def test_a_stopped_writers_temporary_file_is_removed_a_working_ones_kept(
    cache: DataCache,
) -> None:
    stale, busy = cache.path / f".{rounded.NAME}.aaaa.tmp", cache.path / f".{rounded.NAME}.bbbb.tmp"
    stale.write_bytes(b"x" * 10)
    busy.write_bytes(b"y" * 10)
    with open(busy, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        rounded.make(cache, True)
        assert not stale.exists() and busy.exists()


def test_a_reader_of_the_rounded_rows_gives_the_orders_rows_in_bfloat16(
    cache: DataCache,
) -> None:
    source = stream.Source((rounded.make(cache, True), 0), rounded.DTYPE, standardized=True)
    reader = stream.Reader(cache, None, source, seed=3, batch_size=10, end_step=30)
    want = _expected(cache)
    for step in range(30):
        x, y, at = reader.element(step)
        assert x.dtype == rounded.DTYPE and x.ctypes.data % stream.ALIGNMENT == 0
        ids = order.batch_rows(3, step, 10, 240)
        assert np.array_equal(x[at][..., 0].view(np.uint16), want[ids].view(np.uint16))
        assert np.array_equal(y[at], np.asarray(cache.labels("train"))[ids])
    reader.close()


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    import tensorflow as tf
    from app.config import TrainConfig
    from app.data.cache import rounded
    from app.data.input import mapped, pipeline, stream
    from tests.conftest import prepare_cache

    # Edge values: denormal inputs, results that are denormal, ties and near-ties of the
    # rounding, signed zeros, large values; TensorFlow's kernels flush denormals.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 20, 195)).astype(np.float32) * 5
    bits = rng.integers(0, 2**32, (8, 20, 195), dtype=np.uint64).astype(np.uint32)
    x[:8] = bits.view(np.float32)
    x[8:10] = np.float32(3e-39) * rng.standard_normal((2, 20, 195)).astype(np.float32)
    x = np.where(np.isfinite(x), x, np.float32(1.0)).astype(np.float32)
    mean = (rng.standard_normal((20, 195)) * 1e-38).astype(np.float32)
    inv = (1.0 / np.abs(rng.standard_normal((20, 195)) + 0.5)).astype(np.float32)
    x[10:12] = mean + np.float32(1e-39)
    step = tf.function(lambda x, m, i: tf.cast((x - m) * i, tf.bfloat16))
    want = step(x[..., None], mean[..., None], inv[..., None]).numpy()[..., 0]
    rounded.BLOCK_BYTES = 7 * 4 * 20 * 195  # 64 rows in 10 blocks, the last of one
    got = rounded.rounded(x.copy(), mean, inv)
    raw = tf.function(lambda x: tf.cast(x, tf.bfloat16))(x).numpy()
    out = {"same": bool(np.array_equal(got.view(np.uint16), want.view(np.uint16))),
           "raw_same": bool(np.array_equal(rounded.rounded(x.copy(), None, None).view(np.uint16),
                                           raw.view(np.uint16))),
           "denormal_inputs": int(np.sum((x.view(np.uint32) & 0x7F800000) == 0))}

    # A bfloat16 step streamed from the rounded rows gets the bits it would compute on
    # from the float32 rows held in memory (its first operation is the rounding).
    data, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    c = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp / "o", cache_dir=tmp / "c"))
    stats = stream.Stats.of(c)
    kw = dict(seed=3, batch_size=100, start_step=0, end_step=7, stats=stats)
    n = c.train_size
    made = {  # makes_rounded: streamed under a page cache smaller than the file; held,
        # for at least ROUND_EPOCHS epochs
        "streamed_small_cache": pipeline.makes_rounded(c, False, 1 << 20, 1),
        "streamed_page_cached": pipeline.makes_rounded(c, False, None, 10**9),
        "held_long": pipeline.makes_rounded(c, True, 1 << 20, pipeline.ROUND_EPOCHS * n),
        "held_short": pipeline.makes_rounded(c, True, 1 << 20, pipeline.ROUND_EPOCHS * n - 1),
    }
    out["makes"] = made
    out["float32"] = pipeline.rounded_source(c, "float32", True, True) is None
    out["not_made"] = pipeline.rounded_source(c, "bfloat16", True, False) is None
    source = pipeline.rounded_source(c, "bfloat16", True, True)
    out["made"] = source is not None and Path(source.where[0]).name == rounded.NAME
    held = pipeline.train_input(c, 1, resident=True, **kw)
    streamed = pipeline.train_input(c, 1, source=source, **kw)
    held_rounded = pipeline.train_input(c, 1, resident=True, source=source, **kw)
    out["held_rounded"] = held_rounded.resident.rounded and not held.resident.rounded
    same = True
    for a, b, r in zip(held.dataset, streamed.dataset, held_rounded.dataset, strict=True):
        xa, ya = mapped.batch(a, held.held)
        want = tf.cast(xa, tf.bfloat16).numpy().view(np.uint16)
        for xb, yb in (mapped.batch(b, streamed.held), mapped.batch(r, held_rounded.held)):
            same &= xb.dtype == tf.bfloat16
            same &= bool(np.array_equal(want, xb.numpy().view(np.uint16)))
            same &= bool(np.array_equal(ya.numpy(), yb.numpy()))
    out["stream_same"] = same
    out["kept"] = pipeline.rounded_source(c, "bfloat16", True, False) is not None
    # Held or streamed is judged on the file that would be held: a limit whose page-cache
    # share (3/4) is below the float32 features file and above the kept bfloat16 rows.
    kept = pipeline.kept_rounded(c, "bfloat16", True)
    limit = 4 * n * c.height * c.width
    out["choices"] = [
        [got.resident, got.why] for got in (
            pipeline.choose_input(c, limit, 100, 10_000, held=kept),
            pipeline.choose_input(c, limit, 100, 10_000),
        )
    ]  # fmt: skip
    out["kept_float32"] = pipeline.kept_rounded(c, "float32", True)
    print(json.dumps(out))
    """
)


def test_the_rows_are_the_bits_tensorflow_computes_and_a_bfloat16_step_trains_on_them(
    tiny_data: Path, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_data), str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.splitlines()[-1])
    assert r["denormal_inputs"] > 1000
    assert r["same"] is True and r["raw_same"] is True
    assert r["makes"] == {
        "streamed_small_cache": True,  # one read from the disk every epoch: made
        "streamed_page_cached": False,  # a split the page cache holds: not for the stream
        "held_long": True,
        "held_short": False,
    }
    assert r["float32"] is True  # a float32 step trains from the float32 rows
    assert r["not_made"] is True
    assert r["made"] is True
    assert r["held_rounded"] is True  # held as the rounded rows, mapped
    assert r["stream_same"] is True  # streamed or held, the bits of the float32 rows' cast
    assert r["kept"] is True  # once made, used without making
    (on_kept, why_kept), (on_float32, why_float32) = r["choices"]
    assert on_kept is True and "page cache holds" in why_kept  # half the bytes: held
    assert on_float32 is False and "more than the page cache may hold" in why_float32
    assert r["kept_float32"] is None  # a float32 step keeps to the float32 rows


def test_rows_that_would_pass_max_cache_bytes_are_not_made(cache: DataCache) -> None:
    used = sum(p.stat().st_size for p in cache.path.iterdir())
    with pytest.raises(StorageError, match="more than --max-cache-bytes"):
        rounded.make(cache, True, max_bytes=used + 240 * 20 * 195 * 2 - 1)
    assert sorted(os.listdir(cache.path)) == sorted(p.name for p in cache.path.iterdir())
    assert not (cache.path / rounded.NAME).exists()
    assert [n for n in os.listdir(cache.path) if n.endswith(".tmp")] == []
    rounded.make(cache, True, max_bytes=used + 240 * 20 * 195 * 2)  # just fits
