"""What the CNN is judged against, measured before TensorFlow starts: the mean predictor
(the training-label mean) and the linear baseline (a ridge regression:
app/training/inputs/linear.py), on the validation rows and the test set. Logged as the
``linear_baseline`` event; the test set's figures go into every ``progress`` record,
``metrics.json`` and TensorBoard (``baseline_rmse``, ``linear_rmse``). No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from app import __version__, logs
from app.data.cache import DataCache, measured
from app.data.input import split as split_lib
from app.data.input.split import Split
from app.training.inputs import linear


@dataclass(frozen=True)
class Baselines:
    """RMSEs in raw label units: the mean predictor on the evaluated rows (the validation
    rows the CNN is evaluated on, or the test set without them) and on the test set; the
    ridge (None when it could not be fitted)."""

    eval_mean: float
    test_mean: float
    linear: linear.Baseline | None

    def fields(self) -> dict[str, float | None]:
        """The test set's reference RMSEs every ``progress`` record carries."""
        lin = self.linear.test_rmse if self.linear else None
        return {"baseline_rmse": self.test_mean, "linear_rmse": lin}


def measure(
    data: DataCache, rows: Split, seed: int, threads: int, store: measured.Store | None = None,
    eval_rows: int = 0,
) -> Baselines:  # fmt: skip
    """Both baselines of a run on ``data`` split into ``rows`` (``threads``: BLAS threads).
    Their validation figures are of the rows the CNN is evaluated on (``eval_rows`` of the
    validation rows, ``--eval-rows``: app/data/input/split.py ``evaluated``), so the three
    compare on the same rows, and a large validation split is not read whole before the
    first step (at the seed's scale, 81,090 rows read from the disk were 11 of the ridge's
    15 s: docs/performance.md). The ridge is kept in ``store`` (beside the data cache:
    app/data/cache/measured.py) by what it depends on (:func:`ridge_depends`) and reused
    from there (``source`` "cached") instead of fitted again. Data the ridge can't fit
    (NaN/Inf let in by --allow-nonfinite) leave it out, with a warning."""
    evaluated = split_lib.evaluated(rows.validation, eval_rows, seed)
    eval_mean = linear.mean_rmse(data, evaluated) if rows.validating else data.baseline_rmse
    depends = ridge_depends(data, rows.train, evaluated, seed)
    fitted, source = _kept(store, depends), "cached"
    if fitted is None:
        try:
            fitted = linear.baseline(data, rows.train, evaluated, seed, threads)
        except (ValueError, np.linalg.LinAlgError) as exc:
            logs.event(
                "linear_baseline", f"no linear baseline: {exc}", level=logging.WARNING,
                error=str(exc),
            )  # fmt: skip
            return Baselines(eval_mean, data.baseline_rmse, None)
        source = "fitted"
        measured.keep(store, "ridge", depends, fitted.to_json())
    val = f", validation {fitted.val_rmse:.4g}" if fitted.val_rmse is not None else ""
    cost = f"in {fitted.seconds:.1f} s"
    if source == "cached":
        cost = f"kept from an earlier fit ({fitted.seconds:.1f} s then)"
    logs.event(
        "linear_baseline",
        f"ridge regression on {fitted.rows:,} training rows {cost}: test RMSE "
        f"{fitted.test_rmse:.4g}{val} (mean predictor {data.baseline_rmse:.4g})",
        source=source,
        val_rows=len(evaluated),
        **fitted.to_json(),
    )
    return Baselines(eval_mean, data.baseline_rmse, fitted)


def ridge_depends(
    data: DataCache, train_rows: np.ndarray, val_rows: np.ndarray, seed: int
) -> dict[str, Any]:
    """What the ridge fitted on ``train_rows`` and scored on ``val_rows`` and the test set
    depends on, the key it is kept by (docs/architecture.md, "Kept measurements"): the data
    (the fingerprints of the training and test arrays and of their statistics), the rows
    (by digest), the seed, the fit's settings and coretrain's version. BLAS threads are not
    part of it: they change at most the last bits of the same fit."""
    return {
        "train": data.fingerprint("train"),
        "test": data.fingerprint("test"),
        "stats": data.checksums.get("stats.npz", ""),
        "rows": {"train": _digest(train_rows), "validation": _digest(val_rows)},
        "seed": seed,
        "settings": {
            "max_rows": linear.MAX_ROWS,
            "max_work": linear.MAX_WORK,
            "max_gram": linear.MAX_GRAM,
            "max_sample_bytes": linear.MAX_SAMPLE_BYTES,
            "alphas": list(linear.ALPHAS),
            "chunk_rows": linear.CHUNK_ROWS,
        },
        "coretrain": __version__,
    }


def _digest(rows: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(rows, np.int64).tobytes()).hexdigest()[:16]


def _kept(store: measured.Store | None, depends: dict) -> linear.Baseline | None:
    """The ridge kept for ``depends``; None when there is none valid."""
    found = measured.lookup(store, "ridge", depends)
    if found is None:
        return None
    try:
        return linear.Baseline.from_json(found)
    except (KeyError, TypeError, ValueError):
        logs.event(
            "measured_invalid", "kept ridge not used (its value is not a baseline); fitting again",
            level=logging.WARNING, problem="value",
        )  # fmt: skip
        return None
