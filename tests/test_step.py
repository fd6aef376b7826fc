"""The training step (app/training/loop/step.py) end to end: several steps per call change
nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import SEED_RECIPE_ARGS, events, json_lines, run_cli
from tests.runs import checkpoint_tensors

pytestmark = pytest.mark.slow

# A progress event and a checkpoint every 6 steps: calls of 4 steps are cut there.
ARGS = ["--batch-size", "40", "--eval-every", "6", "--checkpoint-every", "6", *SEED_RECIPE_ARGS]


def _train(data: Path, out: Path, steps: int, *extra: str) -> list[dict]:
    args = ["--data", str(data), "--output", str(out), "--max-steps", str(steps), *ARGS, *extra]
    proc = run_cli("train", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json_lines(proc.stdout)


def test_steps_per_call_do_not_change_the_trajectory(tiny_data: Path, tmp_path: Path) -> None:
    # One step per call, four (cut at 6 and 12), and auto: the same ops on the same batches.
    runs = {k: _train(tiny_data, tmp_path / k, 12, "--steps-per-loop", k) for k in ("1", "4", "0")}
    losses = {k: [p["loss"] for p in events(r, "progress")] for k, r in runs.items()}
    assert len(losses["1"]) == 2
    assert losses["4"] == losses["1"] and losses["0"] == losses["1"]
    ckpt = {k: checkpoint_tensors(tmp_path / k / "checkpoints" / "ckpt-12") for k in runs}
    for name, value in ckpt["1"].items():
        assert np.array_equal(ckpt["4"][name], value), name
        assert np.array_equal(ckpt["0"][name], value), name
    (chosen,) = events(runs["0"], "steps_per_loop")
    assert chosen["steps_per_loop"] >= 1
    ends = {k: events(r, "end")[-1] for k, r in runs.items()}
    assert ends["4"]["steps_per_loop"] == 4 and ends["1"]["steps_per_loop"] == 1
