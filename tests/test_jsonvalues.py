"""JSON every parser reads (app/jsonvalues.py): non-finite numbers are null in metrics.json
and in the log lines, which a strict parser (RFC 8259) then accepts."""

from __future__ import annotations

import io
import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from app import jsonvalues, logs
from tests.conftest import TINY_TRAIN_ARGS, run_cli


def _strict(text: str) -> object:
    """Parse as RFC 8259 does: NaN and Infinity are errors, not values."""

    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_at_any_depth_are_null() -> None:
    value = {"rmse": math.nan, "runs": [1.5, -math.inf, (math.inf, 2)], "f64": np.float64("nan")}
    assert jsonvalues.finite(value) == {"rmse": None, "runs": [1.5, None, [None, 2]], "f64": None}
    assert _strict(jsonvalues.dumps(value)) == jsonvalues.finite(value)
    assert jsonvalues.dumps({"n": 3, "s": "NaN", "ok": 0.25}) == '{"n": 3, "s": "NaN", "ok": 0.25}'


def test_a_non_finite_number_from_a_default_is_refused_not_written() -> None:
    with pytest.raises(ValueError):
        jsonvalues.dumps({"x": object()}, default=lambda o: math.nan)


def test_metrics_of_a_run_with_nan_test_labels_parse_strictly(
    tiny_data: Path, tmp_path: Path
) -> None:
    data = shutil.copytree(tiny_data, tmp_path / "data")
    path = data / "test_labels.txt"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = "nan " + " ".join(lines[2].split()[1:]) + "\n"
    path.write_text("".join(lines))
    out = tmp_path / "out"
    proc = run_cli("train", "--data", str(data), "--output", str(out), "--max-steps", "3",
                   "--allow-nonfinite", *TINY_TRAIN_ARGS)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = _strict((out / "metrics.json").read_text())
    assert isinstance(metrics, dict) and metrics["test_rmse"] is None
    for line in proc.stdout.splitlines():  # every log line too
        _strict(line)


def test_a_log_line_with_nan_parses_strictly() -> None:
    out = io.StringIO()
    logs.setup(stream=out)
    try:
        logs.event("end", "done", test_rmse=math.nan, rounds=[1.0, math.inf])
    finally:
        logs.setup(level=logging.INFO)
    line = _strict(out.getvalue().splitlines()[-1])
    assert isinstance(line, dict)
    assert line["test_rmse"] is None and line["rounds"] == [1.0, None]
