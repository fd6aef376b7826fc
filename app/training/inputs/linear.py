"""The linear baseline: a ridge regression fitted in closed form before the CNN trains.

A reference the CNN must beat: ``ŷ = x·W + b`` on the flattened H·W features, standardised
with the training statistics, fitted to the standardised labels on a bounded, seeded sample
of the training rows (never validation or test rows): four fifths of the sample are fitted
for each penalty λ of :data:`ALPHAS` (× the mean diagonal of the centred Gram matrix), and
the λ with the smallest squared error on the other fifth is kept. Closed form (a linear
solve per λ):

* primal, ``(XᵀX + λI) W = XᵀY``, when the fitted rows are at least as many as the
  features: XᵀX is accumulated piece by piece, so the sample is never held whole;
* dual, ``W = Xᵀ(XXᵀ + λI)⁻¹Y``, when they are fewer: the rows are held, not the d×d matrix.

Bounds (:func:`sample_size`): at most :data:`MAX_ROWS` rows, ``rows·min(rows, d)·d`` at
most :data:`MAX_WORK` multiply-adds, ``min(rows, d)`` at most :data:`MAX_GRAM` (the Gram
matrix, float64) and, for the dual form, the sample at most :data:`MAX_SAMPLE_BYTES`; so a
large H×W costs a smaller sample, not more memory or time. BLAS runs with the plan's
intra-op threads (threadpoolctl). Numpy only: no TensorFlow here. Its cost is logged
(``linear_baseline``) and measured in docs/quality.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from app.data.cache import DataCache
from app.training import phases

MAX_ROWS = 20_000
MAX_WORK = 3e11
MAX_GRAM = 4096
MAX_SAMPLE_BYTES = 256 << 20
#: Penalties tried, as multiples of the Gram matrix's mean diagonal.
ALPHAS = (1e-3, 1e-2, 1e-1, 1.0)
#: Pieces of rows: (x (m, d), y (m, K)).
Chunks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]
#: Rows read and multiplied at a time.
CHUNK_ROWS = 1024


@dataclass(frozen=True)
class Ridge:
    """A fitted ridge: standardised features (n, d) → standardised labels (n, K).

    ``weights`` (d, K) and ``bias`` (K,) float64 act on features already standardised;
    ``alpha`` is the penalty's multiple of the mean Gram diagonal (:data:`ALPHAS`).
    """

    weights: np.ndarray
    bias: np.ndarray
    alpha: float

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(n, d) standardised features → (n, K) standardised predictions."""
        return x.reshape(len(x), -1) @ self.weights + self.bias


