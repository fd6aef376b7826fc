"""``coretrain predict``: a trained or published model over a features file, on the CPUs
planned for this process."""

from __future__ import annotations

from app import logs
from app.atomic import restrict_umask
from app.budget import apply, detect_plan
from app.budget.plan import PlanOptions
from app.config import PredictConfig


def run(config: PredictConfig, options: PlanOptions) -> None:
    """Plan and apply the threads, start TensorFlow, predict (app/serving/predict.py).
    Raises ConfigError (no model), DataError (bad features), StorageError (output)."""
    logs.setup()
    restrict_umask()
    apply.apply(detect_plan("/", options))
    apply.import_tensorflow()
    from app.serving.predict import predict

    predict(config)
