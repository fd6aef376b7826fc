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
done. Progress (bytes, rate, ETA) is logged every few seconds. Never imports TensorFlow.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from app import logs
from app.atomic import temp_dir, write_json
from app.data import parallel, textfile
from app.data.sources import ROLES, Sources, fingerprint
from app.errors import DataError, Preempted, StorageError

FORMAT_VERSION = 2
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

    def features(self, split: str) -> np.memmap:
        """Memory-mapped raw features of ``split`` ("train"/"test"), shape (N, H, W)."""
        n = self.train_size if split == "train" else self.test_size
        return np.memmap(
            self.path / f"{split}_x.f32", np.float32, "r", shape=(n, self.height, self.width)
        )

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
        fd = os.open(path, os.O_RDONLY)
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
        return np.memmap(self.path / f"{split}_y.f32", np.float32, "r", shape=(n, self.num_outputs))


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


def _label_width(path: Path) -> int:
    """K: the number of fields on the first line of the label file."""
    for chunk in textfile.iter_chunks(path, chunk_rows=1):
        return int(chunk.shape[1])
    raise DataError(f"{path}: empty file")  # pragma: no cover - iter_chunks raises first


def _std(total: np.ndarray, total_sq: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf data (--allow-nonfinite)
        mean = total / n
        var = np.maximum(total_sq / n - np.square(mean), 0.0)
    std = np.sqrt(var)
    std[std < 1e-6] = 1.0  # constant columns: leave them unscaled
    return mean.astype(np.float32), std.astype(np.float32)


def _convert_role(
    sources: Sources, role: str, work: Path, k: int, threads: int, stop: Callable[[], bool],
    progress: Progress,
) -> tuple[int, np.ndarray, np.ndarray]:  # fmt: skip
    """Convert one file into ``work`` unless a finished result is there; (rows, sums, sums²).

    The array is written as ``<name>.part`` and renamed when complete; ``<role>.json``
    (rows) and ``<role>.npz`` (float64 column sums) are written after it: together they
    mark the file done.
    """
    record, sums_file, final = work / f"{role}.json", work / f"{role}.npz", work / _FILES[role]
    hw = sources.height * sources.width
    width, hint = (
        (hw, f"H×W = {sources.height}×{sources.width}")
        if "features" in role
        else (k, f"K = {k} labels")
    )
    if record.is_file() and sums_file.is_file() and final.is_file():
        rows = json.loads(record.read_text())["rows"]
        if final.stat().st_size == 4 * rows * width:
            with np.load(sums_file) as sums:
                progress.add(sources.path(role).stat().st_size)
                return rows, sums["sums"], sums["sums_sq"]
    part = final.with_name(final.name + ".part")
    done = parallel.convert_file(
        sources.path(role), part, width=width, width_hint=hint,
        allow_nonfinite=sources.allow_nonfinite, threads=threads, stop=stop,
        progress=progress.add,
    )  # fmt: skip
    os.replace(part, final)
    np.savez(sums_file, sums=done.sums, sums_sq=done.sums_sq)
    write_json(record, {"rows": done.rows, "threads": done.threads})
    logs.event(
        "cache_progress",
        f"converted {sources.path(role)}",
        file=role,
        rows=done.rows,
        threads=done.threads,
    )
    return done.rows, done.sums, done.sums_sq


def _convert(sources: Sources, work: Path, stop: Callable[[], bool], threads: int) -> dict:
    k = _label_width(sources.path("train_labels"))
    progress = Progress(sum(sources.path(role).stat().st_size for role in ROLES))
    sizes: dict[str, int] = {}
    sums: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for role in ROLES:
        rows, total, total_sq = _convert_role(sources, role, work, k, threads, stop, progress)
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
    np.savez(
        work / "stats.npz",
        feature_mean=f_mean.reshape(sources.height, sources.width),
        feature_std=f_std.reshape(sources.height, sources.width),
        label_mean=l_mean,
        label_std=l_std,
    )
    for role in ROLES:  # the per-file records are only for resuming
        (work / f"{role}.json").unlink()
        (work / f"{role}.npz").unlink()
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
    }
    write_json(work / "manifest.json", manifest)
    return manifest


