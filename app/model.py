"""The seed CNN (docs/architecture.md, "The model") in two formulations of one function.

Input (N, H, W, 1) float32, already standardised (default H×W = 20×195)::

    conv1  5 filters 3×30, stride (1, 5), VALID, ReLU  → (N, Ho, Wo, 5)
    pool1  max 2×2 / 2                                 → (N, Hp, Wp, 5)
    conv2  5 filters 2×2, VALID, bias init 0.1, ReLU   → (N, Hp-1, Wp-1, 5)
    pool2  max 2×2 / 2                                 → (N, Hq, Wq, 5)
    flatten (row-major, NHWC)                          → (N, Hq·Wq·5)
    [dropout, keep 0.5, training only: :func:`forward`]
    dense1 20 units, ReLU; dense2 K units, linear      → (N, K)

with Ho = H-2, Wo = (W-30)//5 + 1, Hp = Ho//2, Wp = Wo//2, Hq = (Hp-1)//2 and
Wq = (Wp-1)//2: 18×34, 9×17, 8×16, 4×8 and 160 features for 20×195.

``formulation="plain"`` runs Keras layers exactly as listed. ``"fast"``
computes the same function with the same variables as a few wide matrix
products; see "The fast formulation" below. Both formulations own the same
layers and variables under the same names (``conv1/kernel`` (3, 30, 1, 5),
``conv1/bias``, ``conv2/kernel`` (2, 2, 5, 5), ``conv2/bias``,
``dense1/kernel`` (160, 20), ...), so a checkpoint or ``.keras`` file written by
one restores into the other.

The fast formulation
--------------------
conv1 dominates the step (1.1 of the 1.2 MFLOP/sample a train step needs). As
oneDNN is off by default on AMD CPUs, TensorFlow runs it through Eigen, whose
convolution kernels with 1 input and 5 output channels reach only a few
GFLOP/s, mostly in the filter gradient. The fast path instead:

1. transposes the batch to the last axis, x → (H·W, N), so every row of every
   intermediate is N contiguous floats (one wide SIMD-friendly run);
2. gathers one *tile* of input per output position into a patch matrix
   P (4·(5·PHASES+25), Hp·T·N): 4 input rows × (5·PHASES+25) columns feed a
   2-row × PHASES-column block of conv1 outputs (T = ceil(Wp / (PHASES/2))
   tiles per row);
3. multiplies by the conv1 kernel laid out as a (4·PHASES·5, 4·(5·PHASES+25))
   block-Toeplitz matrix, gathered from the (3, 30, 1, 5) variable at call time,
   whose rows are ordered (pool-window element, output column, channel), so the
   2×2 max-pool is a max over 4 contiguous row blocks;
4. does conv2 + pool2 the same way (gather 2×2×5 patches, one (5, 20) matrix
   product, max over the pool window), then gathers the (160, N) result into
   NHWC flatten order and transposes it back to (N, 160) for dropout and the
   dense layers, which are the same Keras layers in both formulations.

A custom gradient routes each pooled gradient to the *first* maximum of its
window in row-major order, as ``tf.nn.max_pool2d``'s gradient does, so outputs
and gradients match the plain layers to float32 rounding (tested to 1e-5).
Pooling before the bias and ReLU is exact because both are monotone and the
bias is shared by the window. Any H, W the plain model accepts works; padding
columns of the last tile read a clamped (real) input column and only feed
conv1 outputs that pooling drops. The input gradient is implemented too (for
callers that differentiate with respect to x); graphs that don't use it prune it.

Its measured speed, and the choices behind ``PHASES``, are in docs/performance.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from app.errors import ConfigError

FORMULATIONS = ("plain", "fast")
#: Compute precisions: float32, or bfloat16 products with float32 variables, loss and
#: interface (Keras' "mixed_bfloat16" policy on every layer).
PRECISIONS = ("float32", "bfloat16")
_POLICY = {"float32": "float32", "bfloat16": "mixed_bfloat16"}

FILTERS = 5
CONV1_KERNEL = (3, 30)
CONV1_STRIDE = 5  # along the width; 1 along the height
CONV2_KERNEL = (2, 2)
CONV2_BIAS_INIT = 0.1
DENSE_UNITS = 20
# Weight decay on l2_loss(w) = sum(w²)/2, as in the seed (docs/architecture.md, "The model").
CONV_WEIGHT_DECAY = 0.001
DENSE_WEIGHT_DECAY = 0.004
# conv1 output columns per tile of the fast formulation (even): wider tiles mean a
# smaller patch matrix and wider matrix products but more zero products in the
# block-Toeplitz kernel (50 % zeros at 4); docs/performance.md has the comparison.
PHASES = 4


# ---------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    """Spatial sizes of every stage for an H×W input (see the module docstring)."""

    height: int
    width: int
    conv1: tuple[int, int]
    pool1: tuple[int, int]
    conv2: tuple[int, int]
    pool2: tuple[int, int]

    @property
    def flat(self) -> int:
        """Features after flatten: Hq·Wq·FILTERS (160 for 20×195)."""
        return self.pool2[0] * self.pool2[1] * FILTERS


def geometry(height: int, width: int) -> Geometry:
    """Stage sizes for an H×W input (VALID convolutions, floor pooling).

    Raises ConfigError when the input is too small to leave at least one
    position after pool2 (H ≥ 8 and W ≥ 55).
    """
    c1 = (height - CONV1_KERNEL[0] + 1, (width - CONV1_KERNEL[1]) // CONV1_STRIDE + 1)
    p1 = (c1[0] // 2, c1[1] // 2)
    c2 = (p1[0] - CONV2_KERNEL[0] + 1, p1[1] - CONV2_KERNEL[1] + 1)
    p2 = (c2[0] // 2, c2[1] // 2)
    if width < CONV1_KERNEL[1] or min(p2) < 1:
        raise ConfigError(
            f"input {height}×{width} is too small for the seed CNN "
            "(needs height ≥ 8 and width ≥ 55 to leave one position after pool2)"
        )
    return Geometry(height, width, c1, p1, c2, p2)


# ---------------------------------------------------------------------------
# The fast formulation: index tables (numpy, built once per input size)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FastTables:
    """Gather indices of the fast formulation for one input size.

    ``patch_rows``: rows of x (H·W, N) forming the conv1 patch matrix, ordered
    (input row 0..3, tile column u, pooled row i, tile t). ``kernel_index``:
    (4·PHASES·5, 4·span) positions in the flattened conv1 kernel (450 = zero).
    ``conv2_rows``: rows of the pooled conv1 output forming the conv2 patch
    matrix, ordered (dy, dx, c, window, i2, j2). ``flatten_rows``: rows of the
    pooled conv2 output in NHWC flatten order.
    """

    patch_rows: np.ndarray
    kernel_index: np.ndarray
    conv2_rows: np.ndarray
    flatten_rows: np.ndarray
    inner: int
    pool1_rows: int


@functools.lru_cache(maxsize=8)
def fast_tables(height: int, width: int, phases: int = PHASES) -> FastTables:
    """Build the gather indices for an H×W input and ``phases`` conv1 columns per tile."""
    g = geometry(height, width)
    kh, kw = CONV1_KERNEL
    hp, wp = g.pool1
    half = phases // 2
    tiles = -(-wp // half)
    span = CONV1_STRIDE * (phases - 1) + kw  # input columns feeding one tile
    rows_in = kh + 1  # input rows feeding two conv1 rows

    d, u, i, t = np.meshgrid(
        np.arange(rows_in), np.arange(span), np.arange(hp), np.arange(tiles), indexing="ij"
    )
    column = np.minimum(CONV1_STRIDE * phases * t + u, width - 1)
    patch_rows = (2 * i + d) * width + column

    # Kernel rows (window row a, window column b, output column pair ph, channel c);
    # output column p = 2·ph + b of the tile; columns (input row d, tile column u).
    a, b, ph, c, d, u = np.meshgrid(
        np.arange(2),
        np.arange(2),
        np.arange(half),
        np.arange(FILTERS),
        np.arange(rows_in),
        np.arange(span),
        indexing="ij",
    )
    dh = d - a
    j = u - CONV1_STRIDE * (2 * ph + b)
    valid = (dh >= 0) & (dh < kh) & (j >= 0) & (j < kw)
    kernel_index = np.where(valid, (dh * kw + j) * FILTERS + c, kh * kw * FILTERS)
    kernel_index = kernel_index.reshape(4 * half * FILTERS, rows_in * span)

    # Pooled conv1 output rows are (ph, c, i, t) with pooled column x = half·t + ph.
    hq, wq = g.pool2
    dy, dx, c, a, b, i2, j2 = np.meshgrid(
        *(np.arange(n) for n in (2, 2, FILTERS, 2, 2, hq, wq)), indexing="ij"
    )
    y = 2 * i2 + a + dy
    x = 2 * j2 + b + dx
    conv2_rows = (((x % half) * FILTERS + c) * hp + y) * tiles + x // half

    i2, j2, c = np.meshgrid(np.arange(hq), np.arange(wq), np.arange(FILTERS), indexing="ij")
    flatten_rows = (c * hq + i2) * wq + j2

    return FastTables(
        patch_rows=patch_rows.reshape(-1).astype(np.int32),
        kernel_index=kernel_index.astype(np.int32),
        conv2_rows=conv2_rows.reshape(-1).astype(np.int32),
        flatten_rows=flatten_rows.reshape(-1).astype(np.int32),
        inner=rows_in * span,
        pool1_rows=half * FILTERS * hp * tiles,
    )


# ---------------------------------------------------------------------------
# The fast formulation: ops
# ---------------------------------------------------------------------------


def _first_max_routing(y: tf.Tensor, m: tf.Tensor, dm: tf.Tensor, axis: int) -> tf.Tensor:
    """Gradient of m = max(y, axis) (window of 4) sent to the first maximum only.

    This is the tie rule of ``tf.nn.max_pool2d``'s gradient (the first element
    of the window in row-major order wins); ``tf.reduce_max`` would split it.
    """
    parts = tf.unstack(y, num=4, axis=axis)
    first = tf.where(tf.equal(parts[2], m), 2, 3)
    first = tf.where(tf.equal(parts[1], m), 1, first)
    first = tf.where(tf.equal(parts[0], m), 0, first)
    window = tf.reshape(tf.range(4), [4 if k == axis else 1 for k in range(3)])
    return tf.where(tf.equal(tf.expand_dims(first, axis), window), tf.expand_dims(dm, axis), 0.0)


def matmul_maxpool(w: tf.Tensor, p: tf.Tensor, *, window_axis: int) -> tf.Tensor:
    """max over a 2×2 pool window of ``w @ p``, with max-pool's gradient tie rule.

    ``w`` (R, K), ``p`` (K, M). With ``window_axis=0`` the rows of ``w`` are
    (window element, C); with ``window_axis=1`` the columns of ``p`` are
    (window element, M/4). Returns (C, M) or (R, M/4) respectively. Gradients
    flow to both ``w`` and ``p`` (the one for ``p`` is pruned from graphs that
    don't use it).
    """

    @tf.custom_gradient
    def op(w: tf.Tensor, p: tf.Tensor) -> Any:
        y = tf.matmul(w, p)
        shape = tf.shape(y)
        if window_axis == 0:
            y = tf.reshape(y, (4, shape[0] // 4, -1))
        else:
            y = tf.reshape(y, (shape[0], 4, -1))
        m = tf.reduce_max(y, axis=window_axis)

        def grad(dm: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            dy = tf.reshape(_first_max_routing(y, m, dm, window_axis), shape)
            # (K, M)·(R, M)ᵀ is the fast layout for Eigen here; (R, M)·(K, M)ᵀ is ~2× slower.
            dw = tf.transpose(tf.matmul(p, dy, transpose_b=True))
            dp = tf.matmul(w, dy, transpose_a=True)
            return dw, dp

        return m, grad

    return op(w, p)


def _fast_features(model: SeedCNN, x: tf.Tensor) -> tf.Tensor:
    """conv1 … flatten of the fast formulation: (N, H, W, 1) → (N, Hq·Wq·5)."""
    g = model.geometry
    t = fast_tables(g.height, g.width, PHASES)
    dtype = tf.as_dtype(model.compute_dtype)  # float32, or bfloat16 under mixed precision
    xt = tf.transpose(tf.reshape(tf.cast(x, dtype), (-1, g.height * g.width)))  # (H·W, N)
    patches = tf.reshape(tf.gather(xt, t.patch_rows), (t.inner, -1))
    k1 = tf.reshape(tf.cast(model.conv1.kernel, dtype), (-1,))
    k1 = tf.gather(tf.concat([k1, tf.zeros((1,), dtype)], 0), t.kernel_index)
    a1 = matmul_maxpool(k1, patches, window_axis=0)  # (ph·c, i·t·N)
    a1 = tf.reshape(a1, (-1, FILTERS, tf.shape(a1)[1]))
    a1 = tf.nn.relu(a1 + tf.reshape(tf.cast(model.conv1.bias, dtype), (1, FILTERS, 1)))
    a1 = tf.reshape(a1, (t.pool1_rows, -1))  # rows (ph, c, i, t)

    q = tf.reshape(tf.gather(a1, t.conv2_rows), (4 * FILTERS, -1))  # rows (dy, dx, c)
    k2 = tf.transpose(tf.reshape(tf.cast(model.conv2.kernel, dtype), (4 * FILTERS, FILTERS)))
    a2 = matmul_maxpool(k2, q, window_axis=1)  # (c, i2·j2·N)
    a2 = tf.nn.relu(a2 + tf.cast(model.conv2.bias, dtype)[:, None])
    a2 = tf.reshape(a2, (g.flat, -1))  # rows (c, i2, j2)
    return tf.transpose(tf.gather(a2, t.flatten_rows))


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------


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
        if precision not in PRECISIONS:
            raise ConfigError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}"
            )
        kwargs.pop("dtype", None)  # the policy follows from precision (also when reloaded)
        super().__init__(dtype=_POLICY[precision], **kwargs)
        if formulation not in FORMULATIONS:
            raise ConfigError(
                f"formulation must be one of {', '.join(FORMULATIONS)}, got {formulation!r}"
            )
        self.precision = precision
        policy = _POLICY[precision]
        if int(num_outputs) < 1:
            raise ConfigError(f"the model needs at least one output, got {num_outputs}")
        self.num_outputs = int(num_outputs)
        self.height = int(height)
        self.width = int(width)
        self.seed = int(seed)
        self.formulation = formulation
        self.geometry = geometry(self.height, self.width)
        s = _layer_seeds(self.seed)
        init = keras.initializers.GlorotUniform
        self.conv1 = keras.layers.Conv2D(
            FILTERS,
            CONV1_KERNEL,
            strides=(1, CONV1_STRIDE),
            padding="valid",
            activation="relu",
            kernel_initializer=init(seed=s[0]),
            name="conv1",
            dtype=policy,
        )
        self.pool1 = keras.layers.MaxPooling2D(2, name="pool1", dtype=policy)
        self.conv2 = keras.layers.Conv2D(
            FILTERS,
            CONV2_KERNEL,
            padding="valid",
            activation="relu",
            kernel_initializer=init(seed=s[1]),
            bias_initializer=keras.initializers.Constant(CONV2_BIAS_INIT),
            name="conv2",
            dtype=policy,
        )
        self.pool2 = keras.layers.MaxPooling2D(2, name="pool2", dtype=policy)
        self.flatten = keras.layers.Flatten(name="flatten", dtype=policy)
        self.dense1 = keras.layers.Dense(
            DENSE_UNITS,
            activation="relu",
            kernel_initializer=init(seed=s[2]),
            name="dense1",
            dtype=policy,
        )
        self.dense2 = keras.layers.Dense(
            self.num_outputs, kernel_initializer=init(seed=s[3]), name="dense2", dtype=policy
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

    def features(self, x: tf.Tensor) -> tf.Tensor:
        """conv1 … flatten: (N, H, W, 1) → (N, Hq·Wq·5), NHWC flatten order."""
        self._check_shape(tuple(x.shape))
        if self.formulation == "fast":
            return _fast_features(self, x)
        h = self.pool1(self.conv1(x))
        return self.flatten(self.pool2(self.conv2(h)))

    def head(self, h: tf.Tensor) -> tf.Tensor:
        """dense1 (ReLU) and dense2 (linear): (N, Hq·Wq·5) → (N, K) float32."""
        return tf.cast(self.dense2(self.dense1(h)), tf.float32)

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        """Inference: (N, H, W, 1) → (N, K); no dropout (see :func:`forward`)."""
        return self.head(self.features(x))

    def compute_output_shape(self, input_shape: Any) -> tuple:
        """(N, H, W, 1) → (N, K)."""
        return (input_shape[0], self.num_outputs)

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments (``.keras`` serialisation)."""
        config = super().get_config()
        config.update(
            num_outputs=self.num_outputs,
            height=self.height,
            width=self.width,
            seed=self.seed,
            formulation=self.formulation,
            precision=self.precision,
        )
        return config


def build_model(
    num_outputs: int,
    *,
    height: int = 20,
    width: int = 195,
    seed: int = 0,
    formulation: str = "fast",
    precision: str = "float32",
) -> SeedCNN:
    """The built inference model: x (N, H, W, 1) float32 → y (N, K); no dropout inside.

    ``formulation`` is "plain" (Keras layers) or "fast" (matrix products, same
    function and variables; see the module docstring); ``precision`` "float32" or
    "bfloat16" (computation only: variables and outputs stay float32). The initial
    weights depend only on ``seed``. Raises ConfigError for an unknown formulation or
    precision, K < 1 or an input too small for the network.
    """
    model = SeedCNN(
        num_outputs,
        height=height,
        width=width,
        seed=seed,
        formulation=formulation,
        precision=precision,
        name="seed_cnn",
    )
    model.build((None, height, width, 1))
    # One call on a single zero sample marks the model as called, which Keras'
    # ``model.export`` requires of subclassed models (it then reads the input
    # signature from the build shape).
    model(tf.zeros((1, height, width, 1)))
    return model


def forward(
    model: SeedCNN,
    x: tf.Tensor,
    *,
    dropout_seed: tf.Tensor | None = None,
    keep_prob: float = 0.5,
) -> tf.Tensor:
    """The training forward pass: ``model(x)`` with dropout on the flattened pool2 output.

    ``x`` (N, H, W, 1) → (N, K). With ``dropout_seed`` (an int32/int64 tensor of
    shape (2,), e.g. (seed, step)), each feature is kept with probability
    ``keep_prob`` and scaled by 1/keep_prob; the mask comes from
    ``tf.nn.experimental.stateless_dropout`` and so depends only on the seed and
    the batch shape (fold a replica id into the seed for distinct masks per
    replica; see :func:`dropout`). Works inside ``tf.function`` and
    ``strategy.run``. Raises ConfigError unless 0 < keep_prob ≤ 1.
    """
    h = model.features(x)
    if dropout_seed is not None:
        h = dropout(h, dropout_seed, keep_prob)
    elif not 0.0 < keep_prob <= 1.0:
        raise ConfigError(f"keep_prob must be in (0, 1], got {keep_prob}")
    return model.head(h)


def dropout(h: tf.Tensor, seed: tf.Tensor, keep_prob: float) -> tf.Tensor:
    """Keep each element of ``h`` with probability ``keep_prob``, scaled by 1/keep_prob.

    The mask is ``tf.nn.experimental.stateless_dropout``'s: a function of ``seed``
    (shape (2,), int32/int64) and ``h``'s shape only. Raises ConfigError unless
    0 < keep_prob ≤ 1; keep_prob = 1 returns ``h``.
    """
    if not 0.0 < keep_prob <= 1.0:
        raise ConfigError(f"keep_prob must be in (0, 1], got {keep_prob}")
    if keep_prob == 1.0:
        return h
    return tf.nn.experimental.stateless_dropout(h, rate=1.0 - keep_prob, seed=seed)


def regularized_loss(
    model: SeedCNN, y_pred: tf.Tensor, y_true: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """(total_loss, rmse) for predictions and targets of shape (N, K).

    rmse = sqrt(mean((y_pred - y_true)²)) over all N·K outputs of this batch;
    total = rmse + 0.001·(l2(conv1) + l2(conv2)) + 0.004·(l2(dense1) + l2(dense2))
    on the kernels, with l2(w) = sum(w²)/2 (``tf.nn.l2_loss``), as in the seed.
    """
    y_true = tf.cast(y_true, y_pred.dtype)
    rmse = tf.sqrt(tf.reduce_mean(tf.square(y_pred - y_true)))
    return rmse + weight_decay(model), rmse


def weight_decay(model: SeedCNN) -> tf.Tensor:
    """The weight-decay term of the loss (a float32 scalar).

    0.001·(l2(conv1) + l2(conv2)) + 0.004·(l2(dense1) + l2(dense2)) on the
    kernels, l2(w) = sum(w²)/2 (``tf.nn.l2_loss``), as in the seed
    (docs/architecture.md, "The model").
    """
    conv = tf.nn.l2_loss(model.conv1.kernel) + tf.nn.l2_loss(model.conv2.kernel)
    dense = tf.nn.l2_loss(model.dense1.kernel) + tf.nn.l2_loss(model.dense2.kernel)
    return CONV_WEIGHT_DECAY * conv + DENSE_WEIGHT_DECAY * dense
