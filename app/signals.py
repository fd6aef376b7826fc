"""SIGTERM/SIGINT as a polite stop request: finish the step, checkpoint, exit 143.

Python as PID 1 ignores SIGTERM without a handler, so the job
always installs one. The handler only sets a flag; the training loop and the
cache converter poll it between steps/chunks.
"""

from __future__ import annotations

import signal
from types import FrameType

from app import logs


class StopRequest:
    """Callable flag: ``stop()`` is True once SIGTERM or SIGINT arrived."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> StopRequest:
        """Install the handler for SIGTERM and SIGINT (main thread only); returns self."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            name = signal.Signals(signum).name
            logs.event("signal", f"{name} received: stopping after the current step", signal=name)

    def __call__(self) -> bool:
        return self.signum is not None
