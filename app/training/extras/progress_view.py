"""The console's progress bar fed from the loop: a ``step`` record after every call into
TensorFlow.

A hook at the loop's :meth:`~app.training.loop.hooks.Hook.after_steps` boundary: the step,
the loss, the samples per step (the view's rate is its estimate of steps/s times them), and
since the previous call the samples/s, the ETA, the CPU use as a share of the budget and the
throttled time (the same :class:`~app.training.loop.controller.Meter` as the
``progress`` events). The record is at level :data:`app.logs.STEP`, below INFO, so the
console view (app/report/view.py) draws it and the JSON log never holds it; a run gets this
hook only when a view is shown. No TensorFlow here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app import logs
from app.budget.usage import Throttling
from app.training.loop.controller import Meter
from app.training.loop.hooks import Hook, StepResult

if TYPE_CHECKING:
    from app.training.extras import Context


class StepView(Hook):
    """The hook of the module docstring for a loop to ``max_steps``. The first call traces
    the step function: it starts the meter's window and shows no rate."""

    def __init__(self, meter: Meter, max_steps: int) -> None:
        self.meter, self.max_steps, self.started = meter, max_steps, False

    def after_steps(self, step: int, result: StepResult) -> None:
        fields: dict[str, float | None] = {}
        if self.started:
            fields = self.meter.read(step, self.max_steps)
        else:
            self.meter.mark(step)
            self.started = True
        logs.event(
            "step",
            f"step {step}/{self.max_steps}",
            level=logs.STEP,
            step=step,
            max_steps=self.max_steps,
            loss=result.loss,
            samples_per_step=self.meter.samples_per_step,
            cpu_budget=self.meter.cpu_budget,
            **fields,
        )


def hooks(context: Context) -> list[Hook]:
    """The bar's feed, when a console view shows it (app/report/view.py)."""
    if not logs.shows(logs.STEP):
        return []
    throttling = Throttling(context.plan.cpu_stat).read
    meter = Meter(context.plan.cpu_budget, context.samples_per_step, throttling=throttling)
    return [StepView(meter, context.max_steps)]
