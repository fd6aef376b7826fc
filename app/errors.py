"""The exception hierarchy: every expected failure carries its process exit code.

Library code raises these and never calls ``sys.exit``; ``app.cli`` catches
:class:`AppError` once, prints ``str(error)`` as one line on stderr and exits
with ``error.exit_code``. The codes are a contract (README "Exit codes"; the
Kubernetes podFailurePolicy keys on them).
"""

from __future__ import annotations


class AppError(Exception):
    """Base class: an expected failure with a one-line message and an exit code."""

    exit_code: int = 1


class ConfigError(AppError):
    """Bad usage or configuration (an option, an environment variable). Exit 2."""

    exit_code = 2


class DataError(AppError):
    """Bad input data; the message names the file, line and field. Exit 3."""

    exit_code = 3


class StorageError(AppError):
    """The output/checkpoint storage failed or holds only unreadable state. Exit 4."""

    exit_code = 4


class Preempted(AppError):
    """Stopped by SIGTERM/SIGINT after saving what could be saved. Exit 143 (128 + 15)."""

    exit_code = 143


class TrainingDiverged(AppError):
    """The loss became NaN or Inf; the last good checkpoint is kept. Exit 5."""

    exit_code = 5


class OutputLocked(AppError):
    """Another run holds the output directory's lock (sysexits EX_TEMPFAIL). Exit 75."""

    exit_code = 75
