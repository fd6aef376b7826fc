"""The run's inputs, before TensorFlow starts: the data cache, its memory, the validation
split and the baselines.

The text files are parsed once into the binary cache (or the cache is reused) and checked,
so bad input fails in a fraction of a second with one line (exit 3); the run's expected
peak memory is compared with the memory limit (exit 8); the validation rows are drawn by
seed (app/data/input/split.py) and the baselines fitted (app/training/inputs/baselines.py). No
TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app import logs
from app.budget.memory import MIB
from app.budget.plan import ThreadPlan
from app.config import TrainConfig
from app.data import cache as cache_lib
from app.data.cache import measured
from app.data.formats.sources import ROLES, Sources, find, in_container
from app.data.input import split as split_lib
from app.data.input.split import Split
from app.errors import DataError
from app.training.inputs import baselines, peak_memory


@dataclass(frozen=True)
class Inputs:
    """What the run trains and is judged on: the cache, its training and validation rows
    (``rows``), and the baselines' RMSEs (``reference``)."""

    data: cache_lib.DataCache
    rows: Split
    reference: baselines.Baselines


def complete(
    config: TrainConfig, plan: ThreadPlan, data: cache_lib.DataCache,
    store: measured.Store | None = None,
) -> Inputs:  # fmt: skip
    """The inputs of the run on ``data`` (the cache :func:`load_data` returned): the memory
    check, the split and the baselines (the ridge kept in ``store``, beside the data cache).
    Raises MemoryBudgetExceeded (exit 8)."""
    check_memory(config, data, plan)
    rows = split_lib.split(data.train_size, config.data.validation_fraction, config.recipe.seed)
    reference = baselines.measure(
        data, rows, config.recipe.seed, plan.intra_op_threads, store, config.schedule.eval_rows
    )
    return Inputs(data, rows, reference)


def sources(config: TrainConfig) -> Sources:
    """The data files (found in the directory ``config.data.data_dir``, or its four arrays
    when it is a .npz or HDF5 file: app/data/formats/sources.py) and the parse settings of
    ``config``. Raises DataError (a missing file), ConfigError (two candidates for one
    role)."""
    given = config.data
    data, names = given.data_dir, {role: getattr(given, role) for role in ROLES}
    if data.is_file():
        paths, members = dict.fromkeys(ROLES, data), in_container(data, names)
    else:
        paths, members = {role: find(data, role, names[role]) for role in ROLES}, {}
    return Sources(paths, given.height, given.width, given.allow_nonfinite, members=members)


def load_data(
    config: TrainConfig,
    cache_dir: Path,
    plan: ThreadPlan,
    stop: Callable[[], bool],
    below: Path | None = None,
    found: Sources | None = None,
    key: str | None = None,
) -> cache_lib.DataCache:
    """Parse the text files once into the binary cache (or reuse it) and check it.

    Large files are parsed in as many threads as TensorFlow gets intra-op threads.
    ``below``: the directory the operator named that ``cache_dir`` lies in (the
    workspace's ``cache_top``). ``found`` and ``key``: :func:`sources` of ``config`` and
    their cache key, when the caller has them already. Raises DataError for bad input
    (InputTooLarge past the cache's bound: app/data/cache/bounds.py), and when NaN/Inf
    values (let in by --allow-nonfinite) make the standardisation statistics non-finite.
    """
    found = found or sources(config)
    data = cache_lib.prepare(
        found, cache_dir, stop=stop, threads=plan.intra_op_threads, below=below,
        max_bytes=config.cache.max_cache_bytes,
        keep=cache_lib.Keep(config.cache.cache_keep, config.cache.cache_keep_bytes), key=key,
    )  # fmt: skip
    if config.data.standardize:
        for role, stats in (
            ("train_features", (data.feature_mean, data.feature_std)),
            ("train_labels", (data.label_mean, data.label_std)),
        ):
            if not all(np.isfinite(s).all() for s in stats):
                raise DataError(
                    f"{found.label(role)}: NaN/Inf values (allowed by --allow-nonfinite) "
                    "make the standardisation statistics NaN/Inf; train with --no-standardize, "
                    "or remove them"
                )
    return data


def _evaluated_rows(config: TrainConfig, data: cache_lib.DataCache) -> int:
    """How many validation rows the run evaluates while it trains (``--eval-rows`` of the
    validation split at most; app/data/input/split.py)."""
    n = split_lib.validation_count(data.train_size, config.data.validation_fraction)
    eval_rows = config.schedule.eval_rows
    return min(n, eval_rows) if eval_rows > 0 else n


def check_memory(config: TrainConfig, data: cache_lib.DataCache, plan: ThreadPlan) -> None:
    """The expected peak memory against the memory limit (app/training/inputs/peak_memory.py),
    logged as the ``memory`` event. Raises MemoryBudgetExceeded (exit 8) when it can't fit."""
    found = peak_memory.peak(
        rows=data.train_size, height=data.height, width=data.width,
        outputs=data.num_outputs, batch_size=config.recipe.batch_size,
        memory_limit=plan.memory_limit, validation_rows=_evaluated_rows(config, data),
    )  # fmt: skip
    logs.event(
        "memory",
        f"expected peak memory {found.total / MIB:,.0f} MiB"
        + (f" of a {plan.memory_limit / MIB:,.0f} MiB limit" if plan.memory_limit else ""),
        memory_limit=plan.memory_limit,
        **found.to_json(),
    )
    peak_memory.check(found, plan.memory_limit, config.recipe.batch_size)
