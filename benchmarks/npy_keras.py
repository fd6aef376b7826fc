"""The seed's CNN as a user would train it from ``.npy`` arrays: a plain Keras script.

``python -m benchmarks.npy_keras DIR [--steps N] [--batch-size B]`` loads ``DIR/train_x.npy``
(n, 20, 195) and ``DIR/train_y.npy`` (n, K) whole (a Keras user's best case: no text to
parse), standardises them, builds the seed's architecture with Keras layers
(:func:`benchmarks.seed_keras.seed_cnn`, the seed's SGD recipe) and fits ``--steps`` batches
of a shuffled, repeated ``tf.data`` pipeline. It prints one JSON line of wall-clock stamps
(``time.time()``): ``started`` (before TensorFlow's import), ``imported``, ``loaded``,
``first_step`` (the end of the first batch) and ``end``. The time-to-model benchmark
(:mod:`benchmarks.time_to_model`) runs it beside ``coretrain train``.
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.seed_keras import StepTimes, rmse, seed_cnn  # noqa: E402


def main() -> None:
    stamps = {"started": STARTED, "imported": time.time()}
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=1000)
    args = parser.parse_args()
    x = np.load(args.data / "train_x.npy")
    y = np.load(args.data / "train_y.npy")
    x = ((x - x.mean(0)) / (x.std(0) + 1e-6))[..., None]
    y = (y - y.mean(0)) / (y.std(0) + 1e-6)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    data = data.batch(args.batch_size, drop_remainder=True).repeat().prefetch(2)
    stamps["loaded"] = time.time()
    model = seed_cnn(y.shape[1])
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 200, 0.8, staircase=True)
    model.compile(optimizer=tf.keras.optimizers.SGD(schedule, momentum=0.8), loss=rmse)
    times = StepTimes()
    model.fit(data, epochs=1, steps_per_epoch=args.steps, callbacks=[times], verbose=0)
    stamps["first_step"] = times.ends[0] - time.perf_counter() + time.time()
    stamps["end"] = time.time()
    print(json.dumps({**stamps, "steps": len(times.ends)}), flush=True)


if __name__ == "__main__":
    main()
