"""The formulation and precision: chosen by measurement, kept by a resume."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import events, json_lines, run_cli

ARGS = ["--batch-size", "40", "--eval-every", "3", "--checkpoint-every", "3"]


def _train(data: Path, out: Path, steps: int, *extra: str) -> tuple[int, list[dict], str]:
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--max-steps", str(steps),
        *ARGS, *extra,
    )  # fmt: skip
    return proc.returncode, json_lines(proc.stdout), proc.stderr


def test_explicit_choices_and_recorded_ones(tmp_path: Path) -> None:
    from app.config import TrainConfig
    from app.errors import ConfigError
    from app.training.state import choose

    config = TrainConfig.of(
        data_dir=tmp_path, output_dir=tmp_path, formulation="plain", precision="float32"
    )
    ckpt = tmp_path / "checkpoints"
    plan, _ = _stand_ins(native_bf16=True)
    picked = choose._decide(config, plan, None, tmp_path, ckpt)  # type: ignore[arg-type]
    assert (picked.formulation, picked.precision) == ("plain", "float32")
    ckpt.mkdir()
    (ckpt / "run.json").write_text('{"formulation": "fast", "precision": "bfloat16"}')
    auto = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path)
    kept = choose._decide(auto, plan, None, tmp_path, ckpt)  # type: ignore[arg-type]
    assert (kept.formulation, kept.precision) == ("fast", "bfloat16")
    with pytest.raises(ConfigError, match="trained in bfloat16"):
        choose._decide(config, plan, None, tmp_path, ckpt)  # type: ignore[arg-type]


def test_checkpoints_without_a_record_are_float32(tmp_path: Path) -> None:
    from app.training.state import choose

    (tmp_path / "ckpt-3.index").write_bytes(b"")
    assert choose.recorded(tmp_path) == {"formulation": "fast", "precision": "float32"}
    assert choose.recorded(tmp_path / "none") is None


def _stand_ins(native_bf16: bool) -> tuple[SimpleNamespace, SimpleNamespace]:
    plan = SimpleNamespace(
        native_bf16=native_bf16, cpu_model="test", inputs={}, intra_op_threads=2,
        inter_op_threads=1, onednn=True,
    )  # fmt: skip
    return plan, SimpleNamespace(height=10, width=10, num_outputs=1)


@pytest.mark.parametrize(
    ("native_bf16", "in_auto", "expected"),
    [
        (True, False, ["fast/float32", "plain/float32"]),
        (False, True, ["fast/float32", "plain/float32"]),
        (True, True, ["fast/bfloat16", "fast/float32", "plain/bfloat16", "plain/float32"]),
    ],
)
def test_auto_measures_bfloat16_only_where_native_and_its_parity_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native_bf16: bool, in_auto: bool,
    expected: list[str],
) -> None:  # fmt: skip
    from app import config as config_lib
    from app.config import TrainConfig
    from app.training.state import choose

    def measure(candidates: list, data: object, config: object) -> dict:
        return {c: 5.0 if c == ("plain", "float32") else 10.0 for c in candidates}

    monkeypatch.setattr(config_lib, "BFLOAT16_IN_AUTO", in_auto)
    monkeypatch.setattr(choose, "_measure", measure)
    plan, data = _stand_ins(native_bf16)
    config = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path)
    picked = choose._decide(config, plan, data, tmp_path, tmp_path / "ckpt")  # type: ignore[arg-type]
    assert sorted(picked.timings) == expected
    assert (picked.formulation, picked.precision) == ("plain", "float32")
    bf16_measured = len(expected) == 4
    assert ("bfloat16" in picked.reason) == (not bf16_measured)  # why it was left out
    # An explicit formulation: float32 alone is then not measured, and the reason says why.
    fast = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path, formulation="fast")
    one = choose._decide(fast, plan, data, tmp_path / "w", tmp_path / "ckpt")  # type: ignore[arg-type]
    assert (one.precision, len(one.timings)) == ("float32", 2 if bf16_measured else 0)
    assert ("float32 under --precision auto" in one.reason) == (not bf16_measured)


@pytest.mark.slow
def test_auto_times_the_candidates_and_takes_the_fastest(tiny_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    auto = ["--formulation", "auto", "--precision", "auto"]
    code, records, err = _train(tiny_data, out, 3, *auto)
    assert code == 0, err[-2000:]
    (choice,) = events(records, "choice")
    plan = events(records, "start")[0]["plan"]
    if plan["native_bf16"]:  # both precisions timed (their parity holds: docs/quality.md)
        assert sorted(choice["timings"]) == [
            "fast/bfloat16", "fast/float32", "plain/bfloat16", "plain/float32",
        ]  # fmt: skip
    else:
        assert sorted(choice["timings"]) == ["fast/float32", "plain/float32"]
        assert "no native support" in choice["reason"]
    fastest = min(choice["timings"], key=choice["timings"].get)
    assert f"{choice['formulation']}/{choice['precision']}" == fastest
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["formulation"], metrics["precision"]) == (
        choice["formulation"],
        choice["precision"],
    )
    # The measurement is kept for this CPU, and the resume keeps the run's choice.
    assert json.loads((out / "choice.json").read_text())["timings"] == choice["timings"]
    code, records, err = _train(tiny_data, out, 6, *auto)
    assert code == 0, err[-2000:]
    (again,) = events(records, "choice")
    assert "kept from the checkpoints" in again["reason"]
    assert (again["formulation"], again["precision"]) == (
        choice["formulation"],
        choice["precision"],
    )


@pytest.mark.slow
def test_bfloat16_trains_keeps_float32_variables_and_exports_float32(
    tiny_data: Path, tmp_path: Path
) -> None:
    import numpy as np
    import tensorflow as tf

    out = tmp_path / "out"
    code, records, err = _train(tiny_data, out, 3, "--precision", "bfloat16")
    assert code == 0, err[-2000:]
    assert events(records, "choice")[0]["precision"] == "bfloat16"
    reader = tf.train.load_checkpoint(str(out / "checkpoints" / "ckpt-3"))
    dtypes = reader.get_variable_to_dtype_map()
    assert dtypes["model/conv1/_kernel/.ATTRIBUTES/VARIABLE_VALUE"] == tf.float32
    served = tf.saved_model.load(str(out / "model" / "saved_model")).signatures["serve"]
    x = np.loadtxt(tiny_data / "test_features.txt", dtype=np.float32)[:5]
    pred = next(iter(served(tf.constant(x)).values()))
    assert pred.dtype == tf.float32 and pred.shape == (5, 3)
    # Its checkpoints are bfloat16's: a float32 resume is refused, in one line.
    code, _, err = _train(tiny_data, out, 6, "--precision", "float32")
    assert code == 2
    (line,) = err.splitlines()
    assert "trained in bfloat16" in line


# In a fresh process (TensorFlow's thread pools are process-wide): the real measurement of
# choose._decide on the tiny set, with the candidates of one formulation or one precision
# made slower by a known 0.3 s sleep per step. The choice must follow the clock: the slowed
# candidates lose, whichever they are.
SLOWED = r"""
import json, sys, time
from pathlib import Path
from app.budget import apply, detect_plan
from app.budget.plan import PlanOptions
slow, precision, data_dir, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
plan = detect_plan("/", PlanOptions(), bfloat16=precision != "float32")  # as the CLI plans
apply.apply(plan)
apply.import_tensorflow()
from app.config import TrainConfig
from app.training.state import choose
from tests.conftest import prepare_cache
config = TrainConfig.of(data_dir=data_dir, output_dir=out, batch_size=40, precision=precision)
data = prepare_cache(config)
real = choose.train_step
def train_step(formulation, precision, x, y, config):
    step = real(formulation, precision, x, y, config)
    if slow not in (formulation, precision):
        return step
    def slowed():
        time.sleep(0.3)
        return step()
    return slowed
