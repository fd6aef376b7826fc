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

    config = TrainConfig.of(
        data_dir=tmp_path, output_dir=tmp_path, formulation="plain", precision="float32"
    )
    ckpt = tmp_path / "checkpoints"
    plan, _ = _stand_ins(native_bf16=True)
    picked = _decide(config, plan, None, None, ckpt)
    assert (picked.formulation, picked.precision) == ("plain", "float32")
    ckpt.mkdir()
    (ckpt / "run.json").write_text('{"formulation": "fast", "precision": "bfloat16"}')
    auto = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path)
    kept = _decide(auto, plan, None, None, ckpt)
    assert (kept.formulation, kept.precision) == ("fast", "bfloat16")
    with pytest.raises(ConfigError, match="trained in bfloat16"):
        _decide(config, plan, None, None, ckpt)


def test_checkpoints_without_a_record_are_float32(tmp_path: Path) -> None:

    (tmp_path / "ckpt-3.index").write_bytes(b"")
    assert _kept(tmp_path) == {"formulation": "fast", "precision": "float32"}
    assert _kept(tmp_path / "none") is None


def _kept(ckpt: Path) -> dict | None:
    """The choice a run resuming the checkpoints in ``ckpt`` keeps (None: a fresh start)."""
    from app.training.admit.facts import Previous
    from app.training.state import identity

    return Previous(identity.read(ckpt), identity.has_checkpoints(ckpt)).kept_choice()


def _decide(config, plan, data, store, ckpt: Path):  # type: ignore[no-untyped-def]
    """The choice of a run of ``config`` whose checkpoints would be in ``ckpt``: admitted
    first (an explicit --precision against theirs), then decided."""
    from app.training.admit import identity as admission
    from app.training.admit.facts import Previous
    from app.training.state import choose, identity

    previous = Previous(identity.read(ckpt), identity.has_checkpoints(ckpt))
    options = identity.options_of(config)
    admission.before_data(ckpt, previous, config.compute.precision, options, 1)
    return choose._decide(
        config.compute, config.recipe, config.schedule.max_steps, plan, data, store,
        previous.kept_choice(),
    )  # fmt: skip


def _stand_ins(native_bf16: bool) -> tuple[SimpleNamespace, SimpleNamespace]:
    plan = SimpleNamespace(
        native_bf16=native_bf16, cpu_model="test", inputs={}, intra_op_threads=2,
        inter_op_threads=1, onednn=True, pin_cpus=None,
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

    def measure(candidates: list, data: object, recipe: object, end: object) -> dict:
        return {c: 5.0 if c == ("plain", "float32") else 10.0 for c in candidates}

    monkeypatch.setattr(config_lib, "BFLOAT16_IN_AUTO", in_auto)
    monkeypatch.setattr(choose, "_measure", measure)
    forwards: list = []
    monkeypatch.setattr(choose, "_forward_ms", _forward(forwards))
    plan, data = _stand_ins(native_bf16)
    config = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path)
    picked = _decide(config, plan, data, None, tmp_path / "ckpt")
    assert sorted(picked.timings) == expected
    assert (picked.formulation, picked.precision) == ("plain", "float32")
    # The evaluation's formulation: both forward passes timed at the chosen precision.
    assert forwards == [(["fast", "plain"], "float32")]
    assert (picked.evaluation, picked.evaluation_timings) == (
        "plain", {"fast/float32": 3.0, "plain/float32": 2.0},
    )  # fmt: skip
    bf16_measured = len(expected) == 4
    assert ("bfloat16" in picked.reason) == (not bf16_measured)  # why it was left out
    # An explicit formulation: float32 alone is then not measured, and the reason says why.
    fast = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path, formulation="fast")
    one = _decide(fast, plan, data, None, tmp_path / "ckpt")
    assert (one.precision, len(one.timings)) == ("float32", 2 if bf16_measured else 0)
    assert ("float32 under --precision auto" in one.reason) == (not bf16_measured)
    assert (one.evaluation, one.evaluation_timings) == ("fast", {})  # the asked formulation


