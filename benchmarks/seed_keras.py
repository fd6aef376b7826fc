"""The seed's CNN as a user would write it: a plain Keras script, nothing of coretrain.

``python benchmarks/seed_keras.py DATA_DIR [--steps N] [--batch-size B] [--warmup W]``
reads ``train_features.txt`` / ``train_labels.txt`` (the seed's text format, as
``coretrain generate`` writes it) with numpy, builds the seed's architecture with Keras layers
(docs/architecture.md, "The model"; the seed's loss and SGD recipe, weight decay through L2
regularizers: ``L2(l)`` adds ``l·sum(w²)``, the seed's ``c·sum(w²)/2`` is ``L2(c/2)``) and fits
``--steps`` batches. It prints one JSON line: samples/s over the steps after ``--warmup``
(TensorFlow's tracing is in the first), the thread variables it found and the BLAS pool
(threadpoolctl). Used by ``benchmarks.exec_keras``, bare and through ``coretrain exec``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
import threadpoolctl

HEIGHT, WIDTH = 20, 195


def load(data: Path) -> tuple[np.ndarray, np.ndarray]:
    """The training features (n, 20, 195, 1) and labels (n, K), standardised."""
    x = np.loadtxt(data / "train_features.txt", dtype=np.float32, ndmin=2)
    y = np.loadtxt(data / "train_labels.txt", dtype=np.float32, ndmin=2)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = (y - y.mean(0)) / (y.std(0) + 1e-6)
    return x.reshape(-1, HEIGHT, WIDTH, 1), y


def seed_cnn(outputs: int) -> tf.keras.Model:
    """The seed's layers: conv 5@3×30 /(1,5) → pool → conv 5@2×2 → pool → dropout → 20 → K."""
    conv_l2, dense_l2 = tf.keras.regularizers.L2(0.0005), tf.keras.regularizers.L2(0.002)
    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            tf.keras.Input((HEIGHT, WIDTH, 1)),
            layers.Conv2D(
                5, (3, 30), strides=(1, 5), activation="relu", kernel_regularizer=conv_l2
            ),
            layers.MaxPooling2D(2, 2),
            layers.Conv2D(
                5,
                (2, 2),
                activation="relu",
                bias_initializer=tf.keras.initializers.Constant(0.1),
                kernel_regularizer=conv_l2,
            ),
            layers.MaxPooling2D(2, 2),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(20, activation="relu", kernel_regularizer=dense_l2),
            layers.Dense(outputs, kernel_regularizer=dense_l2),
        ]
    )


def rmse(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    return tf.sqrt(tf.reduce_mean(tf.square(y_true - y_pred)))


class StepTimes(tf.keras.callbacks.Callback):
    """The wall time at the end of every training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.ends.append(time.perf_counter())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    x, y = load(args.data)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    data = data.batch(args.batch_size, drop_remainder=True).repeat().prefetch(2)
    model = seed_cnn(y.shape[1])
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 200, 0.8, staircase=True)
    model.compile(optimizer=tf.keras.optimizers.SGD(schedule, momentum=0.8), loss=rmse)
    times = StepTimes()
    model.fit(data, epochs=1, steps_per_epoch=args.steps, callbacks=[times], verbose=0)
    timed = times.ends[args.warmup :]
    rate = (len(timed) - 1) * args.batch_size / (timed[-1] - timed[0])
    names = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS")
    blas = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    print(
        json.dumps(
            {
                "samples_per_s": round(rate, 1),
                "timed_steps": len(timed) - 1,
                "env": {n: os.environ.get(n) for n in names},
                "blas_threads": blas,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
