"""The run's inputs, before TensorFlow starts, from its admitted data
(app/training/admit/): the validation rows drawn by seed (app/data/input/split.py) and the
baselines the run is judged against (app/training/inputs/baselines.py). No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.data import cache as cache_lib
from app.data.cache import measured
from app.data.input import split as split_lib
from app.data.input.split import Split
from app.training.inputs import baselines


@dataclass(frozen=True)
class Inputs:
    """What the run trains and is judged on: the cache, its training and validation rows
    (``rows``), and the baselines' RMSEs (``reference``)."""

    data: cache_lib.DataCache
    rows: Split
    reference: baselines.Baselines


def load(
    data: cache_lib.DataCache, validation_fraction: float, seed: int, eval_rows: int,
    threads: int, store: measured.Store | None = None,
) -> Inputs:  # fmt: skip
    """The inputs of a run on ``data``: the split by ``seed`` (``validation_fraction`` of
    the training rows held out) and the baselines on the ``eval_rows`` evaluated
    (``--eval-rows``), the ridge fitted in ``threads`` BLAS threads and kept in ``store``,
    beside the data cache."""
    rows = split_lib.split(data.train_size, validation_fraction, seed)
    reference = baselines.measure(data, rows, seed, threads, store, eval_rows)
    return Inputs(data, rows, reference)
