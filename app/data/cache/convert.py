"""Converting the four text files into a cache's arrays, statistics and manifest.

Each file is parsed (:func:`app.data.formats.textfile.parallel.convert_file`, in several threads
when it
pays) into the work directory (app/data/cache/workdir.py), and its result is kept there as
soon as that file is done (its array, then ``<role>.json`` with its row count and digest,
``<role>.npz`` with its column sums), so a conversion stopped by SIGTERM, or killed, goes
on at the next run with the files not yet done; a kept array that does not match its
recorded digest is logged (``cache_corrupt``) and converted again. The statistics come
from the column sums; the manifest is written last. Progress (bytes, rate, ETA) is logged
every :data:`PROGRESS_EVERY_S` seconds. A float32 array that can be used where it lies
(``Array.in_place``) is not copied: it is read once for its statistics, NaN/Inf check and
digest (the digest its converted copy would have, so the run's identity is the same
whatever the format), and the manifest's ``in_place`` records its file and offset.
Bounds (app/data/cache/bounds.py): the bytes written while converting. Never imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app import logs
from app.atomic import Dir
from app.data.cache import bounds
from app.data.cache.store import (
    CHECKSUM,
    FILES,
    FORMAT_VERSION,
    MANIFEST,
    STATS,
    corrupt_event,
    digest,
    digested,
    file_status,
    hasher,
    keep_verified,
    npz,
    read_npz,
)
from app.data.formats.base import Array, Io, Place, Shape, add_sums
from app.data.formats.sources import ROLES, Sources
from app.errors import DataError, Preempted

#: Seconds between two ``cache_progress`` events while a file converts.
PROGRESS_EVERY_S = 5.0


class Progress:
    """``cache_progress`` events while converting: bytes parsed of the whole data set, the
    rate and the time left, at most every :data:`PROGRESS_EVERY_S` seconds (thread-safe)."""

    def __init__(self, total_bytes: int, clock: Callable[[], float] = time.monotonic):
        self.total, self.done, self.clock = total_bytes, 0, clock
        self.start = self.last = clock()
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.done += count
            now = self.clock()
            if now - self.last < PROGRESS_EVERY_S:
                return
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
        logs.event(
            "cache_progress",
            f"converted {self.done / 1e6:,.0f} of {self.total / 1e6:,.0f} MB "
            f"({100 * self.done / max(self.total, 1):.0f} %), {rate / 1e6:,.0f} MB/s",
            bytes_done=self.done,
            bytes_total=self.total,
            mb_per_s=round(rate / 1e6, 1),
            eta_s=round((self.total - self.done) / max(rate, 1e-9), 1),
        )


def _std(total: np.ndarray, total_sq: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, standard deviation) float32 of ``n`` rows from their float64 column sums and
    sums of squares; a constant column's deviation is 1 (left unscaled)."""
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf data (--allow-nonfinite)
        mean = total / n
        var = np.maximum(total_sq / n - np.square(mean), 0.0)
    std = np.sqrt(var)
    std[std < 1e-6] = 1.0  # constant columns: leave them unscaled
    return mean.astype(np.float32), std.astype(np.float32)


@dataclass
class Run:
    """One conversion: where it writes, how, and what bounds it."""

    sources: Sources
    work: Dir
    k: int
    threads: int
    stop: Callable[[], bool]
    progress: Progress
    guard: bounds.Guard


def _finished(run: Run, role: str, width: int) -> tuple[int, np.ndarray, np.ndarray, str] | None:
    """A file converted by an earlier, stopped run: (rows, sums, sums², digest), or None
    when it is not done, or its array does not match the digest recorded with it (logged
    as ``cache_corrupt``: converted again)."""
    work, final = run.work, FILES[role]
    if not all(work.is_file(n) for n in (f"{role}.json", f"{role}.npz", final)):
        return None
    record = json.loads(work.read_bytes(f"{role}.json"))
    rows, recorded = record["rows"], record.get("checksum")
    size = work.lstat(final)
    if size is None or size.st_size != 4 * rows * width or digest(work, final) != recorded:
        corrupt_event(work.path / final, "a finished file of a stopped conversion")
        return None
    sums = read_npz(work, f"{role}.npz")
    return rows, sums["sums"], sums["sums_sq"], recorded


def _convert_role(run: Run, role: str) -> tuple[int, np.ndarray, np.ndarray, str, Place | None]:
    """Convert one file into ``run.work`` unless a finished result is there, or scan an
    array read in place; (rows, sums, sums², digest, where it lies or None).

    The array is written as ``<name>.part`` (a new file) and renamed when complete;
    ``<role>.json`` (rows, digest) and ``<role>.npz`` (float64 column sums) are written
    after it: together they mark the file done. An array read in place is scanned (its
    values checked, summed and digested: nothing is written) by :func:`_scan`.
    """
    sources, work, final = run.sources, run.work, FILES[role]
    array, shape = sources.array(role), bounds.shape(sources, role, run.k)
    place = array.in_place(shape)
    if place is not None:
        return (*_scan(run, role, array, shape), place)
    done_before = _finished(run, role, shape.width)
    if done_before is not None:
        run.progress.add(array.size)
        return (*done_before, None)
    part = final + ".part"
    work.check(part, "cache file")
    work.remove(part)  # what a killed conversion left
    run.guard.path = Path(sources.label(role))
    io = Io(run.threads, run.stop, run.progress.add, run.guard.add, work.fd, hasher)
    done = array.convert(work.path / part, shape, sources.allow_nonfinite, io)
    work.rename(part, final)
    checksum, status = _digest_of(work, final, done.checksum)
    work.write_bytes(f"{role}.npz", npz({"sums": done.sums, "sums_sq": done.sums_sq}))
    record = {"rows": done.rows, "threads": done.threads, "checksum": checksum, "status": status}
    work.write_json(f"{role}.json", record)
    _converted_event(sources, role, done.rows, done.threads)
    return done.rows, done.sums, done.sums_sq, checksum, None


