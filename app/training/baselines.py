"""What the CNN is judged against, measured before TensorFlow starts: the mean predictor
(the training-label mean) and the linear baseline (a ridge regression:
app/training/linear.py), on the validation rows and the test set. Logged as the
``linear_baseline`` event; the test set's figures go into every ``progress`` record,
``metrics.json`` and TensorBoard (``baseline_rmse``, ``linear_rmse``). No TensorFlow here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from app import logs
from app.data import measured
from app.data.cache import DataCache
from app.data.split import Split
from app.training import kept, linear


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


def measure(
    data: DataCache, rows: Split, seed: int, threads: int, store: measured.Store | None = None
) -> Baselines:
    """Both baselines of a run on ``data`` split into ``rows`` (``threads``: BLAS threads).
    The ridge is kept in ``store`` (beside the data cache: app/data/measured.py) by what it
    depends on (app/training/kept.py) and reused from there (``source`` "cached") instead
    of fitted again. Data the ridge can't fit (NaN/Inf let in by --allow-nonfinite) leave
    it out, with a warning."""
    eval_mean = linear.mean_rmse(data, rows.validation) if rows.validating else data.baseline_rmse
    depends = kept.ridge_depends(data, rows.train, rows.validation, seed)
    fitted, source = _kept(store, depends), "cached"
    if fitted is None:
        try:
            fitted = linear.baseline(data, rows.train, rows.validation, seed, threads)
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
        **fitted.to_json(),
    )
    return Baselines(eval_mean, data.baseline_rmse, fitted)


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
