"""The console view: a command's log records rendered for a person at a terminal (rich).

The same records as the JSON log (docs/architecture.md, "Logs"), shown as lines: the start,
each setup phase as it begins with its cost and how to skip it (``phase``), warnings, each
evaluation (``progress``), and at the ``end`` a summary block (test RMSE against the mean
predictor and the linear baseline, the exported step, the wall time, where the model, the
logs and the TensorBoard files are, what was published); the other commands' events
(``generated``, ``predicted``, ``exec``, ``exec_end``) as their message. Between
evaluations a progress bar follows the ``step`` records the loop sends after every call
into TensorFlow (level :data:`app.logs.STEP`, below INFO: never in the JSON log):
step/max, the loss, samples/s, ETA, CPU use against the budget, throttling when there is
any. The bar is rich's ``Progress`` (transient: cleared when it stops, before the summary
or an error line), and so is its estimate: samples/s and the ETA are rich's speed over the
steps of the last :data:`SPEED_WINDOW_S` seconds (``Task.speed``, ``Task.time_remaining``),
timed by the records' own times, so one call slowed by an evaluation or a checkpoint moves
them by its share of the window, not by its own rate. No TensorFlow.

The bar is one line, as wide as the terminal is at each redraw (rich reads its size then,
so a resized terminal too): ``training ━━━━ 100/200 loss 0.1382 · 15,227 samples/s · ETA
0:03 · CPU 50% of 2 · throttled 1.2 s``. A terminal too narrow for all of it loses whole
fields, least important first (:data:`LEFT_OUT_FIRST`): samples/s, CPU use, the throttled
seconds, the word "training", then the bar (first narrowed from :data:`BAR_WIDTH` columns
down to :data:`BAR_MIN_WIDTH`), the loss, the ETA; the step n/N stays. So 80 columns show
at least the word, the bar, the step, the loss and the ETA, and 40 the step, the loss and
the ETA (66 and 40 columns with 10000/10000, a loss of 1.234e-05 and an ETA of 1:02:05).
A field is never cut short (``100/2…`` reads as another step count): a terminal narrower
than the step alone gets an empty line.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any, TextIO

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task
from rich.progress_bar import ProgressBar
from rich.table import Column, Table
from rich.text import Text

from app import logs

#: Events a person does not need line by line (each is in logs/train.jsonl).
QUIET = frozenset({"steps_per_loop", "checkpoint", "traceback", "input_loaded", "step"})
_RMSE_NAMES = {"val_rmse": "validation RMSE", "test_rmse": "test RMSE"}
#: Seconds of steps the bar's speed and ETA are estimated over (rich's
#: ``speed_estimate_period``, its default).
SPEED_WINDOW_S = 30.0
#: Timed calls the bar's speed and ETA wait for: the first call's record only starts the
#: clock (it traced the step function), and the next of an automatic --steps-per-loop is
#: its calibration, a few steps: an estimate from it alone moved by 3x at the next call.
ESTIMATED_FROM = 2
#: The ``step`` record's fields the bar shows (:func:`bar_figures`).
_BAR_FIELDS = ("loss", "samples_per_step", "cpu_util", "cpu_budget", "cpu_throttled_s")
#: The bar line's fields, least important first: the order a terminal too narrow for the
#: whole line loses them in (:func:`fit`); the step n/N is the last one standing.
LEFT_OUT_FIRST = ("samples/s", "CPU", "throttled", "label", "bar", "loss", "ETA")
#: The figures among them (after the step, joined by " · "), as :func:`bar_figures` names them.
_FIGURES = frozenset({"loss", "samples/s", "ETA", "CPU", "throttled"})
#: Columns of the bar itself, and the fewest it is narrowed to before it is left out.
BAR_WIDTH, BAR_MIN_WIDTH = 16, 5


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The event's own fields of ``record`` (what ``app.logs.event`` passed as extra)."""
    return record.__dict__


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def bar_figures(f: dict[str, Any], speed: float | None, eta_s: float | None) -> dict[str, str]:
    """The figures beside the bar, by name in reading order, for the fields ``f`` of the
    last ``step`` record: the loss; samples/s from ``speed`` (steps/s) and the ETA
    ``eta_s`` (seconds; None: not known yet, "?"); CPU use against the budget, the
    throttled seconds when there were any. A figure without its value is absent."""
    figures = {} if f.get("loss") is None else {"loss": f"loss {f['loss']:.4g}"}
    if speed is not None and f.get("samples_per_step"):
        figures["samples/s"] = f"{speed * f['samples_per_step']:,.0f} samples/s"
    figures["ETA"] = f"ETA {_clock(eta_s)}"
    if f.get("cpu_util") is not None:
        figures["CPU"] = f"CPU {f['cpu_util']:.0%} of {f['cpu_budget']:g}"
    if f.get("cpu_throttled_s"):
        figures["throttled"] = f"throttled {f['cpu_throttled_s']:.1f} s"
    return figures


