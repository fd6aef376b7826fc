"""Measurements kept beside the data caches (app/data/cache/measured.py): reused only when what
they depend on is exactly the same and the entry is valid; damaged or foreign entries are
measured again, never trusted; the marker and eviction rules of the cache directory hold."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.atomic import open_dir
from app.data.cache import evict as cache_evict
from app.data.cache import marker as cache_marker
from app.data.cache import measured

DEPENDS = {"cpu_model": "Zen", "cpu_flags": ["avx2", "fma"], "threads": {"intra_op": 2}}
VALUE = {"formulation": "fast", "precision": "float32", "timings": {"fast/float32": 40.0}}


def _events(logged: list[logging.LogRecord], name: str) -> list[logging.LogRecord]:
    return [r for r in logged if getattr(r, "event", "") == name]


def _entry(store: measured.Store, depends: dict = DEPENDS) -> Path:
    return store.directory / f"choice-{measured.key_of('choice', depends)}"


def test_a_kept_value_is_reused_only_for_the_same_dependencies(tmp_path: Path) -> None:
    store = measured.Store(tmp_path / "cache")
    assert measured.lookup(store, "choice", DEPENDS) is None  # no cache directory yet
    measured.keep(store, "choice", DEPENDS, VALUE)
    assert measured.lookup(store, "choice", DEPENDS) == VALUE
    for changed in (
        {**DEPENDS, "cpu_flags": ["avx2", "avx512f", "fma"]},
        {**DEPENDS, "threads": {"intra_op": 1}},
        {**DEPENDS, "tensorflow": "2.22.0"},
    ):
        assert measured.lookup(store, "choice", changed) is None
    assert measured.lookup(store, "ridge", DEPENDS) is None  # another kind of measurement
    assert measured.lookup(None, "choice", DEPENDS) is None  # nowhere to keep
    with open_dir(store.directory) as root:
        assert cache_marker.owned(root, _entry(store).name) == "measured"


@pytest.mark.parametrize(
    "damage",
    ["truncated", "value_edited", "other_depends", "other_format", "no_entry", "not_json"],
)
def test_a_damaged_or_foreign_entry_is_measured_again_with_a_warning(
    tmp_path: Path, logged: list[logging.LogRecord], damage: str
) -> None:
    store = measured.Store(tmp_path / "cache")
    measured.keep(store, "choice", DEPENDS, VALUE)
    path = _entry(store) / measured.ENTRY
    entry = json.loads(path.read_text())
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "value_edited":
        entry["value"]["formulation"] = "plain"  # the digest no longer matches
        path.write_text(json.dumps(entry))
    elif damage == "other_depends":  # a foreign entry under this key, with its own digest
        entry["depends"] = {"cpu_model": "other"}
        path.write_text(json.dumps(entry))
    elif damage == "other_format":
        entry["format"] = measured.FORMAT + 1
        path.write_text(json.dumps(entry))
    elif damage == "no_entry":
        path.unlink()
    else:
        path.write_bytes(b"\xff\xfe garbage")
    logged.clear()
    assert measured.lookup(store, "choice", DEPENDS) is None
    (warning,) = _events(logged, "measured_invalid")
    assert warning.levelno == logging.WARNING
    measured.keep(store, "choice", DEPENDS, VALUE)  # measured again: the entry replaced
    assert measured.lookup(store, "choice", DEPENDS) == VALUE


def test_a_directory_not_ours_under_the_name_is_never_trusted_nor_touched(
    tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    store = measured.Store(tmp_path / "cache")
    planted = _entry(store)
    planted.mkdir(parents=True)
    forged = {"format": measured.FORMAT, "what": "choice", "depends": DEPENDS, "value": VALUE}
    (planted / measured.ENTRY).write_text(json.dumps(forged))  # no marker: not coretrain's
    before = sorted(p.name for p in planted.iterdir())
    logged.clear()
    assert measured.lookup(store, "choice", DEPENDS) is None
    assert _events(logged, "measured_invalid")
    measured.keep(store, "choice", DEPENDS, VALUE)  # refused, as a warning: the run goes on
    assert _events(logged, "measured_not_kept")
    assert sorted(p.name for p in planted.iterdir()) == before
    assert json.loads((planted / measured.ENTRY).read_text()) == forged


def test_only_the_newest_entries_are_kept_and_data_caches_are_not_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(measured, "KEEP", 2)
    store = measured.Store(tmp_path / "cache")
    names = []
    for i in range(4):
        depends = {**DEPENDS, "i": i}
        measured.keep(store, "choice", depends, VALUE)
        names.append(_entry(store, depends).name)
        marker = _entry(store, depends) / cache_marker.MARKER
        os.utime(marker, ns=(i * 10**9, (i + 1) * 10**9))  # last use: in order
        if i == 0:
            measured.lookup(store, "choice", depends)  # a reuse makes it the newest
    left = sorted(p.name for p in store.directory.iterdir())
    assert left == sorted([names[0], names[3]])
    with open_dir(store.directory) as root:  # the data caches' rule ignores them
        assert cache_evict.evict(root, "0123456789abcdef", cache_evict.Keep(count=1)) == []
    assert sorted(p.name for p in store.directory.iterdir()) == left


# A keep() killed (SIGKILL, in a process of its own) at one of two moments: just after its
# entry's directory is made, and with the marker written under its temporary name, not yet
# renamed into place. Either leaves an entry without a marker.
_KILLED_KEEP = """
import json, os, signal, sys
from pathlib import Path
from app.data.cache import marker, measured

