"""The per-user cache directory (app/data/cache/userdir.py): ``$XDG_CACHE_HOME/coretrain``,
else ``~/.cache/coretrain``, shared by runs into new output directories; the run's own
OUTPUT/cache, with a ``cache_default`` warning saying why, when there is none."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from app.cluster.spec import ClusterOptions, resolve
from app.config import TrainConfig
from app.data.cache import userdir
from app.training.state import workspace
from tests.conftest import (
    SMALLEST,
    SMALLEST_VALUES,
    TINY_TRAIN_ARGS,
    assert_choice_reused,
    events,
    json_lines,
    run_cli,
)
from tests.runs import IS_ROOT, mount_tmpfs, umount


def _home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    return home


def test_xdg_cache_home_wins_and_is_made_private(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg" / "cache"
    found, note = userdir.locate({"XDG_CACHE_HOME": str(xdg), "HOME": str(_home(tmp_path))})
    assert (found, note) == (xdg / "coretrain", "")
    assert found.is_dir() and not (tmp_path / "home" / ".cache").exists()
    assert stat.S_IMODE(xdg.stat().st_mode) == 0o700  # the base it made: the spec's mode


@pytest.mark.parametrize("xdg", [None, ""])
def test_without_xdg_cache_home_it_is_under_the_home(tmp_path: Path, xdg: str | None) -> None:
    home = _home(tmp_path)
    environ = {"HOME": str(home)} if xdg is None else {"HOME": str(home), "XDG_CACHE_HOME": xdg}
    assert userdir.locate(environ) == (home / ".cache" / "coretrain", "")
    assert (home / ".cache" / "coretrain").is_dir()


def test_a_relative_xdg_cache_home_is_ignored_and_said(tmp_path: Path) -> None:
    home = _home(tmp_path)
    found, note = userdir.locate({"HOME": str(home), "XDG_CACHE_HOME": "rel/cache"})
    assert found == home / ".cache" / "coretrain"
    assert note.startswith("XDG_CACHE_HOME='rel/cache' is not an absolute path: ignored")
    assert not (Path.cwd() / "rel").exists()


@pytest.mark.parametrize(
    ("environ", "why"),
    [
        ({}, "HOME is not set"),
        ({"HOME": ""}, "HOME is not set"),
        ({"HOME": "home"}, "HOME='home' is not an absolute path"),
        ({"HOME": "{tmp}/missing"}, "HOME='{tmp}/missing' is not a directory"),
        ({"HOME": "{tmp}/file"}, "HOME='{tmp}/file' is not a directory"),
        (
            {"HOME": "{tmp}/missing", "XDG_CACHE_HOME": "x"},
            "XDG_CACHE_HOME='x' is not an absolute path: ignored, as the XDG Base Directory "
            "Specification says; HOME='{tmp}/missing' is not a directory",
        ),
    ],
)
def test_no_usable_home_gives_no_directory_and_makes_nothing(
    tmp_path: Path, environ: dict[str, str], why: str
) -> None:
    (tmp_path / "file").write_text("not a home\n")
    environ = {k: v.format(tmp=tmp_path) for k, v in environ.items()}
    assert userdir.locate(environ) == (None, why.format(tmp=tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_home_that_cannot_be_written_gives_no_directory(tmp_path: Path) -> None:
    home = tmp_path / "ro"
    skip = mount_tmpfs(home, "ro,size=64k")  # root ignores file modes: a read-only mount
    if skip:
        pytest.skip(skip)
    try:
        found, why = userdir.locate({"HOME": str(home)})
    finally:
        umount(home)
    assert (found, why) == (
        None,
        f"{home / '.cache'}: per-user cache directory cannot be made: Read-only file system",
    )


def _in_place(home: Path, kind: str) -> Path:
    """``~/.cache/coretrain`` made a ``kind`` that isn't a directory of this user's."""
    (home / ".cache").mkdir()
    place = home / ".cache" / "coretrain"
    if kind == "symlink":
        (home / "elsewhere").mkdir()
        place.symlink_to(home / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(place)  # opened O_DIRECTORY: refused at once, never waited on
    elif kind == "file":
        place.write_text("")
    else:
        place.mkdir()
        os.chown(place, 12345, 12345)
    return place


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("symlink", "per-user cache directory is a symbolic link; refusing to follow it"),
        ("fifo", "per-user cache directory not writable: File exists"),
        ("file", "per-user cache directory not writable: File exists"),
        ("foreign", "per-user cache directory belongs to uid 12345, not to this run's uid"),
    ],
)
def test_what_is_not_the_users_own_directory_is_not_used(
    tmp_path: Path, kind: str, why: str
) -> None:
    if kind == "foreign" and not IS_ROOT:
        pytest.skip("giving a directory to another user needs root")
    home = _home(tmp_path)
    place = _in_place(home, kind)
    found, note = userdir.locate({"HOME": str(home)})
    assert found is None and note.startswith(f"{place}: {why}"), note
    assert sorted(p.name for p in (home / ".cache").iterdir()) == ["coretrain"]
    if kind == "symlink":
        assert list((home / "elsewhere").iterdir()) == []  # not followed


def test_the_workspace_shares_the_users_directory_as_a_cache_dir(tmp_path: Path) -> None:
    home = _home(tmp_path)
    mine = home / ".cache" / "coretrain"
    config = TrainConfig.of(data_dir=tmp_path / "data", output_dir=tmp_path / "out")
    chief, other = (
        resolve({}, ClusterOptions(workers=2, worker_index=i, worker_hosts="w{index}"))
        for i in (0, 1)
    )
    for cluster, cache in ((None, mine), (chief, mine), (other, mine / "worker-1")):
        ws = workspace.for_run(config, cluster, {"HOME": str(home)})
        assert (ws.cache, ws.cache_top, ws.cache_note) == (cache, mine, "")
    named = config.with_options(cache_dir=tmp_path / "named")  # --cache-dir wins
    ws = workspace.for_run(named, other, {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert (ws.cache, ws.cache_top) == (tmp_path / "named" / "worker-1", tmp_path / "named")
    assert not (tmp_path / "xdg").exists()  # not even looked at
    for cluster, cache in ((None, "out/cache"), (other, "out/workers/worker-1/cache")):
        ws = workspace.for_run(config, cluster, {})  # no HOME: the run's own, as before
        assert (ws.cache, ws.cache_top) == (tmp_path / cache, tmp_path / "out")
        assert ws.cache_note == "HOME is not set"


def test_a_run_without_a_per_user_directory_says_so_and_caches_in_its_output(
    tmp_path: Path,
) -> None:
    """A run stopped by its data (exit 3, before TensorFlow) has logged why its cache is
    OUTPUT/cache, on stdout and in its log file."""
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "test"):
        (data / f"{split}_features.txt").write_text(" ".join(["1"] * SMALLEST_VALUES) + "\n")
        (data / f"{split}_labels.txt").write_text("")  # no data lines
    out = tmp_path / "out"
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), *SMALLEST,
        env={"HOME": str(tmp_path / "missing")},
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    records = json_lines(proc.stdout)
    assert records[0]["event"] == "start"  # the first record still
    (warned,) = events(records, "cache_default")
    assert warned["level"] == "WARNING" and warned["path"] == str(out / "cache")
    assert warned["message"] == (
        f"HOME='{tmp_path / 'missing'}' is not a directory: the data cache is {out / 'cache'}"
    )
    logged = [json.loads(line) for line in (out / "logs" / "train.jsonl").open()]
    assert [r["message"] for r in events(logged, "cache_default")] == [warned["message"]]
    assert not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_a_second_run_into_a_new_output_converts_nothing_and_times_nothing(
    tiny_data: Path, tmp_path: Path
) -> None:
    """No --cache-dir: the data cache and the kept measurements are in the user's
    ``~/.cache/coretrain``, so a run into a new output directory finds them."""
    home = _home(tmp_path)
    auto = ["--formulation", "auto", "--precision", "auto", "--max-steps", "2"]
    runs = []
    for out in (tmp_path / "a", tmp_path / "b"):
        proc = run_cli(
            "train", "--data", str(tiny_data), "--output", str(out), *TINY_TRAIN_ARGS, *auto,
            env={"HOME": str(home)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json_lines(proc.stdout))
        assert not (out / "cache").exists()
    first, second = runs
    mine = home / ".cache" / "coretrain"
    (converted,) = [r for r in events(first, "cache") if "reused" in r]
    assert converted["reused"] is False and Path(converted["path"]).parent == mine
    assert events(first, "choice")[0]["source"] == "measured"
    assert [r["reused"] for r in events(second, "cache") if "reused" in r] == [True]
    assert events(second, "cache")[0]["path"] == converted["path"]
    kept_choice = assert_choice_reused(events(first, "choice")[0], second)
    assert events(second, "linear_baseline")[0]["source"] == "cached"
    assert not events(first, "cache_default") and not events(second, "cache_default")
    kept = sorted(p.name.split("-")[0] for p in mine.iterdir() if "-" in p.name)
    timed_again = events(second, "choice")[0].get("measurement", {})
    assert kept == (["choice", "ridge"] if kept_choice or timed_again.get("kept") else ["ridge"])
