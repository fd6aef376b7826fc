"""How a run reports beyond its JSON log: to a person at a terminal and to monitoring.

:class:`ReportOptions` are ``coretrain train``'s options for it: ``--log-format`` (stdout as
JSON lines, or the readable view of :mod:`app.report.view` with a progress bar) and
``--metrics-push`` (the run's outcome pushed to a Prometheus Pushgateway at its end:
:mod:`app.report.push`). ``logs/train.jsonl`` is JSON lines whatever the format. No click,
no TensorFlow here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TextIO

from app.options import option

LOG_FORMATS = ("auto", "json", "text")


@dataclass(frozen=True)
class ReportOptions:
    """The stdout format and the metrics push of a run (module docstring)."""

    log_format: str = option(
        "auto",
        "What stdout shows: text, a readable view for people (setup phases with their cost, "
        "a progress bar, evaluations, a summary); json, one JSON object per line; auto, text "
        "when stdout is a terminal, else json. logs/train.jsonl is always JSON lines.",
        choices=LOG_FORMATS,
    )
    metrics_push: str | None = option(
        None,
        "Push the run's outcome (status, exit code, RMSEs, published version, steps, rates, "
        "times, CPU use) to this Prometheus Pushgateway at the end of the run, also when it "
        'fails, grouped by job and run (docs/deploy.md, "Metrics"); a failed push is a '
        "warning.",
        metavar="URL",
        shown_default="none",
    )

    def text(self, stream: TextIO) -> bool:
        """Whether ``stream`` (stdout) gets the readable view: ``text``, or ``auto`` on a
        terminal (``TERM=dumb`` counts as none, as for rich and less)."""
        if self.log_format != "auto":
            return self.log_format == "text"
        try:
            tty = os.isatty(stream.fileno())
        except (AttributeError, OSError, ValueError):
            return False
        return tty and os.environ.get("TERM") != "dumb"
