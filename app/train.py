"""The training entry point: ``train(config, plan) -> summary``.

The CLI, tests and benchmarks all call this. It must be imported only after
:func:`app.budget.apply.apply` (it imports TensorFlow). Everything it writes lives
under ``config.output_dir``: ``checkpoints/``, ``model/``, ``logs/train.jsonl``,
``metrics.json`` and (unless ``--cache-dir``) ``cache/``.

The loop runs *to an absolute step*: it restores the newest valid checkpoint
first, so a restarted job continues and ends at the same total (as orbit's
Controller does).
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from app import __version__, checkpoints, distributed, export, logs
from app import model as model_lib
from app.atomic import write_json
from app.budget.plan import ThreadPlan
from app.config import TrainConfig
from app.data import cache as cache_lib
from app.data import pipeline
from app.errors import DataError, Preempted, StorageError, TrainingDiverged
from app.signals import StopRequest

WARNING = 30
# Warn when the test RMSE is not below the mean predictor from this evaluation on.
NOT_LEARNING_AFTER_EVALS = 2


class _Trainer:
    """Holds the TF objects of one run; ``run()`` does the loop."""

    def __init__(self, config: TrainConfig, plan: ThreadPlan, data: cache_lib.DataCache) -> None:
        self.config = config
        self.plan = plan
        self.data = data
        self.model = model_lib.build_model(
            data.num_outputs,
            height=data.height,
            width=data.width,
            seed=config.seed,
            formulation=config.formulation,
        )
        schedule = keras.optimizers.schedules.ExponentialDecay(
            config.learning_rate, config.lr_decay_steps, config.lr_decay, staircase=True
        )
        self.schedule = schedule
        self.optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=config.momentum)
        # A Keras 3 optimizer must be built before restore() or its state is skipped.
        self.optimizer.build(self.model.trainable_variables)
        self.step = tf.Variable(0, dtype=tf.int64, name="step", trainable=False)
        self.ckpt = tf.train.Checkpoint(step=self.step, model=self.model, optimizer=self.optimizer)
        self.ckpt_dir = config.output_dir / "checkpoints"
        self.manager = tf.train.CheckpointManager(
            self.ckpt,
            str(self.ckpt_dir),
            max_to_keep=config.keep_checkpoints,
            checkpoint_name=checkpoints.PREFIX,
        )
        if config.standardize:
            f_mean, f_std = data.feature_mean, data.feature_std
            l_mean, l_std = data.label_mean, data.label_std
        else:
            f_mean, f_std = np.zeros_like(data.feature_mean), np.ones_like(data.feature_std)
            l_mean, l_std = np.zeros_like(data.label_mean), np.ones_like(data.label_std)
        self.f_mean = tf.constant(f_mean[..., None])
        self.f_inv = tf.constant(1.0 / f_std[..., None])
        self.l_mean = tf.constant(l_mean)
        self.l_std = tf.constant(l_std)
        self.seed = tf.constant(config.seed, tf.int64)
        self.train_step = tf.function(self._train_step, reduce_retracing=True)
        self.predict = tf.function(self._predict, reduce_retracing=True)

    def _train_step(self, x: tf.Tensor, y: tf.Tensor, step: tf.Tensor) -> tuple:
        xs = (x - self.f_mean) * self.f_inv
        ys = (y - self.l_mean) / self.l_std
        with tf.GradientTape() as tape:
            pred = model_lib.forward(
                self.model,
                xs,
                dropout_seed=tf.stack([self.seed, step]),
                keep_prob=self.config.keep_prob,
            )
            loss, rmse = model_lib.regularized_loss(self.model, pred, ys)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        return loss, rmse

    def _predict(self, x: tf.Tensor) -> tf.Tensor:
        pred = self.model((x - self.f_mean) * self.f_inv, training=False)
        return pred * self.l_std + self.l_mean

    def evaluate(self) -> float:
        """Test RMSE over all outputs, in raw label units."""
        sq, count = 0.0, 0
        for x, y in pipeline.eval_dataset(self.data, self.plan, self.config.batch_size):
            err = self.predict(x) - y
            sq += float(tf.reduce_sum(tf.square(err)))
            count += int(tf.size(err))
        return math.sqrt(sq / max(count, 1))

    def finite(self) -> bool:
        """True when every floating-point model and optimizer variable is free of NaN/Inf."""
        for variable in [*self.model.variables, *self.optimizer.variables]:
            value = tf.convert_to_tensor(variable)
            if value.dtype.is_floating and not bool(tf.reduce_all(tf.math.is_finite(value))):
                return False
        return True

    def kept(self) -> str:
        """Where the last good checkpoint is, for a divergence message."""
        if self.manager.latest_checkpoint is None:
            return "no checkpoint had been saved yet"
        return f"the last good checkpoint is kept in {self.ckpt_dir}"

    def save(self, step: int) -> str:
        """Save checkpoint ``step``; never one holding NaN/Inf (TrainingDiverged instead)."""
        t0 = time.perf_counter()
        if not self.finite():
            raise TrainingDiverged(
                f"weights became NaN/Inf at step {step} (not saved); {self.kept()}; "
                "lower --learning-rate"
            )
        try:
            path = self.manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as exc:
            raise StorageError(
                f"{self.ckpt_dir}: cannot save checkpoint {step}: {checkpoints.describe(exc)}"
            ) from exc
        logs.event(
            "checkpoint",
            f"saved checkpoint at step {step}",
            step=step,
            path=path,
            seconds=round(time.perf_counter() - t0, 3),
        )
        return path

    def restore(self) -> int:
        prefix = checkpoints.restore(self.ckpt, self.manager, self.ckpt_dir)
        start = int(self.step.numpy())
        if prefix is None:
            return 0
        iterations = int(self.optimizer.iterations.numpy())
        if iterations != start:
            raise StorageError(
                f"{prefix}: optimizer state not restored (iterations {iterations}, step {start})"
            )
        logs.event("resume", f"resuming from step {start} ({prefix})", step=start, path=prefix)
        return start


class _DistributedTrainer(_Trainer):
    """One worker of a MultiWorkerMirroredStrategy run (see :mod:`app.distributed`).

    The variables live under the strategy's scope, so each step all-reduces
    the gradients (the optimizer sums them over the workers). The loss is the
    RMSE over the *global* batch: each step also all-reduces the workers'
    squared-error sums and counts, and worker w differentiates
    sq_w / (2·rmse·count) + decay/N, whose sum over the workers has exactly
    the gradient of rmse + decay on the global batch. Dropout uses the rows
    of the single-process mask for the global batch, so N workers follow the
    single-process run with batch N·B (up to float summation order; tested).
    The same all-reduce carries the workers' stop requests
    (:class:`app.distributed.AgreedStop`).
    The test set is evaluated in shards, one per worker, and all-reduced.
    Every worker restores the chief's ``checkpoints/`` (the chief first); a
    non-chief worker saves its copies to ``workers/worker-<i>/checkpoints``.
    """

    def __init__(
        self,
        config: TrainConfig,
        plan: ThreadPlan,
        data: cache_lib.DataCache,
        cluster: distributed.Cluster,
        stop: Callable[[], bool],
    ) -> None:
        self.cluster = cluster
        self.strategy = distributed.create_strategy(cluster)
        self.peers = distributed.Peers(self.strategy, cluster)
        self.stop = distributed.AgreedStop(stop)
        # Different data or options would break the variables' broadcast: compare first.
        self.peers.check_same(
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
        with self.strategy.scope():
            super().__init__(config, plan, data)
        self.train_step = self._run_step
        self._step_fn = tf.function(self._replica_steps, reduce_retracing=True)

    def _replica_step(self, x: tf.Tensor, y: tf.Tensor, step: tf.Tensor, flag: tf.Tensor) -> tuple:
        ctx = tf.distribute.get_replica_context()
        workers, index = self.cluster.count, self.cluster.index
        xs = (x - self.f_mean) * self.f_inv
        ys = (y - self.l_mean) / self.l_std
        with tf.GradientTape() as tape:
            h = self.model.features(xs)
            if self.config.keep_prob < 1:
                # The single-process dropout mask of the global batch (seed, step), rows
                # index::workers: this worker's rows (app.distributed.shard_indices).
                size = h.shape[0] * workers
                mask = model_lib.dropout(
                    tf.ones((size, h.shape[1]), h.dtype),
                    tf.stack([self.seed, step]),
                    self.config.keep_prob,
                )
                h = h * tf.gather(mask, tf.range(index, size, workers))
            pred = self.model.head(h)
            sq = tf.reduce_sum(tf.square(pred - tf.cast(ys, pred.dtype)))
            local = tf.stack([sq, tf.cast(tf.size(pred), sq.dtype), tf.cast(flag, sq.dtype)])
            total = tf.stop_gradient(
                ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(local))
            )
            rmse = tf.sqrt(total[0] / total[1])
            decay = model_lib.weight_decay(self.model)
            surrogate = sq / (2.0 * tf.maximum(rmse, 1e-12) * total[1]) + decay / workers
        grads = tape.gradient(surrogate, self.model.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        return rmse + decay, rmse, total[2]

    def _replica_steps(self, x: tf.Tensor, y: tf.Tensor, step: tf.Tensor, flag: tf.Tensor) -> tuple:
        out = self.strategy.run(self._replica_step, args=(x, y, step, flag))
        return tuple(self.strategy.experimental_local_results(v)[0] for v in out)

    def _run_step(self, x: tf.Tensor, y: tf.Tensor, step: tf.Tensor) -> tuple:
        """One synchronous step; updates the agreed stop request. Returns (loss, rmse)."""
        flag = tf.constant(self.stop.local_flag(), tf.float32)
        with distributed.collective(self.cluster, f"training step {int(step) + 1}"):
            loss, rmse, stops = self._step_fn(x, y, step, flag)
            self.stop.update(float(stops))
        return loss, rmse

    def evaluate(self) -> float:
        """Test RMSE over all outputs (raw label units); each worker evaluates a shard."""
        sq, count = 0.0, 0
        batches = pipeline.eval_dataset(self.data, self.plan, self.config.batch_size)
        shard = batches.shard(self.cluster.count, self.cluster.index)
        with distributed.collective(self.cluster, "evaluation"):
            for x, y in distributed.without_autotune(shard):
                err = self.predict(x) - y
                sq += float(tf.reduce_sum(tf.square(err)))
                count += int(tf.size(err))
        total = self.peers.sum([sq, count], "evaluation")
        return math.sqrt(total[0] / max(total[1], 1.0))

    def save(self, step: int) -> str:
        with distributed.collective(self.cluster, f"checkpoint {step}"):
            return super().save(step)

    def restore(self) -> int:
        """Restore the chief's newest checkpoint on every worker; agree on the step.

        The chief restores first (it also removes partial saves); then the
        others read the same directory. A non-chief worker then switches its
        manager to ``workers/worker-<i>/checkpoints`` (emptied: only copies).
        """
        if self.cluster.is_chief:
            start = super().restore()
            self.peers.sum([0.0], "restore")  # a barrier: the others read after the chief
        else:
            self.peers.sum([0.0], "restore")
            start = super().restore()
            own = distributed.worker_dir(self.config.output_dir, self.cluster) / "checkpoints"
            shutil.rmtree(own, ignore_errors=True)
            self.ckpt_dir = own
            self.manager = tf.train.CheckpointManager(
                self.ckpt, str(own), max_to_keep=1, checkpoint_name=checkpoints.PREFIX
            )
        self.peers.check_same("the checkpoint to resume from", start_step=start)
        self.stop.update(self.peers.sum([self.stop.local_flag()], "restore")[0])
        return start


def _cluster_fields(cluster: distributed.Cluster | None, global_batch: int) -> dict[str, Any]:
    """Extra ``start`` event fields of a multi-worker run (none for a single process)."""
    if cluster is None:
        return {}
    return {"cluster": cluster.to_json(), "global_batch_size": global_batch}


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StorageError(f"{directory}: output directory not writable: {exc.strerror}") from exc


def _drop_partial_record(path: Path) -> None:
    """Cut an incomplete last line off the JSON-lines log (a run killed mid-write, a full disk).

    Without this the next run's first record would be glued to the fragment. Raises
    StorageError when the file exists but can't be repaired.
    """
    try:
        with open(path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            pos = end
            while pos > 0:
                start = max(0, pos - 65536)
                f.seek(start)
                newline = f.read(pos - start).rfind(b"\n")
                if newline >= 0:
                    pos = start + newline + 1
                    break
                pos = start
            if pos != end:
                f.truncate(pos)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"{path}: cannot repair the log: {exc.strerror}") from exc


def _check_statistics(config: TrainConfig, data: cache_lib.DataCache) -> None:
    """Raise DataError when NaN/Inf values (let in by --allow-nonfinite) make the
    standardisation statistics non-finite: every sample would become NaN."""
    for role, stats in (
        ("train_features", (data.feature_mean, data.feature_std)),
        ("train_labels", (data.label_mean, data.label_std)),
    ):
        if not all(np.isfinite(s).all() for s in stats):
            raise DataError(
                f"{config.data_path(role)}: NaN/Inf values (allowed by --allow-nonfinite) make "
                "the standardisation statistics NaN/Inf; train with --no-standardize, or "
                "remove them"
            )


def train(
    config: TrainConfig,
    plan: ThreadPlan,
    stop: Callable[[], bool] | None = None,
    cluster: distributed.Cluster | None = None,
) -> dict[str, Any]:
    """Train to ``config.max_steps`` (or the target loss) and export; return the summary.

    With ``cluster`` this process is one worker of a multi-worker run
    (:mod:`app.distributed`): ``config.batch_size`` is per worker, only the
    chief (worker 0) writes checkpoints/, model/ and metrics.json, and a lost
    or failing peer raises ClusterError (exit 6).

    The summary (also ``metrics.json``) has ``status`` ("completed",
    "target_reached"), ``final_step``, ``test_rmse`` and ``baseline_rmse`` (raw
    label units), ``examples_per_sec``, ``wall_seconds`` and ``plan``.
    Raises DataError (bad input), StorageError (output), Preempted (SIGTERM or
    SIGINT; a checkpoint was saved), TrainingDiverged (NaN/Inf loss).
    """
    stop = stop or StopRequest()
    out = config.output_dir
    own = distributed.worker_dir(out, cluster)  # == out unless a non-chief worker
    global_batch = config.batch_size * (cluster.count if cluster else 1)
    _check_writable(own)
    _drop_partial_record(own / "logs" / "train.jsonl")
    logs.add_file(own / "logs" / "train.jsonl", worker=cluster.index if cluster else None)
    t_start = time.perf_counter()
    logs.event(
        "start",
        f"coretrain {__version__}: {plan.intra_op_threads} intra-op threads "
        f"for a budget of {plan.cpu_budget:g} CPUs",
        version=__version__,
        tensorflow=tf.__version__,
        config=config.to_json(),
        plan=plan.to_json(),
        **_cluster_fields(cluster, global_batch),
    )
    try:
        # Parse large text files in as many threads as TensorFlow gets intra-op threads.
        data = cache_lib.prepare(
            distributed.worker_config(config, cluster),
            stop=stop,
            threads=plan.intra_op_threads,
        )
        if stop():
            raise Preempted("stopped by signal before training started")
        if config.standardize:
            _check_statistics(config, data)
        if cluster is None:
            trainer = _Trainer(config, plan, data)
        else:
            trainer = _DistributedTrainer(config, plan, data, cluster, stop)
            stop = trainer.stop  # from here on: the request all workers agreed on
        start = trainer.restore()
        if stop():  # e.g. during model building: nothing new to save
            raise Preempted(f"stopped by signal before training resumed at step {start}")
    except Preempted as exc:
        logs.event("end", str(exc), status="preempted")
        raise
    status, test_rmse, first_step = "completed", None, start
    evals = 0
    t_loop = t_mark = time.perf_counter()
    cpu_mark = time.process_time()
    step_mark = start
    step = start
    resident = pipeline.fits_in_memory(data, plan)
    logs.event(
        "input",
        "training split held in memory (batches gathered in tf.data)"
        if resident
        else "training split read from the cache file batch by batch (larger than the limit)",
        resident=resident,
        split_bytes=pipeline.split_bytes(data),
        resident_limit=pipeline.resident_limit(plan),
    )
    batches = (
        pipeline.train_dataset
        if cluster is None
        else functools.partial(distributed.train_dataset, cluster=cluster)
    )
    ds = batches(
        data,
        plan,
        resident=resident,
        seed=config.seed,
        batch_size=config.batch_size,
        start_step=start,
        end_step=config.max_steps,
    )
    for x, y in ds:
        loss, rmse = trainer.train_step(x, y, tf.constant(step, tf.int64))
        step += 1
        trainer.step.assign(step)
        loss_value = float(loss)
        if not math.isfinite(loss_value):
            raise TrainingDiverged(
                f"loss became {loss_value} at step {step}; {trainer.kept()}; lower --learning-rate"
            )
        last = step == config.max_steps
        if step % config.eval_every == 0 or last or stop():
            test_rmse = trainer.evaluate()
            if not math.isfinite(test_rmse):  # the weights to be checkpointed are broken
                raise TrainingDiverged(
                    f"test RMSE became {test_rmse} at step {step} (loss {loss_value:.4g}); "
                    f"{trainer.kept()}; lower --learning-rate"
                )
            evals += 1
            now, cpu_now = time.perf_counter(), time.process_time()
            wall = max(now - t_mark, 1e-9)
            rate = (step - step_mark) * global_batch / wall
            logs.event(
                "progress",
                f"step {step}/{config.max_steps} loss {loss_value:.4f} test_rmse {test_rmse:.4f}",
                step=step,
                loss=loss_value,
                train_rmse=float(rmse),
                test_rmse=test_rmse,
                lr=float(trainer.schedule(step)),
                examples_per_sec=round(rate, 1),
                cpu_util=round((cpu_now - cpu_mark) / (wall * plan.cpu_budget), 3),
                eta_s=round((config.max_steps - step) * wall / max(step - step_mark, 1), 1),
            )
            t_mark, cpu_mark, step_mark = now, cpu_now, step
            if evals >= NOT_LEARNING_AFTER_EVALS and test_rmse >= data.baseline_rmse:
                logs.event(
                    "not_learning",
                    f"test RMSE {test_rmse:.4g} is not below the mean predictor's "
                    f"{data.baseline_rmse:.4g}",
                    level=WARNING,
                    step=step,
                    test_rmse=test_rmse,
                    baseline_rmse=data.baseline_rmse,
                )
            if test_rmse < config.target_loss:
                status = "target_reached"
        if step % config.checkpoint_every == 0 or last or status != "completed" or stop():
            trainer.save(step)
        if stop():
            status = "preempted"
            break
        if status == "target_reached":
            break
    loop_seconds = time.perf_counter() - t_loop
    trained = step - first_step
    if test_rmse is None:
        test_rmse = trainer.evaluate()
    if step > first_step and not trainer.manager.latest_checkpoint:
        trainer.save(step)
    summary: dict[str, Any] = {
        "status": status,
        "final_step": step,
        "start_step": first_step,
        "steps_trained": trained,
        "test_rmse": test_rmse,
        "baseline_rmse": data.baseline_rmse,
        "examples_per_sec": round(trained * global_batch / max(loop_seconds, 1e-9), 1),
        "wall_seconds": round(time.perf_counter() - t_start, 2),
        "train_size": data.train_size,
        "test_size": data.test_size,
        "plan": plan.to_json(),
    }
    if status == "preempted":
        logs.event("end", f"preempted at step {step}; rerun to resume", **summary)
        raise Preempted(f"stopped by signal at step {step}; checkpoint saved, rerun to resume")
    if cluster is not None:
        summary.update(workers=cluster.count, global_batch_size=global_batch)
        if not cluster.is_chief:  # the chief exports and writes metrics.json
            logs.event("end", f"{status} at step {step}: test RMSE {test_rmse:.4g}", **summary)
            return summary
    t_export = time.perf_counter()
    export_dir = export.export(trainer.model, data, config.standardize, out / "model")
    logs.event(
        "export",
        f"exported the model to {export_dir}",
        path=str(export_dir),
        seconds=round(time.perf_counter() - t_export, 2),
    )
    summary["export"] = str(export_dir)
    write_json(out / "metrics.json", summary)
    logs.event(
        "end",
        f"{status} at step {step}: test RMSE {test_rmse:.4g} "
        f"(mean predictor {data.baseline_rmse:.4g})",
        **summary,
    )
    return summary
