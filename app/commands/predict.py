"""``coretrain predict``: a trained or published model over a features file, on the CPUs
planned for this process.

Its log (the ``predicted`` event, warnings) goes to stdout as JSON lines, or as lines for
people on a terminal (``--log-format``); to stderr when ``--out`` is stdout itself
(``--out /dev/stdout``: the predictions are the stream, and no log line is mixed into it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TextIO

from app import logs
from app.atomic import restrict_umask
from app.budget import apply, detect_plan
from app.budget.plan import PlanOptions
from app.config import PredictConfig
from app.report import LogOptions


def run(config: PredictConfig, options: PlanOptions, log: LogOptions) -> None:
    """Plan and apply the threads, start TensorFlow, predict (app/serving/predict.py).
    Raises ConfigError (no model), DataError (bad features), StorageError (output)."""
    stream = _log_stream(config.out)
    logs.setup(stream=stream, text=log.text(stream))
    restrict_umask()
    apply.apply(detect_plan("/", options))
    apply.import_tensorflow()
    from app.serving.predict import predict

    predict(config)


def _log_stream(out: Path) -> TextIO:
    """stdout, or stderr when ``out`` is the file stdout is (the same device and inode)."""
    try:
        same = os.path.samestat(os.stat(out), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError):
        same = False
    return sys.stderr if same else sys.stdout
