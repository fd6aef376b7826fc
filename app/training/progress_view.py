"""The progress bar's feed: a ``step`` record after every call into TensorFlow.

A tick of the loop (:attr:`app.training.controller.Controller.ticks`): the step, the
loss, and since the previous call the samples/s, the ETA, the CPU use as a share of the
budget and the throttled time (the same :class:`~app.training.controller.Meter` as the
``progress`` events). The record is at level :data:`app.logs.STEP`, below INFO, so the
console view (app/report/view.py) draws it and the JSON log never holds it; the loop adds
this tick only when a view is shown. No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass

from app import logs
from app.training.controller import Meter, StepResult


@dataclass
class StepView:
    """The tick of the module docstring for a loop to ``max_steps``. The first call traces
    the step function: it starts the meter's window and shows no rate."""

    meter: Meter
    max_steps: int
    started: bool = False

    def __call__(self, step: int, result: StepResult) -> None:
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
            cpu_budget=self.meter.cpu_budget,
            **fields,
        )
