"""Nightly retraining: published versions behind a quality gate, TensorBoard curves, gzip
data with default names, and ``coretrain predict`` on the served version."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from app.data import synthetic
from app.errors import NotPublished
from app.release import gate
from app.release.gate import judge
from app.release.layout import listing, newest, versions
from tests.conftest import events, json_lines, run_cli

ARGS = ["--batch-size", "100", "--eval-every", "20", "--checkpoint-every", "1000"]


# --- the gate's rule (app/release/gate.py) on constructed predictions -------------------


def _errors(rmse: float, n: int = 2000, seed: int = 0) -> np.ndarray:
    """Per-row mean squared errors of predictions whose RMSE is about ``rmse``."""
    err = np.random.default_rng(seed).normal(0.0, rmse, (n, 3))
    return np.mean(np.square(err), axis=1)


def _scaled(errors: np.ndarray, factor: float, seed: int = 1) -> np.ndarray:
    """Another model's errors on the same rows: ``factor`` × the RMSE, row by row noisy."""
    jitter = np.random.default_rng(seed).lognormal(0.0, 0.3, len(errors))
    return errors * jitter / np.mean(jitter) * factor**2


def test_the_first_version_needs_only_to_beat_the_mean_predictor() -> None:
    assert judge(_errors(0.2), None, None, baseline=0.27).published
    rejected = judge(_errors(0.28), None, None, baseline=0.27)
    assert not rejected.published and "mean predictor" in rejected.reason


def test_a_candidate_within_the_noise_is_published() -> None:
    champion = _errors(0.10)
    # 2 % worse: less than two runs of the recipe differ by (gate.NOISE_TOLERANCE, 20 %).
    decision = judge(_scaled(champion, 1.02), champion, 3, baseline=0.27)
    assert decision.published and decision.rule == "noise", decision.reason
    assert decision.difference == pytest.approx(0.02, abs=0.01)
    lo, hi = decision.interval
    assert lo < decision.difference < hi and lo <= gate.NOISE_TOLERANCE


def test_a_clearly_worse_candidate_is_refused_and_a_better_one_published() -> None:
    champion = _errors(0.10)
    worse = judge(_scaled(champion, 1.5), champion, 3, baseline=0.27)
    assert not worse.published and "champion version 3" in worse.reason
    assert worse.interval[0] > gate.NOISE_TOLERANCE
    better = judge(_scaled(champion, 0.8), champion, 3, baseline=0.27)
    assert better.published and better.interval[1] < 0


def test_the_interval_is_paired_and_repeatable() -> None:
    a = _errors(0.1)
    assert gate.interval(a, a) == (0.0, 0.0)  # the same errors: no difference at all
    # Every row's squared error × 1.21: every resample's RMSE ratio is √1.21 = 1.1 when the
    # rows are resampled together (an unpaired resampling spreads it).
    assert gate.interval(a * 1.21, a) == pytest.approx((0.1, 0.1), abs=1e-12)
    b = _scaled(a, 1.1)
    first = gate.interval(b, a)
    assert gate.interval(b, a, seed=1) != first  # the resamples depend on the seed...
    assert gate.interval(b.copy(), a.copy(), seed=0) == first  # ...and only on it: repeatable
    lo, hi = first
    assert lo < 0.1 < hi and hi - lo < 0.1


def test_one_row_cannot_be_judged_against_a_champion() -> None:
    """One row 'showed' a candidate 65 % better, "interval −65.33 %..−65.33 %": the bootstrap
    sees no row it was not given. Below gate.MIN_ROWS rows, no comparison: not published
    over the champion, saying how many rows it takes."""
    one = judge(np.array([0.01]), np.array([0.083]), 2, baseline=0.27)
    assert not one.published and one.interval is None
    assert one.reason.startswith("cannot judge: the test set has 1 rows")
    assert f"takes at least {gate.MIN_ROWS}" in one.reason and "champion version 2" in one.reason
    few = _errors(0.1, n=gate.MIN_ROWS - 1)
    assert not judge(_scaled(few, 0.5), few, 2, baseline=0.27).published
    assert not judge(_scaled(few, 0.5), few, 2, baseline=0.27, tolerance=0.1).published
    enough = _errors(0.1, n=gate.MIN_ROWS)
    assert judge(_scaled(enough, 0.5), enough, 2, baseline=0.27).published
    assert judge(np.array([0.01]), None, None, baseline=0.27).published  # no champion


