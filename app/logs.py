"""JSON logging: one object per line on stdout and in ``<output>/logs/train.jsonl``; or,
for a person at a terminal, the console view on stdout (app/report/view.py) with the file
still JSON lines.

Every record has ``timestamp``, ``level``, ``event`` and ``message`` plus the
event's own fields (docs/architecture.md, "Logs"); no line is longer than
:data:`MAX_LINE` characters: an event that would be is written with its longest strings
shortened in their middle, and the fields that were named in ``shortened``. Python
warnings and the ``tensorflow`` / ``absl`` Python loggers are routed into the same stream at
WARNING and above; TensorFlow's C++ log lines stay on stderr (their level is set by
``TF_CPP_MIN_LOG_LEVEL`` in :mod:`app.budget.apply`).

A log stream that can't be written (a pipe whose reader is gone, ``>/dev/full``, a hung-up
terminal) never changes how a command ends: its first failed write stops that stream, its
descriptor is pointed at ``/dev/null`` (so that nothing written later, nor Python's flush at
exit, fails again: the Python documentation's advice for SIGPIPE), and one line on stderr
says so; the log file goes on. A standard descriptor closed when the process started is
opened on ``/dev/null`` (:func:`standard_streams`), so no file the job opens takes its
number.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any, TextIO

from pythonjsonlogger.json import JsonFormatter

from app import jsonvalues

LOGGER_NAME = "coretrain"
#: The level of the loop's ``step`` records (after every call into TensorFlow): below INFO,
#: so only the console view (app/report/view.py) gets them, never the JSON log.
STEP = 15
#: The longest line a JSON record is written as (characters): log collectors cut or refuse
#: longer ones (docs/architecture.md, "Logs").
MAX_LINE = 2000
#: Fields a shortened record keeps whole (:func:`_lean`).
_WHOLE = ("timestamp", "level", "event")
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


class _Formatter(JsonFormatter):
    """python-json-logger's formatter, with no line over :data:`MAX_LINE` characters
    (:func:`_lean`)."""

    def jsonify_log_record(self, log_data: dict[str, Any]) -> str:
        line = super().jsonify_log_record(log_data)
        if len(line) <= MAX_LINE:
            return line
        dumps = super().jsonify_log_record
        return dumps(_lean(json.loads(line), dumps))


def _lean(data: dict[str, Any], dumps: Callable[[Any], str]) -> dict[str, Any]:
    """The record ``data`` (plain JSON values) cut to :data:`MAX_LINE` characters as
    ``dumps`` writes it: the longest string at any depth loses its middle (down to
    :data:`_KEPT_CHARS` characters), then the next; when no long string is left, the
    largest field is replaced by a note of its size (and when none is large, all but the
    message go). ``shortened`` names the fields that lost something; ``timestamp``,
    ``level`` and ``event`` never do."""
    shortened: list[str] = []
    noted: set[str] = set()
    while (excess := len(dumps(data)) - MAX_LINE) > 0:
        found = [
            (len(text), path)
            for path, text in _strings(data)
            if path[0] not in (*_WHOLE, "shortened") and len(text) > _KEPT_CHARS + 40
        ]
        if found:
            size, path = max(found)
            *parents, last = path
            holder: Any = data
            for key in parents:
                holder = holder[key]
            holder[last] = _shorter(holder[last], min(excess + 160, size - _KEPT_CHARS))
            name = str(path[0])
        else:
            sizes = {
                k: len(dumps(v)) for k, v in data.items() if k not in (*_WHOLE, "shortened", *noted)
            }
            name = max(sizes, key=lambda key: sizes[key], default="")
            if sizes.get(name, 0) < 100:  # a record of many small fields: they all go
                kept = {k: data[k] for k in (*_WHOLE, "message") if k in data}
                return {**kept, "shortened": "every field but these"}
            data[name] = f"[{sizes[name]} characters of JSON left out]"
            noted.add(name)
        shortened += [] if name in shortened else [name]
        data["shortened"] = shortened
    return data


#: Characters a shortened string keeps: a quarter from its head, the rest from its tail
#: (where a path has its file and a traceback its error).
_KEPT_CHARS = 100


def _strings(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(path, string) of every string in the JSON value ``value``."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*path, index))


def _shorter(text: str, cut: int) -> str:
    """``text`` without ``cut`` characters of its middle, with a note saying so."""
    keep = len(text) - cut
    head = keep // 4
    return f"{text[:head]} … [{cut} characters left out] … {text[len(text) - keep + head :]}"


def _formatter(ascii_only: bool = False) -> JsonFormatter:
    """JSON lines in UTF-8, or with ``ascii_only`` in ASCII (``\\u2248``: the same JSON)."""
    return _Formatter(
        "{levelname}{event}{message}",
        style="{",
        rename_fields={"levelname": "level"},
        timestamp=True,
        json_ensure_ascii=ascii_only,
        json_serializer=jsonvalues.dumps,  # NaN as null: a line every collector parses
    )


def _writes_all_text(stream: IO[str]) -> bool:
    """Whether ``stream``'s encoding writes every character (a UTF: the usual case). A
    stream that can't (``PYTHONIOENCODING=ascii``, a Latin-1 locale) is set to write what
    it can't encode as ``\\uXXXX`` (``errors="backslashreplace"``) instead of raising on
    every record that holds a "≈" or a non-ASCII path: False."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        if codecs.lookup(encoding).name.startswith("utf"):
            return True
    except LookupError:
        pass
    reconfigure = getattr(stream, "reconfigure", None)
    if callable(reconfigure):
        reconfigure(errors="backslashreplace")
    return False


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
    unicode = _writes_all_text(out)
    stdout: logging.Handler
    if text:
        from app.report.view import ConsoleView

        stdout = ConsoleView(out)
    else:
        stdout = _Stream(out)
        stdout.setFormatter(_formatter(ascii_only=not unicode))
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


