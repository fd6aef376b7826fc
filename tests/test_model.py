"""The seed CNN: shapes, plain vs fast (same function, one checkpoint layout), dropout, loss.

Comparisons between the formulations use an absolute tolerance of 1e-5 (inputs are
standardised, outputs are O(1) and gradients O(0.01–0.1); observed differences are
~1e-7, float32 summation order). Every gradient comparison also checks that the gradient
is far from zero, so a match is not a match of two zeros.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from app import model as model_lib
from app.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
EPS32 = float(np.finfo(np.float32).eps)  # 1.19e-7: one ulp at 1.0
# Fast vs plain: the same float32 function with the sums in another order (conv1 sums 90
# products per output, its gradients sum over the whole batch), so each value may differ by
# rounding in each of those sums; for values and gradients of magnitude ~1, 1e-5 is ~80 ulps,
# above what reordering sums of that length gives and far below any real formula error.
ATOL = 1e-5
K = 3


def inputs(n: int, height: int = 20, width: int = 195, seed: int = 0) -> tuple:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, height, width, 1)).astype(np.float32)
    y = rng.standard_normal((n, K)).astype(np.float32)
    return tf.constant(x), tf.constant(y)


def pair(height: int = 20, width: int = 195, seed: int = 0) -> tuple:
    plain = model_lib.build_model(K, height=height, width=width, seed=seed, formulation="plain")
    fast = model_lib.build_model(K, height=height, width=width, seed=seed + 1, formulation="fast")
    fast.set_weights(plain.get_weights())
    return plain, fast


def loss_and_grads(model, x, y, dropout_seed=None, wrt_input=False):
    with tf.GradientTape() as tape:
        if wrt_input:
            tape.watch(x)
        pred = model_lib.forward(model, x, dropout_seed=dropout_seed)
        loss, _ = model_lib.regularized_loss(model, pred, y)
    sources = [x] if wrt_input else model.trainable_variables
    return pred, tape.gradient(loss, sources)


def assert_same_grads(ga, gb, names):
    assert len(ga) == len(gb) == len(names)
    for a, b, name in zip(ga, gb, names, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.max(np.abs(a)) > 1e-3, f"{name}: gradient is ~0, the comparison proves nothing"
        np.testing.assert_allclose(b, a, rtol=0, atol=ATOL, err_msg=name)


@pytest.fixture(scope="module")
def models():
    return pair()


# --- shapes ---------------------------------------------------------------


def test_plain_layer_output_shapes_follow_the_spec(models) -> None:
    plain, _ = models
    x, _ = inputs(3)
    shapes = []
    h = x
    for layer in (plain.conv1, plain.pool1, plain.conv2, plain.pool2, plain.flatten):
        h = layer(h)
        shapes.append(tuple(h.shape))
    assert shapes == [(3, 18, 34, 5), (3, 9, 17, 5), (3, 8, 16, 5), (3, 4, 8, 5), (3, 160)]
    assert tuple(plain.dense1(h).shape) == (3, 20)


@pytest.mark.parametrize("formulation", model_lib.FORMULATIONS)
def test_model_maps_n_h_w_1_to_n_k(formulation: str) -> None:
    m = model_lib.build_model(4, seed=2, formulation=formulation)
    x, _ = inputs(5)
    assert tuple(m(x).shape) == (5, 4)
    assert m.conv1.kernel.shape == (3, 30, 1, 5)
    assert m.dense1.kernel.shape == (160, 20)
    np.testing.assert_array_equal(m.conv2.bias.numpy(), np.full(5, 0.1, np.float32))


def test_geometry_of_the_default_input() -> None:
    g = model_lib.geometry(20, 195)
    assert (g.conv1, g.pool1, g.conv2, g.pool2, g.flat) == (
        (18, 34),
        (9, 17),
        (8, 16),
        (4, 8),
        160,
    )


def test_initial_weights_depend_only_on_the_seed() -> None:
    a = model_lib.build_model(K, seed=5, formulation="plain").get_weights()
    b = model_lib.build_model(K, seed=5, formulation="fast").get_weights()
    c = model_lib.build_model(K, seed=6, formulation="plain").get_weights()
    for wa, wb in zip(a, b, strict=True):
        np.testing.assert_array_equal(wa, wb)
    assert not np.array_equal(a[0], c[0])


# --- same function ----------------------------------------------------------


@pytest.mark.parametrize("with_dropout", [False, True])
def test_fast_matches_plain_outputs_and_gradients(models, with_dropout: bool) -> None:
    plain, fast = models
    x, y = inputs(24, seed=3)
    seed = tf.constant([7, 11], tf.int64) if with_dropout else None
    pa, ga = loss_and_grads(plain, x, y, seed)
    pb, gb = loss_and_grads(fast, x, y, seed)
    np.testing.assert_allclose(pb.numpy(), pa.numpy(), rtol=0, atol=ATOL)
    assert np.std(pa.numpy()) > 1e-2
    assert_same_grads(ga, gb, [v.path for v in plain.trainable_variables])


@pytest.mark.parametrize(
    ("height", "width"),
    [(20, 197), (13, 112), (9, 55)],
    ids=["width-not-on-stride", "odd-conv-rows-and-columns", "smallest"],
)
def test_fast_matches_plain_for_other_input_sizes(height: int, width: int) -> None:
    plain, fast = pair(height, width, seed=4)
    x, y = inputs(16, height, width, seed=5)
    pa, ga = loss_and_grads(plain, x, y)
    pb, gb = loss_and_grads(fast, x, y)
    np.testing.assert_allclose(pb.numpy(), pa.numpy(), rtol=0, atol=ATOL)
    assert_same_grads(ga, gb, [v.path for v in plain.trainable_variables])


def test_pool_ties_route_the_gradient_to_the_first_maximum_like_max_pool(models) -> None:
    # Zero input blocks make all four conv1 outputs of a pool window equal (the bias
    # keeps them above the ReLU's kink), and so some conv2 windows too. max_pool2d
    # sends the window's gradient to its first element; reduce_max would split it,
    # which the input gradient shows.
    plain, fast = pair(seed=8)
    for m in (plain, fast):
        m.conv1.bias.assign(np.full(5, 0.3, np.float32))
    x, y = inputs(6, seed=9)
    x = x.numpy()
    x[:, 4:12, 40:120] = 0.0
    x = tf.constant(x)
    _, (dxa,) = loss_and_grads(plain, x, y, wrt_input=True)
    _, (dxb,) = loss_and_grads(fast, x, y, wrt_input=True)
    assert np.max(np.abs(dxa.numpy())) > 1e-3
    np.testing.assert_allclose(dxb.numpy(), dxa.numpy(), rtol=0, atol=ATOL)


def test_fast_train_step_matches_plain_inside_tf_function(models) -> None:
    plain, fast = pair(seed=12)
    x, y = inputs(16, seed=13)
    results = []
    for m in (plain, fast):
        opt = keras.optimizers.SGD(0.1, momentum=0.8)
        opt.build(m.trainable_variables)

        @tf.function
        def step(x, y, s, m=m, opt=opt):
            with tf.GradientTape() as tape:
                pred = model_lib.forward(m, x, dropout_seed=tf.stack([tf.constant(1, tf.int64), s]))
                loss, _ = model_lib.regularized_loss(m, pred, y)
            grads = tape.gradient(loss, m.trainable_variables)
            opt.apply_gradients(zip(grads, m.trainable_variables, strict=True))
            return loss

        losses = [float(step(x, y, tf.constant(i, tf.int64))) for i in range(3)]
        results.append((losses, m.get_weights()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=0, atol=ATOL)
    for wa, wb in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_allclose(wb, wa, rtol=0, atol=ATOL)
    assert results[0][0][2] != results[0][0][0]


def test_forward_runs_under_a_distribution_strategy() -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        m = model_lib.build_model(K, seed=3, formulation="fast")
    x, y = inputs(8, seed=4)

    @tf.function
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            pred = model_lib.forward(m, x, dropout_seed=tf.constant([1, 2], tf.int64))
            loss, _ = model_lib.regularized_loss(m, pred, y)
        return loss, tape.gradient(loss, m.trainable_variables)

    loss, grads = strategy.run(replica_step, args=(x, y))
    _, expected = loss_and_grads(m, x, y, tf.constant([1, 2], tf.int64))
    assert np.isfinite(float(loss))
    for g, e in zip(grads, expected, strict=True):
        np.testing.assert_allclose(np.asarray(g), e.numpy(), rtol=0, atol=1e-6)


# --- one checkpoint layout ---------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), [("plain", "fast"), ("fast", "plain")])
def test_checkpoint_of_one_formulation_restores_into_the_other(
    tmp_path: Path, src: str, dst: str
) -> None:
    a = model_lib.build_model(K, seed=20, formulation=src)
    b = model_lib.build_model(K, seed=21, formulation=dst)
    x, _ = inputs(8, seed=22)
    assert np.max(np.abs(a(x).numpy() - b(x).numpy())) > 1e-3
    path = tf.train.Checkpoint(model=a).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=b).restore(path).assert_consumed()
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(wb, wa)
    np.testing.assert_allclose(b(x).numpy(), a(x).numpy(), rtol=0, atol=ATOL)


def test_both_formulations_have_the_same_variable_names() -> None:
    names = {
        f: [v.path for v in model_lib.build_model(K, formulation=f).variables]
        for f in model_lib.FORMULATIONS
    }
    assert names["plain"] == names["fast"]
    assert names["plain"][0] == "seed_cnn/conv1/kernel"


@pytest.mark.parametrize("formulation", model_lib.FORMULATIONS)
def test_keras_file_round_trip_gives_the_same_outputs(tmp_path: Path, formulation: str) -> None:
    m = model_lib.build_model(K, seed=30, formulation=formulation)
    x, _ = inputs(8, seed=31)
    m.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert isinstance(loaded, model_lib.SeedCNN)
    assert loaded.formulation == formulation
    np.testing.assert_array_equal(loaded(x).numpy(), m(x).numpy())


def test_saved_model_export_serves_the_same_outputs(tmp_path: Path) -> None:
    m = model_lib.build_model(K, seed=40, formulation="fast")
    x, _ = inputs(8, seed=41)
    m.export(str(tmp_path / "sm"), format="tf_saved_model", verbose=False)
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    served = loaded.serve(x)
    np.testing.assert_allclose(served.numpy(), m(x).numpy(), rtol=0, atol=1e-6)


# --- dropout ------------------------------------------------------------------


def test_dropout_depends_only_on_the_seed(models) -> None:
    _, fast = models
    x, _ = inputs(16, seed=50)
    s1, s2 = tf.constant([1, 5], tf.int64), tf.constant([1, 6], tf.int64)
    a = model_lib.forward(fast, x, dropout_seed=s1).numpy()
    b = model_lib.forward(fast, x, dropout_seed=s1).numpy()
    c = model_lib.forward(fast, x, dropout_seed=s2).numpy()
    np.testing.assert_array_equal(a, b)
    assert np.max(np.abs(a - c)) > 1e-3
    np.testing.assert_array_equal(model_lib.forward(fast, x).numpy(), fast(x).numpy())


@pytest.mark.parametrize("keep_prob", [0.5, 0.8])
def test_dropout_keeps_the_right_fraction_scaled_by_one_over_keep(keep_prob: float) -> None:
    h = tf.constant(np.random.default_rng(0).uniform(1, 2, (1000, 160)).astype(np.float32))
    out = model_lib.dropout(h, tf.constant([3, 4], tf.int64), keep_prob).numpy()
    kept = out != 0
    np.testing.assert_allclose(out[kept], h.numpy()[kept] / keep_prob, rtol=1e-6)
    # 160,000 Bernoulli draws: the kept fraction's standard deviation is ≤ 0.0013.
    assert abs(kept.mean() - keep_prob) < 0.01


def test_forward_applies_dropout_between_features_and_head(models) -> None:
    _, fast = models
    x, _ = inputs(8, seed=60)
    seed = tf.constant([9, 9], tf.int64)
    expected = fast.head(model_lib.dropout(fast.features(x), seed, 0.5))
    np.testing.assert_array_equal(
        model_lib.forward(fast, x, dropout_seed=seed).numpy(), expected.numpy()
    )
    np.testing.assert_array_equal(
        model_lib.forward(fast, x, dropout_seed=seed, keep_prob=1.0).numpy(), fast(x).numpy()
    )


# --- loss -------------------------------------------------------------------------


def test_regularized_loss_equals_a_hand_computation(models) -> None:
    plain, _ = models
    rng = np.random.default_rng(70)
    pred = rng.standard_normal((10, K)).astype(np.float32)
    true = rng.standard_normal((10, K)).astype(np.float32)
    total, rmse = model_lib.regularized_loss(plain, tf.constant(pred), tf.constant(true))
    w = {
        v.path.split("/")[-2]: v.numpy().astype(np.float64)
        for v in plain.variables
        if "kernel" in v.path
    }

    def l2(a):
        return np.sum(a**2) / 2

    want_rmse = np.sqrt(np.mean((pred.astype(np.float64) - true) ** 2))
    want = (
        want_rmse
        + 0.001 * (l2(w["conv1"]) + l2(w["conv2"]))
        + 0.004 * (l2(w["dense1"]) + l2(w["dense2"]))
    )
    # float32 against a float64 reference: a sum of 30 squares and a square root, each
    # within a few ulps in float32, so 8 ulps (relative) bound it on any CPU.
    assert float(rmse) == pytest.approx(want_rmse, rel=8 * EPS32)
    assert float(total) == pytest.approx(want, rel=8 * EPS32)
    assert want - want_rmse > 1e-3


# --- errors -------------------------------------------------------------------------


def test_bad_arguments_raise_config_error(models) -> None:
    _, fast = models
    x, _ = inputs(2)
    with pytest.raises(ConfigError, match="formulation"):
        model_lib.build_model(K, formulation="turbo")
    with pytest.raises(ConfigError, match="too small"):
        model_lib.build_model(K, height=7, width=195)
    with pytest.raises(ConfigError, match="at least one output"):
        model_lib.build_model(0)
    with pytest.raises(ConfigError, match="keep_prob"):
        model_lib.forward(fast, x, dropout_seed=tf.constant([1, 2]), keep_prob=0.0)
    with pytest.raises(ConfigError, match=r"takes \(N, 20, 195, 1\)"):
        fast(tf.zeros((2, 20, 190, 1)))


# --- the benchmark stays runnable ------------------------------------------------


def test_benchmark_step_worker_reports_a_rate() -> None:
    spec = {
        "kind": "step",
        "formulation": "fast",
        "batch": 16,
        "height": 20,
        "width": 195,
        "outputs": K,
        "threads": 1,
        "warmup": 1,
        "steps": 2,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.model_step", "--worker", json.dumps(spec)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "TF_NUM_INTRAOP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["wall_s"] > 0 and result["cpu_s"] >= 0
    assert result["samples_per_s"] == pytest.approx(16 / result["wall_s"])


def test_benchmark_flop_count_matches_the_layer_sizes() -> None:
    from benchmarks.model_step import forward_flops, train_flops

    conv1 = 2 * 18 * 34 * 5 * 90
    conv2 = 2 * 8 * 16 * 5 * 20
    dense = 2 * 160 * 20 + 2 * 20 * 3
    assert forward_flops(20, 195, 3) == conv1 + conv2 + dense
    assert train_flops(20, 195, 3) == 3 * (conv1 + conv2 + dense) == 1_748_760
