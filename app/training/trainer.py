"""The Trainer owns *what* is trained: model, optimizer, standardisation, the step, evaluation.

It knows no intervals (:mod:`app.training.controller` decides when to train, evaluate
and save) and is the same for one process and N workers: the replicas are passed in
(:mod:`app.training.replicas`), a single process being one replica of one.

One training step of worker i of N (N = 1 for one process), batch B per worker:

* the worker's rows are positions ``i::N`` of the single-process batch of N·B samples
  (:func:`app.data.order.batch_rows`), standardised with the training statistics;
* dropout keeps the same rows of the single-process mask of the N·B batch, drawn from
  (seed, step) (:func:`app.model.dropout`);
* the loss is the RMSE over the *global* batch plus the weight decay: the workers
  all-reduce their squared-error sums and counts, and worker i differentiates
  ``sq_i / (2·rmse·count) + decay/N``, whose sum over the workers has exactly the
  gradient of ``rmse + decay`` on the global batch (the optimizer sums the gradients);
* the same all-reduce carries each worker's stop request, so all stop after the same
  step.

So N workers follow the single-process run with batch N·B, up to the order of float
sums (tested). :meth:`Trainer.train` runs up to K such steps inside one ``tf.function``
(a loop over the batch iterator, as orbit's ``steps_per_loop``): the step counter lives
on the device, the host is woken once per call, and the loop ends early at the first
non-finite loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from app import model as model_lib
from app.budget.plan import ThreadPlan
from app.config import TrainConfig
from app.data import pipeline, stream
from app.data import split as split_lib
from app.data.cache import DataCache
from app.data.split import Split
from app.training import recipe
from app.training.replicas import Replicas

#: Lower bound of the RMSE a surrogate gradient divides by (a perfect fit has RMSE 0).
_RMSE_FLOOR = 1e-12


@dataclass(frozen=True)
class Steps:
    """What one :meth:`Trainer.train` call did.

    ``losses``: the loss (RMSE + weight decay, standardised units) of each step run,
    shape (n,); ``train_rmse``: the last step's RMSE; ``stop``: a stop request all
    workers agreed on.
    """

    losses: np.ndarray
    train_rmse: float
    stop: bool

    @property
    def loss(self) -> float:
        """The last step's loss."""
        return float(self.losses[-1])

    @property
    def diverged(self) -> bool:
        """True when the last step's loss is NaN or Inf (the call stopped there)."""
        return not math.isfinite(self.loss)


