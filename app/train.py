"""The training entry point: ``train(config, plan) -> summary``.

The CLI, tests and benchmarks all call this. It must be imported only after
:func:`app.runtime.apply` (it imports TensorFlow). Everything it writes lives
under ``config.output_dir``: ``checkpoints/``, ``model/``, ``logs/train.jsonl``,
``metrics.json`` and (unless ``--cache-dir``) ``cache/``.

The loop runs *to an absolute step*: it restores the newest valid checkpoint
first, so a restarted job continues and ends at the same total (as orbit's
Controller does).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from app import __version__, checkpoints, export, logs
from app import model as model_lib
from app.atomic import write_json
from app.config import TrainConfig
from app.data import cache as cache_lib
from app.data import pipeline
from app.errors import Preempted, StorageError, TrainingDiverged
from app.plan import ThreadPlan
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

    def save(self, step: int) -> str:
        """Save checkpoint ``step``; never one holding NaN/Inf (TrainingDiverged instead)."""
        t0 = time.perf_counter()
        if not self.finite():
            raise TrainingDiverged(
                f"weights became NaN/Inf at step {step} (not saved); the last good checkpoint "
                f"is kept in {self.ckpt_dir}; lower --learning-rate"
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


def train(config: TrainConfig, plan: ThreadPlan, stop: StopRequest | None = None) -> dict[str, Any]:
    """Train to ``config.max_steps`` (or the target loss) and export; return the summary.

    The summary (also ``metrics.json``) has ``status`` ("completed",
    "target_reached"), ``final_step``, ``test_rmse`` and ``baseline_rmse`` (raw
    label units), ``examples_per_sec``, ``wall_seconds`` and ``plan``.
    Raises DataError (bad input), StorageError (output), Preempted (SIGTERM or
    SIGINT; a checkpoint was saved), TrainingDiverged (NaN/Inf loss).
    """
    stop = stop or StopRequest()
    out = config.output_dir
    _check_writable(out)
    _drop_partial_record(out / "logs" / "train.jsonl")
    logs.add_file(out / "logs" / "train.jsonl")
    t_start = time.perf_counter()
    logs.event(
        "start",
        f"coretrain {__version__}: {plan.intra_op_threads} intra-op threads "
        f"for a budget of {plan.cpu_budget:g} CPUs",
        version=__version__,
        tensorflow=tf.__version__,
        config=config.to_json(),
        plan=plan.to_json(),
    )
    # Parse large text files in as many processes as TensorFlow gets threads.
    try:
        data = cache_lib.prepare(config, stop=stop, processes=plan.intra_op_threads)
        if stop():
            raise Preempted("stopped by signal before training started")
        trainer = _Trainer(config, plan, data)
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
    ds = pipeline.train_dataset(
        data,
        plan,
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
                f"loss became {loss_value} at step {step}; the last good checkpoint is kept "
                f"in {trainer.ckpt_dir}; lower --learning-rate"
            )
        last = step == config.max_steps
        if step % config.eval_every == 0 or last or stop():
            test_rmse = trainer.evaluate()
            if not math.isfinite(test_rmse):  # the weights to be checkpointed are broken
                raise TrainingDiverged(
                    f"test RMSE became {test_rmse} at step {step} (loss {loss_value:.4g}); the "
                    f"last good checkpoint is kept in {trainer.ckpt_dir}; lower --learning-rate"
                )
            evals += 1
            now, cpu_now = time.perf_counter(), time.process_time()
            wall = max(now - t_mark, 1e-9)
            rate = (step - step_mark) * config.batch_size / wall
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
        "examples_per_sec": round(trained * config.batch_size / max(loop_seconds, 1e-9), 1),
        "wall_seconds": round(time.perf_counter() - t_start, 2),
        "train_size": data.train_size,
        "test_size": data.test_size,
        "plan": plan.to_json(),
    }
    if status == "preempted":
        logs.event("end", f"preempted at step {step}; rerun to resume", **summary)
        raise Preempted(f"stopped by signal at step {step}; checkpoint saved, rerun to resume")
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
