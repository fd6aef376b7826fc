"""JSON logging: one object per line on stdout and in ``<output>/logs/train.jsonl``; or,
for a person at a terminal, the console view on stdout (app/report/view.py) with the file
still JSON lines.

Every record has ``timestamp``, ``level``, ``event`` and ``message`` plus the
event's own fields (docs/architecture.md, "Logs"). Python warnings and the ``tensorflow`` /
``absl`` Python loggers are routed into the same stream at WARNING and above;
TensorFlow's C++ log lines stay on stderr (their level is set by
``TF_CPP_MIN_LOG_LEVEL`` in :mod:`app.budget.apply`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from app import jsonvalues

LOGGER_NAME = "coretrain"
#: The level of the loop's ``step`` records (after every call into TensorFlow): below INFO,
#: so only the console view (app/report/view.py) gets them, never the JSON log.
STEP = 15
_ROUTED = ("tensorflow", "absl", "keras", "py.warnings")
# Until setup() (commands that keep stdout for their own output, such as plan, never call
# it), events go nowhere: without a handler Python's logging would print them on stderr,
# next to the one-line error (the logging HOWTO's rule for libraries).
logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())


class _Defaults(logging.Filter):
    """Gives every record an ``event`` (default ``log``) and the worker index if set."""

    def __init__(self, worker: int | None) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "event"):
            record.event = "log"
        if self.worker is not None and not hasattr(record, "worker"):
            record.worker = self.worker
        return True


def _formatter() -> JsonFormatter:
    return JsonFormatter(
        "{levelname}{event}{message}",
        style="{",
        rename_fields={"levelname": "level"},
        timestamp=True,
        json_ensure_ascii=False,
        json_serializer=jsonvalues.dumps,  # NaN as null: a line every collector parses
    )


def setup(
    worker: int | None = None,
    level: int = logging.INFO,
    stream: TextIO | None = None,
    text: bool = False,
) -> logging.Logger:
    """Send the project's logger (and routed library loggers) to ``stream`` (default
    stdout; ``coretrain exec`` leaves stdout to its program) as JSON lines, or with
    ``text`` as the console view for people (app/report/view.py), which also gets the
    :data:`STEP` records.

    Idempotent: replaces handlers installed by an earlier call. Returns the
    ``coretrain`` logger.
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(min(level, STEP) if text else level)
    logger.propagate = False
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    out = sys.stdout if stream is None else stream
    stdout: logging.Handler
    if text:
        from app.report.view import ConsoleView

        stdout = ConsoleView(out)
    else:
        stdout = logging.StreamHandler(out)
        stdout.setFormatter(_formatter())
        stdout.setLevel(level)
    stdout.addFilter(_Defaults(worker))
    logger.addHandler(stdout)
    logging.captureWarnings(True)
    for name in _ROUTED:
        routed = logging.getLogger(name)
        routed.handlers = [stdout]
        routed.setLevel(logging.WARNING)
        routed.propagate = False
    return logger


class _FileHandler(logging.StreamHandler[TextIO]):
    """A stream handler that owns its file (closed with the handler)."""

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            super().close()


def add_file(fd: int, worker: int | None = None) -> None:
    """Also append the JSON lines to the open log file ``fd`` (taken over: closed with the
    handler). The caller opens it without following symlinks (app/training/state/workspace.py).

    An incomplete last line left by a run killed mid-write (or a full disk) is cut off
    first, so the next record is not glued to the fragment. Raises OSError.
    """
    _drop_partial_record(fd)
    handler = _FileHandler(os.fdopen(fd, "a", encoding="utf-8"))
    handler.setFormatter(_formatter())
    handler.setLevel(max(logging.getLogger(LOGGER_NAME).level, logging.INFO))
    handler.addFilter(_Defaults(worker))
    logging.getLogger(LOGGER_NAME).addHandler(handler)
    for name in _ROUTED:
        logging.getLogger(name).addHandler(handler)


def _drop_partial_record(fd: int) -> None:
    """Truncate the file ``fd`` after its last newline (nothing to do when it ends in one)."""
    end = os.fstat(fd).st_size
    pos = end
    while pos > 0:
        start = max(0, pos - 65536)
        newline = os.pread(fd, pos - start, start).rfind(b"\n")
        if newline >= 0:
            pos = start + newline + 1
            break
        pos = start
    if pos != end:
        os.ftruncate(fd, pos)


def add_handler(handler: logging.Handler) -> None:
    """Also give the project's records (at INFO and above) to ``handler``."""
    handler.setLevel(max(handler.level, logging.INFO))
    logging.getLogger(LOGGER_NAME).addHandler(handler)


def clear_view() -> None:
    """Erase the console view's progress bar, if one is shown (before a line on stderr)."""
    for handler in logging.getLogger(LOGGER_NAME).handlers:
        clear = getattr(handler, "clear", None)
        if callable(clear):
            clear()


def shows(level: int) -> bool:
    """Whether records at ``level`` reach any handler (:data:`STEP`: a console view)."""
    return logging.getLogger(LOGGER_NAME).isEnabledFor(level)


def event(name: str, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event: ``event=name`` with ``fields`` as top-level JSON keys."""
    logging.getLogger(LOGGER_NAME).log(level, message, extra={"event": name, **fields})
