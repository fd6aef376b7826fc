"""The exception hierarchy: every expected failure carries its process exit code.

Library code raises these and never calls ``sys.exit``; ``app.cli`` catches
:class:`AppError` once, prints ``str(error)`` as one line on stderr and exits
with ``error.exit_code``. The codes are a contract (README "Exit codes"; the
Kubernetes podFailurePolicy keys on them).
"""

from __future__ import annotations

import re


class AppError(Exception):
    """Base class: an expected failure with a one-line message and an exit code."""

    exit_code: int = 1


class ConfigError(AppError):
    """Bad usage or configuration (an option, an environment variable). Exit 2."""

    exit_code = 2


class DataError(AppError):
    """Bad input data; the message names the file, line and field. Exit 3."""

    exit_code = 3


class InputTooLarge(DataError):
    """The input would take more than its bound: a data cache past the free space of its
    file system or ``--max-cache-bytes`` (app/data/cache/bounds.py). Exit 3, as bad input."""


class MemoryBudgetExceeded(AppError):
    """The run's estimated peak memory is more than the memory limit (the cgroup's), so it
    would be OOM-killed (exit 137, no message); refused before training instead
    (app/training/admit/memory.py). Exit 8: final, a retry with the same limit ends the
    same."""

    exit_code = 8


class StorageError(AppError):
    """The output/checkpoint storage failed or holds only unreadable state. Exit 4."""

    exit_code = 4


class Preempted(AppError):
    """Stopped by SIGTERM/SIGINT after saving what could be saved. Exit 143 (128 + 15)."""

    exit_code = 143


class TrainingDiverged(AppError):
    """The loss became NaN or Inf; the last good checkpoint is kept. Exit 5."""

    exit_code = 5


class ClusterError(AppError):
    """Another worker was lost, never arrived, or disagrees with this one. Exit 6.

    Every worker exits; rerunning all of them resumes from the last checkpoint.
    """

    exit_code = 6


class NotPublished(AppError):
    """The publish gate keeps the model out of ``--publish-dir`` before training: its
    serving signature differs from the served version's. Exit 7, as a model the gate
    refused after training (app/commands/train.py)."""

    exit_code = 7


class OutputLocked(AppError):
    """Another run holds the output directory's lock (sysexits EX_TEMPFAIL). Exit 75."""

    exit_code = 75


class CommandNotFound(AppError):
    """``coretrain exec``: the program is not on PATH or not there. Exit 127, the shell's
    code (POSIX.1-2024, Shell Command Language, 2.9.1.6 "Command Search and Execution")."""

    exit_code = 127


class CommandNotExecutable(AppError):
    """``coretrain exec``: the program was found but can't be executed (not executable, a
    directory, an unknown format). Exit 126, the shell's code (as :class:`CommandNotFound`)."""

    exit_code = 126


def exit_code_of(exc: BaseException) -> int:
    """The exit code a failure ends the process with: an AppError's own, else 1."""
    return exc.exit_code if isinstance(exc, AppError) else 1


def short_message(exc: BaseException, limit: int = 300) -> str:
    """One informative line of an error, TensorFlow's included (no TensorFlow import).

    A TensorFlow ``OpError`` carries its text in ``message``; lines of graph context
    ("Graph execution error", "Detected at node", tracebacks, ``[[...]]``) and
    ``{{function_node ...}}`` / ``[Op:...]`` tags are dropped.
    """
    text = getattr(exc, "message", None) or str(exc)
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:\w+\]", "", text)
    skip = ("Graph execution error", "Detected at node", "File ", "Additional GRPC", ":", "[[")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(skip)]
    return " ".join(useful[:3])[:limit] if useful else type(exc).__name__