def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if sys.argv[2] == "after_mkdir":
    marker.write = killed
else:
    os.replace = killed
depends, value = json.loads(sys.argv[3]), json.loads(sys.argv[4])
measured.keep(measured.Store(Path(sys.argv[1])), "choice", depends, value)
"""


@pytest.mark.parametrize("moment", ["after_mkdir", "before_marker_rename"])
def test_an_entry_a_killed_keep_left_is_replaced_and_the_next_run_reuses_it(
    tmp_path: Path, logged: list[logging.LogRecord], moment: str
) -> None:
    store = measured.Store(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_KEEP, str(store.directory), moment, json.dumps(DEPENDS),
         json.dumps(VALUE)],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr
    left = sorted(p.name for p in _entry(store).iterdir())
    assert left == ([] if moment == "after_mkdir" else [left[0]])
    assert all(name.startswith("..coretrain.") and name.endswith(".tmp") for name in left)
    logged.clear()
    assert measured.lookup(store, "choice", DEPENDS) is None  # measured again...
    (invalid,) = _events(logged, "measured_invalid")
    assert "left unmarked by a killed run" in invalid.problem
    measured.keep(store, "choice", DEPENDS, VALUE)  # ...and kept, replacing the leftover
    assert not _events(logged, "measured_not_kept")
    assert measured.lookup(store, "choice", DEPENDS) == VALUE  # the next run reuses it
    assert sorted(p.name for p in _entry(store).iterdir()) == [cache_marker.MARKER, measured.ENTRY]


def test_an_entry_whose_file_became_a_directory_is_replaced(tmp_path: Path) -> None:
    store = measured.Store(tmp_path / "cache")
    measured.keep(store, "choice", DEPENDS, VALUE)
    entry = _entry(store) / measured.ENTRY
    entry.unlink()
    (entry / "x").mkdir(parents=True)
    assert measured.lookup(store, "choice", DEPENDS) is None
    measured.keep(store, "choice", DEPENDS, VALUE)
    assert measured.lookup(store, "choice", DEPENDS) == VALUE


@pytest.mark.parametrize("planted", ["fifo", "huge"])
def test_an_entry_file_that_is_a_fifo_or_huge_is_refused_unread(
    tmp_path: Path, logged: list[logging.LogRecord], planted: str
) -> None:
    """Whoever can write the cache directory plants a FIFO (an open for reading waits for a
    writer: the run hung before it trained) or a 2 GiB sparse file under entry.json."""
    store = measured.Store(tmp_path / "cache")
    measured.keep(store, "choice", DEPENDS, VALUE)
    entry = _entry(store) / measured.ENTRY
    entry.unlink()
    if planted == "fifo":
        os.mkfifo(entry)
    else:
        entry.touch()
        os.truncate(entry, 2 << 30)
    logged.clear()
    found: list[object] = []
    looking = threading.Thread(
        target=lambda: found.append(measured.lookup(store, "choice", DEPENDS))
    )
    looking.start()
    looking.join(timeout=60)
    if looking.is_alive():  # blocked in open(): give it a writer, then fail
        os.close(os.open(entry, os.O_WRONLY | os.O_NONBLOCK))
        looking.join()
        pytest.fail("the lookup waited for a writer of the FIFO")
    assert found == [None]
    (invalid,) = _events(logged, "measured_invalid")
    assert (
        "not a regular file" if planted == "fifo" else "more than 1048576 bytes"
    ) in invalid.problem
    measured.keep(store, "choice", DEPENDS, VALUE)
    assert measured.lookup(store, "choice", DEPENDS) == VALUE
