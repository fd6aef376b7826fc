"""Shared fixtures: a tiny generated data set and a runner for the real CLI."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.runs import Done

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# Small enough for seconds per run on 2 cores, big enough for several batches.
TINY = {"train": 240, "test": 60}
TINY_TRAIN_ARGS = ["--batch-size", "40", "--eval-every", "3", "--checkpoint-every", "3"]
#: The seed's recipe, which checkpoints of a coretrain before the run identity trained with
#: (app/training/state/identity.py, BEFORE): what a resume of such checkpoints must give.
SEED_RECIPE_ARGS = [
    "--optimizer", "sgd", "--learning-rate", "0.1", "--lr-schedule", "exponential",
    "--keep-prob", "0.5", "--validation-fraction", "0",
]  # fmt: skip
#: The smallest H×W the CNN takes (app/geometry.py): the options of runs on data made only
#: to reach a check of the data, whose feature lines :func:`widen` pads to its H·W values.
SMALLEST = ["--height", "8", "--width", "55"]
SMALLEST_VALUES = 8 * 55


def widen(text: bytes, fields: int = 6) -> bytes:
    """Feature lines of ``fields`` values as lines of :data:`SMALLEST_VALUES`: each line
    that is not blank gets ``0`` fields appended (a line short of ``fields`` stays as short,
    a bad field keeps its number)."""
    pad = b" 0" * (SMALLEST_VALUES - fields)
    return b"\n".join(line + pad if line.strip() else line for line in text.split(b"\n"))


# The suite's runs keep their data cache in their own output directory, as a run without a
# per-user cache directory does (app/data/cache/userdir.py: no HOME, no XDG_CACHE_HOME): each
# test's runs start from nothing and never share a cache or a kept measurement with another
# test's, and nothing is written into the home of whoever runs the suite. Tests of the
# per-user directory give their runs a HOME or XDG_CACHE_HOME of their own.
for _name in ("HOME", "XDG_CACHE_HOME"):
    os.environ.pop(_name, None)

# Runs a test compares must compute the same way: without this, --formulation auto and
# --precision auto would pick by timing, which the machine's load can change.
PINNED = {"CORETRAIN_FORMULATION": "fast", "CORETRAIN_PRECISION": "float32"}


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m app ARGS`` in a fresh process (TF settings are process-global)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    full_env.update(PINNED)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd or REPO,
    )


def popen_cli(*args: str) -> subprocess.Popen[str]:
    """``python -m app ARGS`` started in the background with :func:`run_cli`'s environment,
    its stdout and stderr pipes of text, for a test that acts while it runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    return subprocess.Popen(
        [sys.executable, "-m", "app", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**env, **PINNED}, cwd=REPO,
    )  # fmt: skip


def json_lines(text: str) -> list[dict]:
    """Parse every line as JSON (fails the test on any non-JSON line)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def events(records: list[dict], name: str) -> list[dict]:
    return [r for r in records if r.get("event") == name]


def assert_choice_reused(first: dict, again: list[dict]) -> bool:
    """The ``choice`` event ``first`` (a run that measured) against the records ``again`` of a
    later run sharing its cache: the choice is reused, timing nothing, when ``first`` kept it;
    timed again when its timing was noisy and ``first`` said it was not kept (the test suite's
    background runs load the CPUs: docs/architecture.md, "A choice that holds"). Returns
    whether it was kept."""
    (choice,) = events(again, "choice")
    kept = first["measurement"]["kept"]
    assert ("not kept" in first["reason"]) == (not kept), first["reason"]
    assert choice["source"] == ("cached" if kept else "measured"), (first, choice)
    assert bool(events(again, "choice_measured")) == (not kept)
    return bool(kept)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated demo data set: 240 train / 60 test samples of 20×195, K = 3."""
    from app.data import synthetic

    out = tmp_path_factory.mktemp("tiny-data")
    synthetic.generate(out, train=TINY["train"], test=TINY["test"], seed=1)
    return out


# Background training runs (tests/runs.py, which imports this module: the fixtures below
# import it where they use it).


@pytest.fixture(scope="session")
def pool() -> Iterator[ThreadPoolExecutor]:
    """The workers of the background training runs (tests/runs.py), two: the machine has 2
    cores."""
    from tests.runs import WORKERS

    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="train-run") as executor:
        yield executor


@pytest.fixture(scope="session")
def reference(
    pool: ThreadPoolExecutor, tiny_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Future[Done]:
    """The reference run, in the background: ``--max-steps 10 --batch-size 40 --eval-every 1
    --checkpoint-every 2 --keep-checkpoints 5 --seed 3`` (and a constant learning rate:
    tests/runs.py, ARGS) on the 240/60-sample tiny data set, so every step has a
    ``progress`` event with its loss and checkpoints 2, 4, 6, 8, 10 are on disk. Runs that
    need a finished training copy its output directory."""
    from tests.runs import train

    out = tmp_path_factory.mktemp("reference") / "out"
    return pool.submit(train, tiny_data, out)


def cache_dir(config: Any) -> Path:
    """The data cache directory of a run of the TrainConfig ``config`` in the suite's
    environment (above: no per-user directory): ``--cache-dir``, else OUTPUT/cache."""
    from app.training.state import workspace

    return workspace.for_run(config, environ={}).cache


def prepare_cache(config: Any, **kwargs: Any) -> Any:
    """``cache.prepare`` for a TrainConfig, as a training run calls it (one place for tests)."""
    from app.data import cache
    from app.training.admit.sources import find

    return cache.prepare(find(config.data), cache_dir(config), **kwargs)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged() -> Iterator[list[logging.LogRecord]]:
    """The project's log records (events) emitted during the test, in order."""
    from app import logs

    logs.setup(level=logging.INFO)
    handler = _Records()
    logging.getLogger(logs.LOGGER_NAME).addHandler(handler)
    yield handler.records
    logging.getLogger(logs.LOGGER_NAME).removeHandler(handler)
