"""coretrain bench-scaling: the rows' arithmetic, and the command end to end on this machine."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.bench import step_scaling as scaling
from tests.conftest import run_cli
from tests.test_streams import assert_lean


def test_speed_up_efficiency_and_knee_come_from_the_measured_rates() -> None:
    rates = {1: 100.0, 2: 190.0, 4: 300.0, 8: 330.0, 16: 340.0}
    rows = scaling._rows({n: {"samples_per_s": r} for n, r in rates.items()})
    assert [r["speedup"] for r in rows] == [1.0, 1.9, 3.0, 3.3, 3.4]
    assert [r["efficiency"] for r in rows] == [1.0, 0.95, 0.75, 0.41, 0.21]
    assert [r["gain_over_previous"] for r in rows] == [None, 1.9, 1.58, 1.1, 1.03]
    assert scaling._knee(rows) == 4  # 4 → 8 threads gains 1.1×, under KNEE_GAIN
    assert scaling._knee(rows[:3]) is None  # every doubling paid


def test_a_failed_measurement_is_a_row_with_its_error_not_a_crash() -> None:
    rows = scaling._rows({1: {"samples_per_s": 100.0}, 2: {"error": "exit 1"}})
    assert rows[1]["speedup"] is None and rows[1]["error"] == "exit 1"
    assert scaling._knee(rows) is None


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to split")
def test_bench_scaling_measures_threads_and_processes_here(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    proc = run_cli("bench-scaling", "--max-threads", "2", "--batch-size", "200", "--out",
                   str(out), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_lean(proc)  # no line over 2,000 characters, as every command (tests/test_streams.py)
    report = json.loads(out.read_text())
    assert report["cpus"] >= 2
    for name, result in report["threads"].items():
        assert [r["threads"] for r in result["rows"]] == [1, 2], name
        assert all(r["samples_per_s"] > 0 and "error" not in r for r in result["rows"]), name
        assert result["rows"][0]["speedup"] == 1.0
    assert {"fast/float32", "plain/float32"} <= report["threads"].keys()
    processes = {r["workers"]: r for r in report["processes"]}
    assert processes.keys() == {1, 2}
    assert all(r.get("samples_per_s", 0) > 0 for r in processes.values()), processes
    assert "fast/float32" in proc.stdout and "processes: 2 × 1 threads" in proc.stdout
