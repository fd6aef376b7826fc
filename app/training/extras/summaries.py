"""TensorBoard curves under ``OUTPUT/tensorboard/``, written with TensorFlow alone.

TensorFlow 2.21 no longer depends on the ``tensorboard`` package, and without it
``tf.summary.scalar`` raises; but ``tf.summary.create_file_writer`` and
``tf.summary.write(tag, tensor, step, metadata=...)`` work, and a ``SummaryMetadata`` whose
plugin is "scalars" (or "text") is exactly what tensorboard's own ``scalar`` (``text``)
writes, so ``tensorboard --logdir OUTPUT`` shows the curves of every run under it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from app import __version__
from app.atomic import Dir
from app.training.loop.hooks import Hook

if TYPE_CHECKING:
    from app.training.extras import Context

#: progress fields written as scalars (TensorBoard tag = field name; lr as learning_rate).
SCALARS = {
    "loss": "loss",
    "train_rmse": "train_rmse",
    "val_rmse": "val_rmse",
    "test_rmse": "test_rmse",
    "baseline_rmse": "baseline_rmse",
    "linear_rmse": "linear_rmse",
    "lr": "learning_rate",
    "examples_per_sec": "examples_per_sec",
    "cpu_util": "cpu_util",
    "cpu_throttled_ratio": "cpu_throttled_ratio",
    "cpu_throttled_s": "cpu_throttled_s",
}


def _metadata(plugin: str) -> summary_pb2.SummaryMetadata:
    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin)
    )


class Summaries(Hook):
    """A hook writing :data:`SCALARS` of every ``progress`` record at its step.

    ``directory``: held open for the writer's life; TensorFlow writes through its
    descriptor (app/atomic.py), so a renamed or replaced path can't redirect the events.
    ``config`` (any JSON-able dict) is written once as text at ``step``.
    """

    def __init__(self, directory: Dir, config: dict[str, Any], step: int) -> None:
        self.directory = directory
        self.writer = tf.summary.create_file_writer(directory.via)
        with self.writer.as_default():
            text = "```\n" + json.dumps(config, indent=2, sort_keys=True) + "\n```"
            tf.summary.write("config", tf.constant(text), step=step, metadata=_metadata("text"))
        self.writer.flush()

    def after_evaluation(self, record: dict[str, Any]) -> None:
        with self.writer.as_default():
            for field, tag in SCALARS.items():
                value = record.get(field)
                if value is not None:
                    tf.summary.write(
                        tag,
                        tf.constant(float(value), tf.float32),
                        step=int(record["step"]),
                        metadata=_metadata("scalars"),
                    )
        self.writer.flush()


def hooks(context: Context) -> list[Hook]:
    """The TensorBoard hook, on the chief only (one set of curves per run), in
    ``OUTPUT/tensorboard/`` with the run's options and plan as text."""
    if not context.ws.is_chief:
        return []
    text = {
        "config": context.options,
        "plan": context.plan.to_json(),
        "version": __version__,
    }
    directory = context.ws.open(context.ws.output / "tensorboard", "TensorBoard directory")
    return [Summaries(directory, text, context.start)]
