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
products; see app/model/fast_formulation.py. Both formulations own the same
layers and variables under the same names (``conv1/kernel`` (3, 30, 1, 5),
``conv1/bias``, ``conv2/kernel`` (2, 2, 5, 5), ``conv2/bias``,
``dense1/kernel`` (160, 20), ...), so a checkpoint or ``.keras`` file written by
one restores into the other.

Modules: :mod:`app.geometry` (sizes, no TensorFlow), :mod:`app.model.fast_formulation` (the fast
formulation), :mod:`app.model.cnn` (the Keras model), :mod:`app.model.loss` (dropout and the loss).
Importing the package registers the model with Keras (``.keras`` files load).
"""

from __future__ import annotations

from app.geometry import Geometry, geometry
from app.model.cnn import FORMULATIONS, PRECISIONS, SeedCNN, build_model, stock
from app.model.fast_formulation import PHASES, fast_tables, matmul_maxpool
from app.model.loss import dropout, forward, regularized_loss, weight_decay

__all__ = [
    "FORMULATIONS", "PHASES", "PRECISIONS", "Geometry", "SeedCNN", "build_model", "dropout",
    "fast_tables", "forward", "geometry", "matmul_maxpool", "regularized_loss", "stock",
    "weight_decay",
]  # fmt: skip
