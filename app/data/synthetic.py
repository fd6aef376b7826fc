"""Synthetic data sets in the seed's text format (they are not real data).

``demo`` (the quick start's): each sample is a 20×195 "spectrogram": 20 rows of a 195-bin
spectrum holding one Gaussian peak plus a sloped baseline and noise. The K = 3 labels are
the peak's centre (fraction of the axis), its width (fraction of the axis) and its
amplitude (arbitrary units); the peak drifts across the rows by an amount tied to the
width, so the network has to combine rows.

``lines`` (harder, K = 15): a decaying emission spectrum. Five Lorentzian lines, one in
each fifth of the axis, narrow (1–4 bins wide at 195 bins); the rows are 20 moments of a
decay whose rate differs per sample (a nuisance, not a label), on a curved background with
a per-row gain and signal-dependent noise. The labels are each line's centre, half width
and initial amplitude (5 × 3). The four files are one set (app/output.py ``write_set``):
each is written to a temporary, and renamed into place only when all four are written, so
a failure leaves the set that was there whole.
Never imports TensorFlow.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from app.errors import ConfigError, StorageError
from app.output import write_set

NUM_OUTPUTS = 3


def make_samples(
    n: int, rng: np.random.Generator, height: int = 20, width: int = 195
) -> tuple[np.ndarray, np.ndarray]:
    """Return (features (n, height, width) float32, labels (n, 3) float32)."""
    centre = rng.uniform(0.2, 0.8, n)
    sigma = rng.uniform(0.02, 0.08, n)
    amplitude = rng.uniform(0.5, 2.0, n)
    axis = np.linspace(0.0, 1.0, width)[None, None, :]
    rows = np.arange(height)[None, :, None] / max(height - 1, 1)
    drift = (sigma[:, None, None] * 2.0) * (rows - 0.5)
    peak = np.exp(
        -np.square(axis - centre[:, None, None] - drift) / (2 * np.square(sigma[:, None, None]))
    )
    slope = rng.normal(0.0, 0.2, (n, 1, 1))
    feats = amplitude[:, None, None] * peak + slope * axis + rng.normal(0, 0.05, peak.shape)
    labels = np.stack([centre, sigma, amplitude], axis=1)
    return feats.astype(np.float32), labels.astype(np.float32)


LINES = 5
KINDS = {"demo": 3, "lines": 3 * LINES}


def make_lines(
    n: int, rng: np.random.Generator, height: int = 20, width: int = 195
) -> tuple[np.ndarray, np.ndarray]:
    """The ``lines`` kind (module docstring): (features (n, height, width) float32,
    labels (n, 15) float32: centre, half width and amplitude of line 1, then line 2, …)."""
    band = (np.arange(LINES) + 0.5) / LINES
    centre = band + rng.uniform(-0.35, 0.35, (n, LINES)) / LINES
    half_width = rng.uniform(0.003, 0.012, (n, LINES))
    amplitude = rng.uniform(0.2, 1.5, (n, LINES))
    axis = np.linspace(0.0, 1.0, width)
    t = np.linspace(0.0, 1.0, height)
    decay = np.exp(-rng.uniform(0.3, 2.5, (n, 1)) * t)  # (n, height)
    gain = 1.0 + rng.normal(0.0, 0.03, (n, height))
    shape = 1.0 / (1.0 + np.square((axis - centre[..., None]) / half_width[..., None]))
    spectrum = np.einsum("nl,nlw->nw", amplitude, shape)  # (n, width)
    background = rng.normal(0.3, 0.1, (n, 1)) + rng.normal(0.0, 0.2, (n, 1)) * (axis - 0.5) ** 2
    signal = (decay * gain)[..., None] * spectrum[:, None, :] + background[:, None, :]
    noise = rng.normal(0.0, 1.0, signal.shape) * (0.02 + 0.03 * np.sqrt(np.abs(signal)))
    labels = np.stack([centre, half_width, amplitude], axis=2).reshape(n, 3 * LINES)
    return (signal + noise).astype(np.float32), labels.astype(np.float32)


def _text(rows: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    np.savetxt(buf, rows, fmt=fmt)
    return buf.getvalue()


def generate(
    out: Path, train: int = 3000, test: int = 600, seed: int = 0, height: int = 20,
    width: int = 195, kind: str = "demo",
) -> dict[str, Path]:  # fmt: skip
    """Write train/test features and labels of ``kind`` (:data:`KINDS`) to ``out``; return
    role → path.

    Raises ConfigError for non-positive sizes or an unknown kind, StorageError if ``out``
    can't be written.
    """
    if train < 1 or test < 1:
        raise ConfigError(f"--train and --test must be at least 1, got {train} and {test}")
    if kind not in KINDS:
        raise ConfigError(f"--kind must be one of {', '.join(KINDS)}, got {kind!r}")
    make = make_samples if kind == "demo" else make_lines
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{out}: --out is not a directory") from None
    except OSError as exc:
        raise StorageError(f"{out}: cannot make the directory: {exc.strerror}") from exc
    paths = {f"{split}_{role}": out / f"{split}_{role}.txt" for split in ("train", "test")
             for role in ("features", "labels")}  # fmt: skip
    write_set(_files(make, paths, train, test, seed, height, width), "data file")
    return paths


def _files(
    make: Callable[..., tuple[np.ndarray, np.ndarray]], paths: dict[str, Path], train: int,
    test: int, seed: int, height: int, width: int,
) -> Iterator[tuple[Path, bytes]]:  # fmt: skip
    """Each file of ``paths`` and its text, made as they are taken (one split at a time)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", train), ("test", test)):
        feats, labels = make(n, rng, height, width)
        yield paths[f"{split}_features"], _text(feats.reshape(n, -1), "%.4g")
        yield paths[f"{split}_labels"], _text(labels, "%.6g")
