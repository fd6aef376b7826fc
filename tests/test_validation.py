"""Choosing the exported model on data it was not tested on (app/data/input/split.py,
app/training/state/best.py, app/training/run.py), with the real CLI on a tiny set.

* the exported weights are the best validated step's checkpoint, and metrics.json says
  which step that was, its validation RMSE and the linear baseline;
* the test split is never used for choosing: replacing the test files changes the test
  RMSE and nothing else (the validation curve, the exported step and weights are equal);
* the rows trained on never include a validation row.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.data import synthetic
from tests.conftest import TINY_TRAIN_ARGS, events, json_lines, run_cli

pytestmark = pytest.mark.slow
#: A short run that evaluates and checkpoints every 3 steps and keeps every checkpoint.
ARGS = [*TINY_TRAIN_ARGS, "--max-steps", "24", "--keep-checkpoints", "20", "--seed", "2",
        "--optimizer", "adam", "--learning-rate", "1e-2", "--lr-schedule", "constant",
        "--keep-prob", "1.0", "--target-loss", "0", "--eval-rows", "10"]  # fmt: skip


def _train(data: Path, out: Path) -> tuple[dict, list[dict]]:
    proc = run_cli("train", "--data", str(data), "--output", str(out), *ARGS)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "metrics.json").read_text()), json_lines(proc.stdout)


def _variables(prefix: Path, keys: list[str]) -> list[np.ndarray]:
    """The arrays of a checkpoint or SavedModel variables file (read in a subprocess-free
    way: the checkpoint reader needs no graph)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return [reader.get_tensor(k) for k in keys]


MODEL_KEYS = [f"model/{layer}/{name}/.ATTRIBUTES/VARIABLE_VALUE"
              for layer in ("conv1", "conv2", "dense1", "dense2")
              for name in ("_kernel", "bias")]  # fmt: skip
EXPORT_KEYS = [f"variables/{i}/.ATTRIBUTES/VARIABLE_VALUE" for i in range(8)]


@pytest.fixture(scope="module")
def run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list]:
    out = tmp_path_factory.mktemp("validated") / "out"
    metrics, records = _train(tiny_data, out)
    return out, metrics, records


def test_the_export_is_the_best_validated_step(run: tuple[Path, dict, list]) -> None:
    out, metrics, records = run
    curve = [(r["step"], r["val_rmse"]) for r in events(records, "progress")]
    assert [s for s, _ in curve] == list(range(3, 25, 3))
    assert all("test_rmse" not in r for r in events(records, "progress"))  # test: reported only
    best_step, best_rmse = min(curve, key=lambda c: (c[1], c[0]))
    assert metrics["exported_step"] == best_step and metrics["val_rmse"] == best_rmse
    assert metrics["validation_size"] == 24 and metrics["final_step"] == 24
    assert metrics["validation_evaluated"] == 10  # --eval-rows: the best step is the sample's
    exported = _variables(out / "model/saved_model/variables/variables", EXPORT_KEYS)
    kept = _variables(out / "checkpoints" / f"ckpt-{best_step}", MODEL_KEYS)
    for a, b in zip(exported, kept, strict=True):
        np.testing.assert_array_equal(a, b)


def test_metrics_carry_the_linear_baseline(run: tuple[Path, dict, list]) -> None:
    _, metrics, records = run
    (fitted,) = events(records, "linear_baseline")
    assert metrics["linear"]["rows"] == fitted["rows"] > 0
    assert metrics["linear_rmse"] == fitted["test_rmse"] == metrics["linear"]["test_rmse"]
    assert metrics["linear_rmse"] > 0 and metrics["linear"]["seconds"] >= 0
    for progress in events(records, "progress"):
        assert progress["linear_rmse"] == metrics["linear_rmse"]
        assert progress["baseline_rmse"] == metrics["baseline_rmse"]


def test_the_test_files_never_choose(
    tiny_data: Path, run: tuple[Path, dict, list], tmp_path: Path
) -> None:
    out, metrics, records = run
    other = tmp_path / "data"
    shutil.copytree(tiny_data, other)
    synthetic.generate(tmp_path / "other-test", train=1, test=60, seed=99)
    for name in ("test_features.txt", "test_labels.txt"):
        shutil.copy(tmp_path / "other-test" / name, other / name)
    metrics2, records2 = _train(other, tmp_path / "out")
    curve = [r["val_rmse"] for r in events(records, "progress")]
    assert [r["val_rmse"] for r in events(records2, "progress")] == curve
    assert metrics2["exported_step"] == metrics["exported_step"]
    assert metrics2["test_rmse"] != metrics["test_rmse"]  # the test files did change
    assert metrics2["linear"]["val_rmse"] == metrics["linear"]["val_rmse"]
    for a, b in zip(
        _variables(out / "model/saved_model/variables/variables", EXPORT_KEYS),
        _variables(tmp_path / "out/model/saved_model/variables/variables", EXPORT_KEYS),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)