def test_the_minimum_rows_are_where_the_interval_is_the_tolerance_wide() -> None:
    """gate.MIN_ROWS from its derivation (z / tolerance)², checked on the gate's own
    bootstrap: two models with independent one-output Gaussian errors get an interval of
    half-width NOISE_TOLERANCE at that many rows (the median of 20 draws), twice as wide at a
    quarter of them."""

    def half_width(n: int) -> float:
        widths = []
        for seed in range(20):
            rng = np.random.default_rng(seed)
            lo, hi = gate.interval(rng.normal(0, 1, n) ** 2, rng.normal(0, 1, n) ** 2)
            widths.append((hi - lo) / 2)
        return float(np.median(widths))

    assert gate.MIN_ROWS == 97
    assert half_width(gate.MIN_ROWS) == pytest.approx(gate.NOISE_TOLERANCE, rel=0.1)
    assert half_width(gate.MIN_ROWS // 4) == pytest.approx(2 * gate.NOISE_TOLERANCE, rel=0.1)


def test_an_explicit_tolerance_is_the_plain_ratio_rule() -> None:
    champion = _errors(0.10)
    tie = judge(champion, champion, 3, baseline=0.27, tolerance=0.0)
    assert tie.published and tie.rule == "tolerance" and tie.interval is None
    slightly = _scaled(champion, 1.02)
    assert not judge(slightly, champion, 3, baseline=0.27, tolerance=0.0).published
    assert judge(slightly, champion, 3, baseline=0.27, tolerance=0.05).published
    broken = np.full(10, np.nan)
    assert not judge(broken, champion, 3, baseline=0.27, tolerance=0.0).published


def test_an_exact_champion_is_beaten_only_by_an_exact_candidate() -> None:
    """A champion of RMSE 0 on the test rows (test rows in its training data): no ratio to
    resample (the interval was '+9999…%', 150 digits wide), a plain decision."""
    exact = np.zeros(gate.MIN_ROWS)
    worse = judge(np.full(gate.MIN_ROWS, 0.01), exact, 3, baseline=0.27)
    assert not worse.published and worse.interval is None
    assert worse.reason.startswith("champion version 3's test RMSE on these data is 0")
    assert judge(exact, exact, 3, baseline=0.27).published


def test_a_champion_that_does_not_fit_the_data_is_no_comparison() -> None:
    decision = judge(_errors(0.2), None, 4, baseline=0.27)
    assert decision.published and "can't be evaluated on these data" in decision.reason


# --- three nights into one publish directory ----------------------------------------------


def _train(data: Path, out: Path, models: Path, steps: int) -> tuple[int, list[dict], str]:
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--max-steps", str(steps),
        "--publish-dir", str(models), *ARGS,
    )  # fmt: skip
    return proc.returncode, json_lines(proc.stdout), proc.stderr


def test_models_on_a_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    """A mistyped --publish-dir must not look like an empty one."""
    missing = tmp_path / "no-such-dir"
    proc = run_cli("models", str(missing))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"coretrain: Invalid value for 'DIRECTORY': Directory '{missing}' does not exist. "
        "(see coretrain models --help)"
    ]
    missing.mkdir()  # an empty one is no error
    proc = run_cli("models", str(missing))
    assert (proc.returncode, proc.stdout) == (0, f"no published versions in {missing}\n")