def test_the_evaluation_takes_the_faster_forward_pass_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.config import TrainConfig
    from app.training.state import choose

    monkeypatch.setattr(choose, "_measure", lambda c, d, g, n: {c[0]: 5.0, c[1]: 9.0})
    for faster, other in (("plain", "fast"), ("fast", "plain")):
        ms = {faster: 1.0, other: 4.0}
        monkeypatch.setattr(choose, "_forward_ms", lambda f, p, d, g, ms=ms: ms)
        plan, data = _stand_ins(native_bf16=False)
        config = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path)
        picked = _decide(config, plan, data, None, tmp_path / "c")
        assert (picked.formulation, picked.evaluation) == ("fast", faster)
        said = "evaluated in the plain formulation, 1.0 ms a forward pass against 4.0"
        assert (said in picked.reason) == (faster == "plain"), picked.reason


CPUINFO = "model name: Test CPU\nflags: avx2 fma"


def _forward(calls: list | None = None):  # type: ignore[no-untyped-def]
    """A stand-in for choose._forward_ms: the plain forward pass is the faster."""

    def forward(formulations: list, precision: str, data: object, config: object) -> dict:
        if calls is not None:
            calls.append((formulations, precision))
        if len(formulations) < 2:
            return {}
        return {f: 2.0 if f == "plain" else 3.0 for f in formulations}

    return forward


@pytest.mark.parametrize(
    "change",
    ["nothing", "intra_op_threads", "inter_op_threads", "onednn", "pin_cpus", "cpu_flag",
     "cpu_model", "tensorflow", "batch_size", "shape", "corrupt", "no_evaluation"],
)  # fmt: skip
def test_a_kept_choice_is_reused_only_when_everything_it_depends_on_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    from app.config import TrainConfig
    from app.data.cache import measured
    from app.training.state import choose

    calls: list[list] = []

    def measure(candidates: list, data: object, recipe: object, end: object) -> dict:
        calls.append(candidates)
        return {c: 5.0 if c == ("plain", "float32") else 10.0 for c in candidates}

    monkeypatch.setattr(choose, "_measure", measure)
    monkeypatch.setattr(choose, "_forward_ms", _forward())
    plan, data = _stand_ins(native_bf16=False)
    plan.inputs = {"/proc/cpuinfo": CPUINFO}
    config = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path)
    store = measured.Store(tmp_path / "cache")
    first = _decide(config, plan, data, store, tmp_path / "a")
    assert (first.source, len(calls)) == ("measured", 1)
    if change in ("intra_op_threads", "inter_op_threads"):
        setattr(plan, change, getattr(plan, change) + 1)
    elif change == "onednn":
        plan.onednn = False
    elif change == "pin_cpus":  # the same thread counts, pinned to CPUs now
        plan.pin_cpus = (0, 1)
    elif change == "cpu_flag":
        plan.inputs = {"/proc/cpuinfo": CPUINFO + " avx512f"}
    elif change == "cpu_model":
        plan.cpu_model = "another"
    elif change == "tensorflow":
        monkeypatch.setattr(choose.tf, "__version__", "0.0.1")
    elif change == "batch_size":
        config = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path, batch_size=50)
    elif change == "shape":
        data.width = 11
    elif change == "corrupt":
        (entry,) = (tmp_path / "cache").iterdir()
        (entry / measured.ENTRY).write_text('{"format": 1, "what": "choice"}')
    elif change == "no_evaluation":  # a kept choice naming no formulation to evaluate in
        (entry,) = (tmp_path / "cache").iterdir()
        kept = json.loads((entry / measured.ENTRY).read_text())
        kept["value"].pop("evaluation")  # digest and all: an entry of an older coretrain
        kept["digest"] = measured._sha256([kept["what"], kept["depends"], kept["value"]])
        (entry / measured.ENTRY).write_text(json.dumps(kept))
    again = _decide(config, plan, data, store, tmp_path / "b")
    if change == "nothing":  # a new output directory, the same cache directory
        assert (again.source, len(calls)) == ("cached", 1)
        assert (again.formulation, again.timings) == ("plain", first.timings)
        assert (again.evaluation, again.evaluation_timings) == ("plain", first.evaluation_timings)
    else:
        assert (again.source, len(calls)) == ("measured", 2)


