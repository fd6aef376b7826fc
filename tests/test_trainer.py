"""The Trainer (app/training/loop/trainer.py) in this process on a tiny cache: the steps it
trains per call, its learning rate, and its evaluation against a reading by hand. The same
parts in a whole run are pinned by tests/test_step.py and the CLI's tests."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from app.config import RecipeConfig, TrainConfig
from app.data.input import pipeline
from app.data.input import split as split_lib
from app.training.loop import recipe
from app.training.loop.replicas import Replicas
from app.training.loop.trainer import Trainer
from app.training.state.choose import Choice
from tests.conftest import prepare_cache

RECIPE = RecipeConfig(batch_size=16, learning_rate=0.01, seed=3)


@pytest.fixture(scope="module")
def trained(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    out = tmp_path_factory.mktemp("trainer")
    data = prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=out))
    rows = split_lib.split(data.train_size, 0.1, RECIPE.seed)
    computed = Choice("fast", "float32", "as asked", {})
    trainer = Trainer(RECIPE, 10, computed, data, Replicas(), rows, threads=1)
    batches = pipeline.train_input(
        data, 1, seed=RECIPE.seed, batch_size=RECIPE.batch_size, start_step=0,
        end_step=10, rows=rows.train, stats=trainer.stats,
    )  # fmt: skip
    trainer.feed(batches)
    return trainer, data, rows, [trainer.train(3, lambda: False), trainer.train(2, lambda: True)]


def test_each_call_trains_its_steps_and_reports_the_stop_request(trained: tuple) -> None:
    trainer, _, _, (first, second) = trained
    assert len(first.losses) == 3 and len(second.losses) == 2
    assert all(math.isfinite(x) for x in [*first.losses, *second.losses])
    assert (first.stop, second.stop) == (False, True)
    assert trainer.train_step.global_step == 5


def test_the_learning_rate_is_the_recipes(trained: tuple) -> None:
    trainer = trained[0]
    expected = recipe.schedule(RECIPE, 10)
    assert [trainer.learning_rate(s) for s in (0, 1, 5)] == pytest.approx(
        [float(expected(s)) for s in (0, 1, 5)]
    )


def test_evaluation_is_the_rmse_of_the_predictions_in_label_units(trained: tuple) -> None:
    trainer, data, rows, _ = trained
    for split, x, y in [
        ("test", data.features("test"), data.labels("test")),
        ("validation", data.features("train")[rows.validation],
         data.labels("train")[rows.validation]),
    ]:  # fmt: skip
        xs = trainer.standardize_x(np.asarray(x, np.float32)[..., None])
        err = np.asarray(trainer.predict(xs)) - np.asarray(y)
        assert trainer.evaluate(split) == pytest.approx(math.sqrt(np.mean(err**2)), rel=1e-4)
    assert trainer.eval_split == "validation"


def test_validation_gathered_from_a_held_split_is_the_rmse_read_from_the_cache(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fed a split held in memory, the trainer gathers its validation rows from it: the
    same batches and operations as reading them, so the same RMSE to the bit; and it
    computes in the formulation chosen for evaluation, not the step's."""
    data = prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path))
    rows = split_lib.split(data.train_size, 0.1, RECIPE.seed)
    computed = Choice("fast", "float32", "as asked", {}, evaluation="plain")
    trainer = Trainer(RECIPE, 10, computed, data, Replicas(), rows, threads=1)
    read = trainer.evaluate("validation")
    batches = pipeline.train_input(
        data, 1, seed=RECIPE.seed, batch_size=RECIPE.batch_size, start_step=0,
        end_step=10, rows=rows.train, stats=trainer.stats, resident=True,
    )  # fmt: skip
    trainer.feed(batches)

    def unread(*args: object) -> None:
        raise AssertionError("the validation rows were read from the cache file")

    with monkeypatch.context() as patched:
        patched.setattr(type(data), "read_rows", unread)
        assert trainer.evaluate("validation") == read
    assert trainer.evaluate("test") > 0
    x = trainer.standardize_x(np.asarray(data.features("test")[:8], np.float32)[..., None])
    plain = trainer.model.infer(x, "plain") * trainer.l_std + trainer.l_mean
    np.testing.assert_array_equal(np.asarray(trainer.predict(x)), np.asarray(plain))
    fast = np.asarray(trainer.model.infer(x, "fast"))
    np.testing.assert_allclose(np.asarray(trainer.model.infer(x, "plain")), fast, atol=1e-5)


@pytest.mark.parametrize(
    ("rounded", "hold"), [(False, True), (False, False), (True, True)],
    ids=["streamed-held", "streamed-read", "held-rounded"],
)  # fmt: skip
def test_validation_not_gathered_from_the_split_held_once_is_the_rmse_read_at_each(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounded: bool,
    hold: bool,
) -> None:  # fmt: skip
    """Fed a streamed split, or one held as the rows rounded to bfloat16 (not the rows
    evaluated), with ``hold_validation`` the trainer reads the validation rows once and
    gathers them from memory at every evaluation (the same batches and operations: the
    same RMSE to the bit); without it, it reads them at each."""
    data = prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path))
    rows = split_lib.split(data.train_size, 0.1, RECIPE.seed)
    computed = Choice("fast", "bfloat16" if rounded else "float32", "as asked", {})
    trainer = Trainer(RECIPE, 10, computed, data, Replicas(), rows, threads=1)
    read = trainer.evaluate("validation")
    source = pipeline.rounded_source(data, computed.precision, True, make=True)
    batches = pipeline.train_input(
        data, 1, seed=RECIPE.seed, batch_size=RECIPE.batch_size, start_step=0,
        end_step=10, rows=rows.train, stats=trainer.stats, resident=rounded, source=source,
    )  # fmt: skip
    assert (batches.resident is not None and batches.resident.rounded) is rounded
    trainer.feed(batches, hold_validation=hold)
    reads: list[int] = []
    real = type(data).read_rows

    def counted(self: object, *args: object) -> object:
        reads.append(1)
        return real(self, *args)

    with monkeypatch.context() as patched:
        patched.setattr(type(data), "read_rows", counted)
        assert trainer.evaluate("validation") == read
    assert (len(reads) == 0) is hold


def test_validation_evaluates_a_fixed_sample_of_eval_rows(tiny_data: Path, tmp_path: Path) -> None:
    data = prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp_path))
    rows = split_lib.split(data.train_size, 0.25, RECIPE.seed)
    computed = Choice("fast", "float32", "as asked", {})
    trainer = Trainer(RECIPE, 10, computed, data, Replicas(), rows, threads=1, eval_rows=20)
    sample = split_lib.evaluated(rows.validation, 20, RECIPE.seed)
    assert np.array_equal(trainer.evaluated, sample) and len(rows.validation) > 20
    x = trainer.standardize_x(np.asarray(data.features("train")[sample], np.float32)[..., None])
    err = np.asarray(trainer.predict(x)) - np.asarray(data.labels("train")[sample])
    assert trainer.evaluate("validation") == pytest.approx(math.sqrt(np.mean(err**2)), rel=1e-5)
