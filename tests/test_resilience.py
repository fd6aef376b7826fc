"""Lose nothing: overlapping conversions into one cache directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.config import TrainConfig
from app.data import cache, cache_convert
from tests.conftest import prepare_cache

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------
# Overlapping runs sharing a cache directory (the output lock: tests/test_lock.py)


def test_two_conversions_of_the_same_data_into_one_cache_dir_both_succeed(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run B finishes the same conversion while run A is still converting: A's rename
    finds B's complete cache (ENOTEMPTY) and uses it instead of failing."""
    shared = tmp_path / "shared-cache"
    config_a = TrainConfig(data_dir=tiny_data, output_dir=tmp_path / "a", cache_dir=shared)
    config_b = TrainConfig(data_dir=tiny_data, output_dir=tmp_path / "b", cache_dir=shared)
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
    config = TrainConfig(data_dir=tiny_data, output_dir=tmp_path / "out")
    root = config.resolved_cache_dir
    live = root / ".0123456789abcdef.999999999.live"  # no such pid here, but a live owner
    dead = root / f".0123456789abcdef.{os.getpid()}.dead"  # "our" pid, but nobody owns it
    for d in (live, dead):
        d.mkdir(parents=True)
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
