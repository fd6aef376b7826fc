"""The baselines (app/training/baselines.py): the ridge is kept beside the data cache by the
data's fingerprint, the rows, the seed and its settings, and fitted again when any differs
or the kept entry is damaged."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.config import TrainConfig
from app.data import synthetic
from app.data.cache import measured
from app.data.input import split
from app.training import phases
from app.training.inputs import baselines, linear
from tests.conftest import prepare_cache


def _events(logged: list[logging.LogRecord], name: str) -> list[logging.LogRecord]:
    return [r for r in logged if getattr(r, "event", "") == name]


@pytest.fixture
def data(tmp_path: Path):  # type: ignore[no-untyped-def]
    synthetic.generate(tmp_path / "data", train=120, test=30, seed=3)
    config = TrainConfig.of(data_dir=tmp_path / "data", output_dir=tmp_path / "out")
    cache = prepare_cache(config)
    yield cache
    cache.release()


def _figures(found: baselines.Baselines) -> tuple:
    assert found.linear is not None
    lin = found.linear
    return found.eval_mean, found.test_mean, lin.alpha, lin.rows, lin.val_rmse, lin.test_rmse


def _measure(data, store, seed=0, fraction=0.2):  # type: ignore[no-untyped-def]
    rows = split.split(data.train_size, fraction, seed)
    return baselines.measure(data, rows, seed, 1, store)


def test_the_ridge_is_kept_and_reused_only_for_the_same_data_rows_seed_and_settings(
    data, tmp_path: Path, logged: list[logging.LogRecord], monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    store = measured.Store(tmp_path / "cache")
    first = _measure(data, store)
    (fitted,) = _events(logged, "linear_baseline")
    assert fitted.source == "fitted"
    logged.clear()
    again = _measure(data, store)
    (reused,) = _events(logged, "linear_baseline")
    assert reused.source == "cached"
    assert _figures(again) == _figures(first)  # the same figures, in full precision
    for other in (
        lambda: _measure(data, store, seed=1),
        lambda: _measure(data, store, fraction=0.3),
    ):
        logged.clear()
        other()
        assert _events(logged, "linear_baseline")[0].source == "fitted"
    monkeypatch.setattr(linear, "ALPHAS", (1e-2, 1.0))  # the fit's settings
    logged.clear()
    _measure(data, store)
    assert _events(logged, "linear_baseline")[0].source == "fitted"


def test_a_damaged_ridge_entry_is_fitted_again_with_a_warning(
    data, tmp_path: Path, logged: list[logging.LogRecord]
) -> None:  # type: ignore[no-untyped-def]
    store = measured.Store(tmp_path / "cache")
    first = _measure(data, store)
    (entry,) = (tmp_path / "cache").glob("ridge-*")
    found = json.loads((entry / measured.ENTRY).read_text())
    found["value"]["test_rmse"] = 0.0  # a better baseline than the fit: the digest says no
    (entry / measured.ENTRY).write_text(json.dumps(found))
    logged.clear()
    again = _measure(data, store)
    assert _events(logged, "measured_invalid")
    assert _events(logged, "linear_baseline")[0].source == "fitted"
    assert _figures(again) == _figures(first)


def test_the_validation_figures_are_of_the_rows_the_cnn_is_evaluated_on(
    data, logged: list[logging.LogRecord]
) -> None:  # type: ignore[no-untyped-def]
    rows = split.split(data.train_size, 0.25, 0)  # 30 validation rows
    found = baselines.measure(data, rows, 0, 1, None, eval_rows=7)
    evaluated = split.evaluated(rows.validation, 7, 0)
    assert len(evaluated) == 7
    (event,) = _events(logged, "linear_baseline")
    assert event.val_rows == 7
    assert found.eval_mean == linear.mean_rmse(data, evaluated)
    on_sample = linear.baseline(data, rows.train, evaluated, 0, 1)
    on_all = linear.baseline(data, rows.train, rows.validation, 0, 1)
    assert found.linear is not None
    assert found.linear.val_rmse == on_sample.val_rmse != on_all.val_rmse
    assert found.linear.test_rmse == on_sample.test_rmse == on_all.test_rmse
    assert found.eval_mean != linear.mean_rmse(data, rows.validation)
    logged.clear()
    everything = baselines.measure(data, rows, 0, 1, None)  # --eval-rows 0: all of them
    assert _events(logged, "linear_baseline")[0].val_rows == 30
    assert everything.linear is not None and everything.linear.val_rmse == on_all.val_rmse


def test_the_ridge_phase_announces_about_what_the_seeds_sample_took(
    logged: list[logging.LogRecord],
) -> None:
    """The ``phase`` event before the ridge, for the seed's sample (18,000 rows of 3,900
    features, 2 threads): about the 5.1–6.8 s it took on 2 vCPUs (app/training/phases.py),
    not the 34 s the earlier rate gave."""
    phases.ridge(18_000, 3_900, 2)
    (event,) = _events(logged, "phase")
    assert event.phase == "linear_baseline" and 5.0 <= event.estimate_s <= 8.0
    assert ", ~7 s" in event.getMessage()
