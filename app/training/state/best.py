"""The best validated step: its weights kept beside the checkpoints, exported at the end.

With a validation split (app/data/input/split.py) every evaluation offers its step; one whose
validation RMSE is below the best so far is written as ``checkpoints/best-<step>``
(``tf.train.Checkpoint.write`` of the model's variables, the step and the RMSE: a file
that says what it is), and the older ``best-*`` files are removed after it. At the end the
newest readable one is restored into the model, which is then exported: the exported
weights are those of the best validated step, not merely the last
(``metrics.json``: ``exported_step``, ``val_rmse``).

A resume reads the newest readable ``best-<step>`` at or before the step it resumes from
and removes those after it (a fallback to an older checkpoint trains those steps again).
As with the checkpoints, every worker writes (into its own directory; TensorFlow's
multi-worker saving wants all to), only the chief's files are read, and at the end the
chief's restored weights are sent to the others.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import tensorflow as tf

from app import logs
from app.atomic import Dir
from app.errors import StorageError, short_message
from app.training.loop.replicas import Replicas

PREFIX = "best"
_NUMBERED = re.compile(rf"^{PREFIX}-(\d+)\.index$")
_RMSE = "rmse/.ATTRIBUTES/VARIABLE_VALUE"


class Best:
    """The best validated step of a run, kept in ``directory`` (the checkpoint directory,
    held open by the run). ``step`` is None until a step was kept; ``rmse`` in raw label
    units."""

    def __init__(self, model: Any, directory: Dir, replicas: Replicas) -> None:
        self.model, self.held, self.replicas = model, directory, replicas
        self._step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._rmse = tf.Variable(math.inf, dtype=tf.float64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, step=self._step, rmse=self._rmse)
        # restore() makes this counter if it is missing and then finds it unmatched: made
        # here, write() saves it too.
        _ = self.checkpoint.save_counter
        self.step: int | None = None
        self.rmse = math.inf

    def steps(self) -> list[int]:
        """The steps of the ``best-<step>`` files in the directory, newest first."""
        found = (_NUMBERED.match(name) for name in self.held.names())
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def resume(self, start: int) -> None:
        """Take up the best step at or before ``start`` (the step resumed from; chief only:
        the others' files are scratch), remove those after it."""
        if self.replicas.is_chief:
            for step in self.steps():
                if step > start:
                    self._remove(step)
                elif self.step is None:
                    rmse = self._read_rmse(step)
                    if rmse is not None:
                        self.step, self.rmse = step, rmse
        # Every worker takes the chief's, so all decide alike at each offer (and write).
        mine = [float(self.step or 0), self.rmse if self.step else 0.0]
        agreed = self.replicas.sum(mine if self.replicas.is_chief else [0.0, 0.0], "best step")
        if agreed[0] > 0:
            self.step, self.rmse = int(agreed[0]), float(agreed[1])

    def offer(self, step: int, rmse: float) -> bool:
        """Keep ``step`` when its validation RMSE is below the best so far; True if kept.
        Raises StorageError when it can't be written (the previous best stays)."""
        if not rmse < self.rmse:
            return False
        self.held.check(f"{PREFIX}-{step}_temp", "best checkpoint's temporary directory")
        self._step.assign(step)
        self._rmse.assign(rmse)
        try:
            with self.replicas.guard(f"best checkpoint {step}"):
                self.checkpoint.write(f"{self.held.via}/{PREFIX}-{step}")
        except (OSError, tf.errors.OpError) as exc:
            raise StorageError(
                f"{self.held.path}: cannot save the best checkpoint {step}: "
                f"{self.held.named(short_message(exc))}"
            ) from exc
        for older in self.steps():
            if older != step:
                self._remove(older)
        self.step, self.rmse = step, rmse
        return True

    def restore(self) -> int | None:
        """Put the best step's weights into the model (on every worker); return the step,
        or None when none was kept (the model stays as it is). Raises StorageError when the
        chief's file can't be read."""
        step = self.step if self.replicas.is_chief else None
        if step is not None:
            prefix = f"{self.held.via}/{PREFIX}-{step}"
            try:
                self.checkpoint.restore(prefix).assert_existing_objects_matched()
            except Exception as exc:  # as checkpointer.restore: OpError, ValueError, ...
                raise StorageError(
                    f"{self.held.path}/{PREFIX}-{step}: cannot read the best checkpoint: "
                    f"{type(exc).__name__}: {self.held.named(short_message(exc))}"
                ) from exc
        kept = self.replicas.sum([float(step or 0)], "best step")[0]
        if kept > 0 and self.replicas.count > 1:
            self.replicas.broadcast(self.model.variables, "best weights")
        return int(kept) if kept > 0 else None

    def _read_rmse(self, step: int) -> float | None:
        try:
            reader = tf.train.load_checkpoint(f"{self.held.via}/{PREFIX}-{step}")
            return float(reader.get_tensor(_RMSE))
        except Exception as exc:  # a truncated or partial file: an older one may do
            logs.event(
                "checkpoint_unreadable",
                f"skipping unreadable best checkpoint {PREFIX}-{step}: {short_message(exc)}",
                level=logging.WARNING,
                path=f"{self.held.path}/{PREFIX}-{step}",
            )
            return None

    def _remove(self, step: int) -> None:
        for name in self.held.names():
            if name.startswith(f"{PREFIX}-{step}."):
                self.held.remove(name)
