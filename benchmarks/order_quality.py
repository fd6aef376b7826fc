"""The training order (app/data/input/order.py) against a full permutation of each epoch.

``python -m benchmarks.order_quality [--rows 810901] [--batch 1000] [--epochs 3]``
(numpy only, ~10 s). Rows whose order in the file carries no information (exchangeable
rows) give batches with exactly the same distribution under both orders, so the measure is
the worst case for a block order: a file **sorted** by the quantity measured, here the
row's own position ``u = row / n`` (uniform on [0, 1), variance 1/12). For each order it
reports, over every batch of ``--epochs`` epochs:

* the variance of the batch mean of ``u``, and its ratio to the full permutation's
  (``1/12 / B × (1 − B/n)`` in theory; 1 would be as good as a full permutation);
* the correlation of the means of consecutive batches (lag 1 and lag ``WINDOW_STEPS``:
  batches of one window share its blocks);
* the share of a batch's rows that come from distinct blocks of ``BLOCK_ROWS`` rows, and the
  span of the set a batch draws from (the smallest and largest ``u`` of its rows);
* that every row appears exactly once per epoch.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from app.data.input import order


def _batches(kind: str, seed: int, n: int, batch: int, steps: int) -> np.ndarray:
    """(steps, batch) rows of the first ``steps`` batches under ``kind``."""
    if kind == "blocks":
        return np.stack([order.batch_indices(seed, s, batch, n) for s in range(steps)])
    out = np.empty((steps, batch), np.int64)
    for s in range(steps):  # the previous order: a full permutation of each epoch
        start, filled = s * batch, 0
        while filled < batch:
            epoch, offset = divmod(start + filled, n)
            perm = _perm(seed, epoch, n)
            take = min(batch - filled, n - offset)
            out[s, filled : filled + take] = perm[offset : offset + take]
            filled += take
    return out


_PERMS: dict[tuple[int, int, int], np.ndarray] = {}


def _perm(seed: int, epoch: int, n: int) -> np.ndarray:
    key = (seed, epoch, n)
    if key not in _PERMS:
        _PERMS.clear()
        _PERMS[key] = np.random.default_rng([seed, epoch]).permutation(n)
    return _PERMS[key]


def _corr(means: np.ndarray, lag: int) -> float:
    a, b = means[:-lag] - means.mean(), means[lag:] - means.mean()
    return float(np.sum(a * b) / np.sqrt(np.sum(a * a) * np.sum(b * b)))


def measure(kind: str, n: int, batch: int, epochs: int, seed: int = 0) -> dict[str, float]:
    steps = epochs * n // batch
    rows = _batches(kind, seed, n, batch, steps)
    u = rows / n
    means = u.mean(axis=1)
    once = all(
        np.array_equal(np.sort(rows.reshape(-1)[e * n : (e + 1) * n]), np.arange(n))
        for e in range(epochs)
        if (e + 1) * n <= steps * batch
    )
    blocks = [len(np.unique(r // order.BLOCK_ROWS)) / batch for r in rows[:200]]
    return {
        "batch_mean_variance": float(means.var()),
        "lag1_correlation": round(_corr(means, 1), 4),
        f"lag{order.WINDOW_STEPS}_correlation": round(_corr(means, order.WINDOW_STEPS), 4),
        "distinct_blocks_per_row": round(float(np.mean(blocks)), 4),
        "min_u_mean": round(float(u.min(axis=1).mean()), 5),
        "max_u_mean": round(float(u.max(axis=1).mean()), 5),
        "each_row_once_per_epoch": once,
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=810_901)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    report: dict[str, object] = {
        "rows": args.rows, "batch": args.batch, "epochs": args.epochs,
        "block_rows": order.BLOCK_ROWS, "window_steps": order.WINDOW_STEPS,
        "theory_full_permutation_variance": (1 / 12) / args.batch * (1 - args.batch / args.rows),
    }  # fmt: skip
    for kind in ("full_permutation", "blocks"):
        report[kind] = measure(kind, args.rows, args.batch, args.epochs)
    full = report["full_permutation"]["batch_mean_variance"]  # type: ignore[index]
    ours = report["blocks"]["batch_mean_variance"]  # type: ignore[index]
    report["variance_ratio_blocks_over_full"] = round(ours / full, 3)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
