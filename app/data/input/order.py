"""The training order: the positions each training step reads, a pure function of (seed, step).

Positions index the run's *training rows*: a sorted int64 array of row ids of the cache's
training split (all its rows by default; a subset when some rows are held out), so
position ``p`` is row ``rows[p]``. Positions next to each other are rows next to each
other in the cache file (or close, with held-out rows between them), which is what lets a
streamed run read blocks instead of single rows (:mod:`app.data.input.stream`).

Epoch ``e`` of ``m`` positions, with a global batch of ``B`` samples:

1. the positions are cut into blocks of :data:`BLOCK_ROWS` consecutive positions (the last
   block may be shorter), and the blocks shuffled: ``numpy.random.default_rng([seed, e])``;
2. that sequence is cut into windows of :data:`WINDOW_STEPS` × ``B`` positions (the last
   window may be shorter), and each window ``w`` shuffled as a whole:
   ``default_rng([seed, e, w])``.

The concatenation of the windows is a permutation of ``range(m)``: every position appears
exactly once per epoch. The epochs follow each other without a break, and batch ``s`` is
the slice ``[s·B, (s+1)·B)`` of that endless sequence. A split of at most
``WINDOW_STEPS × B`` positions is one window: its epochs are uniform random permutations.

How this compares with a full permutation of each epoch (docs/performance.md, "The
training order"): each batch is a uniform sample of its window, which holds
``WINDOW_STEPS × B / BLOCK_ROWS`` blocks drawn from the whole split, so a batch mixes
the whole set; only rows within :data:`BLOCK_ROWS` of each other in the file are more
likely than under a full permutation to share a window. Numpy only.
"""

from __future__ import annotations

import functools

import numpy as np

#: Consecutive training rows read together by a streamed run (62 KB of 20×195 features).
BLOCK_ROWS = 4
#: Steps whose rows are shuffled together (and which a streamed run reads as one chunk).
WINDOW_STEPS = 8


def window_size(batch_size: int) -> int:
    """Positions per shuffling window for a global batch of ``batch_size`` samples."""
    return WINDOW_STEPS * batch_size


@functools.lru_cache(maxsize=4)
def epoch_order(seed: int, epoch: int, n: int, window: int) -> np.ndarray:
    """Epoch ``epoch``'s order of the positions ``range(n)``: (n,) int64, read-only.

    Blocks of :data:`BLOCK_ROWS` shuffled, then windows of ``window`` positions shuffled
    (the module docstring). Cached: a run computes each epoch once.
    """
    blocks = -(-n // BLOCK_ROWS)
    starts = np.random.default_rng([seed, epoch]).permutation(blocks) * BLOCK_ROWS
    order = (starts[:, None] + np.arange(BLOCK_ROWS)).reshape(-1)
    order = order[order < n]  # the last block may be short
    for w, a in enumerate(range(0, n, window)):
        part = order[a : a + window]
        order[a : a + window] = part[np.random.default_rng([seed, epoch, w]).permutation(len(part))]
    order.setflags(write=False)
    return order


def batch_indices(seed: int, step: int, batch_size: int, n: int) -> np.ndarray:
    """Positions of global batch ``step`` (``batch_size`` samples of ``n``): (batch_size,)
    int64, in the order's sequence (not sorted)."""
    start = step * batch_size
    window = window_size(batch_size)
    out = np.empty(batch_size, np.int64)
    filled = 0
    while filled < batch_size:
        epoch, offset = divmod(start + filled, n)
        take = min(batch_size - filled, n - offset)
        out[filled : filled + take] = epoch_order(seed, epoch, n, window)[offset : offset + take]
        filled += take
    return out


def batch_rows(
    seed: int, step: int, batch_size: int, n: int, workers: int = 1, index: int = 0
) -> np.ndarray:
    """Positions of worker ``index`` of ``workers`` for ``step``: (batch_size,), int64, sorted.

    The global batch is the single-process batch of ``batch_size·workers`` samples
    (:func:`batch_indices`), sorted (rows in file order read fastest); this worker takes
    its positions ``index::workers``. The shards are disjoint and their union is the
    global batch; the training step uses the same positions of the global dropout mask.
    A single process is worker 0 of 1.
    """
    positions = np.sort(batch_indices(seed, step, batch_size * workers, n))
    return positions[index::workers]