class _Stream(logging.StreamHandler[TextIO]):
    """A stream handler whose failed writes are :func:`lost`, not a traceback each."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not lost(self, self.stream):
            super().handleError(record)


class _FileHandler(_Stream):
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


#: Standard descriptors given up after a failed write (:func:`lost`) → a duplicate of what
#: they were (close-on-exec), for a program that takes over (:func:`handed_over`).
_GIVEN_UP: dict[int, int] = {}
_STANDARD = {1: "stdout", 2: "stderr"}


def standard_streams() -> None:
    """Open ``/dev/null`` on each of the descriptors 0, 1 and 2 that is closed, and give
    Python a stream for each that has none (it makes none for a descriptor closed at its
    start): a closed stdout then swallows the log instead of the next file opened taking
    its number. Not inheritable, so a program ``coretrain exec`` runs finds it closed, as
    it was given."""
    for fd, name in ((0, "stdin"), *_STANDARD.items()):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
            if null != fd:
                os.dup2(null, fd, inheritable=False)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, os.fdopen(fd, "r" if fd == 0 else "w", closefd=False))


def lost(handler: logging.Handler, stream: IO[str]) -> bool:
    """Called by ``handler`` while the failure of a write to ``stream`` is handled: False
    unless it is an OSError (logging's traceback then follows). A standard stream is given
    up: the handler stops, its descriptor is pointed at ``/dev/null`` and one line on
    stderr says so (module docstring); the log file is said once and goes on (a disk that
    frees up takes the rest: its buffer keeps what a write could not place)."""
    exc = sys.exc_info()[1]
    if not isinstance(exc, OSError):
        return False
    why = exc.strerror or str(exc)
    fd = _fileno(stream)
    name = None if fd is None else _STANDARD.get(fd)
    if fd is None or name is None:
        if not getattr(handler, "said", False):
            handler.said = True  # type: ignore[attr-defined]
            say(f"coretrain: the log file: {why}: records from here on may be missing there")
        return True
    handler.setLevel(logging.CRITICAL + 1)
    give_up(fd)
    kept = any(isinstance(h, _FileHandler) for h in logging.getLogger(LOGGER_NAME).handlers)
    if name == "stdout":
        say(
            f"coretrain: stdout: {why}: the log stops there"
            + ("; logs/train.jsonl has every record" if kept else "")
        )
    return True


def _fileno(stream: IO[str] | None) -> int | None:
    try:
        return None if stream is None else stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def give_up(fd: int) -> None:
    """Point standard descriptor ``fd`` at ``/dev/null``, the original kept aside."""
    if fd in _GIVEN_UP:
        return
    _GIVEN_UP[fd] = os.dup(fd)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)


@contextlib.contextmanager
def handed_over() -> Iterator[None]:
    """Inside: the standard descriptors given up are what they were given as (a program
    ``coretrain exec`` starts meets its own broken pipe); after: ``/dev/null`` again."""
    for fd, original in _GIVEN_UP.items():
        os.dup2(original, fd)
    try:
        yield
    finally:
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in _GIVEN_UP:
            os.dup2(null, fd)
        os.close(null)


#: Control characters (C0 but the tab, DEL, C1) as their Python escapes: a file name
#: holding ``ESC [2J`` or a newline must neither drive the terminal it is shown on nor make
#: one line two.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c != 0x09}


def printable(text: str) -> str:
    """``text`` with its control characters written as escapes (:data:`_CONTROLS`)."""
    return text.translate(_CONTROLS)


def say(line: str) -> None:
    """``line`` on stderr, :func:`printable` and its middle left out past :data:`MAX_LINE`
    characters, never raising: a stderr that can't be written is given up."""
    line = printable(line)
    if len(line) > MAX_LINE:
        line = _shorter(line, len(line) - MAX_LINE + 64)
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        give_up(2)
    except (AttributeError, ValueError):  # no stderr, or one closed by its owner
        pass
