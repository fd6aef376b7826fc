"""The linear baseline (app/training/inputs/linear.py): a ridge regression in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from app.training.inputs import linear


def _reference(x: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Ridge with an unpenalised intercept by the textbook normal equations."""
    mx, my = x.mean(0), y.mean(0)
    xc = x - mx
    lam = alpha * np.trace(xc.T @ xc) / x.shape[1]
    w = np.linalg.inv(xc.T @ xc + lam * np.eye(x.shape[1])) @ xc.T @ (y - my)
    return w, my - mx @ w


def test_a_noise_free_linear_map_is_recovered() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 12))
    w, b = rng.normal(size=(12, 3)), np.array([0.5, -1.0, 2.0])
    ridge = linear.fit(x, x @ w + b, held=80, alphas=(1e-9, 1e-2, 1.0))
    assert ridge.alpha == 1e-9  # the held-out rows prefer the least penalty
    np.testing.assert_allclose(ridge.weights, w, atol=1e-6)
    np.testing.assert_allclose(ridge.bias, b, atol=1e-6)


@pytest.mark.parametrize(("n", "d"), [(300, 20), (40, 200)])  # primal form, then dual
def test_each_form_matches_the_textbook_ridge(n: int, d: int) -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(n, d)), rng.normal(size=(n, 2))
    ridge = linear.fit(x, y, held=0, alphas=(0.3,))
    w, b = _reference(x, y, 0.3)
    np.testing.assert_allclose(ridge.weights, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ridge.bias, b, rtol=1e-5, atol=1e-6)


def test_the_penalty_is_chosen_on_the_held_out_rows() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(60, 50))
    y = x[:, :1] * 0.1 + rng.normal(size=(60, 1))  # mostly noise: a strong penalty wins
    assert linear.fit(x, y, held=20, alphas=(1e-6, 10.0)).alpha == 10.0


def test_no_row_left_to_fit_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        linear.fit(np.ones((5, 3)), np.ones((5, 1)), held=5)


@pytest.mark.parametrize(("rows", "d"), [(40_000, 3900), (3_000, 3900), (10**6, 10**5),
                                         (10**6, 16), (5, 3900)])  # fmt: skip
def test_the_sample_is_bounded_in_rows_work_and_memory(rows: int, d: int) -> None:
    n = linear.sample_size(rows, d)
    assert 1 <= n <= min(rows, linear.MAX_ROWS)
    assert n * min(n, d) * d <= linear.MAX_WORK or n == 1
    assert min(n, d) <= linear.MAX_GRAM
    if n < d:
        assert 8 * n * d <= linear.MAX_SAMPLE_BYTES