@pytest.fixture(scope="module")
def nights(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("nights")
    data = root / "data"
    synthetic.generate(data, train=1500, test=300, seed=3)
    models = root / "models"
    models.mkdir()  # TF Serving's base path exists before the first night
    # Night 1 is cut short (40 steps: it beats the mean predictor, not much more), night 2
    # trains on; the gate publishes night 2 as better or as the same up to noise.
    first = _train(data, root / "night1", models, 40)
    second = _train(data, root / "night2", models, 150)
    # Night 2's Job retried once it had finished: the same output, data and options.
    night2 = root / "night2"
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in _written(night2, models)}
    retried = _train(data, night2, models, 150)
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in _written(night2, models)}
    # Night 3: the training labels arrive shuffled (a broken export upstream), the test set
    # intact, and every file gzip-compressed under its default name + .gz.
    bad = root / "bad-data"
    bad.mkdir()
    rng = np.random.default_rng(0)
    for role in ("train_features", "train_labels", "test_features", "test_labels"):
        lines = (data / f"{role}.txt").read_bytes().splitlines(keepends=True)
        if role == "train_labels":
            lines = [lines[i] for i in rng.permutation(len(lines))]
        with gzip.open(bad / f"{role}.txt.gz", "wb") as f:
            f.write(b"".join(lines))
    third = _train(bad, root / "night3", models, 150)
    return {
        "root": root, "data": data, "models": models, "runs": [first, second, third],
        "retried": (retried, before, after),
    }  # fmt: skip


def _written(output: Path, models: Path) -> list[Path]:
    """Every file and directory a run writes but its log and the data cache (whose marker
    records each use, for eviction): the output's and the versions'."""
    found = [
        p for p in (*output.rglob("*"), *models.rglob("*"))
        if "logs" not in p.parts and "cache" not in p.relative_to(output.parent).parts
    ]  # fmt: skip
    return sorted(p for p in found if p.name != ".lock")


@pytest.mark.slow
def test_two_good_nights_publish_and_the_bad_one_is_kept_out(nights: dict) -> None:
    (c1, _, e1), (c2, _, e2), (c3, r3, e3) = nights["runs"]
    assert (c1, c2) == (0, 0), (e1[-2000:], e2[-2000:])
    assert c3 == 7, e3[-2000:]
    (line,) = e3.splitlines()
    assert line.startswith("coretrain: model not published: ")
    assert versions(nights["models"]) == [1, 2]
    metrics = json.loads((nights["root"] / "night3" / "metrics.json").read_text())
    gate = metrics["publish"]
    assert gate["published"] is False and gate["champion_version"] == 2
    assert gate["reason"] in line
    assert events(r3, "publish_rejected")[0]["level"] == "WARNING"
    assert events(r3, "end")[-1]["status"] == "completed"
    # The gzip files were found by their default names, without options.
    start = events(r3, "start")[0]["config"]
    assert start["train_features"] is None and events(r3, "cache")


@pytest.mark.slow
def test_a_finished_run_rerun_is_a_no_op(nights: dict) -> None:
    (code, records, stderr), before, after = nights["retried"]
    assert (code, stderr.strip()) == (0, ""), stderr[-2000:]
    (done,) = events(records, "already_finished")
    assert "nothing to do" in done["message"] and "published as version 2" in done["message"]
    assert not events(records, "progress") and not events(records, "export")
    assert not events(records, "published") and not events(records, "choice")
    assert after == before  # nothing written, replaced or added (the log aside)
    assert versions(nights["models"]) == [1, 2]


def _wider(data: Path, to: Path) -> Path:
    """A copy of ``data`` with one more label column (K = 4) upstream."""
    shutil.copytree(data, to)
    for role in ("train_labels", "test_labels"):
        path = to / f"{role}.txt"
        path.write_text("".join(f"{line} 0.5\n" for line in path.read_text().splitlines()))
    return to


@pytest.mark.slow
def test_a_changed_signature_is_refused_before_training(nights: dict, tmp_path: Path) -> None:
    """One more label column upstream: the served version has 3 outputs, this run's data 4."""
    wider = _wider(nights["data"], tmp_path / "wider")
    code, records, stderr = _train(wider, tmp_path / "out", nights["models"], 150)
    assert code == 7, stderr[-2000:]
    (line,) = stderr.splitlines()
    assert line.startswith("coretrain: model not published: the serving signature changes: ")
    assert "version 2 takes (n, 3900) → (n, 3), this model (n, 3900) → (n, 4)" in line
    assert not events(records, "cache")  # refused before its data were converted
    assert not events(records, "progress") and not events(records, "choice")
    assert versions(nights["models"]) == [1, 2]


