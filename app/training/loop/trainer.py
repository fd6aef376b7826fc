"""The Trainer owns *what* is trained: the step on the run's data, and its evaluation.

It knows no intervals (:mod:`app.training.loop.controller` decides when to train, evaluate
and save) and is the same for one process and N workers: the replicas are passed in
(:mod:`app.training.loop.replicas`), a single process being one replica of one. The step
itself, with the model, optimizer and the multi-worker loss, is
:class:`app.training.loop.step.TrainStep`; the Trainer feeds it the run's batches (standardised
with the training statistics) and evaluates the model on the validation or test rows, in
the formulation chosen for evaluation (app/training/state/choose.py); validation rows are
gathered from the training split when it is held in memory, else read from the cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import tensorflow as tf

from app.config import RecipeConfig
from app.data.cache import DataCache
from app.data.input import pipeline, stream
from app.data.input import split as split_lib
from app.data.input.split import Split
from app.training.loop.replicas import Replicas
from app.training.loop.step import Computed, TrainStep


class Decided(Computed, Protocol):
    """How the run computes (app/training/state/choose.py ``Choice``): the step's
    formulation and precision, and ``evaluation``, the formulation evaluation computes in."""

    @property
    def evaluation(self) -> str: ...


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
    """The training step of one run on ``replicas`` (:attr:`train_step`, whose state the
    checkpoints hold: ``recipe`` to ``max_steps``, computed as ``computed``) fed with the
    run's batches, and its evaluation on ``data``'s validation rows (``rows``; a fixed sample
    of ``eval_rows`` of them when there are more, 0: all) or test set (standardised with the
    training statistics when ``recipe.standardize``; computed in ``computed.evaluation``), read
    with ``threads`` tf.data threads. Raises
    ClusterError (exit 6) when workers were given different data or options.
    """

    def __init__(
        self,
        recipe: RecipeConfig,
        max_steps: int,
        computed: Decided,
        data: DataCache,
        replicas: Replicas,
        rows: Split | None = None,
        threads: int = 1,
        eval_rows: int = 0,
    ) -> None:
        self.data, self.replicas = data, replicas
        self.rows = rows or split_lib.split(data.train_size, 0.0, recipe.seed)
        #: The validation rows evaluated (``eval_rows`` of them at most; 0: all).
        self.evaluated = split_lib.evaluated(self.rows.validation, eval_rows, recipe.seed)
        # Different data or options would break the variables' broadcast: compare first.
        replicas.check_same(
            "the data set and training options",
            train_size=data.train_size,
            test_size=data.test_size,
            num_outputs=data.num_outputs,
            height=data.height,
            width=data.width,
            batch_size=recipe.batch_size,
            max_steps=max_steps,
            seed=recipe.seed,
        )
        shape = (data.height, data.width, data.num_outputs)
        self.train_step = TrainStep(recipe, max_steps, computed, shape, replicas)
        self.model = self.train_step.model
        self.batch_size, self.standardize = recipe.batch_size, recipe.standardize
        stats = _statistics(data, recipe.standardize)
        self.f_mean, self.f_inv, self.l_mean, self.l_std = (tf.constant(s) for s in stats)
        #: The same standardisation for the training input (applied as it reads the rows).
        self.stats = stream.Stats.of(data, recipe.standardize)
        self.evaluation, self.threads = computed.evaluation, threads
        sums = tf.function(lambda batch: self._batch_sums(*batch))
        read = {
            "test": pipeline.eval_dataset(data, threads, recipe.batch_size, self.standardize_x),
            "validation": pipeline.eval_dataset(
                data, threads, recipe.batch_size, self.standardize_x, "train", self.evaluated
            ),
        }
        #: Each split's batches (this worker's shard) and the function summing a batch's
        #: squared errors and their count.
        self._evals = {name: (replicas.shard(ds), sums) for name, ds in read.items()}
        self._batches: Any = None
        self._held: tuple[tf.Tensor, ...] | None = None

    def learning_rate(self, step: int) -> float:
        """The learning rate of ``step`` (the schedule's)."""
        return self.train_step.learning_rate(step)

    # -- training -------------------------------------------------------------------

    def standardize_x(self, x: tf.Tensor) -> tf.Tensor:
        """Raw features (…, H, W, 1) → standardised (training-set mean and std)."""
        return (x - self.f_mean) * self.f_inv

    def feed(self, batches: pipeline.TrainInput, hold_validation: bool = False) -> None:
        """Train on ``batches`` from now on: one element per step, in step order; the step
        gathers and standardises its batch with :attr:`stats` (app/data/input/mapped.py
        ``batch``). The validation rows are gathered from a split held as float32 rows;
        else (streamed, or held as the rows rounded to bfloat16) read once and held when
        ``hold_validation`` (app/data/input/pipeline.py ``holds_validation``), else read at
        each evaluation."""
        self._batches = iter(batches.dataset)
        self._held = batches.held
        if not self.rows.validating:
            return
        resident = batches.resident
        if resident is not None and not resident.rounded:
            self._evaluate_held(resident.features, resident.labels, self.evaluated)
        elif hold_validation:
            x, y = pipeline.read_train_rows(self.data, self.evaluated)
            ids = np.arange(len(self.evaluated), dtype=np.int64)
            self._evaluate_held(tf.constant(x), tf.constant(y), ids)

    def _evaluate_held(self, features: tf.Tensor, labels: tf.Tensor, rows: np.ndarray) -> None:
        """Evaluate the validation rows by gathering them from rows held in memory,
        ``features`` (N, H, W, 1), ``labels`` (N, K) (raw), where ``rows`` (sorted int64)
        are the validation rows' indices in them, instead of reading them: the same batches
        and operations, so the same RMSE to the bit, without a ``preadv`` per row run or a
        Python function per batch."""

        def gathered(ids: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            x = self.standardize_x(tf.gather(features, ids))
            return self._batch_sums(x, tf.gather(labels, ids))

        ids = pipeline.eval_ids(rows, self.train_step.config.batch_size, self.threads)
        self._evals["validation"] = (self.replicas.shard(ids), tf.function(gathered))

    def train(self, steps: int, stop: Callable[[], bool]) -> Steps:
        """Run up to ``steps`` steps in one call; fewer only when the loss turns non-finite.

        ``stop`` is this process's stop request; the result's ``stop`` is the one all
        workers agreed on (for one process: ``stop()`` after the call).
        """
        first = self.train_step.global_step + 1
        flag = tf.constant(1.0 if stop() else 0.0)
        with self.replicas.guard(f"training steps {first}..{first + steps - 1}"):
            losses, rmse, stops = self.train_step.run(
                self._batches, tf.constant(steps), flag, self._held
            )
            losses = losses.numpy()
        agreed = float(stops) > 0 if self.replicas.count > 1 else stop()
        return Steps(losses=losses, train_rmse=float(rmse), stop=agreed)

    # -- evaluation -----------------------------------------------------------------

    def predict(self, xs: tf.Tensor) -> tf.Tensor:
        """Standardised features (n, H, W, 1) → raw-scale predictions (n, K), computed in
        the evaluation's formulation."""
        return self.model.infer(xs, self.evaluation) * self.l_std + self.l_mean

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
        batches, sums = self._evals[split or self.eval_split]
        with self.replicas.guard("evaluation"):
            for batch in batches:
                batch_sq, batch_count = sums(batch)
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
