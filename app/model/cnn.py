"""The seed CNN as a Keras model, in two formulations of one function (plain, fast).

The architecture is in the package docstring (app/model/__init__.py); the fast
formulation in app/model/fast_formulation.py.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from app.errors import ConfigError
from app.geometry import (
    CONV1_KERNEL,
    CONV1_STRIDE,
    CONV2_BIAS_INIT,
    CONV2_KERNEL,
    DENSE_UNITS,
    FILTERS,
    geometry,
)
from app.model.fast_formulation import fast_features

FORMULATIONS = ("plain", "fast")
#: Compute precisions: float32, or bfloat16 products with float32 variables, loss and
#: interface (Keras' "mixed_bfloat16" policy on every layer).
PRECISIONS = ("float32", "bfloat16")
_POLICY = {"float32": "float32", "bfloat16": "mixed_bfloat16"}
#: The constructor's arguments, as ``.keras`` files record them (``get_config``).
_ARGUMENTS = ("num_outputs", "height", "width", "seed", "formulation", "precision")


def _check_choices(num_outputs: int, formulation: str, precision: str) -> None:
    """Raise ConfigError for an unknown formulation or precision, or K < 1."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if formulation not in FORMULATIONS:
        raise ConfigError(
            f"formulation must be one of {', '.join(FORMULATIONS)}, got {formulation!r}"
        )
    if int(num_outputs) < 1:
        raise ConfigError(f"the model needs at least one output, got {num_outputs}")


def _layer_seeds(seed: int) -> list[int]:
    """Four independent initializer seeds derived from one (numpy SeedSequence)."""
    return [int(s) for s in np.random.SeedSequence(seed).generate_state(4) % (2**31 - 1)]


