"""How a command reports beyond its JSON log: to a person at a terminal and to monitoring.

:class:`LogOptions` is every logging command's ``--log-format`` (``train``, ``generate``,
``predict``, ``exec``): its log stream as JSON lines, or the readable view of
:mod:`app.report.view`. :class:`ReportOptions` adds ``coretrain train``'s
``--metrics-push`` and ``--metrics-job`` (the run's outcome pushed to a Prometheus
Pushgateway at its end, under a job label that stays the same night after night:
:mod:`app.report.push`). A run's ``logs/train.jsonl`` is JSON lines whatever the format. No
click, no TensorFlow here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TextIO
from urllib.parse import urlsplit

from app.errors import ConfigError
from app.options import option

LOG_FORMATS = ("auto", "json", "text")
#: Values of ``TERM`` that name a terminal without cursor control: no view for them (rich's
#: ``Console.is_dumb_terminal`` rule; less and Emacs' shell set ``dumb``).
DUMB_TERMINALS = ("dumb", "unknown")
#: The longest --metrics-push and --metrics-job: both are in the push's log line, and a log
#: line stays under 2,000 characters (docs/architecture.md, "Lean lines").
MAX_CHARS = 200


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
    """The stdout format and the metrics push of a run (module docstring). Raises
    ConfigError (exit 2) for a ``--metrics-push`` that is no Pushgateway URL
    (:func:`gateway_url`), or a ``--metrics-job`` that is blank, not printable or over
    :data:`MAX_CHARS` characters."""

    metrics_push: str | None = option(
        None,
        "Push the run's outcome (status, exit code, RMSEs, published version, steps, rates, "
        "times, CPU use, the last success) to this Prometheus Pushgateway (http://HOST:PORT) "
        'at the end of the run, also when it fails (docs/deploy.md, "Metrics"); a failed '
        "push is a warning.",
        metavar="URL",
        shown_default="none",
    )
    metrics_job: str = option(
        "coretrain",
        "The job label of the push, its only grouping key: the same every night, so each "
        "run's push replaces the last one's; give each CronJob its own.",
        metavar="NAME",
    )

    def __post_init__(self) -> None:
        if self.metrics_push is not None:
            gateway_url(self.metrics_push)
        job = self.metrics_job
        if not job.strip() or len(job) > MAX_CHARS or not job.isprintable():
            raise ConfigError(
                f"--metrics-job must be 1 to {MAX_CHARS} printable characters, not blank"
            )


def gateway_url(url: str) -> str:
    """The Pushgateway URL ``url`` (``--metrics-push``) as pushed to: ``http://`` added when
    it has no scheme (``HOST:PORT``, as prometheus-client does). Raises ConfigError (exit 2)
    for one no push could reach, told at the start rather than after the run: empty, white
    space or control characters, a scheme other than http/https, no host, a port that is
    not a number in 1-65535, a query or fragment (the push appends its path), a user and
    password (the URL is logged), over :data:`MAX_CHARS` characters."""
    full = url if "://" in url else f"http://{url}"
    if "@" in full.partition("://")[2].partition("/")[0]:  # not echoed: it may hold a password
        raise ConfigError("--metrics-push: no user or password in the URL (it is logged)")
    if len(url) > MAX_CHARS:
        raise ConfigError(f"--metrics-push: a URL of {len(url)} characters (at most {MAX_CHARS})")
    bad = f"--metrics-push {url!r}"
    if not url.strip() or any(c.isspace() or not c.isprintable() for c in url):
        raise ConfigError(f"{bad}: give the Pushgateway's URL (http://HOST:PORT)")
    try:
        parts = urlsplit(full)
        if not parts.hostname or parts.port == 0:
            raise ValueError("no host")
    except ValueError:  # no host, a port out of range or not a number, a "[" not closed
        raise ConfigError(f"{bad}: give the Pushgateway's host and port (HOST:PORT)") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{bad}: the scheme must be http or https (http://HOST:PORT)")
    if parts.query or parts.fragment or full.endswith(("?", "#")):
        raise ConfigError(f"{bad}: no query or fragment (the push appends its own path)")
    return full
