"""A cache directory is shared ground: coretrain removes only the entries its marker proves
it made (checked by content and name), and nothing else in the directory."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest

from app.atomic import open_dir
from app.config import TrainConfig
from app.data import cache, synthetic
from app.data.cache import marker as cache_marker
from app.errors import StorageError
from app.training.admit.sources import find
from tests.conftest import prepare_cache

KEY = "0123456789abcdef"


def _data(tmp_path: Path, seed: int) -> Path:
    out = tmp_path / f"data-{seed}"
    synthetic.generate(out, train=40, test=10, seed=seed)
    return out


def _config(data: Path, shared: Path, **kw: object) -> TrainConfig:
    return TrainConfig.of(data_dir=data, output_dir=shared.parent / "out", cache_dir=shared, **kw)


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path → SHA-256 of its bytes)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _foreign(shared: Path) -> dict[str, str]:
    """What a shared directory holds besides coretrain: a repository, a volume's snapshots,
    reports with a manifest.json, hidden directories with and without an ``.owner``, a
    directory named like a key with a manifest (no marker), and forged markers."""
    for name, text in {
        ".git/HEAD": "ref: refs/heads/main\n",
        ".snapshot/hourly.0/notes.txt": "yesterday\n",
        "reports/manifest.json": "{}\n",
        "reports/r.pdf": "%PDF-1.4\n",
        ".partial-fedcba9876543210/train_x.f32": "not ours\n",
        ".tool/.owner": "",
        "fedcba9876543210/manifest.json": '{"format_version": 3}\n',
        "aaaaaaaaaaaaaaaa/.coretrain": "coretrain\n",  # the name alone proves nothing
        "bbbbbbbbbbbbbbbb/.coretrain": cache_marker.content("data-cache", KEY).decode(),
        f".{KEY}.1.x/.coretrain": '{"made_by": "someone", "kind": "cache-work", "key": "'
        + KEY
        + '"}',
    }.items():
        path = shared / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return _tree(shared)


def test_a_shared_cache_dir_keeps_everything_coretrain_did_not_make(tmp_path: Path) -> None:
    """The directory of the report (.git/, .snapshot/, reports/manifest.json + r.pdf) and
    look-alikes of coretrain's entries survive two data sets, their conversion, reuse and
    the eviction of one of them, byte for byte."""
    shared = tmp_path / "shared"
    before = _foreign(shared)
    a = prepare_cache(_config(_data(tmp_path, 1), shared))
    a.release()
    b = prepare_cache(_config(_data(tmp_path, 2), shared), keep=cache.Keep(1))
    assert not a.path.exists()  # coretrain's own, beyond --cache-keep 1: removed
    after = _tree(shared)
    assert {k: v for k, v in after.items() if k in before} == before
    ours = {k.split("/")[0] for k in after if k not in before}
    assert ours == {b.path.name}
    assert json.loads((b.path / cache_marker.MARKER).read_text()) == {
        "made_by": "coretrain",
        "kind": "data-cache",
        "key": b.path.name,
    }


def _raw(made_by: str, kind: str, key: str) -> bytes:
    return json.dumps({"made_by": made_by, "kind": kind, "key": key}).encode()


@pytest.mark.parametrize(
    ("name", "marker", "kind"),
    [
        (KEY, cache_marker.content("data-cache", KEY), "cache"),
        (f".partial-{KEY}", cache_marker.content("cache-work", KEY), "work"),
        (f".{KEY}.7.ab12cd34", cache_marker.content("cache-work", KEY), "work"),
        (f".{KEY}.7.ab12cd34", cache_marker.content("data-cache", KEY), "work"),  # cut at rename
        (f".{KEY}.bak", cache_marker.content("data-cache", KEY), None),  # a user's backup copy
        (f".{KEY}.7.ab12", cache_marker.content("cache-work", KEY), None),  # not claim's name
        (KEY, cache_marker.content("cache-work", KEY), None),  # work kind under a key name
        (KEY, cache_marker.content("data-cache", "fedcba9876543210"), None),  # other key
        (".partial-x", cache_marker.content("cache-work", KEY), None),
        (KEY, _raw("coretrainer", "data-cache", KEY), None),
        (KEY, _raw("coretrain", "model", KEY), None),
        (KEY, b"coretrain data-cache " + KEY.encode(), None),
        (KEY, b"", None),
        (KEY, cache_marker.content("data-cache", KEY) + b" " * 5000, None),  # not a marker
        (KEY, None, None),  # no marker
    ],
)
def test_an_entry_is_coretrains_only_by_its_marker_s_content_and_name(
    tmp_path: Path, name: str, marker: bytes | None, kind: str | None
) -> None:
    (tmp_path / name).mkdir()
    if marker is not None:
        (tmp_path / name / cache_marker.MARKER).write_bytes(marker)
    with open_dir(tmp_path) as root:
        assert cache_marker.owned(root, name) == kind


def test_a_symlinked_marker_or_directory_proves_nothing(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / cache_marker.MARKER).write_bytes(cache_marker.content("data-cache", KEY))
    (tmp_path / KEY).symlink_to(real)
    other = tmp_path / "fedcba9876543210"
    other.mkdir()
    (other / cache_marker.MARKER).symlink_to(real / cache_marker.MARKER)
    with open_dir(tmp_path) as root:
        assert cache_marker.owned(root, KEY) is None
        assert cache_marker.owned(root, other.name) is None
        assert not cache_marker.remove_if_unused(root, other.name)
    assert (real / cache_marker.MARKER).exists() and other.exists()


def test_an_earlier_version_s_cache_of_these_data_is_verified_marked_and_reused(
    tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    shared = tmp_path / "shared"
    config = _config(_data(tmp_path, 1), shared)
    made = prepare_cache(config)
    made.release()
    (made.path / cache_marker.MARKER).unlink()  # as an earlier coretrain left it
    logged.clear()
    again = prepare_cache(config)
    assert again.path == made.path
    cache_events = [r for r in logged if getattr(r, "event", "") == "cache"]
    assert [getattr(r, "adopted", False) for r in cache_events] == [True, False]
    assert cache_events[-1].reused is True  # not converted again
    with open_dir(shared) as root:
        assert cache_marker.owned(root, made.path.name) == "cache"


def test_an_earlier_version_s_cache_of_other_data_is_left_alone_and_named(
    tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    shared = tmp_path / "shared"
    old = prepare_cache(_config(_data(tmp_path, 1), shared))
    old.release()
    (old.path / cache_marker.MARKER).unlink()
    before = _tree(old.path)
    logged.clear()
    prepare_cache(_config(_data(tmp_path, 2), shared), keep=cache.Keep(1))
    assert _tree(old.path) == before  # not provably ours: not evicted
    (warning,) = [r for r in logged if getattr(r, "event", "") == "cache_unmarked"]
    assert warning.levelno == logging.WARNING and warning.names == [old.path.name]


def test_something_else_under_the_cache_s_own_name_is_exit_4_and_untouched(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "shared"
    config = _config(_data(tmp_path, 1), shared)
    made = prepare_cache(config)
    made.release()
    (made.path / cache_marker.MARKER).unlink()
    (made.path / "train_x.f32").write_bytes(b"someone else's file")
    before = _tree(made.path)
    with pytest.raises(StorageError, match=rf"{made.path}: in the way of the data cache") as err:
        prepare_cache(config)
    assert err.value.exit_code == 4
    assert _tree(made.path) == before


def test_a_marked_cache_removed_half_way_is_removed_by_the_next_run(tmp_path: Path) -> None:
    """Eviction removes the marker last: a removal cut short leaves a marked, incomplete
    cache, which the next run that needs it removes and converts again."""
    shared = tmp_path / "shared"
    config = _config(_data(tmp_path, 1), shared)
    made = prepare_cache(config)
    made.release()
    for name in os.listdir(made.path):
        if name not in (cache_marker.MARKER, "train_y.f32"):
            (made.path / name).unlink()
    again = prepare_cache(config)
    assert again.path == made.path and again.train_size == 40


def test_an_empty_directory_under_the_cache_s_name_is_replaced_by_the_cache(
    tmp_path: Path,
) -> None:
    """What an eviction leaves for a moment (marker unlinked, directory not yet removed):
    nothing to lose, so the conversion's rename replaces it."""
    shared = tmp_path / "shared"
    config = _config(_data(tmp_path, 1), shared)
    key = cache.source_key(find(config.data))
    (shared / key).mkdir(parents=True)
    made = prepare_cache(config)
    assert made.path == shared / key and made.train_size == 40


def test_the_current_directory_is_a_cache_directory(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--cache-dir .`` (README: ``.`` is a place teams point it at)."""
    from app.config import TrainConfig
    from tests.conftest import prepare_cache

    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("keep")
    monkeypatch.chdir(home)
    data = prepare_cache(
        TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path / "o", cache_dir=Path("."))
    )
    assert data.path.parent.resolve() == home and (home / ".bashrc").read_text() == "keep"
