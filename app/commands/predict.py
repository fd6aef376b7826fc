"""``coretrain predict``: a trained or published model over a features file, on the CPUs
planned for this process.

Its log (the ``predicted`` event, warnings) goes to stdout as JSON lines, or as lines for
people on a terminal (``--log-format``); to stderr when ``--out`` is stdout itself
(``--out /dev/stdout``: the predictions are the stream, and no log line is mixed into it).
"""

from __future__ import annotations

import sys

from app import logs
from app.atomic import restrict_umask
from app.budget import apply, detect_plan
from app.budget.plan import PlanOptions
from app.config import PredictConfig
from app.output import is_stdout
from app.report import LogOptions
from app.signals import StopRequest


def run(config: PredictConfig, options: PlanOptions, log: LogOptions) -> None:
    """Plan and apply the threads, start TensorFlow, predict (app/serving/predict.py); the
    log goes to stderr when the predictions go to stdout (``--out /dev/stdout``).
    Raises ConfigError (no model), DataError (bad features), StorageError (output),
    Preempted (SIGTERM/SIGINT)."""
    stream = sys.stderr if is_stdout(config.out) else sys.stdout
    logs.setup(stream=stream, text=log.text(stream))
    restrict_umask()
    stop = StopRequest().install()
    apply.apply(detect_plan("/", options))
    apply.import_tensorflow()
    from app.serving.predict import predict

    predict(config, stop)
