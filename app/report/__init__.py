"""How a command reports beyond its JSON log: to a person at a terminal and to monitoring.

:class:`LogOptions` is every logging command's ``--log-format`` (``train``, ``generate``,
``predict``, ``exec``): its log stream as JSON lines, or the readable view of
:mod:`app.report.view`. :class:`ReportOptions` adds ``coretrain train``'s
``--metrics-push`` (the run's outcome pushed to a Prometheus Pushgateway at its end:
:mod:`app.report.push`). A run's ``logs/train.jsonl`` is JSON lines whatever the format. No
click, no TensorFlow here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TextIO

from app.options import option

LOG_FORMATS = ("auto", "json", "text")
#: Values of ``TERM`` that name a terminal without cursor control: no view for them (rich's
#: ``Console.is_dumb_terminal`` rule; less and Emacs' shell set ``dumb``).
DUMB_TERMINALS = ("dumb", "unknown")


@dataclass(frozen=True)
class LogOptions:
    """The format of a command's log stream (module docstring): stdout, or stderr for
    ``coretrain exec``, whose stdout is its program's."""

    log_format: str = option(
        "auto",
        "What the log stream (stdout; stderr for exec) shows: text, a readable view for people "
        "(train: setup phases with their cost, a progress bar with the loss and ETA, "
        "evaluations, a summary); json, one JSON object per line; auto, text when it is a "
        "terminal (TERM not dumb), else json. A run's logs/train.jsonl is always JSON lines.",
        choices=LOG_FORMATS,
    )

    def text(self, stream: TextIO | None) -> bool:
        """Whether ``stream`` (the log stream) gets the readable view: ``text``, or ``auto``
        on a terminal whose ``TERM`` is not one of :data:`DUMB_TERMINALS` (unset counts as
        a terminal: the view's cursor codes are the ones every terminal emulator has).
        A closed stream (None) gets JSON, which goes nowhere."""
        if self.log_format != "auto":
            return self.log_format == "text"
        try:
            tty = stream is not None and os.isatty(stream.fileno())
        except (AttributeError, OSError, ValueError):
            return False
        return tty and os.environ.get("TERM", "").lower() not in DUMB_TERMINALS


@dataclass(frozen=True)
class ReportOptions(LogOptions):
    """The stdout format and the metrics push of a run (module docstring)."""

    metrics_push: str | None = option(
        None,
        "Push the run's outcome (status, exit code, RMSEs, published version, steps, rates, "
        "times, CPU use) to this Prometheus Pushgateway at the end of the run, also when it "
        'fails, grouped by job and run (docs/deploy.md, "Metrics"); a failed push is a '
        "warning.",
        metavar="URL",
        shown_default="none",
    )
