"""The fast formulation of the seed CNN: conv1 … flatten as a few wide matrix products.

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
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from app.geometry import CONV1_KERNEL, CONV1_STRIDE, FILTERS, geometry

if TYPE_CHECKING:
    from app.model.cnn import SeedCNN

# conv1 output columns per tile of the fast formulation (even): wider tiles mean a
# smaller patch matrix and wider matrix products but more zero products in the
# block-Toeplitz kernel (50 % zeros at 4); docs/performance.md has the comparison.
PHASES = 4


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


def fast_features(model: SeedCNN, x: tf.Tensor) -> tf.Tensor:
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
