"""JSON every parser reads (app/jsonvalues.py): non-finite numbers are null in the files
the job writes and in its log lines, which a strict parser (RFC 8259) then accepts."""

from __future__ import annotations

import io
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from app import jsonvalues, logs
from app.atomic import write_json


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


def test_metrics_written_with_nan_parse_strictly(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    write_json(path, {"test_rmse": math.nan, "baseline_rmse": 0.5})
    assert _strict(path.read_text()) == {"baseline_rmse": 0.5, "test_rmse": None}


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