def _digest_of(work: Dir, name: str, computed: str | None) -> tuple[str, list[int]]:
    """The digest of the array ``name`` just renamed into place and its status (after the
    rename, which sets its change time): the digest the conversion computed of the bytes
    as it wrote them, else read from the file."""
    if computed is not None and (st := work.lstat(name)) is not None:
        return computed, file_status(st)
    return digested(work, name)


def _scan(
    run: Run, role: str, array: Array, shape: Shape
) -> tuple[int, np.ndarray, np.ndarray, str]:
    """An array used where it lies: its rows read once (checked for NaN/Inf, summed, and
    digested as the cache's own array would be: the same BLAKE2b of the same bytes), nothing
    written. Raises DataError, Preempted."""
    h = hasher()
    total, total_sq, rows = np.zeros(shape.width), np.zeros(shape.width), 0
    for chunk in array.chunks(shape, run.sources.allow_nonfinite):
        if run.stop():
            raise Preempted(f"{array.label}: stopped by signal while reading it")
        h.update(chunk.data)
        add_sums(chunk, total, total_sq)
        rows += len(chunk)
        run.progress.add(chunk.nbytes)
    _converted_event(run.sources, role, rows, 1, in_place=True)
    return rows, total, total_sq, h.hexdigest()


def _converted_event(sources: Sources, role: str, rows: int, threads: int, **extra: bool) -> None:
    logs.event(
        "cache_progress",
        f"{'read in place' if extra else 'converted'} {sources.label(role)}",
        file=role,
        rows=rows,
        threads=threads,
        **extra,
    )


def _check_rows(sources: Sources, sizes: dict[str, int]) -> None:
    """Raises DataError when the features and labels of a split differ in rows."""
    for split in ("train", "test"):
        nf, nl = sizes[f"{split}_features"], sizes[f"{split}_labels"]
        if nf != nl:
            raise DataError(
                f"{sources.label(f'{split}_labels')}: {nl} label rows but "
                f"{sources.label(f'{split}_features')} has {nf} feature rows"
            )


def _take_records(work: Dir) -> dict[str, list[Any]]:
    """Remove the per-file records (``<role>.json``, ``<role>.npz``: only for resuming) and
    return what they say of the arrays digested by a conversion: file name → [digest,
    *status when digested] (store.VERIFIED)."""
    verified = {}
    for role in ROLES:
        record = json.loads(work.read_bytes(f"{role}.json")) if work.is_file(f"{role}.json") else {}
        if isinstance(record.get("status"), list):
            verified[FILES[role]] = [record["checksum"], *record["status"]]
        work.remove(f"{role}.json")
        work.remove(f"{role}.npz")
    return verified


def convert(run: Run) -> dict[str, Any]:
    """Convert the four files of ``run.sources`` into ``run.work`` (those a stopped run
    finished are kept), then write ``stats.npz`` and the manifest; return the manifest.

    Raises DataError (bad data; the feature and label files of a split differ in lines),
    Preempted (``run.stop``), InputTooLarge (``run.guard``), OSError, StorageError.
    """
    sources, work, k = run.sources, run.work, run.k
    sizes: dict[str, int] = {}
    sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    checksums: dict[str, str] = {}
    in_place: dict[str, dict[str, Any]] = {}
    for role in ROLES:
        rows, total, total_sq, checksums[FILES[role]], place = _convert_role(run, role)
        sizes[role], sums[role] = rows, (total, total_sq)
        if place is not None:
            in_place[FILES[role]] = {"path": str(place.path), "offset": place.offset}
    _check_rows(sources, sizes)
    n_train = sizes["train_features"]
    f_mean, f_std = _std(*sums["train_features"], n_train)
    l_mean, l_std = _std(*sums["train_labels"], n_train)
    # Baseline: predict the training-label mean on the test set.
    t_sum, t_sq = sums["test_labels"]
    n_test = sizes["test_features"]
    lm = l_mean.astype(np.float64)
    sq_err = t_sq - 2 * lm * t_sum + n_test * np.square(lm)
    baseline = float(np.sqrt(max(sq_err.sum(), 0.0) / (n_test * k)))
    stats = npz(
        {
            "feature_mean": f_mean.reshape(sources.height, sources.width),
            "feature_std": f_std.reshape(sources.height, sources.width),
            "label_mean": l_mean,
            "label_std": l_std,
        }
    )
    work.write_bytes(STATS, stats)
    checksums[STATS] = hashlib.blake2b(stats, digest_size=32).hexdigest()
    verified = _take_records(work)
    manifest = {
        "format_version": FORMAT_VERSION,
        "height": sources.height,
        "width": sources.width,
        "num_outputs": k,
        "train_size": n_train,
        "test_size": n_test,
        "baseline_rmse": baseline,
        "sources": {role: sources.label(role) for role in ROLES},
        "fingerprints": sources.fingerprints(),
        "checksum": CHECKSUM,
        "checksums": checksums,
        "in_place": in_place,
    }
    work.write_json(MANIFEST, manifest)
    if verified:  # a reuse then reads only what changed since
        keep_verified(work, verified)
    return manifest
