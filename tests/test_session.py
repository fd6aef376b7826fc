"""The session's training input: the batches come from the training rows only.

The validation rows (app/data/input/split.py) choose the exported step and the target loss: a
run whose batches also held them would report a validation RMSE on rows it trained on.
tf.data and TensorFlow's thread pools are process-global: the input runs in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from app.config import TrainConfig
from tests.conftest import REPO

SCRIPT = textwrap.dedent(
    """
    import json, sys, types
    from pathlib import Path
    import numpy as np
    import tensorflow as tf
    from app.config import TrainConfig
    from app.data.input import split, stream
    from app.training import session
    from app.training.inputs.load import Inputs
    from tests.conftest import prepare_cache

    data, tmp, limit = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
    config = TrainConfig.of(data_dir=data, output_dir=tmp / "out", cache_dir=tmp / "cache",
                         batch_size=40, max_steps=12, validation_fraction=0.25, seed=3)
    c = prepare_cache(config)
    rows = split.split(c.train_size, config.data.validation_fraction, config.recipe.seed)
    inputs = Inputs(c, rows, None)
    plan = types.SimpleNamespace(memory_limit=limit, tfdata_threads=1, intra_op_threads=1)
    reps = types.SimpleNamespace(count=1, index=0)
    given, _ = session._train_input(
        config.recipe, config.schedule.max_steps, config.cache.max_cache_bytes, plan, inputs,
        reps, None, 0, "float32",
    )
    if given.resident is not None:
        labels = [tf.gather(given.resident.labels, i).numpy() for i in given.dataset]
    else:  # a chunk and the step's rows in it
        labels = [tf.gather(y, at).numpy() for _, y, at in given.dataset]
    seen = np.concatenate(labels)
    raw = np.asarray(c.labels("train"))
    # each generated label row is unique: the row ids the batches came from
    match = (seen[:, None, :] == raw[None, :, :]).all(axis=2)
    ids = sorted({int(i) for i in np.flatnonzero(match.any(axis=0))})
    print(json.dumps({
        "resident": given.resident is not None,
        "unmatched": int((~match.any(axis=1)).sum()),
        "ids": ids,
        "train": rows.train.tolist(),
        "validation": rows.validation.tolist(),
    }))
    """
)


@pytest.mark.parametrize(
    ("memory_limit", "resident"), [(1, False), (None, None)], ids=["streamed", "measured"]
)
def test_training_input_holds_only_the_training_rows(
    tiny_data: Path, tmp_path: Path, memory_limit: int | None, resident: bool | None
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_data), str(tmp_path), json.dumps(memory_limit)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if resident is not None:
        assert got["resident"] is resident
    assert got["unmatched"] == 0
    assert len(got["validation"]) == 60  # a quarter of the 240 training rows held out
    # 12 steps of 40 rows: every one of the 180 training rows, none of the validation rows
    assert got["ids"] == got["train"]
    assert not set(got["ids"]) & set(got["validation"])


# The session's own decisions, with stand-ins for its TensorFlow parts (fast).


def _session(
    tmp_path: Path, *, validating: bool, publish_dir: Path | None = None
) -> tuple[Any, TrainConfig]:
    from types import SimpleNamespace

    from app.training.session import Session
    from app.training.state.choose import Choice

    config = TrainConfig.of(
        data_dir=tmp_path, output_dir=tmp_path / "out", batch_size=8, publish_dir=publish_dir
    )
    lin = SimpleNamespace(test_rmse=0.5, to_json=lambda: {"test_rmse": 0.5})
    inputs = SimpleNamespace(
        rows=SimpleNamespace(validating=validating, validation=[1, 2, 3] if validating else []),
        reference=SimpleNamespace(linear=lin, eval_mean=1.0, fields=dict),
        data=SimpleNamespace(path=tmp_path / "cache-key"),
    )
    best = SimpleNamespace(restore=lambda: 40, rmse=0.3)
    trainer = SimpleNamespace(
        evaluate=lambda split: {"test": 0.6}[split], evaluated=[2, 3], batch_size=8
    )
    reps = SimpleNamespace(count=2, cluster=None)
    plan = SimpleNamespace(to_json=lambda: {"intra_op_threads": 1})
    choice = Choice("plain", "bfloat16", "measured", {})
    return Session(
        None,  # type: ignore[arg-type]
        choice,
        plan,  # type: ignore[arg-type]
        inputs,  # type: ignore[arg-type]
        reps,  # type: ignore[arg-type]
        lambda: False,
        trainer,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        best,  # type: ignore[arg-type]
        0,
        config.schedule,
        config.compute.replan,
        config.to_json(),
    ), config


def test_the_exported_step_is_the_best_validated_one_and_judged_against_the_linear(
    tmp_path: Path, logged: list
) -> None:
    from app.training.loop.outcome import Completed

    run, _ = _session(tmp_path, validating=True)
    outcome = Completed(start_step=0, step=50, eval_rmse=0.3, loop_seconds=1.0, steps_per_loop=1)
    fields = run.exported(outcome)  # type: ignore[attr-defined]
    assert (fields["exported_step"], fields["val_rmse"], fields["test_rmse"]) == (40, 0.3, 0.6)
    assert fields["validation_size"] == 3 and fields["linear_rmse"] == 0.5
    assert fields["validation_evaluated"] == 2
    assert [r.event for r in logged] == ["not_learning"]  # 0.6 is not below the linear's 0.5
    without = _session(tmp_path, validating=False)[0].exported(outcome)
    assert (without["exported_step"], without["val_rmse"]) == (50, None)


def test_samples_per_step_count_every_worker(tmp_path: Path) -> None:
    assert _session(tmp_path, validating=False)[0].samples_per_step == 16


def test_the_publish_step_carries_the_decided_formulation_not_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.release import publish
    from app.training import finish

    def publisher(run: Any, config: TrainConfig) -> Any:  # as the run's end makes it
        options = run.choice.options_json(run.options)
        summary = {"test_rmse": 0.6, "plan": {}}
        return finish.publisher(
            config.publishing, summary, run.inputs.data, options, run.plan, run.stop
        )

    assert publisher(*_session(tmp_path, validating=False)) is None
    seen: dict = {}
    monkeypatch.setattr(
        publish, "publish", lambda exported, target, data, meta, **kw: seen.update(meta=meta, **kw)
    )
    run, config = _session(tmp_path, validating=False, publish_dir=tmp_path)
    publisher(run, config)("exported")
    decided = seen["meta"]["config"]
    assert (decided["formulation"], decided["precision"]) == ("plain", "bfloat16")
    assert config.compute.formulation == "auto"
    assert seen["meta"]["metrics"] == {"test_rmse": 0.6} and seen["keep"] == 0