def test_a_candidate_that_cannot_win_is_not_timed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.config import TrainConfig
    from app.training.state import choose

    timed: list[tuple[str, str]] = []
    ms = {("fast", "float32"): 10.0, ("plain", "float32"): 30.0}
    monkeypatch.setattr(choose, "train_step", lambda f, p, x, y, c, n: (f, p))
    monkeypatch.setattr(choose, "_ms_per_step", lambda step, n: timed.append(step) or ms[step])
    _, data = _stand_ins(native_bf16=False)
    data.features = data.labels = lambda split: [[0.0]]
    data.train_size = 1
    config = TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path)
    monkeypatch.setattr(choose, "WARMUP_STEPS", 0)
    best = choose._measure(list(ms), data, config.recipe, 1)  # type: ignore[arg-type]
    assert best == ms
    assert timed.count(("fast", "float32")) == choose.ROUNDS
    assert timed.count(("plain", "float32")) == 1  # 3× the fastest after one round


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
    # The evaluation's formulation: both forward passes timed at that precision, the faster.
    forward = choice["evaluation_timings"]
    assert sorted(forward) == [f"fast/{choice['precision']}", f"plain/{choice['precision']}"]
    assert f"{choice['evaluation']}/{choice['precision']}" == min(forward, key=forward.get)
    kept = json.loads((out / "checkpoints" / "run.json").read_text())
    assert kept["evaluation"] == choice["evaluation"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["formulation"], metrics["precision"]) == (
        choice["formulation"],
        choice["precision"],
    )
    assert choice["source"] == "measured"
    # The resume keeps the run's choice.
    code, records, err = _train(tiny_data, out, 6, *auto)
    assert code == 0, err[-2000:]
    (again,) = events(records, "choice")
    assert "kept from this run's record" in again["reason"] and again["source"] == "resumed"
    assert [again[k] for k in ("formulation", "precision", "evaluation")] == [
        choice[k] for k in ("formulation", "precision", "evaluation")
    ]


@pytest.mark.slow
def test_a_new_output_reuses_the_choice_and_the_ridge_kept_beside_the_cache(
    tiny_data: Path, tmp_path: Path
) -> None:
    shared = ["--formulation", "auto", "--precision", "auto", "--cache-dir", str(tmp_path / "c")]
    code, records, err = _train(tiny_data, tmp_path / "a", 3, *shared)
    assert code == 0, err[-2000:]
    (choice,) = events(records, "choice")
    assert choice["source"] == "measured" and events(records, "choice_measured")
    (fitted,) = events(records, "linear_baseline")
    assert fitted["source"] == "fitted"
    code, records, err = _train(tiny_data, tmp_path / "b", 3, *shared)
    assert code == 0, err[-2000:]
    (again,) = events(records, "choice")
    assert again["source"] == "cached" and not events(records, "choice_measured")
    assert [again[k] for k in ("formulation", "precision", "timings", "evaluation")] == [
        choice[k] for k in ("formulation", "precision", "timings", "evaluation")
    ]
    (ridge,) = events(records, "linear_baseline")
    assert ridge["source"] == "cached"
    assert (ridge["test_rmse"], ridge["alpha"]) == (fitted["test_rmse"], fitted["alpha"])


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
def train_step(formulation, precision, x, y, recipe, end):
    step = real(formulation, precision, x, y, recipe, end)
    if slow not in (formulation, precision):
        return step
    def slowed():
        time.sleep(0.3)
        return step()
    return slowed
choose.train_step = train_step
picked = choose._decide(
    config.compute, config.recipe, config.schedule.max_steps, plan, data, None, None
)
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
