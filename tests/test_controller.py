"""The Controller's promises, with a stand-in trainer: each rule is pinned by its own test.

When to evaluate (every ``eval_every``, the last step, on a stop), when to checkpoint
(every ``checkpoint_every``, the last step, on a stop, on reaching the target), how calls
are cut at those boundaries, how K = auto is chosen, and what ends the loop. No
TensorFlow: the trainer and checkpoints are recorded fakes, the clock is simulated.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import pytest

from app import logs
from app.errors import TrainingDiverged
from app.training.loop.controller import (
    CALIBRATION_STEPS,
    TARGET_CALL_SECONDS,
    Controller,
    Meter,
    Schedule,
)
from app.training.loop.hooks import Hook, StepResult
from app.training.loop.outcome import Completed, Replan, Stopped, TargetReached


class Recorder(Hook):
    """A hook that records each boundary it is run at; ``replan`` answers the re-plan question."""

    def __init__(self, replan: object = None) -> None:
        self.calls: list[tuple[int, int]] = []  # (step reached, steps in the call)
        self.records: list[dict] = []
        self.answer = replan

    def after_steps(self, step: int, result: StepResult) -> None:
        self.calls.append((step, len(result.losses)))

    def after_evaluation(self, record: dict) -> None:
        self.records.append(record)

    def replan(self) -> bool:
        return bool(self.answer()) if callable(self.answer) else False


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class Result:
    losses: list[float]
    train_rmse: float
    stop: bool

    @property
    def loss(self) -> float:
        return self.losses[-1]

    @property
    def diverged(self) -> bool:
        return not math.isfinite(self.loss)


@dataclass
class FakeTrainer:
    """Trains instantly; ``step_seconds`` of simulated time per step."""

    clock: Clock
    step: int = 0
    step_seconds: float = 0.01
    stop_after: int | None = None  # the stop request turns on once this step is reached
    nan_at: int | None = None
    rmse_at: dict[int, float] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)

    def train(self, steps: int, stop: object) -> Result:
        self.calls.append(steps)
        losses = []
        for _ in range(steps):
            self.step += 1
            self.clock.now += self.step_seconds
            losses.append(math.nan if self.step == self.nan_at else 1.0 / self.step)
            if self.step == self.nan_at:
                break
        stopping = self.stop_after is not None and self.step >= self.stop_after
        return Result(losses, 0.5, stopping)

    def evaluate(self) -> float:
        self.evaluated.append(self.step)
        return self.rmse_at.get(self.step, 1.0)

    def learning_rate(self, step: int) -> float:
        return 0.1


@dataclass
class FakeCheckpoints:
    saved: list[int] = field(default_factory=list)

    def save(self, step: int) -> str:
        self.saved.append(step)
        return f"ckpt-{step}"

    def kept(self) -> str:
        return f"the last good checkpoint is ckpt-{self.saved[-1]}" if self.saved else "none"

    def remedy(self) -> str:
        return "lower --learning-rate"


def run(
    *,
    start: int = 0,
    max_steps: int = 10,
    eval_every: int = 3,
    checkpoint_every: int = 4,
    k: int = 5,
    target: float = 0.0,
    agree: object = None,
    replan: object = None,
    **trainer: object,
) -> tuple[object, FakeTrainer, FakeCheckpoints]:
    clock = Clock()
    fake = FakeTrainer(clock, step=start, **trainer)  # type: ignore[arg-type]
    saves = FakeCheckpoints()
    controller = Controller(
        fake,
        saves,
        Schedule(max_steps, eval_every, checkpoint_every, k, target),
        Meter(cpu_budget=2.0, samples_per_step=10, clock=clock, cpu_clock=clock),
        stop=lambda: False,
        baseline_rmse=2.0,
        **({"agree": agree} if agree else {}),  # type: ignore[arg-type]
        hooks=[Recorder(replan)],
    )
    return controller.run(start), fake, saves


@pytest.fixture(autouse=True)
def quiet_logs() -> None:
    logs.setup(level=logging.ERROR)


def test_calls_are_cut_at_every_evaluation_checkpoint_and_the_last_step() -> None:
    outcome, fake, _ = run()
    # From 0 with K = 5: to 3 (eval), 4 (checkpoint), 6 (eval), 8 (ckpt), 9 (eval), 10 (last).
    assert fake.calls == [3, 1, 2, 2, 1, 1]
    assert isinstance(outcome, Completed) and outcome.status == "completed"
    assert outcome.step == 10


def test_evaluation_every_n_steps_and_at_the_last_step() -> None:
    _, fake, _ = run()
    assert fake.evaluated == [3, 6, 9, 10]


def test_checkpoints_every_n_steps_and_at_the_last_step() -> None:
    _, _, saves = run()
    assert saves.saved == [4, 8, 10]


def test_a_stop_request_evaluates_checkpoints_and_ends_preempted() -> None:
    outcome, fake, saves = run(stop_after=5, checkpoint_every=100, eval_every=100, k=5)
    assert fake.calls == [5]
    assert (fake.evaluated, saves.saved) == ([5], [5])
    assert isinstance(outcome, Stopped) and outcome.status == "preempted"
    assert outcome.step == 5


def test_reaching_the_target_checkpoints_that_step_and_stops() -> None:
    outcome, fake, saves = run(target=0.5, rmse_at={6: 0.4}, checkpoint_every=100, k=1)
    assert fake.evaluated == [3, 6]
    assert saves.saved == [6]
    assert isinstance(outcome, TargetReached) and outcome.status == "target_reached"
    assert outcome.eval_rmse == 0.4


def test_a_non_finite_loss_raises_before_anything_is_saved_at_that_step() -> None:
    with pytest.raises(TrainingDiverged, match=r"loss became nan at step 7; .*ckpt-4"):
        run(nan_at=7)


def test_a_non_finite_test_rmse_raises() -> None:
    with pytest.raises(TrainingDiverged, match="test RMSE became inf at step 3"):
        run(rmse_at={3: math.inf})


def test_resume_trains_from_the_restored_step_to_the_same_absolute_end() -> None:
    outcome, fake, saves = run(start=6)
    assert fake.calls == [2, 1, 1]  # to 8 (checkpoint), 9 (eval), 10 (last)
    assert saves.saved == [8, 10]
    assert outcome.start_step == 6 and outcome.step == 10  # type: ignore[attr-defined]


def test_nothing_left_to_train_makes_no_call() -> None:
    outcome, fake, saves = run(start=10)
    assert (fake.calls, saves.saved, outcome.eval_rmse) == ([], [], None)  # type: ignore[attr-defined]


def test_auto_k_traces_with_one_step_then_times_a_few_and_aims_at_the_target_call_time() -> None:
    step_s = 0.004
    outcome, fake, _ = run(k=0, max_steps=2000, eval_every=1000, checkpoint_every=1000,
                           step_seconds=step_s)  # fmt: skip
    k = round(TARGET_CALL_SECONDS / step_s)
    assert fake.calls[:2] == [1, CALIBRATION_STEPS]
    # 1 + 3 steps, then K-step calls cut at 1000 (an evaluation and a checkpoint) and 2000.
    assert fake.calls[2:10] == [k] * 7 + [1000 - 4 - 7 * k]
    assert max(fake.calls) == k
    assert outcome.steps_per_loop == k  # type: ignore[attr-defined]


def test_auto_k_is_agreed_between_workers() -> None:
    asked: list[float] = []

    def agree(value: float) -> float:
        asked.append(value)
        return 7.9  # the mean of the workers' proposals

    _, fake, _ = run(k=0, max_steps=100, eval_every=100, checkpoint_every=100, agree=agree)
    assert len(asked) == 1
    assert fake.calls[2:4] == [7, 7]


def _one_progress(fake: FakeTrainer, clock: Clock) -> dict:
    """The one progress record of 10 steps (K = 3, an evaluation at step 10), 100 samples a
    step, timed by ``clock``."""
    controller = Controller(
        fake,
        FakeCheckpoints(),
        Schedule(10, 10, 100, 3, 0.0),
        Meter(cpu_budget=1.0, samples_per_step=100, clock=clock, cpu_clock=clock),
        stop=lambda: False,
        baseline_rmse=2.0,
        hooks=[recorder := Recorder()],
    )
    controller.run(0)
    (progress,) = recorder.records
    return progress


def test_progress_rate_leaves_out_the_tracing_call() -> None:
    clock = Clock()
    fake = FakeTrainer(clock, step_seconds=0.01)
    original = fake.train

    def slow_first_call(steps: int, stop: object) -> Result:
        if not fake.calls:
            clock.now += 5.0  # tracing
        return original(steps, stop)

    fake.train = slow_first_call  # type: ignore[method-assign]
    progress = _one_progress(fake, clock)
    # 7 steps after the first call (3 steps), 0.07 s: 10,000 samples/s, not 1000/5.1 s.
    assert progress["examples_per_sec"] == pytest.approx(100 * 7 / 0.07)
    assert progress["step"] == 10 and progress["loss"] == pytest.approx(0.1)


def test_progress_gives_the_training_rate_without_the_evaluation_too() -> None:
    clock = Clock()
    fake = FakeTrainer(clock, step_seconds=0.01)
    evaluate = fake.evaluate

    def slow_evaluation() -> float:
        clock.now += 0.07  # as long as the window's 7 steps
        return evaluate()

    fake.evaluate = slow_evaluation  # type: ignore[method-assign]
    progress = _one_progress(fake, clock)
    assert progress["eval_s"] == pytest.approx(0.07)
    assert progress["examples_per_sec"] == pytest.approx(100 * 7 / 0.14)
    assert progress["train_examples_per_sec"] == pytest.approx(100 * 7 / 0.07)


def test_a_budget_that_needs_a_new_plan_checkpoints_and_ends_in_a_replan() -> None:
    asked: list[int] = []

    def replan() -> bool:  # asked after each evaluation that the loop would go on from
        asked.append(len(asked))
        return len(asked) == 2

    outcome, fake, saves = run(replan=replan, checkpoint_every=100, k=1)
    assert fake.evaluated == [3, 6] and saves.saved == [6]  # checkpointed where it stopped
    assert isinstance(outcome, Replan) and outcome.status == "replan" and outcome.step == 6
    assert outcome.at > 0  # when the change was noticed


def test_the_budget_is_not_asked_after_the_last_evaluation() -> None:
    asked: list[bool] = []
    outcome, fake, _ = run(replan=lambda: asked.append(True) or True, eval_every=10, k=10)
    assert fake.evaluated == [10] and asked == []
    assert isinstance(outcome, Completed)


def _hooked(*hooks: Hook, max_steps: int = 10, k: int = 1, eval_every: int = 5) -> object:
    clock = Clock()
    controller = Controller(
        FakeTrainer(clock),
        FakeCheckpoints(),
        Schedule(max_steps, eval_every, 100, k, 0.0),
        Meter(cpu_budget=1.0, samples_per_step=10, clock=clock, cpu_clock=clock),
        stop=lambda: False,
        baseline_rmse=2.0,
        hooks=list(hooks),
    )
    return controller.run(0)


def test_a_hook_runs_after_every_call_with_the_step_reached() -> None:
    every_step, calls = Recorder(), Recorder()
    _hooked(every_step, k=1)
    assert every_step.calls == [(step, 1) for step in range(1, 11)]  # K = 1: every step
    _hooked(calls, k=4)  # calls cut at the evaluation (5) and the end (10)
    assert calls.calls == [(4, 4), (5, 1), (9, 4), (10, 1)]


def test_every_hook_gets_every_evaluation_record_in_order() -> None:
    first, second = Recorder(), Recorder()
    _hooked(first, second)
    assert [r["step"] for r in first.records] == [5, 10]
    assert first.records == second.records
    assert {"loss", "test_rmse", "examples_per_sec", "lr"} <= set(first.records[0])


def test_every_hook_is_asked_to_replan_and_one_yes_is_enough() -> None:
    asked: list[str] = []
    no = Recorder(lambda: asked.append("no") or False)
    yes = Recorder(lambda: asked.append("yes") or True)
    outcome = _hooked(no, yes)
    assert isinstance(outcome, Replan) and outcome.step == 5
    assert asked == ["no", "yes"]
