"""The seed CNN's layer sizes and the spatial size of every stage for an H×W input.

The architecture is app/model/__init__.py's docstring; the model (app/model/) builds its
layers from these sizes. No TensorFlow here: the options are checked against them before a
run converts, fits or times anything (app/training/admit/shape.py), so a run whose
``--height``/``--width`` the CNN can't take ends in a second, not after its conversion.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.errors import ConfigError

FILTERS = 5
CONV1_KERNEL = (3, 30)
CONV1_STRIDE = 5  # along the width; 1 along the height
CONV2_KERNEL = (2, 2)
CONV2_BIAS_INIT = 0.1
DENSE_UNITS = 20


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
