"""The binary data cache: the text files parsed once into raw float32 arrays.

Layout: ``<cache_dir>/<key>/`` holds ``train_x.f32`` (N×H×W), ``train_y.f32``
(N×K), ``test_x.f32``, ``test_y.f32`` (row-major float32, native byte order),
``stats.npz`` (training-set mean and standard deviation of features (H×W) and
labels (K,)) and ``manifest.json``. ``key`` hashes what the source files are (size,
modification time and a sample of their bytes: app/data/sources.py), not where they
are, plus the parse settings: an unchanged data set is reused wherever it is mounted,
a changed one is converted again.

A conversion is built in ``<cache_dir>/.partial-<key>/`` and renamed into place, so a
reader never sees a partial cache. Each file's result is kept there as soon as that file
is done (its array, then ``<role>.json`` with its row count and column sums), so a
conversion stopped by SIGTERM, or killed, goes on at the next run with the files not yet
done. Progress (bytes, rate, ETA) is logged every few seconds.

Integrity: ``manifest.json`` records a BLAKE2b digest of each array and of ``stats.npz``
(:data:`CHECKSUM`); a reader verifies them before using the cache, and a mismatch is
logged as a ``cache_corrupt`` warning and converted again. The digest of each finished
file is also kept with its per-file record, so a resumed conversion does not take a
swapped array for a finished one. Bounds (app/data/bounds.py): the label columns and the
cache's estimated size are checked before converting, the bytes written while converting.
Every file and directory here is opened through the cache directory's descriptor without
following symlinks (app/atomic.py). Never imports TensorFlow.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from app import logs
from app.atomic import Dir, open_dir
from app.data import bounds, parallel
from app.data.sources import ROLES, Sources, fingerprint
from app.errors import DataError, Preempted, StorageError

FORMAT_VERSION = 3
#: How the arrays' digests in the manifest are made: BLAKE2b (256 bits) of the whole file,
#: read in :data:`HASH_CHUNK` pieces (cost: docs/security.md, "Cache integrity").
CHECKSUM = "blake2b-256"
HASH_CHUNK = 8 << 20
MANIFEST = "manifest.json"
STATS = "stats.npz"
OWNER = ".owner"  # flock-ed by the process converting into a work directory
PARTIAL = ".partial-"  # the resumable work directory of a key: <cache_dir>/.partial-<key>
#: Seconds between two ``cache_progress`` events while a file converts.
PROGRESS_EVERY_S = 5.0
_FILES = {
    "train_features": "train_x.f32",
    "train_labels": "train_y.f32",
    "test_features": "test_x.f32",
    "test_labels": "test_y.f32",
}


@dataclass(frozen=True)
class DataCache:
    """A converted data set on disk and its statistics.

    Shapes: ``feature_mean``/``feature_std`` (H, W); ``label_mean``/``label_std``
    (K,). ``baseline_rmse`` is the test RMSE of predicting the training-label
    mean, in raw label units.
    """

    path: Path
    height: int
    width: int
    num_outputs: int
    train_size: int
    test_size: int
    feature_mean: np.ndarray
    feature_std: np.ndarray
    label_mean: np.ndarray
    label_std: np.ndarray
    baseline_rmse: float
    #: The manifest's :data:`CHECKSUM` digest of each array file (name → hex).
    checksums: dict[str, str] = field(default_factory=dict)

    def fingerprint(self, split: str) -> str:
        """What identifies the converted samples of ``split`` ("train"/"test"): a SHA-256
        (16 hex digits) of its features' and labels' digests. It depends only on the values
        (not on file names, compression or modification times)."""
        parts = [self.checksums.get(f"{split}_{a}.f32", "") for a in ("x", "y")]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]

    def features(self, split: str) -> np.memmap:
        """Memory-mapped raw features of ``split`` ("train"/"test"), shape (N, H, W)."""
        n = self.train_size if split == "train" else self.test_size
        return _map(self.path / f"{split}_x.f32", (n, self.height, self.width))

    def read_rows(self, split: str, what: str, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx`` (sorted int array) of ``what`` ("features" → (len, H, W), "labels" →
        (len, K)) read with ``preadv``, one call per run of consecutive rows.

        Unlike slicing the memory map, the pages read are not left mapped in the
        process, so its RSS stays bounded by a batch however large the data set.
        Raises StorageError if the cache file is shorter than the manifest says.
        """
        shape = (self.height, self.width) if what == "features" else (self.num_outputs,)
        path = self.path / f"{split}_{'x' if what == 'features' else 'y'}.f32"
        row_bytes = 4 * int(np.prod(shape))
        out = np.empty((len(idx), *shape), np.float32)
        if len(idx) == 0:
            return out
        buf = memoryview(out.reshape(-1).view(np.uint8).data)
        starts = np.flatnonzero(np.diff(idx, prepend=idx[0] - 2) != 1)
        ends = [*starts[1:].tolist(), len(idx)]
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for a, b in zip(starts.tolist(), ends, strict=True):
                got = os.preadv(fd, [buf[a * row_bytes : b * row_bytes]], int(idx[a]) * row_bytes)
                if got != (b - a) * row_bytes:
                    raise StorageError(f"{path}: cache file is truncated; delete {self.path}")
        finally:
            os.close(fd)
        return out

    def labels(self, split: str) -> np.memmap:
        """Memory-mapped raw labels of ``split``, shape (N, K)."""
        n = self.train_size if split == "train" else self.test_size
        return _map(self.path / f"{split}_y.f32", (n, self.num_outputs))


