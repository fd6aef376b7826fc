"""The benchmarks run: ``make bench``'s driver at tiny sizes (``--quick``), so a change to the
code they call (the admission stage, the cache, the choice) that breaks them fails here, not
on the next machine that measures. Speed is not asserted (docs/performance.md has the figures);
what the report says about the run is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_make_bench_runs_at_tiny_sizes_and_reports_each_part(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(tmp_path / "bench")],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "bench" / "report.json").read_text())
    cache = report["end_to_end"]["cache"]
    assert cache["steps"] > 0 and cache["samples_per_s"] > 0
    assert cache["chosen"] in cache["candidates"]  # the real train() chose among what it timed
    assert report["ratios"]["chosen"] == cache["chosen"]
    roofline = report["roofline"]
    assert f"{roofline['formulation']}/{roofline['precision']}" == cache["chosen"]
    assert roofline["step_ms"] > 0 and sum(op["ms"] for op in roofline["ops"]) > 0
    bounded = [op for op in roofline["ops"] if "bound" in op]  # those whose work is known
    assert bounded and all(op["bound"] in ("compute", "memory") for op in bounded)
    assert all(op["of_bound"] > 0 for op in bounded)
