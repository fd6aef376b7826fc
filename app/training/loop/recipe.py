"""The training recipe: the run's optimizer and learning-rate schedule, both Keras'.

``--optimizer`` names one of Keras' optimizers (``keras.optimizers.SGD`` with
``--momentum``, ``Adam``, ``AdamW`` with ``--weight-decay``), ``--lr-schedule`` one of its
schedules: ``exponential`` (``ExponentialDecay``, staircase: × ``--lr-decay`` every
``--lr-decay-steps`` steps, the seed's), ``cosine`` (``CosineDecay`` from
``--learning-rate`` to 0 at ``--max-steps``, after ``--lr-warmup-steps`` of linear warmup
from 0, by default a tenth of ``--max-steps``) or ``constant``. The default recipe and the
table it was chosen from are in docs/quality.md; the seed's recipe is reachable with
options (README, "The seed's recipe").
"""

from __future__ import annotations

from typing import Any

import keras

from app.config import RecipeConfig


def schedule(config: RecipeConfig, max_steps: int) -> Any:
    """The learning rate as a function of the step (a Keras ``LearningRateSchedule``) of a
    run to ``max_steps`` (the cosine's horizon)."""
    if config.lr_schedule == "exponential":
        return keras.optimizers.schedules.ExponentialDecay(
            config.learning_rate, config.lr_decay_steps, config.lr_decay, staircase=True
        )
    if config.lr_schedule == "cosine":
        asked = max_steps // 10 if config.lr_warmup_steps is None else config.lr_warmup_steps
        warmup = min(asked, max_steps - 1)
        if warmup < 1:
            return keras.optimizers.schedules.CosineDecay(config.learning_rate, max_steps)
        return keras.optimizers.schedules.CosineDecay(
            0.0, max_steps - warmup, warmup_target=config.learning_rate, warmup_steps=warmup
        )
    return keras.optimizers.schedules.PolynomialDecay(
        config.learning_rate, 1, config.learning_rate
    )  # constant: a schedule too, so the checkpoint layout does not depend on the choice


def optimizer(config: RecipeConfig, learning_rate: Any) -> keras.optimizers.Optimizer:
    """A fresh, unbuilt optimizer of ``config.optimizer`` with ``learning_rate`` (a float
    or a schedule)."""
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate=learning_rate, momentum=config.momentum)
    if config.optimizer == "adamw":
        return keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=config.weight_decay)
    return keras.optimizers.Adam(learning_rate=learning_rate)