@pytest.mark.slow
def test_the_signature_is_refused_early_only_when_the_model_itself_differs(
    nights: dict, tmp_path: Path
) -> None:
    """The version's record is a hint: a record that says K = 4 over a model of K = 3 (the
    data's) refuses nothing; a record without K (an earlier export) defers to the check
    once TensorFlow is up."""
    from app.budget import PlanOptions, detect_plan
    from app.config import TrainConfig
    from app.release.layout import INPUT_FILE, recorded_signature
    from app.training.admit import by_shape
    from app.training.admit.sources import find

    served = newest(nights["models"])
    assert json.loads((served / INPUT_FILE).read_text()) == {
        "height": 20, "width": 195, "outputs": 3,
    }  # fmt: skip
    models = tmp_path / "models"
    shutil.copytree(nights["models"], models)
    record = models / served.name / INPUT_FILE
    record.write_text(json.dumps({"height": 20, "width": 195, "outputs": 4}))
    assert str(recorded_signature(models / served.name)) == "(n, 3900) → (n, 4)"
    plan = detect_plan("/", PlanOptions())

    def check(data: Path) -> None:
        config = TrainConfig.of(data_dir=data, output_dir=tmp_path / "out", publish_dir=models)
        by_shape(
            find(config.data), config.publishing, config.recipe.batch_size, plan.memory_limit, True
        )

    check(nights["data"])  # the model's own signature is the data's: (n, 3)
    wider = _wider(nights["data"], tmp_path / "wider")
    record.write_text(json.dumps({"height": 20, "width": 195}))
    assert recorded_signature(models / served.name) is None
    check(wider)  # no K recorded: left to the check once TensorFlow is up
    record.write_text(json.dumps({"height": 20, "width": 195, "outputs": 3}))
    with pytest.raises(NotPublished, match=r"takes \(n, 3900\) → \(n, 3\), this model"):
        check(wider)


@pytest.mark.slow
def test_the_served_version_reproduces_its_rmse_from_raw_lines(nights: dict) -> None:
    import tensorflow as tf

    metrics = json.loads((nights["root"] / "night2" / "metrics.json").read_text())
    reported = metrics["publish"]["candidate_rmse"]
    assert metrics["publish"]["version"] == 2
    served = tf.saved_model.load(str(newest(nights["models"]))).signatures["serve"]
    data = nights["data"]
    x = np.loadtxt(data / "test_features.txt", dtype=np.float32)
    y = np.loadtxt(data / "test_labels.txt", dtype=np.float64)
    pred = next(iter(served(tf.constant(x)).values())).numpy()
    assert float(np.sqrt(np.mean((pred - y) ** 2))) == pytest.approx(reported, rel=1e-6)
    assert reported == pytest.approx(metrics["test_rmse"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".txt", ".npy"])