class Trainer:
    """The model, optimizer and steps of one run on ``replicas`` (see the module docstring).

    ``checkpoint`` is the one ``tf.train.Checkpoint`` of the run (``step``, ``model``,
    ``optimizer``: the layout every version restores). Raises ClusterError (exit 6) when
    workers were given different data or options.
    """

    def __init__(
        self,
        config: TrainConfig,
        plan: ThreadPlan,
        data: DataCache,
        replicas: Replicas,
        rows: Split | None = None,
    ) -> None:
        self.config, self.plan, self.data, self.replicas = config, plan, data, replicas
        self.rows = rows or split_lib.split(data.train_size, 0.0, config.seed)
        # Different data or options would break the variables' broadcast: compare first.
        replicas.check_same(
            "the data set and training options",
            train_size=data.train_size,
            test_size=data.test_size,
            num_outputs=data.num_outputs,
            height=data.height,
            width=data.width,
            batch_size=config.batch_size,
            max_steps=config.max_steps,
            seed=config.seed,
        )
        with replicas.scope():
            self.model = model_lib.build_model(
                data.num_outputs,
                height=data.height,
                width=data.width,
                seed=config.seed,
                formulation=config.formulation,
                precision=config.precision,
            )
            self.schedule = recipe.schedule(config)
            self.optimizer = recipe.optimizer(config, self.schedule)
            # A Keras 3 optimizer must be built before restore() or its state is skipped.
            self.optimizer.build(self.model.trainable_variables)
            self.step = tf.Variable(0, dtype=tf.int64, name="step", trainable=False)
        self.checkpoint = tf.train.Checkpoint(
            step=self.step, model=self.model, optimizer=self.optimizer
        )
        stats = _statistics(data, config.standardize)
        self.f_mean, self.f_inv, self.l_mean, self.l_std = (tf.constant(s) for s in stats)
        #: The same standardisation for the training input (applied as it reads the rows).
        self.stats = stream.Stats.of(data, config.standardize)
        self.seed = tf.constant(config.seed, tf.int64)
        self._loop = tf.function(self._train_loop)
        self._sums = tf.function(self._batch_sums)
        self._eval = {
            "test": pipeline.eval_dataset(data, plan, config.batch_size, self.standardize_x),
            "validation": pipeline.eval_dataset(
                data, plan, config.batch_size, self.standardize_x, "train", self.rows.validation
            ),
        }
        self._eval = {name: replicas.shard(ds) for name, ds in self._eval.items()}
        self._batches: Any = None
        self._resident: pipeline.Resident | None = None

    # -- state ------------------------------------------------------------------------

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
        """The learning rate of ``step`` (staircase decay)."""
        return float(self.schedule(step))

    # -- training -------------------------------------------------------------------

    def standardize_x(self, x: tf.Tensor) -> tf.Tensor:
        """Raw features (…, H, W, 1) → standardised (training-set mean and std)."""
        return (x - self.f_mean) * self.f_inv

    def feed(self, batches: pipeline.TrainInput) -> None:
        """Train on ``batches`` from now on: one element per step, in step order, already
        standardised with :attr:`stats` (the pipeline applies it once to a split held in
        memory, whose rows the step then gathers)."""
        self._batches = iter(batches.dataset)
        self._resident = batches.resident

    def train(self, steps: int, stop: Callable[[], bool]) -> Steps:
        """Run up to ``steps`` steps in one call; fewer only when the loss turns non-finite.

        ``stop`` is this process's stop request; the result's ``stop`` is the one all
        workers agreed on (for one process: ``stop()`` after the call).
        """
        first = self.global_step + 1
        flag = tf.constant(1.0 if stop() else 0.0)
        with self.replicas.guard(f"training steps {first}..{first + steps - 1}"):
            losses, rmse, stops = self._loop(self._batches, tf.constant(steps), flag)
            losses = losses.numpy()
        agreed = float(stops) > 0 if self.replicas.count > 1 else stop()
        return Steps(losses=losses, train_rmse=float(rmse), stop=agreed)

    def _train_loop(self, batches: Any, steps: tf.Tensor, stop: tf.Tensor) -> tuple:
        losses = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        rmse, stops = tf.constant(0.0), tf.constant(0.0)
        for i in tf.range(steps):
            if self._resident is not None:
                rows = next(batches)
                x = tf.gather(self._resident.features, rows)
                y = tf.gather(self._resident.labels, rows)
            else:
                x, y = next(batches)
            loss, rmse, stops = self.replicas.run(self._replica_step, (x, y, stop))
            self.step.assign_add(1)
            losses = losses.write(i, loss)
            if not tf.math.is_finite(loss):
                break
        return losses.stack(), rmse, stops

    def _replica_step(self, xs: tf.Tensor, ys: tf.Tensor, stop: tf.Tensor) -> tuple:
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

    # -- evaluation -----------------------------------------------------------------

    def predict(self, xs: tf.Tensor) -> tf.Tensor:
        """Standardised features (n, H, W, 1) → raw-scale predictions (n, K)."""
        return self.model(xs, training=False) * self.l_std + self.l_mean

    @property
    def eval_split(self) -> str:
        """What the run evaluates while it trains: "validation", or "test" without one."""
        return "validation" if self.rows.validating else "test"

    def evaluate(self, split: str | None = None) -> float:
        """RMSE over all outputs of ``split`` ("validation" or "test"; default
        :attr:`eval_split`), in raw label units (each worker evaluates a shard).

        Batch by batch from Python, one traced call per batch shape: the same loop inside
        one ``tf.function`` ran the forward passes several times slower (a while-loop body
        of unknown batch size; docs/performance.md).
        """
        sq = count = 0.0
        with self.replicas.guard("evaluation"):
            for x, y in self._eval[split or self.eval_split]:
                batch_sq, batch_count = self._sums(x, y)
                sq, count = sq + float(batch_sq), count + float(batch_count)
        total = self.replicas.sum([sq, count], "evaluation")
        return math.sqrt(total[0] / max(total[1], 1.0))

    def _batch_sums(self, x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        err = self.predict(x) - y
        return tf.cast(tf.reduce_sum(tf.square(err)), tf.float64), tf.cast(tf.size(err), tf.float64)


def _statistics(data: DataCache, standardize: bool) -> tuple[np.ndarray, ...]:
    """(feature mean (H,W,1), 1/feature std (H,W,1), label mean (K,), label std (K,))."""
    if standardize:
        f_mean, f_std, l_mean, l_std = (
            data.feature_mean,
            data.feature_std,
            data.label_mean,
            data.label_std,
        )
    else:
        f_mean, f_std = np.zeros_like(data.feature_mean), np.ones_like(data.feature_std)
        l_mean, l_std = np.zeros_like(data.label_mean), np.ones_like(data.label_std)
    return f_mean[..., None], (1.0 / f_std)[..., None], l_mean, l_std
