"""The training features as a bfloat16 step computes on them, kept beside the cache's rows.

A step that computes in bfloat16 (``--precision bfloat16``, or what ``auto`` chose) rounds
its standardised batch to bfloat16 as its first operation (app/model/fast_formulation.py;
the plain formulation's first layer casts its input the same way). So for such a step the
rows ``bfloat16((x - mean) · (1/std))`` hold exactly what it computes on, in half the
bytes of the float32 rows, with nothing left for the step to standardise or cast. Such a
step gathers its batches from this file when the cache has it, held or streamed
(app/data/input/pipeline.py ``rounded_source``, which says when it is made): :data:`NAME`
in the cache's directory, N×H×W bfloat16, row-major, native byte order. In a 4 GiB memory
group at the seed's scale, half the bytes read was 21–28 % more samples a second; held,
the step was 7–11 % faster (docs/performance.md, "Streaming in the step's precision",
"Held in the step's precision").

The same bits, by construction (tested against the step's own operations): the
standardisation is numpy's float32 subtraction and multiplication (IEEE, no fused
multiply-add) with the denormal handling TensorFlow sets on its CPU threads for arithmetic
(flush to zero, denormals are zero: ``port::ScopedFlushDenormal``), and the rounding to bfloat16 is
``ml_dtypes``' round-to-nearest-even, TensorFlow's own. Without standardisation the rows
are the raw values rounded.

Kept like the cache's arrays (app/data/cache/store.py): :data:`RECORD` says what the file
was made from (the digest of ``train_x.f32``, of the statistics, whether standardised), its
own BLAKE2b digest, and its status (device, inode, size, modification and change times)
when it was written. It is used while all of that matches; a file whose status changed is
digested again, and one that does not match (or a record of another format or origin) is
logged as a ``cache_corrupt`` warning and made again. It is written whole under a
temporary name and renamed: a run that stops while making it leaves no file under
:data:`NAME`. Never imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from app import logs
from app.atomic import Dir, open_dir
from app.data.cache import bounds
from app.data.cache.store import CHECKSUM, DataCache, corrupt_event, digested, file_status, hasher
from app.errors import StorageError

NAME = "train_x.bf16"
RECORD = "train_x.bf16.json"
FORMAT = 1
DTYPE = np.dtype(ml_dtypes.bfloat16)
#: Rows made at a time (16,384 rows of the seed's 20×195: 256 MB read, 128 MB written).
PIECE_BYTES = 256 << 20
#: Rows standardised and rounded at a time within a piece (bytes of float32 rows): the
#: size of a core's L2 cache.
BLOCK_BYTES = 1 << 20
_EXPONENT32, _SIGN32 = np.uint32(0x7F800000), np.uint32(0x80000000)


def flush_denormals(a: np.ndarray) -> None:
    """Replace each denormal of the float32 array ``a`` by a zero of its sign, in place (as
    the CPU does for TensorFlow's kernels: flush to zero, denormals are zero)."""
    bits = a.view(np.uint32)
    np.bitwise_and(bits, _SIGN32, out=bits, where=(bits & _EXPONENT32) == 0)


def rounded(x: np.ndarray, mean: np.ndarray | None, inv: np.ndarray | None) -> np.ndarray:
    """Raw rows ``x`` (n, H, W) float32 → ``bfloat16((x - mean) · inv)`` (n, H, W), the
    values a bfloat16 step computes on (module docstring); ``mean``, ``inv`` (H, W) float32,
    or None for raw rows (rounded as they are: TensorFlow's cast keeps denormals, only its
    arithmetic flushes them). ``x`` is overwritten. Done :data:`BLOCK_BYTES` of rows at a
    time, so that each operation's operands are still in the CPU's cache (2.1× faster than
    whole pieces on an AMD EPYC Zen 4; the same bits)."""
    out = np.empty(x.shape, DTYPE)
    if mean is None or inv is None:
        out[...] = x
        return out
    mean, inv = mean.copy(), inv.copy()
    flush_denormals(mean)
    flush_denormals(inv)
    step = max(1, BLOCK_BYTES // max(1, x[:1].nbytes))
    for first in range(0, len(x), step):
        part = x[first : first + step]
        flush_denormals(part)
        with np.errstate(over="ignore"):  # inf, as the step's own arithmetic gives
            np.subtract(part, mean, out=part)
            flush_denormals(part)  # each operation's result is flushed; the cast keeps them
            np.multiply(part, inv, out=part)
            flush_denormals(part)
        out[first : first + step] = part
    return out


def _made_from(cache: DataCache, standardize: bool) -> dict[str, Any]:
    """What the file depends on: the float32 rows' digest and the standardisation."""
    stats = np.stack([cache.feature_mean, cache.feature_std]).astype(np.float32)
    return {
        "format": FORMAT,
        "dtype": "bfloat16",
        "source": cache.checksums.get("train_x.f32"),
        "standardized": bool(standardize),
        "statistics": hashlib.sha256(stats.tobytes()).hexdigest() if standardize else None,
    }


def find(cache: DataCache, standardize: bool) -> Path | None:
    """The path of the cache's bfloat16 rows made with ``standardize``, when they are there
    and valid (module docstring); None when they are not there, or are not valid (then a
    ``cache_corrupt`` warning, and the caller makes them again)."""
    try:
        with open_dir(cache.path, "data cache", create=False) as d:
            if d.lstat(RECORD) is None:
                return None
            kept = json.loads(d.read_bytes(RECORD))
            st = d.lstat(NAME)
            if not isinstance(kept, dict) or st is None:
                problem = "have a record not of this version" if st else "are missing"
            elif {k: kept.get(k) for k in _made_from(cache, standardize)} != _made_from(
                cache, standardize
            ):
                problem = "were made from other rows or statistics"
            elif kept.get("status") == file_status(st):
                return cache.path / NAME
            elif (found := digested(d, NAME))[0] == kept.get("digest"):
                _renew(d, kept, found[1])
                return cache.path / NAME
            else:
                problem = f"do not match their recorded {CHECKSUM} digest"
    except (OSError, ValueError, StorageError) as exc:
        problem = f"cannot be read ({exc})"
    corrupt_event(
        cache.path / NAME, "the training rows rounded to bfloat16", problem,
        then="not used (made again where that pays)",
    )  # fmt: skip
    return None


def _renew(d: Dir, kept: dict[str, Any], status: list[int]) -> None:
    """Record ``status`` for the file just digested (a rename or copy changed it), so the
    next run does not digest it again (best effort)."""
    with contextlib.suppress(OSError, StorageError):
        d.write_json(RECORD, {**kept, "status": status})


def make(
    cache: DataCache, standardize: bool, max_bytes: int | None = None, threads: int = 1
) -> Path:
    """Write the cache's bfloat16 rows (module docstring) and their record; log
    ``input_rounded`` with the seconds it took; ``threads``: how many round the rows (the
    run's intra-op threads: its CPUs). Returns the file's path. Raises
    StorageError: they would pass the free space or, with the cache's files,
    ``max_bytes`` (``--max-cache-bytes``); the cache directory can't be written; a short
    source file."""
    t0 = time.perf_counter()
    size = cache.train_size * cache.height * cache.width * DTYPE.itemsize
    try:
        with open_dir(cache.path, "data cache", create=False) as d:
            _tidy(d)
            _check_room(d, size, max_bytes)
            tmp = f".{NAME}.{secrets.token_hex(6)}.tmp"
            out = d.create(tmp, "temporary file")
            try:
                fcntl.flock(out, fcntl.LOCK_EX)  # while it is written (:func:`_tidy`)
                found = _write_rows(cache, standardize, out, threads)
                os.fsync(out)
                d.remove(RECORD)  # no reader pairs the new file with the old record
                d.rename(tmp, NAME)
                status = file_status(os.fstat(out))  # after the rename: it sets the ctime
            except BaseException:
                d.remove(tmp)
                raise
            finally:
                os.close(out)
            d.write_json(RECORD, {**_made_from(cache, standardize), "digest": found,
                                  "status": status})  # fmt: skip
    except OSError as exc:
        raise StorageError(f"{cache.path / NAME}: cannot write: {exc.strerror}") from exc
    seconds = time.perf_counter() - t0
    logs.event(
        "input_rounded",
        f"training rows rounded to bfloat16 for a bfloat16 step: {size / 1e6:,.0f} MB in "
        f"{seconds:.1f} s (made once, kept in the cache)",
        path=str(cache.path / NAME),
        bytes=size,
        seconds=round(seconds, 2),
    )
    return cache.path / NAME


def _check_room(d: Dir, size: int, max_bytes: int | None) -> None:
    """Raise StorageError when ``size`` more bytes in the cache ``d`` pass the free space
    of its file system or, with the files it has, ``max_bytes`` (``--max-cache-bytes``:
    app/data/cache/bounds.py)."""
    free = bounds.bound(d.path, None)
    used = sum(st.st_size for n in d.names() if (st := d.lstat(n)) is not None)
    if size > free.limit:
        beyond = free.reason
    elif max_bytes is not None and used + size > max_bytes:
        beyond = f"--max-cache-bytes {max_bytes} with the {used:,} bytes the cache holds"
    else:
        return
    raise StorageError(
        f"{d.path / NAME}: the rows rounded to bfloat16 would take {size:,} bytes, more than "
        f"{beyond}"
    )


def _write_rows(cache: DataCache, standardize: bool, out: int, threads: int) -> str:
    """Write every training row, rounded (:func:`rounded`), to ``out``, piece by piece: a
    piece's rows are rounded by ``threads`` threads (numpy releases the interpreter lock)
    while the last piece is written and the next one's reading is announced; return the
    file's :data:`~app.data.cache.store.CHECKSUM` digest. Raises StorageError (a short
    source file), OSError."""
    path, base = cache.where("train_x.f32")
    per_row = 4 * cache.height * cache.width
    step = max(1, PIECE_BYTES // per_row)
    stats = None
    if standardize:
        stats = cache.feature_mean.astype(np.float32), (1.0 / cache.feature_std).astype(np.float32)
    h = hasher()
    buffer = np.empty((min(step, cache.train_size), cache.height, cache.width), np.float32)
    src = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    writer = ThreadPoolExecutor(1, thread_name_prefix="coretrain-round-write")
    workers = ThreadPoolExecutor(max(1, threads), thread_name_prefix="coretrain-round")
    try:
        pending: Future[None] | None = None
        for first in range(0, cache.train_size, step):
            x = buffer[: min(step, cache.train_size - first)]
            into = memoryview(x.reshape(-1).view(np.uint8).data)
            if os.preadv(src, [into], base + first * per_row) != len(x) * per_row:
                raise StorageError(f"{path}: cache file is truncated; delete {cache.path}")
            after = base + (first + len(x)) * per_row
            os.posix_fadvise(src, after, step * per_row, os.POSIX_FADV_WILLNEED)
            piece = np.empty(x.shape, DTYPE)
            parts = np.array_split(np.arange(len(x)), max(1, threads))
            for job in [workers.submit(_round_into, piece, x, r, stats) for r in parts]:
                job.result()
            if pending is not None:
                pending.result()
            pending = writer.submit(_write, out, h, piece)
        if pending is not None:
            pending.result()
    finally:
        writer.shutdown()
        workers.shutdown()
        os.close(src)
    return h.hexdigest()


def _round_into(
    piece: np.ndarray, x: np.ndarray, rows: np.ndarray, stats: tuple[np.ndarray, ...] | None
) -> None:
    """``piece[rows] = rounded(x[rows])`` for a contiguous range ``rows``."""
    if len(rows):
        part = slice(int(rows[0]), int(rows[-1]) + 1)
        piece[part] = rounded(x[part], *(stats or (None, None)))


def _write(fd: int, h: Any, piece: np.ndarray) -> None:
    """Append ``piece``'s bytes to ``fd`` and to the digest ``h``."""
    data = memoryview(piece.reshape(-1).view(np.uint8).data)
    h.update(data)
    while data:
        data = data[os.write(fd, data) :]


def _tidy(d: Dir) -> None:
    """Remove the temporary files of runs that stopped while making the rows: each writer
    holds an exclusive ``flock`` on its temporary file, so one that can be locked is no
    longer written."""
    for name in d.names():
        if not (name.startswith(f".{NAME}.") and name.endswith(".tmp")):
            continue
        try:
            fd = d.open(name, os.O_RDONLY, "temporary file")
        except (OSError, StorageError):
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            d.remove(name)
        except OSError:
            pass  # being written
        finally:
            os.close(fd)