def _load(path: Path) -> DataCache:
    manifest = json.loads((path / "manifest.json").read_text())
    with np.load(path / "stats.npz") as stats:
        return DataCache(
            path=path,
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


def _in_use(tmp: Path) -> bool:
    """Whether a live conversion owns the temporary directory ``tmp``.

    The converting process holds an flock on ``tmp/.owner``; the kernel drops it when
    that process dies however it dies, and flock works across PID namespaces (two
    containers sharing a cache volume, both pid 7). Without ``.owner`` (the moment
    after mkdtemp) the pid in the name decides.
    """
    try:
        handle = open(tmp / OWNER, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        fields = tmp.name.split(".")  # ".<key>.<pid>.<random>"
        return len(fields) > 2 and fields[2].isdigit() and _pid_alive(int(fields[2]))
    except OSError:
        return True  # can't tell: leave it
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def _remove_stale(root: Path, keep: str, temporary_only: bool = False) -> None:
    """Remove temporary directories left by killed conversions and (unless
    ``temporary_only``) older caches other than ``keep``."""
    for old in root.iterdir():
        if old.name == keep or not old.is_dir():
            continue
        if old.name.startswith("."):
            if not _in_use(old):
                shutil.rmtree(old, ignore_errors=True)
        elif not temporary_only and (old / "manifest.json").exists():
            shutil.rmtree(old, ignore_errors=True)


def _claim(root: Path, key: str) -> tuple[Path, IO[bytes]]:
    """The work directory of ``key`` and its held ``.owner`` lock: ``.partial-<key>``
    (resumable) unless another live run converts the same data there; then a private one.
    Raises OSError."""
    partial = root / f"{PARTIAL}{key}"
    partial.mkdir(exist_ok=True)
    owner = open(partial / OWNER, "ab")  # noqa: SIM115 - held until the conversion ends
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return partial, owner
    except BlockingIOError:
        owner.close()
    private = temp_dir(root, f".{key}.{os.getpid()}.")
    owner = open(private / OWNER, "wb")  # noqa: SIM115 - held until the conversion ends
    fcntl.flock(owner, fcntl.LOCK_EX)
    return private, owner


def prepare(
    sources: Sources,
    cache_dir: Path,
    stop: Callable[[], bool] = lambda: False,
    threads: int = 1,
) -> DataCache:
    """Return the cache of ``sources`` in ``cache_dir``, converting the text files if needed.

    ``threads``: threads that parse a large plain-text file, each a byte range of it at
    a time (:mod:`app.data.parallel`); the caller sizes it from the CPU budget. 1 reads
    each file in one pass.

    ``stop`` is polled between chunks; when it returns True the files already converted
    are kept for the next run (in ``.partial-<key>``) and Preempted is raised. Raises
    DataError for bad input (file:line: problem), StorageError when the cache can't be
    written. Older caches in the same directory are removed after a successful conversion;
    work directories of dead conversions (no process holds their ``.owner`` lock) whenever
    the cache is used. Two runs converting the same data into a shared cache directory at
    once both succeed: the second works in a private directory, and its rename finds the
    first one's complete cache.
    """
    root = Path(cache_dir)
    key = source_key(sources)
    final = root / key
    if (final / "manifest.json").is_file():
        cache = _load(final)
        _remove_stale(root, keep=key, temporary_only=True)
        logs.event("cache", f"reusing data cache {final}", path=str(final), reused=True)
        return cache
    try:
        root.mkdir(parents=True, exist_ok=True)
        work, owner = _claim(root, key)
    except OSError as exc:
        raise StorageError(f"{root}: cannot create the data cache: {exc.strerror}") from exc
    resumed = [role for role in ROLES if (work / f"{role}.json").is_file()]
    logs.event(
        "cache",
        f"converting text data into {final}"
        + (f" (resuming: {', '.join(resumed)} already done)" if resumed else ""),
        path=str(final),
        reused=False,
        resumed=resumed,
    )
    keep = False
    try:
        manifest = _convert(sources, work, stop, threads)
        try:
            os.replace(work, final)
        except OSError:
            # ENOTEMPTY/EEXIST: another run sharing --cache-dir finished the same data set
            # first; its cache is complete (rename is atomic) and identical, so use it.
            if not (final / "manifest.json").is_file():
                raise
            logs.event(
                "cache", f"using the same cache built by another run: {final}", path=str(final)
            )
        else:
            (final / OWNER).unlink(missing_ok=True)
    except Preempted:
        keep = work.name.startswith(PARTIAL)  # the finished files wait for the next run
        raise
    except OSError as exc:
        raise StorageError(f"{root}: cannot write the data cache: {exc.strerror}") from exc
    finally:
        if keep:
            for part in work.glob("*.part"):
                part.unlink(missing_ok=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
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
    return _load(final)