def sample_size(rows: int, d: int) -> int:
    """How many training rows the fit may use for ``d`` features (module docstring)."""
    n = min(rows, MAX_ROWS)
    while n > 1 and (n * min(n, d) * d > MAX_WORK or min(n, d) > MAX_GRAM):
        n = n * 9 // 10
    if n < d:  # the dual form holds the sample
        n = min(n, max(1, MAX_SAMPLE_BYTES // (8 * d)))
    return n


def fit(x: np.ndarray, y: np.ndarray, held: int, alphas: tuple[float, ...] = ALPHAS) -> Ridge:
    """Ridge of ``y`` (n, K) on ``x`` (n, ...) fitted on the first n − ``held`` rows, λ
    chosen on the last ``held``.

    The alpha with the smallest held-out squared error wins (the first of equals); with
    ``held`` 0 the first alpha is used. Rows are used as given (standardise them first).
    Raises ValueError when no row is left to fit, numpy.linalg.LinAlgError when the data
    are not finite.
    """
    x = x.reshape(len(x), -1)
    n = len(x)
    return fit_parts(
        lambda: _chunks(x[: n - held], y[: n - held]),
        lambda: _chunks(x[n - held :], y[n - held :]),
        n - held, x.shape[1], alphas,
    )  # fmt: skip


def fit_parts(
    fit_chunks: Chunks, held_chunks: Chunks, n: int, d: int,
    alphas: tuple[float, ...] = ALPHAS,
) -> Ridge:  # fmt: skip
    """:func:`fit` on rows read piece by piece: ``fit_chunks()`` and ``held_chunks()`` each
    return an iterator of (x (m, d), y (m, K)) pieces; ``n`` rows are fitted. The primal
    form (n ≥ d) reads each piece once; the dual form holds the ``n`` fitted rows."""
    if n < 1:
        raise ValueError("a ridge fit needs at least one row to fit")
    at = _primal(fit_chunks, d) if n >= d else _dual(*_stacked(fit_chunks))
    models = [at(a) for a in alphas]
    errors, seen = np.zeros(len(alphas)), 0
    for x, y in _float64(held_chunks()):
        errors += [np.sum(np.square(m.predict(x) - y)) for m in models]
        seen += len(x)
    return models[int(np.argmin(errors))] if seen else models[0]


def _primal(chunks: Chunks, d: int) -> Callable[[float], Ridge]:
    """alpha → ``(XᵀX + λI)W = XᵀY`` on centred rows, XᵀX accumulated piece by piece
    (float32 products of a piece, summed in float64)."""
    gram, sx, n = np.zeros((d, d)), np.zeros(d), 0
    xy: np.ndarray | None = None
    sy: np.ndarray | None = None
    for x, y in chunks():
        x32, y64 = x.reshape(len(x), -1).astype(np.float32), y.astype(np.float64)
        gram += x32.T @ x32
        part = x32.T.astype(np.float64) @ y64
        xy, sy = (part, y64.sum(0)) if xy is None else (xy + part, sy + y64.sum(0))
        sx, n = sx + x32.sum(0, dtype=np.float64), n + len(x)
    assert xy is not None and sy is not None
    mx, my = sx / n, sy / n
    gram -= n * np.outer(mx, mx)
    xy -= n * np.outer(mx, my)
    scale = max(float(np.trace(gram)) / d, 1e-12)

    def at(alpha: float) -> Ridge:
        w = np.linalg.solve(gram + alpha * scale * np.eye(d), xy)
        return Ridge(w, my - mx @ w, alpha)

    return at


def _stacked(chunks: Chunks) -> tuple[np.ndarray, np.ndarray]:
    parts = list(_float64(chunks()))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _dual(x: np.ndarray, y: np.ndarray) -> Callable[[float], Ridge]:
    """alpha → ``W = Xᵀ(XXᵀ + λI)⁻¹Y`` on centred rows (n < d: the n×n kernel, not the d×d
    Gram), the kernel computed once."""
    mx, my = x.mean(0), y.mean(0)
    xc = x - mx
    kernel = xc @ xc.T
    scale = max(float(np.trace(kernel)) / x.shape[1], 1e-12)

    def at(alpha: float) -> Ridge:
        w = xc.T @ np.linalg.solve(kernel + alpha * scale * np.eye(len(x)), y - my)
        return Ridge(w, my - mx @ w, alpha)

    return at


def _float64(chunks: Iterator[tuple[np.ndarray, np.ndarray]]) -> Iterator[tuple[np.ndarray, ...]]:
    for x, y in chunks:
        yield x.reshape(len(x), -1).astype(np.float64), y.astype(np.float64)


def _chunks(x: np.ndarray, y: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for a in range(0, len(x), CHUNK_ROWS):
        yield x[a : a + CHUNK_ROWS], y[a : a + CHUNK_ROWS]


@dataclass(frozen=True)
class Baseline:
    """The linear baseline of a run: the penalty chosen (``alpha``: :data:`ALPHAS`), the
    rows fitted, RMSEs in raw label units (None where a split is empty), what it cost."""

    alpha: float
    rows: int
    val_rmse: float | None
    test_rmse: float
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "alpha": self.alpha,
            "val_rmse": self.val_rmse,
            "test_rmse": self.test_rmse,
            "seconds": round(self.seconds, 2),
        }

    @classmethod
    def from_json(cls, found: dict[str, Any]) -> Baseline:
        """The baseline :meth:`to_json` wrote. Raises KeyError, TypeError, ValueError."""
        val = found["val_rmse"]
        return cls(
            float(found["alpha"]), int(found["rows"]), None if val is None else float(val),
            float(found["test_rmse"]), float(found["seconds"]),
        )  # fmt: skip


def baseline(
    cache: DataCache, train_rows: np.ndarray, val_rows: np.ndarray, seed: int, threads: int
) -> Baseline:
    """Fit the ridge on a sample of ``train_rows`` (module docstring) and score it on
    ``val_rows`` and the test split, in raw label units."""
    t0 = time.perf_counter()
    d = cache.height * cache.width
    n = sample_size(len(train_rows), d)
    picked = train_rows[np.random.default_rng([seed, 2]).choice(len(train_rows), n, replace=False)]
    fit_rows, held_rows = np.sort(picked[: n - n // 5]), np.sort(picked[n - n // 5 :])
    phases.ridge(n, d, threads)
    with threadpool_limits(limits=threads, user_api="blas"):
        ridge = fit_parts(
            lambda: _read(cache, "train", fit_rows),
            lambda: _read(cache, "train", held_rows),
            len(fit_rows), d,
        )  # fmt: skip
        val = _rmse(cache, ridge, "train", val_rows) if len(val_rows) else None
        test = _rmse(cache, ridge, "test", np.arange(cache.test_size))
    return Baseline(ridge.alpha, len(fit_rows), val, test, time.perf_counter() - t0)


def _read(
    cache: DataCache, split: str, rows: np.ndarray
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Standardised (features (m, d), labels (m, K)) of ``rows``, chunk by chunk."""
    f_mean, f_std = cache.feature_mean.reshape(-1), cache.feature_std.reshape(-1)
    for a in range(0, len(rows), CHUNK_ROWS):
        idx = rows[a : a + CHUNK_ROWS]
        x = cache.read_rows(split, "features", idx).reshape(len(idx), -1)
        y = cache.read_rows(split, "labels", idx)
        yield (x - f_mean) / f_std, (y - cache.label_mean) / cache.label_std


def _rmse(cache: DataCache, ridge: Ridge, split: str, rows: np.ndarray) -> float:
    """RMSE over all outputs of ``rows`` of ``split``, in raw label units."""
    sq, count = 0.0, 0
    for x, y in _read(cache, split, rows):
        err = (ridge.predict(x.astype(np.float64)) - y) * cache.label_std
        sq, count = sq + float(np.sum(np.square(err))), count + err.size
    return math.sqrt(sq / max(count, 1))


def mean_rmse(cache: DataCache, rows: np.ndarray) -> float:
    """RMSE of predicting the training-label mean for ``rows`` of the training file (raw
    label units): the mean predictor on the validation split."""
    y = cache.read_rows("train", "labels", rows).astype(np.float64)
    return math.sqrt(float(np.mean(np.square(y - cache.label_mean))))
