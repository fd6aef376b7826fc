"""The training step: the one the run trains with, ``auto`` times and the benchmarks measure.

One step of worker i of N (N = 1 for one process), batch B per worker:

* the worker's rows are positions ``i::N`` of the single-process batch of N·B samples
  (:func:`app.data.input.order.batch_rows`), standardised with the training statistics;
* dropout keeps the same rows of the single-process mask of the N·B batch, drawn from
  (seed, step) (:func:`app.model.dropout`);
* the loss is the RMSE over the *global* batch plus the weight decay: the workers
  all-reduce their squared-error sums and counts, and worker i differentiates
  ``sq_i / (2·rmse·count) + decay/N``, whose sum over the workers has exactly the
  gradient of ``rmse + decay`` on the global batch (the optimizer sums the gradients);
* the same all-reduce carries each worker's stop request, so all stop after the same
  step.

So N workers follow the single-process run with batch N·B, up to the order of float
sums (tested). :meth:`TrainStep.loop` runs up to K such steps inside one ``tf.function``
(a loop over the batch iterator, as orbit's ``steps_per_loop``): the step counter lives
on the device, the host is woken once per call, and the loop ends early at the first
non-finite loss. Import it after :func:`app.budget.apply.import_tensorflow`.
"""

from __future__ import annotations

from typing import Any, Protocol

import tensorflow as tf

from app import model as model_lib
from app.config import RecipeConfig
from app.data.input import mapped
from app.training.loop import recipe
from app.training.loop.replicas import Replicas

#: Lower bound of the RMSE a surrogate gradient divides by (a perfect fit has RMSE 0).
_RMSE_FLOOR = 1e-12


class Computed(Protocol):
    """How the step computes, as decided at start (app/training/state/choose.py ``Choice``):
    ``formulation`` "fast" or "plain", ``precision`` "float32" or "bfloat16"."""

    @property
    def formulation(self) -> str: ...

    @property
    def precision(self) -> str: ...


class TrainStep:
    """The model, optimizer, learning-rate schedule and step counter of a run on
    ``replicas``, and the step of the module docstring for (N, H, W, 1) inputs and K
    outputs (``shape`` = (H, W, K)).

    ``checkpoint`` is the one ``tf.train.Checkpoint`` of the run (``step``, ``model``,
    ``optimizer``: the layout every version restores). Raises ConfigError for an input too
    small for the network or K < 1.
    """

    def __init__(
        self, config: RecipeConfig, max_steps: int, computed: Computed,
        shape: tuple[int, int, int], replicas: Replicas,
    ) -> None:  # fmt: skip
        height, width, outputs = shape
        self.config, self.replicas = config, replicas
        with replicas.scope():
            self.model = model_lib.build_model(
                outputs, height=height, width=width, seed=config.seed,
                formulation=computed.formulation, precision=computed.precision,
            )  # fmt: skip
            self.schedule = recipe.schedule(config, max_steps)
            self.optimizer = recipe.optimizer(config, self.schedule)
            # A Keras 3 optimizer must be built before restore() or its state is skipped.
            self.optimizer.build(self.model.trainable_variables)
            self.step = tf.Variable(0, dtype=tf.int64, name="step", trainable=False)
        self.checkpoint = tf.train.Checkpoint(
            step=self.step, model=self.model, optimizer=self.optimizer
        )
        self.seed = tf.constant(config.seed, tf.int64)
        #: ``loop`` traced: ``(batches, steps, stop) -> (losses (n,), rmse, stops)``.
        self.run = tf.function(self.loop)

    @property
    def global_step(self) -> int:
        """The number of steps trained so far (a host read of the device counter)."""
        return int(self.step.numpy())

    def state(self) -> list[tf.Variable]:
        """Every variable a checkpoint holds: step, model, optimizer (incl. iterations)."""
        return [self.step, *self.model.variables, *self.optimizer.variables]

    def finite(self) -> bool:
        """True when every floating-point model and optimizer variable is free of NaN/Inf."""
        return all(
            bool(tf.reduce_all(tf.math.is_finite(v)))
            for v in (tf.convert_to_tensor(x) for x in self.state())
            if v.dtype.is_floating
        )

    def learning_rate(self, step: int) -> float:
        """The learning rate of ``step`` (the schedule's)."""
        return float(self.schedule(step))

    def loop(self, batches: Any, steps: tf.Tensor, stop: tf.Tensor, held: Any = None) -> tuple:
        """Up to ``steps`` steps on the next elements of the iterator ``batches``: each an
        (x (B,H,W,1), y (B,K)) batch, or with ``held`` (app/data/input/pipeline.py
        ``TrainInput.held``) what the step gathers its batch from: a streamed chunk and the
        step's rows in it, or the row ids (B,) of a split held in memory
        (app/data/input/mapped.py ``batch``). ``stop``: this worker's stop request (0/1).
        Returns the losses (n,), the last RMSE and the agreed stop count."""
        losses = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        rmse, stops = tf.constant(0.0), tf.constant(0.0)
        for i in tf.range(steps):
            if held is not None:
                x, y = mapped.batch(next(batches), held)
            else:
                x, y = next(batches)
            loss, rmse, stops = self.replicas.run(self.update, (x, y, stop))
            self.step.assign_add(1)
            losses = losses.write(i, loss)
            if not tf.math.is_finite(loss):
                break
        return losses.stack(), rmse, stops

    def update(self, xs: tf.Tensor, ys: tf.Tensor, stop: tf.Tensor) -> tuple:
        """One step on this replica's batch ``xs`` (B,H,W,1), ``ys`` (B,K) (module
        docstring), inside :meth:`Replicas.run`: (loss, global RMSE, agreed stop count)."""
        with tf.GradientTape() as tape:
            h = self._dropout(self.model.features(xs))
            pred = self.model.head(h)
            sq = tf.reduce_sum(tf.square(pred - tf.cast(ys, pred.dtype)))
            local = tf.stack([sq, tf.cast(tf.size(pred), sq.dtype), stop])
            total = tf.stop_gradient(self.replicas.all_reduce(tf.stop_gradient(local)))
            rmse = tf.sqrt(total[0] / total[1])
            decay = model_lib.weight_decay(self.model)
            surrogate = sq / (2.0 * tf.maximum(rmse, _RMSE_FLOOR) * total[1])
            surrogate += decay / self.replicas.count
        variables = self.model.trainable_variables
        grads = tape.gradient(surrogate, variables)
        self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return rmse + decay, rmse, total[2]

    def _dropout(self, h: tf.Tensor) -> tf.Tensor:
        """Dropout with this worker's rows of the global batch's mask for (seed, step)."""
        keep = self.config.keep_prob
        if keep >= 1:
            return h
        workers, rows = self.replicas.count, h.shape[0] * self.replicas.count
        ones = tf.ones((rows, h.shape[1]), h.dtype)
        mask = model_lib.dropout(ones, tf.stack([self.seed, self.step.read_value()]), keep)
        if workers > 1:
            mask = tf.gather(mask, tf.range(self.replicas.index, rows, workers))
        return h * mask


def repeated(x: tf.Tensor, y: tf.Tensor) -> Any:
    """An endless iterator of the one batch (x, y): the step timed on a real batch without
    the input pipeline (app/training/state/choose.py, app/bench/step_scaling.py)."""
    return iter(tf.data.Dataset.from_tensors((x, y)).repeat())
