"""Training configuration: frozen dataclasses holding the defaults (DESIGN.md "The model").

The CLI builds a :class:`TrainConfig` from options and environment variables;
``train()`` takes it as is. The resolved config is logged in the ``start`` event.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import ConfigError

DATA_FILE_NAMES = {
    "train_features": "train_features.txt",
    "train_labels": "train_labels.txt",
    "test_features": "test_features.txt",
    "test_labels": "test_labels.txt",
}


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs, with the seed's defaults.

    Units: steps are optimizer updates of one (global) batch; ``batch_size`` in
    samples; ``learning_rate`` per step before decay (×``lr_decay`` every
    ``lr_decay_steps`` steps, staircase); ``target_loss`` is a test RMSE in raw
    label units (training stops early once below it).
    """

    data_dir: Path
    output_dir: Path
    cache_dir: Path | None = None
    train_features: str = DATA_FILE_NAMES["train_features"]
    train_labels: str = DATA_FILE_NAMES["train_labels"]
    test_features: str = DATA_FILE_NAMES["test_features"]
    test_labels: str = DATA_FILE_NAMES["test_labels"]
    height: int = 20
    width: int = 195
    max_steps: int = 3300
    batch_size: int = 1000
    eval_every: int = 100
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    target_loss: float = 0.01
    learning_rate: float = 0.1
    lr_decay: float = 0.8
    lr_decay_steps: int = 200
    momentum: float = 0.8
    keep_prob: float = 0.5
    seed: int = 0
    standardize: bool = True
    allow_nonfinite: bool = False
    formulation: str = "fast"

    def __post_init__(self) -> None:
        positive = {
            "height": self.height,
            "width": self.width,
            "max_steps": self.max_steps,
            "batch_size": self.batch_size,
            "eval_every": self.eval_every,
            "checkpoint_every": self.checkpoint_every,
            "keep_checkpoints": self.keep_checkpoints,
            "lr_decay_steps": self.lr_decay_steps,
        }
        for name, value in positive.items():
            if value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if not self.learning_rate > 0:
            raise ConfigError(f"--learning-rate must be > 0, got {self.learning_rate}")
        if not 0 < self.keep_prob <= 1:
            raise ConfigError(f"--keep-prob must be in (0, 1], got {self.keep_prob}")
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"--momentum must be in [0, 1), got {self.momentum}")
        if not 0 < self.lr_decay <= 1:
            raise ConfigError(f"--lr-decay must be in (0, 1], got {self.lr_decay}")

    @property
    def resolved_cache_dir(self) -> Path:
        """The binary cache directory: ``--cache-dir`` or ``<output>/cache``."""
        return self.cache_dir if self.cache_dir is not None else self.output_dir / "cache"

    def data_path(self, role: str) -> Path:
        """Path of one data file; ``role`` is a key of :data:`DATA_FILE_NAMES`."""
        name: str = getattr(self, role)
        return self.data_dir / name

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (paths as strings)."""
        return {
            f.name: (str(v) if isinstance(v, Path) else v)
            for f in dataclasses.fields(self)
            for v in [getattr(self, f.name)]
        }
