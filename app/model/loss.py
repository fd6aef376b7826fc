"""The training side of the seed CNN: dropout, the forward pass with it, and the loss with
the seed's weight decay (docs/architecture.md, "The model")."""

from __future__ import annotations

import tensorflow as tf

from app.errors import ConfigError
from app.model.cnn import SeedCNN

# Weight decay on l2_loss(w) = sum(w²)/2, as in the seed (docs/architecture.md, "The model").
CONV_WEIGHT_DECAY = 0.001
DENSE_WEIGHT_DECAY = 0.004


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
