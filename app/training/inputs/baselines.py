"""What the CNN is judged against, measured before TensorFlow starts: the mean predictor
(the training-label mean) and the linear baseline (a ridge regression:
app/training/inputs/linear.py), on the validation rows and the test set. Logged as the
``linear_baseline`` event; the test set's figures go into every ``progress`` record,
``metrics.json`` and TensorBoard (``baseline_rmse``, ``linear_rmse``). No TensorFlow here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from app import logs
from app.data.cache import DataCache
from app.data.input.split import Split
from app.training.inputs import linear


@dataclass(frozen=True)
class Baselines:
    """RMSEs in raw label units: the mean predictor on the evaluated rows (validation, or
    test without them) and on the test set; the ridge (None when it could not be fitted)."""

    eval_mean: float
    test_mean: float
    linear: linear.Baseline | None

    def fields(self) -> dict[str, float | None]:
        """The test set's reference RMSEs every ``progress`` record carries."""
        lin = self.linear.test_rmse if self.linear else None
        return {"baseline_rmse": self.test_mean, "linear_rmse": lin}


def measure(data: DataCache, rows: Split, seed: int, threads: int) -> Baselines:
    """Both baselines of a run on ``data`` split into ``rows`` (``threads``: BLAS threads).
    Data the ridge can't fit (NaN/Inf let in by --allow-nonfinite) leave it out, with a
    warning."""
    eval_mean = linear.mean_rmse(data, rows.validation) if rows.validating else data.baseline_rmse
    try:
        fitted = linear.baseline(data, rows.train, rows.validation, seed, threads)
    except (ValueError, np.linalg.LinAlgError) as exc:
        logs.event(
            "linear_baseline", f"no linear baseline: {exc}", level=logging.WARNING, error=str(exc)
        )
        return Baselines(eval_mean, data.baseline_rmse, None)
    val = f", validation {fitted.val_rmse:.4g}" if fitted.val_rmse is not None else ""
    logs.event(
        "linear_baseline",
        f"ridge regression on {fitted.rows:,} training rows in {fitted.seconds:.1f} s: test "
        f"RMSE {fitted.test_rmse:.4g}{val} (mean predictor {data.baseline_rmse:.4g})",
        **fitted.to_json(),
    )
    return Baselines(eval_mean, data.baseline_rmse, fitted)