def test_predict_on_the_publish_directory_reproduces_the_rmse(nights: dict, suffix: str) -> None:
    data, root = nights["data"], nights["root"]
    packed = root / f"test_features{suffix}.gz"
    with open(data / "test_features.txt", "rb") as f, gzip.open(packed, "wb") as g:
        shutil.copyfileobj(f, g)
    out = root / f"pred{suffix}"
    proc = run_cli(
        "predict", "--model", str(nights["models"]), "--features", str(packed), "--out", str(out),
        "--batch-size", "64",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    pred = np.load(out) if suffix == ".npy" else np.loadtxt(out)
    y = np.loadtxt(data / "test_labels.txt")
    assert pred.shape == y.shape == (300, 3)
    rmse = float(np.sqrt(np.mean((pred - y) ** 2)))
    reported = json.loads((root / "night2" / "metrics.json").read_text())["publish"]
    assert rmse == pytest.approx(reported["candidate_rmse"], rel=1e-6)
    (done,) = events(json_lines(proc.stdout), "predicted")
    assert done["model"].endswith("/2") and done["rows"] == 300


@pytest.mark.slow
def test_predict_names_the_bad_line(nights: dict, tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    lines = (nights["data"] / "test_features.txt").read_text().splitlines()
    bad.write_text("\n".join([*lines[:4], "1 2 3", *lines[5:10]]) + "\n")
    out = tmp_path / "p.txt"
    proc = run_cli("predict", "--model", str(nights["models"]), "--features", str(bad),
                   "--out", str(out))  # fmt: skip
    assert proc.returncode == 3
    (line,) = proc.stderr.splitlines()
    assert f"{bad}:5: " in line and "expected 3900 fields" in line
    assert not out.exists() and list(tmp_path.glob(".p.txt*")) == []


@pytest.mark.slow
def test_models_lists_the_versions(nights: dict) -> None:
    proc = run_cli("models", str(nights["models"]), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["version"] for r in rows] == [1, 2] and rows[-1]["served"] is True
    assert rows == [row.to_json() for row in listing(nights["models"])]
    table = run_cli("models", str(nights["models"])).stdout
    assert "(served)" in table.splitlines()[-1]


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_progress_scalars(nights: dict) -> None:
    import tensorflow as tf

    _, records, _ = nights["runs"][1]
    progress = {p["step"]: p for p in events(records, "progress")}
    found: dict[str, dict[int, float]] = {}
    texts = []
    for path in sorted((nights["root"] / "night2" / "tensorboard").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                tensor = tf.make_ndarray(value.tensor)
                if value.metadata.plugin_data.plugin_name == "text":
                    texts.append(tensor.item().decode())
                else:
                    found.setdefault(value.tag, {})[event.step] = float(tensor)
    assert set(found) >= {"loss", "train_rmse", "val_rmse", "learning_rate",
                          "examples_per_sec", "cpu_util"}  # fmt: skip
    for step, record in progress.items():
        assert found["val_rmse"][step] == pytest.approx(record["val_rmse"], rel=1e-6)
        assert found["learning_rate"][step] == pytest.approx(record["lr"], rel=1e-6)
    assert texts and '"max_steps": 150' in texts[0]


def test_pruning_keeps_the_newest_versions(tmp_path: Path) -> None:
    from app.atomic import open_dir
    from app.release.publish import _prune

    for n in (1, 2, 3, 4, 5):
        (tmp_path / str(n)).mkdir()
        (tmp_path / str(n) / "saved_model.pb").write_bytes(b"")
        if n != 1:  # version 1 was not published by coretrain: never pruned
            (tmp_path / str(n) / "coretrain.json").write_text(json.dumps({"weights": str(n)}))
    (tmp_path / "0").symlink_to(tmp_path / "5")  # a link to a version: never removed
    with open_dir(tmp_path) as directory:
        _prune(directory, keep=2)
        assert versions(tmp_path) == [0, 1, 4, 5] and (tmp_path / "0").is_symlink()
        _prune(directory, keep=0)
    assert versions(tmp_path) == [0, 1, 4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "4", "5"]  # no leftovers


@pytest.mark.slow
def test_a_finished_run_rerun_on_copied_data_is_a_no_op_under_a_new_signature(
    nights: dict, tmp_path: Path
) -> None:
    """Night 2 finished and published version 2; a model of 4 outputs was published above
    it since (its clients moved on); night 2's Job is retried on a fresh copy of its data
    (another cache key: its finish is known only from the data's fingerprints). Nothing to
    do: not the signature's exit 7."""
    models, out = tmp_path / "models", tmp_path / "night2"
    shutil.copytree(nights["models"], models)
    shutil.copytree(nights["root"] / "night2", out)
    wider = _wider(nights["data"], tmp_path / "wider")
    proc = run_cli(
        "train", "--data", str(wider), "--output", str(tmp_path / "other"), "--max-steps", "150",
        "--publish-dir", str(models), "--publish-allow-signature-change", *ARGS,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert versions(models) == [1, 2, 3]
    data = tmp_path / "data"
    shutil.copytree(nights["data"], data)
    code, records, stderr = _train(data, out, models, 150)
    assert (code, stderr.strip()) == (0, ""), stderr[-2000:]
    (done,) = events(records, "already_finished")
    assert "published as version 2" in done["message"]
    assert events(records, "cache")  # known from the data, converted again
    assert versions(models) == [1, 2, 3]


@pytest.mark.slow
def test_predict_says_which_version_it_used_when_the_newest_is_no_model(
    nights: dict, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(nights["models"], models)
    (models / "9").mkdir()  # TF Serving counts it; it can't serve it
    out = tmp_path / "pred.npy"
    proc = run_cli(
        "predict", "--model", str(models), "--features",
        str(nights["data"] / "test_features.txt"), "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (passed,) = events(json_lines(proc.stdout), "version_passed_over")
    assert passed["version"] == 9 and passed["used"] == str(models / "2")
    assert passed["level"] == "WARNING"