def _line_width(widths: dict[str, int]) -> int:
    """Columns of a bar line of the fields ``widths`` (name: columns): a space between two
    fields, `` · `` between two figures."""
    figures = len(widths.keys() & _FIGURES)
    return sum(widths.values()) + max(len(widths) - 1, 0) + 2 * max(figures - 1, 0)


def fit(widths: dict[str, int], room: int) -> dict[str, int]:
    """The fields of ``widths`` (name: columns, in reading order) that a line of ``room``
    columns shows, with their columns: all when they fit; else fields left out whole in
    the order of :data:`LEFT_OUT_FIRST`, the bar narrowed down to :data:`BAR_MIN_WIDTH`
    before it goes; none when the step alone does not fit."""
    shown = dict(widths)
    for name in LEFT_OUT_FIRST:
        over = _line_width(shown) - room
        if over <= 0:
            return shown
        if name == "bar" and shown.get("bar", 0) - over >= BAR_MIN_WIDTH:
            shown["bar"] -= over
            return shown
        shown.pop(name, None)
    return shown if _line_width(shown) <= room else {}


class _Fitted:
    """A bar line: ``label``, rich's ``bar``, the ``step`` n/N and the ``figures`` (name:
    text, in reading order), drawn by rich with the fields :func:`fit` keeps at the width
    it is given."""

    def __init__(self, label: Text, bar: ProgressBar, step: Text, figures: dict[str, str]):
        self.cells: dict[str, RenderableType] = {"label": label, "bar": bar, "step": step}
        self.bar, self.figures = bar, figures
        self.widths = {"label": label.cell_len, "bar": BAR_WIDTH, "step": step.cell_len}
        self.widths.update((name, cell_len(text)) for name, text in figures.items())

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        width = _line_width(fit(self.widths, options.max_width))
        return Measurement(width, width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown = fit(self.widths, options.max_width)
        self.bar.width = shown.get("bar", BAR_WIDTH)
        cells = [cell for name, cell in self.cells.items() if name in shown]
        figures = [text for name, text in self.figures.items() if name in shown]
        if figures:
            cells.append(Text(" · ".join(figures)))
        line = Table.grid(padding=(0, 1))
        line.add_row(*cells)
        yield line


class _Line(ProgressColumn):
    """The bar line of the module docstring as rich's one column: "training", rich's bar
    and n/N, the figures of :func:`bar_figures` from the task's fields (the last ``step``
    record's) and rich's estimate over the task's samples (``Task.speed``,
    ``Task.time_remaining``, once it rests on :data:`ESTIMATED_FROM` calls)."""

    def __init__(self) -> None:
        super().__init__(table_column=Column(no_wrap=True))
        self.bar, self.step = BarColumn(BAR_WIDTH), MofNCompleteColumn()

    def render(self, task: Task) -> _Fitted:
        known = task.fields["timed"] >= ESTIMATED_FROM
        speed, eta = (task.speed, task.time_remaining) if known else (None, None)
        figures = bar_figures(task.fields, speed, eta)
        return _Fitted(Text("training"), self.bar.render(task), self.step.render(task), figures)


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


class _Console(Console):
    """rich's console, whose broken pipe is the view's to handle (logging's rule: a handler
    never ends the process) instead of rich's ``SystemExit(1)``: it writes nothing more
    and raises the error to :meth:`ConsoleView.handleError`."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


class ConsoleView(logging.Handler):
    """The view of the module docstring on ``stream``, as a logging handler of the
    ``coretrain`` logger. A bar in progress is cleared before any other line is written
    through :meth:`clear`, as before the one-line error on stderr."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.console = _Console(file=stream, highlight=False, soft_wrap=True)
        if self.console.width < 1:  # COLUMNS=0 made rich draw nothing at all: its fallback
            self.console.width = 80
        self.progress: Progress | None = None
        self.task: Any = None
        self.now = 0.0  # the time of the last step record: the bar's clock
        self.output: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._show(getattr(record, "event", "log"), record)
        except Exception:  # a view must never end a run (logging's own rule for handlers)
            self.handleError(record)

    def _show(self, event: str, record: logging.LogRecord) -> None:
        f = _fields(record)
        if event == "step":
            self._tick(record, f)
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
        elif event in ("exec", "exec_end"):  # among the program's own lines: say whose
            self._print(escape(f"coretrain exec: {record.getMessage()}"))
            given = " ".join(f"{name}={value}" for name, value in (f.get("env") or {}).items())
            if given:
                self._print(f"  set: {escape(given)}", style="dim")
        elif event == "end":
            self._end(record, f)
        elif record.levelno >= logging.WARNING:
            self._print(f"[yellow]warning:[/] {escape(record.getMessage())}")
        elif event not in QUIET:
            self._print(escape(record.getMessage()), style="dim" if event == "log" else None)

    def _print(self, text: str, style: str | None = None) -> None:
        self.console.print(logs.printable(text), style=style)  # rich keeps ESC as it is

    def _tick(self, record: logging.LogRecord, f: dict[str, Any]) -> None:
        """Move the bar to the ``step`` record's step, at the record's own time."""
        self.now = record.created
        started = self.progress is not None
        if self.progress is None:
            self.progress = Progress(
                _Line(),
                console=self.console,
                auto_refresh=False,
                speed_estimate_period=SPEED_WINDOW_S,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
                get_time=lambda: self.now,
            )
            self.task = self.progress.add_task("", total=f["max_steps"], timed=-1)
        self.progress.update(self.task, completed=f["step"])
        self.progress.tasks[0].fields["timed"] += 1
        self.progress.tasks[0].fields.update({key: f.get(key) for key in _BAR_FIELDS})
        if started:
            self.progress.refresh()
        else:
            self.progress.start()  # drawn

    def _end(self, record: logging.LogRecord, f: dict[str, Any]) -> None:
        self.clear()
        if f.get("status") in ("completed", "target_reached") and "final_step" in f:
            self._print("")
            for i, line in enumerate(summary_block(f, self.output)):
                self._print(escape(line), style="bold" if i == 0 else None)
        elif f.get("status") != "failed":  # a failure is the one line on stderr
            self._print(escape(record.getMessage()))

    def handleError(self, record: logging.LogRecord) -> None:
        if not logs.lost(self, self.console.file):  # a closed or full stream: said once
            super().handleError(record)

    def clear(self) -> None:
        """Stop and erase the progress bar, if one is shown."""
        progress, self.progress = self.progress, None
        if progress is not None:
            try:
                progress.stop()
            except OSError:
                logs.lost(self, self.console.file)

    def close(self) -> None:
        self.clear()
        super().close()