@keras.saving.register_keras_serializable(package="coretrain")
class SeedCNN(keras.Model):
    """The seed CNN; ``formulation`` picks how ``call`` computes it (same variables).

    ``precision`` "bfloat16" computes in bfloat16 with float32 variables (the same
    checkpoint layout) and float32 outputs. Kernels use Glorot-uniform initialisation
    from per-layer seeds derived from ``seed``; biases start at 0 except conv2's (0.1,
    as in the seed).
    """

    def __init__(
        self,
        num_outputs: int,
        height: int = 20,
        width: int = 195,
        seed: int = 0,
        formulation: str = "fast",
        precision: str = "float32",
        **kwargs: Any,
    ) -> None:
        _check_choices(num_outputs, formulation, precision)
        kwargs.pop("dtype", None)  # the policy follows from precision (also when reloaded)
        super().__init__(dtype=_POLICY[precision], **kwargs)
        self.precision, self.formulation = precision, formulation
        self.num_outputs, self.height, self.width = int(num_outputs), int(height), int(width)
        self.seed = int(seed)
        self.geometry = geometry(self.height, self.width)
        self._make_layers(_POLICY[precision], _layer_seeds(self.seed))

    def _make_layers(self, policy: str, seeds: list[int]) -> None:
        """The layers of the module docstring, computing under ``policy``; each kernel is
        Glorot-uniform from its own seed."""
        init = keras.initializers.GlorotUniform
        self.conv1 = keras.layers.Conv2D(
            FILTERS, CONV1_KERNEL, strides=(1, CONV1_STRIDE), padding="valid",
            activation="relu", kernel_initializer=init(seed=seeds[0]), name="conv1",
            dtype=policy,
        )  # fmt: skip
        self.pool1 = keras.layers.MaxPooling2D(2, name="pool1", dtype=policy)
        self.conv2 = keras.layers.Conv2D(
            FILTERS, CONV2_KERNEL, padding="valid", activation="relu",
            kernel_initializer=init(seed=seeds[1]),
            bias_initializer=keras.initializers.Constant(CONV2_BIAS_INIT), name="conv2",
            dtype=policy,
        )  # fmt: skip
        self.pool2 = keras.layers.MaxPooling2D(2, name="pool2", dtype=policy)
        self.flatten = keras.layers.Flatten(name="flatten", dtype=policy)
        self.dense1 = keras.layers.Dense(
            DENSE_UNITS, activation="relu", kernel_initializer=init(seed=seeds[2]),
            name="dense1", dtype=policy,
        )  # fmt: skip
        self.dense2 = keras.layers.Dense(
            self.num_outputs, kernel_initializer=init(seed=seeds[3]), name="dense2", dtype=policy
        )

    def build(self, input_shape: Any = None) -> None:
        """Create every variable for (N, H, W, 1) inputs (the shape argument is checked)."""
        if input_shape is not None:
            self._check_shape(tuple(input_shape))
        g = self.geometry
        self.conv1.build((None, g.height, g.width, 1))
        self.pool1.build((None, *g.conv1, FILTERS))
        self.conv2.build((None, *g.pool1, FILTERS))
        self.pool2.build((None, *g.conv2, FILTERS))
        self.flatten.build((None, *g.pool2, FILTERS))
        self.dense1.build((None, g.flat))
        self.dense2.build((None, DENSE_UNITS))

    def _check_shape(self, shape: tuple) -> None:
        expected = (self.height, self.width, 1)
        if len(shape) != 4 or any(
            a is not None and a != b for a, b in zip(shape[1:], expected, strict=True)
        ):
            raise ConfigError(f"the model takes (N, {self.height}, {self.width}, 1), got {shape}")

    def features(self, x: tf.Tensor, formulation: str | None = None) -> tf.Tensor:
        """conv1 … flatten: (N, H, W, 1) → (N, Hq·Wq·5), NHWC flatten order, computed in
        ``formulation`` (default the model's; the other computes the same function)."""
        self._check_shape(tuple(x.shape))
        if (formulation or self.formulation) == "fast":
            return fast_features(self, x)
        h = self.pool1(self.conv1(x))
        return self.flatten(self.pool2(self.conv2(h)))

    def head(self, h: tf.Tensor) -> tf.Tensor:
        """dense1 (ReLU) and dense2 (linear): (N, Hq·Wq·5) → (N, K) float32."""
        return tf.cast(self.dense2(self.dense1(h)), tf.float32)

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        """Inference: (N, H, W, 1) → (N, K); no dropout (see :func:`forward`)."""
        return self.head(self.features(x))

    def infer(self, x: tf.Tensor, formulation: str | None = None) -> tf.Tensor:
        """Inference computed in ``formulation`` (default the model's): (N, H, W, 1) →
        (N, K) float32. Which formulation is fastest without a gradient is not always the
        one that is fastest with one (app/training/state/choose.py)."""
        return self.head(self.features(x, formulation))

    def compute_output_shape(self, input_shape: Any) -> tuple:
        """(N, H, W, 1) → (N, K)."""
        return (input_shape[0], self.num_outputs)

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments (``.keras`` serialisation)."""
        config = super().get_config()
        config.update({name: getattr(self, name) for name in _ARGUMENTS})
        return config


def stock(model: SeedCNN) -> keras.Sequential:
    """``model``'s function made of stock Keras layers only, with its weights (copied) and
    precision: (N, H, W, 1) → (N, K) float32, the plain formulation. A ``.keras`` file of
    it loads in any Keras 3 without this package (no registered class)."""
    layers = [keras.Input((model.height, model.width, 1), name="image")]
    for part in (model.conv1, model.pool1, model.conv2, model.pool2, model.flatten):
        layers.append(type(part).from_config(part.get_config()))
    layers += [
        keras.layers.Dense.from_config(model.dense1.get_config()),
        keras.layers.Dense.from_config(model.dense2.get_config()),
        keras.layers.Activation("linear", dtype="float32", name="to_float32"),
    ]
    plain = keras.Sequential(layers, name="seed_cnn_stock")
    for mine, theirs in zip(plain.layers, [model.conv1, model.pool1, model.conv2, model.pool2,
                                           model.flatten, model.dense1, model.dense2],
                            strict=False):  # fmt: skip
        mine.set_weights(theirs.get_weights())
    return plain


def build_model(num_outputs: int, **arguments: Any) -> SeedCNN:
    """The built inference model: x (N, H, W, 1) float32 → y (N, K); no dropout inside.

    ``arguments``: :class:`SeedCNN`'s (``height``, ``width``, ``seed``, ``formulation``,
    ``precision``; by default 20, 195, 0, "fast", "float32"). ``formulation`` is "plain"
    (Keras layers) or "fast" (matrix products, same function and variables:
    app/model/fast_formulation.py); ``precision`` "float32" or "bfloat16" (computation only:
    variables and outputs stay float32). The initial weights depend only on ``seed``. Raises
    ConfigError for an unknown formulation or precision, K < 1 or an input too small for
    the network.
    """
    model = SeedCNN(num_outputs, name="seed_cnn", **arguments)
    shape = (model.height, model.width, 1)
    model.build((None, *shape))
    # One call on a single zero sample marks the model as called, which Keras'
    # ``model.export`` requires of subclassed models (it then reads the input
    # signature from the build shape).
    model(tf.zeros((1, *shape)))
    return model
