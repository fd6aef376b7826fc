"""Several data sets side by side in one cache directory: the least recently used beyond
``--cache-keep`` / ``--cache-keep-bytes`` go, never one a live run holds (its shared lock
on the marker), across processes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.config import CacheConfig, TrainConfig
from app.data import cache, synthetic
from app.data.cache import marker as cache_marker
from tests.conftest import REPO, prepare_cache


def _data(tmp_path: Path, seed: int) -> Path:
    out = tmp_path / f"data-{seed}"
    if not out.exists():
        synthetic.generate(out, train=40, test=10, seed=seed)
    return out


def _prepare(tmp_path: Path, seed: int, keep: cache.Keep | None = None) -> cache.DataCache:
    config = TrainConfig.of(
        data_dir=_data(tmp_path, seed), output_dir=tmp_path / "out", cache_dir=tmp_path / "shared"
    )
    return prepare_cache(config, keep=keep)


def _used_at(c: cache.DataCache, seconds: int) -> None:
    """Set ``c``'s last use (its marker's modification time) to ``seconds`` after the epoch."""
    os.utime(c.path / cache_marker.MARKER, (seconds, seconds))


def _names(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "shared").iterdir()}


def _three(tmp_path: Path) -> list[cache.DataCache]:
    """Caches of data sets 1, 2, 3, released, last used in the order 2 (oldest), 3, 1."""
    made = [_prepare(tmp_path, seed) for seed in (1, 2, 3)]
    for c, at in zip(made, (3000, 1000, 2000), strict=True):
        c.release()
        _used_at(c, at)
    return made


def test_several_data_sets_live_side_by_side_under_the_default_bound(tmp_path: Path) -> None:
    one, two, three = _three(tmp_path)
    again = _prepare(tmp_path, 1)  # the first data set again: reused, not converted
    assert again.path == one.path
    assert _names(tmp_path) == {one.path.name, two.path.name, three.path.name}
    assert cache.Keep().count == 4 == CacheConfig().cache_keep


def test_the_least_recently_used_beyond_the_count_go(
    tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    one, two, three = _three(tmp_path)
    logged.clear()
    four = _prepare(tmp_path, 4, keep=cache.Keep(2))
    # newest first: 4 (the run's own), then 1 (3000 s), 3 (2000 s), 2 (1000 s)
    assert _names(tmp_path) == {four.path.name, one.path.name}
    evicted = [r for r in logged if getattr(r, "event", "") == "cache_evicted"]
    assert [r.path for r in evicted] == [str(three.path), str(two.path)]


def test_the_least_recently_used_beyond_the_bytes_go(tmp_path: Path) -> None:
    one, _, _ = _three(tmp_path)
    size = sum(p.stat().st_size for p in one.path.iterdir())  # every cache here has this size
    four = _prepare(tmp_path, 4, keep=cache.Keep(10, 2 * size))
    assert _names(tmp_path) == {four.path.name, one.path.name}
    four.release()
    _used_at(four, 500)  # now the oldest, but the run's own cache always stays
    again = _prepare(tmp_path, 4, keep=cache.Keep(10, 1))
    assert _names(tmp_path) == {again.path.name}


@pytest.mark.parametrize(
    ("count", "sizes"),
    [(3, 2), (2, 3)],
    ids=["the_bytes_bound_before_the_count", "the_count_bounds_before_the_bytes"],
)
def test_the_byte_bound_adds_to_the_count(tmp_path: Path, count: int, sizes: int) -> None:
    """--cache-keep and --cache-keep-bytes both apply: a cache goes when it passes either,
    whichever bounds first (each bound alone would keep a third cache here)."""
    one, two, three = _three(tmp_path)
    size = sum(p.stat().st_size for p in one.path.iterdir())  # every cache here has this size
    four = _prepare(tmp_path, 4, keep=cache.Keep(count, sizes * size))
    # newest first: 4 (own), 1 (3000 s), 3 (2000 s), 2 (1000 s); two fit both bounds
    assert _names(tmp_path) == {four.path.name, one.path.name}
    assert not three.path.exists() and not two.path.exists()


def test_a_cache_in_use_is_kept_beyond_the_bound_and_counts(tmp_path: Path) -> None:
    one, _, three = _three(tmp_path)
    held = _prepare(tmp_path, 2)  # the oldest, but used by a run of this process
    _used_at(held, 1000)
    four = _prepare(tmp_path, 4, keep=cache.Keep(2))
    # newest first: 4 (own), 1 (kept: 2 caches), 3 (removed), 2 (beyond, but in use)
    assert _names(tmp_path) == {four.path.name, one.path.name, held.path.name}
    assert not three.path.exists()
    held.release()
    _prepare(tmp_path, 4, keep=cache.Keep(1))
    assert _names(tmp_path) == {four.path.name}


# --- two real processes sharing the cache volume ---------------------------------------

USE = """
import json, sys
import numpy as np
from pathlib import Path
from app.config import TrainConfig
from app.data import cache
from tests.conftest import prepare_cache