choose.train_step = train_step
picked = choose._decide(config, plan, data, out, out / "checkpoints")
print(json.dumps(picked.to_json()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("slow", ["fast", "plain"])
def test_auto_takes_the_candidate_the_clock_says_is_faster(
    slow: str, tiny_data: Path, tmp_path: Path
) -> None:

    picked = _slowed(slow, "float32", tiny_data, tmp_path)
    other = "plain" if slow == "fast" else "fast"
    assert picked["formulation"] == other, picked
    assert picked["timings"][f"{slow}/float32"] >= 300  # the sleep is in the measurement


def _slowed(slow: str, precision: str, tiny_data: Path, tmp_path: Path) -> dict:
    import subprocess
    import sys

    from tests.conftest import REPO

    proc = subprocess.run(
        [sys.executable, "-c", SLOWED, slow, precision, str(tiny_data), str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("slow", ["float32", "bfloat16"])
def test_auto_s_precision_follows_the_clock_where_bfloat16_is_native(
    slow: str, tiny_data: Path, tmp_path: Path
) -> None:
    """--precision auto on a CPU with native bf16 times both precisions (their parity holds:
    docs/quality.md) and takes the faster; elsewhere it times float32 alone and says why."""
    from app.budget import detect_plan
    from app.budget.plan import PlanOptions

    picked = _slowed(slow, "auto", tiny_data, tmp_path)
    if not detect_plan("/", PlanOptions()).native_bf16:
        assert sorted(picked["timings"]) == ["fast/float32", "plain/float32"]
        assert picked["precision"] == "float32" and "no native support" in picked["reason"]
        return
    assert len(picked["timings"]) == 4, picked
    other = "bfloat16" if slow == "float32" else "float32"
    assert picked["precision"] == other, picked
    assert min(picked["timings"][f"{f}/{slow}"] for f in ("fast", "plain")) >= 300
