"""The recipe (app/training/loop/recipe.py): the learning rate at chosen steps under each
schedule, and the optimizer of each name, from the recipe's options alone."""

from __future__ import annotations

import keras
import pytest

from app.config import RecipeConfig
from app.training.loop import recipe


def _lr(config: RecipeConfig, max_steps: int, *steps: int) -> list[float]:
    schedule = recipe.schedule(config, max_steps)
    return [float(schedule(step)) for step in steps]


def test_cosine_warms_up_over_a_tenth_then_decays_to_zero() -> None:
    lr = _lr(RecipeConfig(learning_rate=0.01), 1000, 0, 50, 100, 550, 1000)
    assert lr == pytest.approx([0.0, 0.005, 0.01, 0.005, 0.0], abs=1e-7)


def test_an_explicit_warmup_is_cut_to_leave_one_step_of_decay() -> None:
    lr = _lr(RecipeConfig(learning_rate=0.1, lr_warmup_steps=50), 10, 0, 9, 10)
    assert lr == pytest.approx([0.0, 0.1, 0.0], abs=1e-7)  # warmup 9 steps, not 50
    no_warmup = _lr(RecipeConfig(learning_rate=0.1, lr_warmup_steps=0), 10, 0, 5)
    assert no_warmup == pytest.approx([0.1, 0.05], abs=1e-7)


def test_exponential_decays_in_stairs_and_constant_stays() -> None:
    seed = RecipeConfig(learning_rate=0.1, lr_schedule="exponential", lr_decay=0.8)
    assert _lr(seed, 3300, 0, 199, 200, 400) == pytest.approx([0.1, 0.1, 0.08, 0.064])
    constant = RecipeConfig(learning_rate=0.05, lr_schedule="constant")
    assert _lr(constant, 3300, 0, 3299) == pytest.approx([0.05, 0.05])


@pytest.mark.parametrize(
    ("name", "kind", "attribute", "value"),
    [("sgd", keras.optimizers.SGD, "momentum", 0.5),
     ("adamw", keras.optimizers.AdamW, "weight_decay", 0.01),
     ("adam", keras.optimizers.Adam, None, None)],
)  # fmt: skip
def test_each_optimizer_name_gives_its_keras_optimizer(
    name: str, kind: type, attribute: str | None, value: float | None
) -> None:
    config = RecipeConfig(optimizer=name, momentum=0.5, weight_decay=0.01)
    built = recipe.optimizer(config, 0.1)
    assert type(built) is kind
    if attribute is not None:
        assert getattr(built, attribute) == pytest.approx(value)
