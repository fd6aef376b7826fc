"""The commands of ``coretrain``, apart from the command line and from the library they call.

Each module is one command: it takes the command's configuration (dataclasses whose
fields are also its options: app/options.py), calls the library and returns what the
command line prints or exits with. None imports click (app/cli/ is the command line)
or TensorFlow at import time, so ``coretrain --help`` and ``coretrain plan`` answer
without starting TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exit:
    """How a command ends: the process's exit ``code`` and, for a non-zero code, the one
    line printed on stderr as ``coretrain: <message>``."""

    code: int = 0
    message: str | None = None
