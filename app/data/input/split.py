"""The validation split: training-file rows held out of training, chosen by the seed.

``--validation-fraction f`` holds out ``round(f·n)`` of the training file's ``n`` rows (at
least one when f > 0, never all): the first rows of a permutation of ``range(n)`` drawn from
``numpy.random.default_rng([seed, 1, STREAM])``, a stream of its own (the batch order draws
its permutations from ``[seed, epoch]``). The rest are the training rows. Both are sorted,
disjoint, and together every row once; they depend only on (n, f, seed), so every worker of
a run, and a resumed run, hold out the same rows. The validation rows evaluate the model
while it trains, decide ``--target-loss`` and choose the exported step; the test file only
reports (docs/architecture.md, "Validation"). Never imports TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The split's random stream, apart from the batch order's (an arbitrary constant).
STREAM = 0x76616C


@dataclass(frozen=True)
class Split:
    """Rows of the training file: ``train`` and ``validation``, sorted int64 arrays."""

    train: np.ndarray
    validation: np.ndarray

    @property
    def validating(self) -> bool:
        """True when rows are held out for validation."""
        return len(self.validation) > 0


def evaluated(validation: np.ndarray, count: int, seed: int) -> np.ndarray:
    """The validation rows evaluated while training (``--eval-rows``): all of
    ``validation`` when ``count`` is 0 or not smaller; else ``count`` of them drawn by
    ``numpy.random.default_rng([seed, 2, STREAM])``, sorted. The same at every evaluation,
    in every worker and in a resumed run: a fixed sample, so the evaluations compare the
    steps on the same rows (docs/quality.md, "Evaluating a sample")."""
    if count <= 0 or count >= len(validation):
        return validation
    picked = np.random.default_rng([seed, 2, STREAM]).choice(len(validation), count, replace=False)
    return validation[np.sort(picked)]


def validation_count(n: int, fraction: float) -> int:
    """Rows held out of ``n`` for ``fraction`` in [0, 1): 0 for 0, else round(f·n) within
    [1, n − 1] (0 when n < 2: a single row can't be split)."""
    if fraction <= 0 or n < 2:
        return 0
    return min(max(round(fraction * n), 1), n - 1)


def evaluated_count(n: int, fraction: float, count: int) -> int:
    """How many validation rows of ``n`` training rows split by ``fraction`` are evaluated
    while training with ``--eval-rows`` ``count`` (:func:`evaluated`)."""
    held = validation_count(n, fraction)
    return min(held, count) if count > 0 else held


def split(n: int, fraction: float, seed: int) -> Split:
    """The training and validation rows of a training file of ``n`` rows (module docstring)."""
    count = validation_count(n, fraction)
    if count == 0:
        return Split(np.arange(n, dtype=np.int64), np.empty(0, np.int64))
    order = np.random.default_rng([seed, 1, STREAM]).permutation(n)
    return Split(np.sort(order[count:]).astype(np.int64), np.sort(order[:count]).astype(np.int64))
