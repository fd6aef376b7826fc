"""The console view: a run's log records rendered for a person at a terminal (rich).

The same records as the JSON log (docs/architecture.md, "Logs"), shown as lines: the start,
each setup phase as it begins with its cost and how to skip it (``phase``), warnings, each
evaluation (``progress``), and at the ``end`` a summary block (test RMSE against the mean
predictor and the linear baseline, the exported step, the wall time, where the model, the
logs and the TensorBoard files are, what was published). Between evaluations a progress
bar follows the ``step`` records the loop sends after every call into TensorFlow (level
:data:`app.logs.STEP`, below INFO: never in the JSON log): step/max, samples/s, ETA, CPU
use against the budget, throttling when there is any. The bar is rich's ``Progress``
(transient: cleared when it stops, before the summary or an error line). No TensorFlow.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

#: Events a person does not need line by line (each is in logs/train.jsonl).
QUIET = frozenset({"steps_per_loop", "checkpoint", "traceback", "input_loaded", "step"})
_RMSE_NAMES = {"val_rmse": "validation RMSE", "test_rmse": "test RMSE"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The event's own fields of ``record`` (what ``app.logs.event`` passed as extra)."""
    return record.__dict__


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def bar_text(f: dict[str, Any]) -> str:
    """The figures beside the bar for a ``step`` record's fields ``f``: samples/s, ETA,
    CPU use against the budget, the throttled seconds when there were any."""
    parts = []
    if f.get("examples_per_sec") is not None:
        parts.append(f"{f['examples_per_sec']:,.0f} samples/s")
        parts.append(f"ETA {_clock(f.get('eta_s'))}")
    if f.get("cpu_util") is not None:
        parts.append(f"CPU {f['cpu_util']:.0%} of {f['cpu_budget']:g}")
    if f.get("cpu_throttled_s"):
        parts.append(f"throttled {f['cpu_throttled_s']:.1f} s")
    return " · ".join(parts)


def evaluation_line(f: dict[str, Any]) -> str:
    """One line for a ``progress`` record: the step, the loss, the evaluated RMSE against
    the mean predictor and the linear baseline, the rate."""
    name = "val_rmse" if f.get("val_rmse") is not None else "test_rmse"
    refs = f"mean predictor {f['baseline_rmse']:.4g}" if f.get("baseline_rmse") else ""
    if f.get("linear_rmse") is not None:
        refs += f", linear {f['linear_rmse']:.4g}"
    return f"step {f['step']} · loss {f['loss']:.4g} · {_RMSE_NAMES[name]} {f[name]:.4g}" + (
        f" (test set: {refs})" if refs else ""
    )


#: The summary's rows from the ``end`` event: label, field, format.
_SUMMARY_ROWS = (
    ("exported step", "exported_step", "{}"),
    ("speed", "examples_per_sec", "{:,.0f} samples/s"),
    ("model", "export", "{}"),
)


def _row(label: str, value: str) -> str:
    return f"{label:<15}{value}"


def summary_block(f: dict[str, Any], output: str | None) -> list[str]:
    """The lines of the summary for a finished run's ``end`` record ``f``; ``output`` is
    the output directory (the ``start`` event's), for where things are."""
    lines = [f"{f['status']} at step {f['final_step']} in {_clock(f.get('wall_seconds'))}"]
    if f.get("test_rmse") is not None:
        refs = [f"mean predictor {f['baseline_rmse']:.4g}"]
        if f.get("linear_rmse") is not None:
            refs.append(f"linear baseline {f['linear_rmse']:.4g}")
        lines.append(_row("test RMSE", f"{f['test_rmse']:.4g}  ({', '.join(refs)})"))
    lines += [_row(label, form.format(f[key])) for label, key, form in _SUMMARY_ROWS if f.get(key)]
    if output is not None:
        out = Path(output)
        lines.append(_row("logs", str(out / "logs" / "train.jsonl")))
        lines.append(_row("TensorBoard", f"tensorboard --logdir {out / 'tensorboard'}"))
        lines.append(_row("summary", str(out / "metrics.json")))
    publish = f.get("publish")
    if publish:
        if publish.get("published"):
            lines.append(_row("published", f"version {publish.get('version')}"))
        else:
            lines.append(_row("not published", str(publish.get("reason", ""))))
    return lines


class ConsoleView(logging.Handler):
    """The view of the module docstring on ``stream``, as a logging handler of the
    ``coretrain`` logger. A bar in progress is cleared before any other line is written
    through :meth:`clear`, as before the one-line error on stderr."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.progress: Progress | None = None
        self.task: Any = None
        self.output: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._show(getattr(record, "event", "log"), record)
        except Exception:  # a view must never end a run (logging's own rule for handlers)
            self.handleError(record)

    def _show(self, event: str, record: logging.LogRecord) -> None:
        f = _fields(record)
        if event == "step":
            self._tick(f)
        elif event == "start":
            self.output = f.get("config", {}).get("output_dir")
            self._print(f"[bold]{escape(record.getMessage())}[/]")
            if f.get("plan_file"):
                self._print(f"  the plan and why: {escape(f['plan_file'])}", style="dim")
        elif event == "phase":
            self._print(f"{escape(record.getMessage())}", style="cyan")
        elif event == "cache" and f.get("reused") is False:  # a conversion begins
            why = "; once: later runs with the same data reuse it (progress below)"
            self._print(escape(record.getMessage() + why), style="cyan")
        elif event == "progress":
            self._print(escape(evaluation_line(f)))
        elif event == "end":
            self._end(record, f)
        elif record.levelno >= logging.WARNING:
            self._print(f"[yellow]warning:[/] {escape(record.getMessage())}")
        elif event not in QUIET:
            self._print(escape(record.getMessage()), style="dim" if event == "log" else None)

    def _print(self, text: str, style: str | None = None) -> None:
        self.console.print(text, style=style)

    def _tick(self, f: dict[str, Any]) -> None:
        if self.progress is None:
            self.progress = Progress(
                TextColumn("training"),
                BarColumn(bar_width=16),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                console=self.console,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self.progress.start()
            self.task = self.progress.add_task("", total=f["max_steps"])
        self.progress.update(self.task, completed=f["step"], description=escape(bar_text(f)))
        self.progress.refresh()

    def _end(self, record: logging.LogRecord, f: dict[str, Any]) -> None:
        self.clear()
        if f.get("status") in ("completed", "target_reached") and "final_step" in f:
            self._print("")
            for i, line in enumerate(summary_block(f, self.output)):
                self._print(escape(line), style="bold" if i == 0 else None)
        elif f.get("status") != "failed":  # a failure is the one line on stderr
            self._print(escape(record.getMessage()))

    def clear(self) -> None:
        """Stop and erase the progress bar, if one is shown."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def close(self) -> None:
        self.clear()
        super().close()
