"""The loop's extras (app/training/extras/): which hooks a run gets, and what each does at
its boundary, with stand-ins for the run's parts. The loop's side of the interface (when
each boundary comes) is pinned by tests/test_controller.py."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.atomic import open_dir
from app.config import TrainConfig
from app.training import extras
from app.training.extras.best_step import BestStep
from app.training.extras.budget_watch import BudgetWatch, ThrottledWarning
from app.training.extras.summaries import Summaries
from app.training.state.choose import Choice

PLAN = SimpleNamespace(
    cpu_quota=1.0, intra_op_threads=2, to_json=lambda: {"intra_op_threads": 2},
    cpu_budget=1.0, cpu_stat=None,
)  # fmt: skip


class FakeBest:
    def __init__(self) -> None:
        self.offered: list[tuple[int, float]] = []

    def offer(self, step: int, rmse: float) -> bool:
        self.offered.append((step, rmse))
        return True


def _run(
    tmp_path: Path, *, chief: bool = True, validating: bool = True, workers: int = 1,
    replan: str = "on-change",
) -> extras.Context:  # fmt: skip
    output = tmp_path / "out"
    ws = SimpleNamespace(
        is_chief=chief, output=output, open=lambda path, what: open_dir(path, what, below=output)
    )
    config = TrainConfig.of(data_dir=tmp_path, output_dir=output, replan=replan)
    choice = Choice("fast", "float32", "as asked", {})
    end, samples = config.schedule.max_steps, config.recipe.batch_size * workers
    options = choice.options_json(config.to_json())
    return extras.Context(
        ws, PLAN, workers == 1, FakeBest(), 0, validating, end, samples, replan, options,  # type: ignore[arg-type]
        model=None, learning_rate=lambda step: 0.01,
    )  # fmt: skip


def _kinds(run: extras.Context) -> list[type]:
    return [type(hook) for hook in extras.hooks(run)]


KNOWN = [BestStep, ThrottledWarning, BudgetWatch, Summaries]  # another extra may join


def test_a_chief_validating_gets_every_extra_in_module_order(tmp_path: Path) -> None:
    assert [kind for kind in _kinds(_run(tmp_path)) if kind in KNOWN] == KNOWN


def test_a_worker_without_validation_gets_no_best_step_and_no_summaries(tmp_path: Path) -> None:
    run = _run(tmp_path, chief=False, validating=False, workers=2)
    assert [kind for kind in _kinds(run) if kind in KNOWN] == [ThrottledWarning, BudgetWatch]
    assert not (tmp_path / "out" / "tensorboard").exists()


@pytest.mark.parametrize(
    ("workers", "replan", "enabled", "why_not"),
    [(1, "on-change", True, "--replan never"), (1, "never", False, "--replan never"),
     (2, "on-change", False, "a multi-worker run")],
)  # fmt: skip
def test_the_budget_watch_replans_only_a_single_process_on_change(
    tmp_path: Path, workers: int, replan: str, enabled: bool, why_not: str
) -> None:
    run = _run(tmp_path, chief=False, workers=workers, replan=replan)
    (watch,) = [h for h in extras.hooks(run) if isinstance(h, BudgetWatch)]
    assert (watch.enabled, watch.why_not) == (enabled, why_not)


def test_the_best_step_is_offered_each_evaluated_validation_rmse(tmp_path: Path) -> None:
    run = _run(tmp_path, chief=False)
    (hook,) = [h for h in extras.hooks(run) if isinstance(h, BestStep)]
    hook.after_evaluation({"step": 100, "val_rmse": 0.5, "loss": 1.0})
    hook.after_evaluation({"step": 200, "val_rmse": 0.25, "loss": 0.5})
    assert run.best.offered == [(100, 0.5), (200, 0.25)]  # type: ignore[attr-defined]


def test_a_throttled_interval_warns_once_per_record(
    tmp_path: Path, logged: list[logging.LogRecord]
) -> None:
    hook = ThrottledWarning(PLAN)  # type: ignore[arg-type]
    hook.after_evaluation({"step": 5, "cpu_throttled_ratio": 0.05})  # below the ratio
    hook.after_evaluation({"step": 10, "cpu_throttled_ratio": 0.6, "cpu_throttled_s": 3.0})
    assert [(r.event, r.step) for r in logged] == [("cpu_throttled", 10)]


def test_the_summaries_write_the_decided_options_and_every_record(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (hook,) = [h for h in extras.hooks(run) if isinstance(h, Summaries)]
    hook.after_evaluation({"step": 10, "loss": 0.5, "val_rmse": 0.25})
    files = list((tmp_path / "out" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    import tensorflow as tf

    found = {
        (v.tag, e.step): v
        for e in tf.compat.v1.train.summary_iterator(str(files[0]))
        for v in e.summary.value
    }
    assert set(found) == {("config", 0), ("loss", 10), ("val_rmse", 10)}
    text = found[("config", 0)].tensor.string_val[0].decode()
    assert '"formulation": "fast"' in text and '"precision": "float32"' in text
    assert tf.make_ndarray(found[("val_rmse", 10)].tensor) == pytest.approx(0.25)


def test_the_progress_view_joins_only_a_run_a_console_view_shows(tmp_path: Path) -> None:
    import io

    from app import logs
    from app.training.extras.progress_view import StepView
    from app.training.loop.controller import Meter

    assert not [h for h in extras.hooks(_run(tmp_path)) if isinstance(h, StepView)]  # JSON
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logs.STEP)
    handler.emit = records.append  # type: ignore[method-assign]
    logs.setup(level=logging.INFO, stream=io.StringIO(), text=True)
    logging.getLogger(logs.LOGGER_NAME).addHandler(handler)
    try:
        run = _run(tmp_path)
        (view,) = [h for h in extras.hooks(run) if isinstance(h, StepView)]
        assert view.max_steps == run.max_steps
        clock = iter(range(100)).__next__
        view = StepView(Meter(2.0, 10, clock=clock, cpu_clock=clock), max_steps=10)
        for step in (1, 4, 7):
            view.after_steps(step, SimpleNamespace(loss=0.5))  # type: ignore[arg-type]
    finally:
        logs.setup(level=logging.INFO)
    steps = [r for r in records if getattr(r, "event", None) == "step"]
    assert [r.step for r in steps] == [1, 4, 7]  # type: ignore[attr-defined]
    assert {r.levelno for r in steps} == {logs.STEP}
    assert not hasattr(steps[0], "examples_per_sec")  # the first call traced: no rate
    assert all(r.examples_per_sec > 0 for r in steps[1:])  # type: ignore[attr-defined]