data, shared, keep = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
config = TrainConfig.of(data_dir=data, output_dir=shared.parent / "out", cache_dir=shared)
c = prepare_cache(config, keep=cache.Keep(keep))
print(json.dumps({"path": str(c.path)}), flush=True)
if sys.argv[4] == "hold":  # a training run: reads its rows until told to end
    sys.stdin.readline()
    rows = c.read_rows("train", "features", np.arange(c.train_size))
    print(json.dumps({"rows": len(rows), "sum": float(rows.sum())}), flush=True)
"""


def _use(tmp_path: Path, seed: int, keep: int, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", USE, str(_data(tmp_path, seed)), str(tmp_path / "shared"),
         str(keep), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip


def _line(proc: subprocess.Popen[str]) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"exit {proc.wait()}"
    return json.loads(line)


def test_a_run_converting_other_data_never_removes_the_cache_of_a_live_run(
    tmp_path: Path,
) -> None:
    """Process A uses data set 1's cache; process B converts data set 2 into the same
    directory with --cache-keep 1. A's cache stays, and A reads all its rows afterwards;
    once A has ended, the next run evicts it."""
    a = _use(tmp_path, 1, 4, "hold")
    try:
        used = Path(_line(a)["path"])
        b = _use(tmp_path, 2, 1, "once")
        other = Path(_line(b)["path"])
        assert b.wait(timeout=120) == 0
        assert other != used and used.exists()
        assert a.stdin is not None
        a.stdin.write("go\n")
        a.stdin.flush()
        read = _line(a)
        assert a.wait(timeout=120) == 0
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    x = np.loadtxt(_data(tmp_path, 1) / "train_features.txt", dtype=np.float32)
    assert read == {"rows": 40, "sum": float(x.reshape(40, 20, 195).sum())}
    c = _use(tmp_path, 2, 1, "once")
    assert _line(c)["path"] == str(other) and c.wait(timeout=120) == 0
    assert _names(tmp_path) == {other.name}  # A has ended: its cache goes


@pytest.mark.parametrize("keep", ["0", "x"])
def test_cache_keep_is_a_count_of_at_least_one(tmp_path: Path, keep: str) -> None:
    from tests.conftest import run_cli

    proc = run_cli("train", "--data", str(tmp_path), "--output", str(tmp_path / "o"),
                   "--cache-keep", keep)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "--cache-keep" in proc.stderr


def test_every_use_of_a_cache_is_its_last_use(tmp_path: Path) -> None:
    one = _prepare(tmp_path, 1)
    one.release()
    _used_at(one, 1000)
    again = _prepare(tmp_path, 1)
    assert (again.path / cache_marker.MARKER).stat().st_mtime > 1000


EXEC_USE = """
import json, os, sys
from pathlib import Path
from app.config import TrainConfig
from app.data.cache.store import HELD_FD_ENV
from tests.conftest import prepare_cache

data, shared = Path(sys.argv[1]), Path(sys.argv[2])
config = TrainConfig.of(data_dir=data, output_dir=shared.parent / "out", cache_dir=shared)
if sys.argv[3] == "first":  # a run that restarts itself with a new thread plan
    held = prepare_cache(config)  # the run's inputs, alive until the exec
    held.hand_over()
    os.execv(sys.executable, [sys.executable, *sys.argv[:3], "again"])
fd = int(os.environ[HELD_FD_ENV])
print(json.dumps({"inherited": fd}), flush=True)
sys.stdin.readline()
c = prepare_cache(config)
try:
    os.fstat(fd)
    closed = False
except OSError:
    closed = True
print(json.dumps({"path": str(c.path), "closed": closed, "env": HELD_FD_ENV in os.environ}),
      flush=True)
sys.stdin.readline()
"""


def test_a_run_restarting_itself_keeps_its_cache_held_across_the_exec(tmp_path: Path) -> None:
    """Between a restart's exec and the new image's own hold, another process converting
    other data with --cache-keep 1 finds the cache held; the new image then holds it
    itself and closes what it inherited."""
    script = tmp_path / "exec_use.py"
    script.write_text(EXEC_USE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    a = subprocess.Popen(
        [sys.executable, str(script), str(_data(tmp_path, 1)), str(tmp_path / "shared"), "first"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    try:
        assert _line(a)["inherited"] >= 0  # the new image, before it prepares its inputs
        (used,) = _names(tmp_path)
        b = _use(tmp_path, 2, 1, "once")
        other = _line(b)["path"]
        assert b.wait(timeout=120) == 0
        assert _names(tmp_path) == {used, Path(other).name}
        assert a.stdin is not None
        a.stdin.write("go\n")
        a.stdin.flush()
        assert _line(a) == {"path": str(tmp_path / "shared" / used), "closed": True, "env": False}
        a.stdin.close()
        assert a.wait(timeout=120) == 0
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    c = _use(tmp_path, 2, 1, "once")
    assert _line(c)["path"] == other and c.wait(timeout=120) == 0
    assert _names(tmp_path) == {Path(other).name}