def _map(path: Path, shape: tuple[int, ...]) -> np.memmap:
    """A read-only float32 memory map of ``path`` (a symlink is not followed)."""
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
        return np.memmap(f, np.float32, "r", shape=shape)


def digest(directory: Dir, name: str) -> str:
    """The :data:`CHECKSUM` of the file ``name`` in ``directory`` (hex). Raises OSError,
    StorageError (a symlink)."""
    h = hashlib.blake2b(digest_size=32)
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    with open(directory.open(name, os.O_RDONLY), "rb", buffering=0) as f:
        while got := f.readinto(buf):
            h.update(view[:got])
    return h.hexdigest()


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` as the bytes of an .npz file."""
    out = io.BytesIO()
    np.savez(out, allow_pickle=False, **arrays)
    return out.getvalue()


def _read_npz(directory: Dir, name: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(directory.read_bytes(name))) as found:
        return {k: found[k] for k in found.files}


class Corrupt(Exception):
    """A cache file does not match its recorded digest (or is missing or unreadable)."""


def source_key(sources: Sources) -> str:
    """Hash of what the sources are (:func:`app.data.sources.fingerprint` of each file)
    and the parse settings. Raises DataError naming a missing or unreadable file."""
    parts: list[object] = [FORMAT_VERSION, sources.height, sources.width, sources.allow_nonfinite]
    parts += [fingerprint(sources.path(role)) for role in ROLES]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


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
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf data (--allow-nonfinite)
        mean = total / n
        var = np.maximum(total_sq / n - np.square(mean), 0.0)
    std = np.sqrt(var)
    std[std < 1e-6] = 1.0  # constant columns: leave them unscaled
    return mean.astype(np.float32), std.astype(np.float32)


@dataclass
class _Run:
    """One conversion: where it writes, how, and what bounds it."""

    sources: Sources
    work: Dir
    k: int
    threads: int
    stop: Callable[[], bool]
    progress: Progress
    guard: bounds.Guard


def _finished(run: _Run, role: str, width: int) -> tuple[int, np.ndarray, np.ndarray, str] | None:
    """A file converted by an earlier, stopped run: (rows, sums, sums², digest), or None
    when it is not done, or its array does not match the digest recorded with it (logged
    as ``cache_corrupt``: converted again)."""
    work, final = run.work, _FILES[role]
    if not all(work.is_file(n) for n in (f"{role}.json", f"{role}.npz", final)):
        return None
    record = json.loads(work.read_bytes(f"{role}.json"))
    rows, recorded = record["rows"], record.get("checksum")
    size = work.lstat(final)
    if size is None or size.st_size != 4 * rows * width or digest(work, final) != recorded:
        _corrupt_event(work.path / final, "a finished file of a stopped conversion")
        return None
    sums = _read_npz(work, f"{role}.npz")
    return rows, sums["sums"], sums["sums_sq"], recorded


def _convert_role(run: _Run, role: str) -> tuple[int, np.ndarray, np.ndarray, str]:
    """Convert one file into ``run.work`` unless a finished result is there; (rows, sums,
    sums², digest).

    The array is written as ``<name>.part`` (a new file) and renamed when complete;
    ``<role>.json`` (rows, digest) and ``<role>.npz`` (float64 column sums) are written
    after it: together they mark the file done.
    """
    sources, work, final = run.sources, run.work, _FILES[role]
    hw = sources.height * sources.width
    width, hint = (
        (hw, f"H×W = {sources.height}×{sources.width}")
        if "features" in role
        else (run.k, f"K = {run.k} labels")
    )
    done_before = _finished(run, role, width)
    if done_before is not None:
        run.progress.add(sources.path(role).stat().st_size)
        return done_before
    part = final + ".part"
    work.check(part, "cache file")
    work.remove(part)  # what a killed conversion left
    run.guard.path = sources.path(role)
    done = parallel.convert_file(
        sources.path(role), work.path / part, width=width, width_hint=hint,
        allow_nonfinite=sources.allow_nonfinite, threads=run.threads, stop=run.stop,
        progress=run.progress.add, written=run.guard.add, dir_fd=work.fd,
    )  # fmt: skip
    work.rename(part, final)
    checksum = digest(work, final)
    work.write_bytes(f"{role}.npz", _npz({"sums": done.sums, "sums_sq": done.sums_sq}))
    work.write_json(
        f"{role}.json", {"rows": done.rows, "threads": done.threads, "checksum": checksum}
    )
    logs.event(
        "cache_progress",
        f"converted {sources.path(role)}",
        file=role,
        rows=done.rows,
        threads=done.threads,
    )
    return done.rows, done.sums, done.sums_sq, checksum


def _convert(run: _Run) -> dict[str, Any]:
    sources, work, k = run.sources, run.work, run.k
    sizes: dict[str, int] = {}
    sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    checksums: dict[str, str] = {}
    for role in ROLES:
        rows, total, total_sq, checksums[_FILES[role]] = _convert_role(run, role)
        sizes[role], sums[role] = rows, (total, total_sq)
    for split in ("train", "test"):
        nf, nl = sizes[f"{split}_features"], sizes[f"{split}_labels"]
        if nf != nl:
            raise DataError(
                f"{sources.path(f'{split}_labels')}: {nl} label lines but "
                f"{sources.path(f'{split}_features')} has {nf} feature lines"
            )
    n_train = sizes["train_features"]
    f_mean, f_std = _std(*sums["train_features"], n_train)
    l_mean, l_std = _std(*sums["train_labels"], n_train)
    # Baseline: predict the training-label mean on the test set.
    t_sum, t_sq = sums["test_labels"]
    n_test = sizes["test_features"]
    lm = l_mean.astype(np.float64)
    sq_err = t_sq - 2 * lm * t_sum + n_test * np.square(lm)
    baseline = float(np.sqrt(max(sq_err.sum(), 0.0) / (n_test * k)))
    stats = _npz(
        {
            "feature_mean": f_mean.reshape(sources.height, sources.width),
            "feature_std": f_std.reshape(sources.height, sources.width),
            "label_mean": l_mean,
            "label_std": l_std,
        }
    )
    work.write_bytes(STATS, stats)
    checksums[STATS] = hashlib.blake2b(stats, digest_size=32).hexdigest()
    for role in ROLES:  # the per-file records are only for resuming
        work.remove(f"{role}.json")
        work.remove(f"{role}.npz")
    manifest = {
        "format_version": FORMAT_VERSION,
        "height": sources.height,
        "width": sources.width,
        "num_outputs": k,
        "train_size": n_train,
        "test_size": n_test,
        "baseline_rmse": baseline,
        "sources": {role: str(sources.path(role)) for role in ROLES},
        "fingerprints": {role: fingerprint(sources.path(role)) for role in ROLES},
        "checksum": CHECKSUM,
        "checksums": checksums,
    }
    work.write_json(MANIFEST, manifest)
    return manifest


def _load(root: Dir, key: str, verify: bool = True) -> DataCache:
    """The cache ``root/key``, its files checked against the manifest's digests first
    (``verify``). Raises Corrupt naming what does not match; StorageError (a symlink, not
    ours)."""
    with root.sub(key, "data cache", create=False) as d:
        try:
            manifest = json.loads(d.read_bytes(MANIFEST))
            checksums = manifest["checksums"]
            for name in [*_FILES.values(), STATS] if verify else ():
                if digest(d, name) != checksums.get(name):
                    raise Corrupt(name)
            stats = _read_npz(d, STATS)
        except (OSError, ValueError, KeyError) as exc:
            raise Corrupt(getattr(exc, "filename", None) or MANIFEST) from exc
    return DataCache(
        path=root.path / key,
        height=manifest["height"],
        width=manifest["width"],
        num_outputs=manifest["num_outputs"],
        train_size=manifest["train_size"],
        test_size=manifest["test_size"],
        feature_mean=stats["feature_mean"],
        feature_std=stats["feature_std"],
        label_mean=stats["label_mean"],
        label_std=stats["label_std"],
        baseline_rmse=manifest["baseline_rmse"],
        checksums=dict(manifest["checksums"]),
    )


def _corrupt_event(path: Path, what: str) -> None:
    logs.event(
        "cache_corrupt",
        f"{path}: {what} does not match its recorded {CHECKSUM} digest; converting again",
        level=logging.WARNING,
        path=str(path),
    )


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not: killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _in_use(root: Dir, name: str) -> bool:
    """Whether a live conversion owns the temporary directory ``name`` in ``root``.

    The converting process holds an flock on ``<name>/.owner``; the kernel drops it when
    that process dies however it dies, and flock works across PID namespaces (two
    containers sharing a cache volume, both pid 7). Without ``.owner`` (the moment
    after its directory was made) the pid in the name decides.
    """
    try:
        with root.sub(name, create=False) as tmp:
            handle = open(tmp.open(OWNER, os.O_RDONLY), "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        fields = name.split(".")  # ".<key>.<pid>.<random>"
        return len(fields) > 2 and fields[2].isdigit() and _pid_alive(int(fields[2]))
    except (OSError, StorageError):
        return True  # can't tell (or not ours): leave it
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def _remove_stale(root: Dir, keep: str, temporary_only: bool = False) -> None:
    """Remove temporary directories left by killed conversions and (unless
    ``temporary_only``) older caches other than ``keep``; only real directories."""
    for name in root.names():
        if name == keep or not root.is_dir(name):
            continue
        if name.startswith("."):
            if not _in_use(root, name):
                root.remove(name)
        elif not temporary_only and root.is_file(f"{name}/{MANIFEST}"):
            root.remove(name)


def _claim(root: Dir, key: str) -> tuple[Dir, IO[bytes]]:
    """The work directory of ``key`` and its held ``.owner`` lock: ``.partial-<key>``
    (resumable) unless another live run converts the same data there; then a private one.
    Raises OSError, StorageError (a symlink or another owner's directory)."""
    partial = root.sub(f"{PARTIAL}{key}", "cache work directory")
    owner = open(partial.open(OWNER, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")  # noqa: SIM115
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return partial, owner
    except BlockingIOError:
        owner.close()
        partial.close()
    private = root.temp_dir(f".{key}.{os.getpid()}.")
    owner = open(private.create(OWNER, "cache owner lock"), "wb")  # noqa: SIM115 - held
    fcntl.flock(owner, fcntl.LOCK_EX)
    return private, owner


def prepare(
    sources: Sources,
    cache_dir: Path,
    stop: Callable[[], bool] = lambda: False,
    threads: int = 1,
    below: Path | None = None,
    max_bytes: int | None = None,
) -> DataCache:
    """Return the cache of ``sources`` in ``cache_dir``, converting the text files if needed.

    ``threads``: threads that parse a large plain-text file, each a byte range of it at
    a time (:mod:`app.data.parallel`); the caller sizes it from the CPU budget. 1 reads
    each file in one pass. ``below``: the directory the operator named that ``cache_dir``
    lies in (app/atomic.py's ``open_dir``; default ``cache_dir`` itself). ``max_bytes``:
    ``--max-cache-bytes`` (app/data/bounds.py; None: the free space alone bounds it).

    ``stop`` is polled between chunks; when it returns True the files already converted
    are kept for the next run (in ``.partial-<key>``) and Preempted is raised. Raises
    DataError for bad input (file:line: problem), InputTooLarge (exit 3) when the cache
    would pass its bound, StorageError when the cache can't be written (or a name in it is
    a symlink or another owner's). A cache whose files don't match their digests is
    logged (``cache_corrupt``) and converted again. Older caches in the same directory are
    removed after a successful conversion; work directories of dead conversions (no
    process holds their ``.owner`` lock) whenever the cache is used. Two runs converting
    the same data into a shared cache directory at once both succeed: the second works in
    a private directory, and its rename finds the first one's complete cache.
    """
    key = source_key(sources)
    with open_dir(Path(cache_dir), "cache directory", below=below) as root:
        cache = _reuse(root, key)
        if cache is not None:
            return cache
        k = bounds.label_width(sources.path("train_labels"))
        _check_size(root, key, sources, k, max_bytes)
        return _build(root, key, sources, k, stop, threads, max_bytes)


def _reuse(root: Dir, key: str) -> DataCache | None:
    """The complete, verified cache ``key`` in ``root``; None when there is none, or it
    did not verify (logged, removed)."""
    root.check(key, "data cache")
    final = root.path / key
    if not root.is_file(f"{key}/{MANIFEST}"):
        return None
    try:
        cache = _load(root, key)
    except Corrupt as exc:
        _corrupt_event(final / str(exc.args[0]), "the cached file")
        root.remove(key)
        return None
    _remove_stale(root, keep=key, temporary_only=True)
    logs.event("cache", f"reusing data cache {final}", path=str(final), reused=True)
    return cache


def _check_size(root: Dir, key: str, sources: Sources, k: int, max_bytes: int | None) -> None:
    """Refuse, before converting, a data set whose estimated cache passes the bound; the
    files a stopped conversion finished count as done."""
    partial = f"{PARTIAL}{key}"
    todo = tuple(r for r in ROLES if not root.is_file(f"{partial}/{r}.json"))
    estimates = bounds.estimate(sources, k, todo)
    bounds.check(sources, estimates, bounds.bound(root.path, max_bytes))


def _build(
    root: Dir, key: str, sources: Sources, k: int, stop: Callable[[], bool], threads: int,
    max_bytes: int | None,
) -> DataCache:  # fmt: skip
    """Convert ``sources`` into ``root/key`` (see :func:`prepare`)."""
    final = root.path / key
    try:
        work, owner = _claim(root, key)
    except OSError as exc:
        raise StorageError(f"{root.path}: cannot create the data cache: {exc.strerror}") from exc
    resumed = [role for role in ROLES if work.is_file(f"{role}.json")]
    logs.event(
        "cache",
        f"converting text data into {final}"
        + (f" (resuming: {', '.join(resumed)} already done)" if resumed else ""),
        path=str(final),
        reused=False,
        resumed=resumed,
    )
    keep = ""  # what is kept of a resumable work directory: "finished" files, or "all"
    progress = Progress(sum(sources.path(role).stat().st_size for role in ROLES))
    guard = bounds.Guard(bounds.bound(root.path, max_bytes))
    resumable = work.path.name.startswith(PARTIAL)
    try:
        manifest = _convert(_Run(sources, work, k, threads, stop, progress, guard))
        _swap_in(root, work, key)
    except Preempted:
        keep = "finished" if resumable else ""  # the finished files wait for the next run
        raise
    except StorageError:
        keep = "all" if resumable else ""  # e.g. a planted symlink in it: touch nothing
        raise
    except OSError as exc:
        raise StorageError(f"{root.path}: cannot write the data cache: {exc.strerror}") from exc
    finally:
        _leave(root, work, keep)
        work.close()
        owner.close()
    _remove_stale(root, keep=key)
    logs.event(
        "cache",
        f"data cache ready: {manifest['train_size']} train, {manifest['test_size']} test samples",
        path=str(final),
        train_size=manifest["train_size"],
        test_size=manifest["test_size"],
        num_outputs=manifest["num_outputs"],
    )
    return _load(root, key, verify=False)


def _leave(root: Dir, work: Dir, keep: str) -> None:
    """After a conversion that did not finish: keep everything in ``work`` ("all"), only
    its finished files ("finished": ``.part`` files go), or nothing ("")."""
    if keep == "all":
        return
    if keep == "finished":
        for name in work.names():
            if name.endswith(".part"):
                work.remove(name)
        return
    root.remove(work.path.name)


def _swap_in(root: Dir, work: Dir, key: str) -> None:
    """Rename the finished ``work`` to ``key``; when another run sharing the directory
    finished the same data set first (ENOTEMPTY/EEXIST), its complete, identical cache is
    used. Raises OSError."""
    try:
        root.publish(work, key)
    except OSError:
        if not root.is_file(f"{key}/{MANIFEST}"):
            raise
        logs.event(
            "cache", f"using the same cache built by another run: {root.path / key}",
            path=str(root.path / key),
        )  # fmt: skip
        return
    os.unlink(OWNER, dir_fd=work.fd)
