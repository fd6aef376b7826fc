"""The release against a publish directory as TF Serving sees it (app/release/): version
numbers by TF Serving's own rule, entries that are not models, a champion that can't be
loaded, a serving signature that changes, weights already published, a stop while another
run holds the lock, and ``model.keras`` loading without this package.

The models here are small Keras models exported as SavedModels (no training): a ridge fit
on the data (good), and worse ones, so that the gate's inputs are known values."""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from app.config import TrainConfig
from app.errors import ConfigError, Preempted, StorageError
from app.release import gate, layout
from tests.conftest import prepare_cache, run_cli

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


# --- TF Serving's version numbers ---------------------------------------------------------

# (name, the version TF Serving reads: safe_strto64 on the name, None = not a version)
NAMES = [
    ("7", 7), ("007", 7), (" 8", 8), ("8\t", 8), ("-1", -1), ("0", 0),
    ("+1", None), ("1e3", None), ("0x10", None), ("1.0", None), ("", None), ("-", None),
    ("٣", None), ("1 2", None), ("9223372036854775807", 2**63 - 1),
    ("9223372036854775808", None), (".7", None), ("7.tmp", None),
]  # fmt: skip


@pytest.mark.parametrize(("name", "number"), NAMES)
def test_version_numbers_follow_tf_serving(name: str, number: int | None) -> None:
    assert layout.version_number(name) == number


def _model_dir(path: Path) -> None:
    path.mkdir(parents=True)
    (path / layout.SAVED_MODEL_FILE).write_bytes(b"")


def test_every_numeric_child_counts_and_the_largest_is_served(tmp_path: Path) -> None:
    _model_dir(tmp_path / "1")
    (tmp_path / "7").write_text("a file")
    (tmp_path / "8").mkdir()  # empty
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "notes.txt").write_text("junk")
    (tmp_path / "reports").mkdir()
    (tmp_path / ".5.tmp").mkdir()
    found = layout.entries(tmp_path)
    assert [(e.number, e.is_model) for e in found] == [
        (1, True), (2, False), (7, False), (8, False)
    ]  # fmt: skip
    assert layout.served(tmp_path).number == 8 and layout.next_number(tmp_path) == 9
    assert layout.versions(tmp_path) == [1] and layout.newest(tmp_path) == tmp_path / "1"
    assert [e.what for e in found[1:]] == [
        "a directory without saved_model.pb", "not a directory",
        "a directory without saved_model.pb",
    ]  # fmt: skip


def test_of_two_names_of_one_number_the_later_is_served(tmp_path: Path) -> None:
    _model_dir(tmp_path / "007")
    _model_dir(tmp_path / "7")
    assert layout.served(tmp_path).path.name == "7"  # "007" < "7": TF Serving keeps the last
    assert layout.next_number(tmp_path) == 8
    (tmp_path / "-3").mkdir()
    assert layout.entries(tmp_path)[0].number == -3 and layout.next_number(tmp_path) == 8


def test_a_symlinked_version_is_what_tf_serving_loads_and_never_pruned(tmp_path: Path) -> None:
    _model_dir(tmp_path / "real")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "3").symlink_to(tmp_path / "real")
    (served,) = layout.entries(tmp_path / "models")
    assert served.is_model and served.is_link and served.what == "a model"


def test_an_entry_that_cant_be_read_is_named_not_a_crash(tmp_path: Path) -> None:
    """``coretrain models`` as a user without root's override: a version directory it can't
    enter is listed as unreadable (Python 3.11's is_file raises on EACCES)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and util-linux setpriv to drop the permission override")
    _model_dir(tmp_path / "1")
    _model_dir(tmp_path / "2")
    (tmp_path / "2").chmod(0)
    drop = "-dac_override,-dac_read_search"
    proc = subprocess.run(
        [setpriv, f"--inh-caps={drop}", f"--bounding-set={drop}", "--", sys.executable, "-m",
         "app", "models", str(tmp_path), "--format", "json"],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    (tmp_path / "2").chmod(0o755)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["version"], r["model"], r["what"]) for r in rows] == [
        (1, True, "a model"), (2, False, "unreadable: Permission denied")
    ]  # fmt: skip


def test_a_record_written_by_another_program_is_listed(tmp_path: Path) -> None:
    _model_dir(tmp_path / "1")
    (tmp_path / "1" / layout.META_FILE).write_text('{"metrics": [], "publish": {"published": '
                                                   'true, "candidate_rmse": "x"}}')  # fmt: skip
    proc = run_cli("models", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].split()[:3] == ["1", "-", "-"]


def test_nothing_is_published_above_the_largest_version(tmp_path: Path) -> None:
    from app.training.admit import publish_dir as preflight

    (tmp_path / "9223372036854775807").mkdir()
    assert layout.no_room(tmp_path) is not None
    with pytest.raises(StorageError, match="largest it can serve"):
        preflight.check(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        preflight.check(tmp_path / "mistyped")
    assert not (tmp_path / "mistyped").exists()


def test_models_marks_what_tf_serving_serves(tmp_path: Path) -> None:
    _model_dir(tmp_path / "1")
    (tmp_path / "7").write_text("")
    (tmp_path / "8").mkdir()
    proc = run_cli("models", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["1", "7", "8"]
    assert "(served" not in lines[1]
    assert "(served: not a model (a directory without saved_model.pb)" in lines[3]
    rows = json.loads(run_cli("models", str(tmp_path), "--format", "json").stdout)
    assert [(r["version"], r["served"], r["model"]) for r in rows] == [
        (1, False, True), (7, False, False), (8, True, False)
    ]  # fmt: skip


# --- publishing real SavedModels ----------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory):
    """A data set whose test split is large enough for the gate to compare (gate.MIN_ROWS)."""
    from app.data import synthetic

    tmp = tmp_path_factory.mktemp("release")
    synthetic.generate(tmp / "data", train=240, test=gate.MIN_ROWS + 3, seed=1)
    config = TrainConfig.of(data_dir=tmp / "data", output_dir=tmp, cache_dir=tmp / "c")
    return prepare_cache(config)


@pytest.fixture(scope="module")
def few_rows(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny data set: 60 test rows, fewer than the gate compares on."""
    tmp = tmp_path_factory.mktemp("few")
    return prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=tmp, cache_dir=tmp / "c"))


def _linear(data, shrink: float = 1.0, outputs: int | None = None, inputs: int | None = None):
    """A Keras model (n, H·W) → (n, K): the ridge fit on the training rows, its
    coefficients × ``shrink`` (1 = the fit: beats the mean predictor; 0 = the mean)."""
    x = np.asarray(data.features("train"), np.float64).reshape(data.train_size, -1)
    y = np.asarray(data.labels("train"), np.float64)
    mean_x, mean_y = x.mean(0), y.mean(0)
    xc = x - mean_x
    coef = np.linalg.solve(xc.T @ xc + 10.0 * np.eye(x.shape[1]), xc.T @ (y - mean_y)) * shrink
    k, width = outputs or data.num_outputs, inputs or x.shape[1]
    kernel = np.zeros((width, k))
    kernel[: min(width, x.shape[1]), : min(k, y.shape[1])] = coef[:width, :k]
    bias = np.zeros(k)
    bias[: min(k, y.shape[1])] = (mean_y - mean_x @ coef)[:k]
    inp = keras.Input((width,), name="features")
    model = keras.Model(inp, keras.layers.Dense(k, name="out")(inp))
    model.layers[-1].set_weights([kernel.astype("float32"), bias.astype("float32")])
    return model


def _export(model, path: Path):
    """``path`` laid out as a run's export (model.keras + saved_model/) and its digest."""
    from app.release.export import Exported, weights_digest

    path.mkdir(parents=True)
    model.save(path / layout.KERAS_FILE)
    model.export(str(path / layout.SAVED_MODEL_DIR), format="tf_saved_model", verbose=False)
    return Exported(path, weights_digest(model))


def _version(model, directory: Path, name: str, meta: dict | None = None) -> Path:
    """A version ``directory/name`` as coretrain publishes it (or without a record)."""
    export = _export(model, directory.parent / f"export-{directory.name}-{name}")
    shutil.copytree(export.path / layout.SAVED_MODEL_DIR, directory / name)
    record = {"weights": export.weights, **(meta or {})}
    (directory / name / layout.META_FILE).write_text(json.dumps(record))
    return directory / name


def _rmse(model, data) -> float:
    x = np.asarray(data.features("test")).reshape(data.test_size, -1)
    err = model(x).numpy().astype(np.float64) - np.asarray(data.labels("test"), np.float64)
    return float(np.sqrt(np.mean(np.square(err))))


def test_a_champion_with_non_finite_outputs_is_no_comparison_and_strict_json() -> None:
    nan = np.full(50, np.nan)
    decision = gate.judge(np.full(50, 0.01), nan, 2, baseline=0.5)
    assert decision.published and "no comparison" in decision.reason
    record = decision.to_json()
    assert record["champion_rmse"] is None and math.isnan(decision.champion_rmse)
    json.dumps(record, allow_nan=False)  # strict JSON: no NaN, no Infinity
    assert gate.Decision.from_json(record) == gate.Decision(
        **{**decision.__dict__, "champion_rmse": None}
    )


def test_a_worse_candidate_is_refused_with_each_rmse_in_its_place(data, tmp_path: Path) -> None:
    """The gate gets the candidate and the champion the right way round."""
    from app.release.publish import publish

    good, worse = _linear(data), _linear(data, shrink=0.3)
    assert _rmse(good, data) < 0.8 * _rmse(worse, data) < data.baseline_rmse
    models = tmp_path / "models"
    _version(good, models, "1")
    decision = publish(_export(worse, tmp_path / "cand"), models, data, {})
    assert not decision.published and decision.champion_version == 1, decision.reason
    assert decision.candidate_rmse == pytest.approx(_rmse(worse, data), rel=1e-4)
    assert decision.champion_rmse == pytest.approx(_rmse(good, data), rel=1e-4)
    assert layout.versions(models) == [1]
    (tmp_path / "m2").mkdir()
    better = publish(_export(good, tmp_path / "again"), tmp_path / "m2", data, {})
    assert better.published and better.version == 1 and better.directory == str(tmp_path / "m2")


def test_publishes_above_every_entry_tf_serving_counts(data, tmp_path: Path, logged) -> None:
    from app.release.publish import publish

    models = tmp_path / "models"
    _version(_linear(data, 0.5), models, "1")
    (models / "7").write_text("not a model")
    (models / "8").mkdir()
    (models / "2").mkdir()
    (models / "2" / "junk").write_text("x")
    os.mkfifo(models / "3")  # never opened: an open for reading would wait for a writer
    decision = publish(_export(_linear(data), tmp_path / "cand"), models, data, {})
    assert decision.published and decision.version == 9 and decision.champion_version == 1
    assert layout.served(models).number == 9 and layout.served(models).is_model
    assert (models / "7").read_text() == "not a model" and (models / "2" / "junk").exists()
    assert (models / "3").is_fifo()
    passed = [r.version for r in logged if getattr(r, "event", "") == "champion_unloadable"]
    assert passed == [8, 7, 3, 2]


def test_a_damaged_champion_is_passed_over_for_the_newest_that_loads(
    data, tmp_path: Path, logged
) -> None:
    from app.release.publish import publish

    models = tmp_path / "models"
    _version(_linear(data, 0.9), models, "1")
    damaged = _version(_linear(data, 0.8), models, "2")
    (shard,) = (damaged / "variables").glob("variables.data-*")
    shard.write_bytes(shard.read_bytes()[:7])  # truncated
    decision = publish(_export(_linear(data), tmp_path / "cand"), models, data, {})
    assert decision.published and decision.champion_version == 1 and decision.version == 3
    (warning,) = [r for r in logged if getattr(r, "event", "") == "champion_unloadable"]
    assert warning.version == 2 and warning.levelname == "WARNING"
    import shutil

    from app.release.publish import champion

    shutil.rmtree(models / "3")
    assert champion(models).number == 1  # looked for again: 2 passed over again
    again = [r for r in logged if getattr(r, "event", "") == "champion_unloadable"]
    assert again == [warning]  # named once a process


def test_a_changed_signature_is_not_published_unless_allowed(data, tmp_path: Path) -> None:
    from app.release.publish import publish

    models = tmp_path / "models"
    _version(_linear(data, outputs=data.num_outputs + 1), models, "1")
    candidate = _export(_linear(data), tmp_path / "cand")
    refused = publish(candidate, models, data, {})
    assert not refused.published and "serving signature changes" in refused.reason
    assert f"(n, {data.num_outputs + 1})" in refused.reason and layout.versions(models) == [1]
    allowed = publish(candidate, models, data, {}, allow_signature_change=True)
    assert allowed.published and allowed.version == 2


def test_weights_already_published_are_not_published_again(data, tmp_path: Path) -> None:
    from app.release.publish import publish

    models = tmp_path / "models"
    models.mkdir()
    export = _export(_linear(data), tmp_path / "cand")
    first = publish(export, models, data, {})
    again = publish(export, models, data, {})
    assert (first.version, again.version, again.published) == (1, 1, True)
    assert "already" in again.reason and layout.versions(models) == [1]
    assert json.loads((models / "1" / layout.META_FILE).read_text())["weights"] == export.weights


def test_a_stop_ends_the_wait_for_the_publish_lock(data, tmp_path: Path) -> None:
    from app.release.publish import publish

    models = tmp_path / "models"
    models.mkdir()
    export = _export(_linear(data), tmp_path / "cand")
    stop = threading.Event()
    with open(models / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another run is publishing
        threading.Timer(0.5, stop.set).start()
        with pytest.raises(Preempted, match=r"waiting for .*rerun to publish"):
            publish(export, models, data, {}, stop=stop.is_set)
    assert layout.entries(models) == []


def test_the_keras_file_loads_without_this_package(data, tmp_path: Path) -> None:
    """model.keras of a real export (app/release/export.py) in a process where ``import
    app`` fails; the same outputs as the SavedModel."""
    from app.model import build_model
    from app.release.export import export

    model = build_model(data.num_outputs, height=data.height, width=data.width, seed=3)
    written = export(model, data, True, tmp_path / "model")
    x = np.asarray(data.features("test"))[:16].reshape(16, -1)
    np.save(tmp_path / "x.npy", x)
    served = tf.saved_model.load(str(written.path / layout.SAVED_MODEL_DIR)).signatures["serve"]
    expected = next(iter(served(tf.constant(x)).values())).numpy()
    script = (
        "import sys; sys.modules['app'] = None\n"
        "import numpy as np, keras\n"
        f"m = keras.saving.load_model({str(written.path / layout.KERAS_FILE)!r})\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, m(np.load({str(tmp_path / 'x.npy')!r})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-4, atol=1e-5)


def test_what_a_killed_publish_left_is_removed_and_nothing_else(
    data, tmp_path: Path, logged
) -> None:
    """Only coretrain's exact names with what it writes there go: ``.N.<8 hex digits>``
    holding the building marker's text, ``.pruned.N.<pid>`` holding version N's record (a
    real one: version 1 renamed as a prune renames it). A name that merely starts like one
    is not coretrain's; one of that shape without its mark is kept, named in a warning."""
    from app.release import publish as publish_lib

    models = tmp_path / "models"
    models.mkdir()
    publish_lib.publish(_export(_linear(data, 0.5), tmp_path / "a"), models, data, {})
    record = (models / "1" / layout.META_FILE).read_bytes()
    os.rename(models / "1", models / ".pruned.1.99")  # a prune killed while removing it
    building, marker = publish_lib.BUILDING, publish_lib._BUILDING_TEXT
    planted = {
        ".3.0a1b2c3d": (building, marker),  # a build killed: removed
        ".3.k1ll3d00": (building, marker),  # not 8 hex digits
        ".3.0a1b2c3d.bak": (building, marker),
        ".5.0a1b2c3d": (building, b"{}"),  # not the marker coretrain writes: warned
        ".pruned.keepme": (layout.META_FILE, record),  # not .pruned.N.<pid>
        ".pruned.2.99": (layout.META_FILE, record),  # version 1's record, not 2's: warned
        ".pruned.4.99": (layout.META_FILE, b"{}"),  # not a record of coretrain's: warned
        ".4.notes": ("notes.txt", b"precious"),
    }
    for name, (file, content) in planted.items():
        (models / name).mkdir()
        (models / name / file).write_bytes(content)
        (models / name / "notes.txt").write_bytes(b"precious")
    decision = publish_lib.publish(_export(_linear(data), tmp_path / "cand"), models, data, {})
    assert decision.published and decision.version == 1
    kept = sorted(n for n in planted if n != ".3.0a1b2c3d")
    assert sorted(p.name for p in models.iterdir()) == sorted([*kept, ".lock", "1"])
    assert all((models / name / "notes.txt").read_bytes() == b"precious" for name in kept)
    assert not (models / "1" / publish_lib.BUILDING).exists()
    removed = [r.message for r in logged if getattr(r, "event", "") == "publish_cleanup"]
    assert removed == [f"removed {models / n}, left by a killed run" for n in (".3.0a1b2c3d",
                       ".pruned.1.99")]  # fmt: skip
    warned = [r.path for r in logged if getattr(r, "event", "") == "publish_leftover_kept"]
    assert warned == [str(models / n) for n in (".5.0a1b2c3d", ".pruned.2.99", ".pruned.4.99")]


def test_versions_are_ordered_by_number_as_tf_serving_orders_them(tmp_path: Path) -> None:
    """TF Serving ranks versions by number: 10 is newer than 9, 100 than 10 (by name, "10"
    and "100" would sort before "9")."""
    from app.atomic import open_dir
    from app.release.publish import _prune

    for name in ("9", "10", "100"):
        _model_dir(tmp_path / name)
        (tmp_path / name / layout.META_FILE).write_text(json.dumps({"weights": name}))
    assert [e.number for e in layout.entries(tmp_path)] == [9, 10, 100]
    assert layout.served(tmp_path).number == 100 and layout.next_number(tmp_path) == 101
    assert layout.newest(tmp_path) == tmp_path / "100"
    assert [e.number for e in layout.models(tmp_path)] == [100, 10, 9]
    assert [row.entry.number for row in layout.listing(tmp_path)] == [9, 10, 100]
    with open_dir(tmp_path) as directory:
        _prune(directory, keep=2)
    assert layout.versions(tmp_path) == [10, 100]


def test_a_published_version_records_the_number_it_was_published_as(data, tmp_path: Path) -> None:
    from app.release.publish import publish

    models = tmp_path / "models"
    models.mkdir()
    first = publish(_export(_linear(data, 0.5), tmp_path / "a"), models, data, {"run": "a"})
    second = publish(_export(_linear(data), tmp_path / "b"), models, data, {"run": "b"})
    assert (first.version, second.version) == (1, 2), second.reason
    for number in (1, 2):
        record = json.loads((models / str(number) / layout.META_FILE).read_text())
        assert record["publish"]["version"] == number and record["publish"]["published"]
    assert json.loads((models / "2" / layout.META_FILE).read_text())["publish"] == second.to_json()


def test_a_number_taken_while_publishing_is_never_replaced(
    data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another program makes the (empty) directory 1 just before the rename: a plain rename
    would replace it; the version goes above it, its record naming the number it got."""
    from app.atomic import Dir
    from app.release.publish import publish

    models = tmp_path / "models"
    models.mkdir()
    real = Dir.publish

    def another_program_first(self: Dir, tmp: Dir, name: str, **kwargs: bool) -> bool:
        if name == "1":
            (models / "1").mkdir()
        return real(self, tmp, name, **kwargs)

    monkeypatch.setattr(Dir, "publish", another_program_first)
    decision = publish(_export(_linear(data), tmp_path / "cand"), models, data, {})
    assert decision.published and decision.version == 2
    assert list((models / "1").iterdir()) == []  # the other program's directory, untouched
    record = json.loads((models / "2" / layout.META_FILE).read_text())
    assert record["publish"]["version"] == 2
    assert sorted(p.name for p in models.iterdir()) == [".lock", "1", "2"]


_KILL_AFTER_MKDIR = """
import os, signal, sys
from pathlib import Path
from app.atomic import Dir, open_dir
from app.release import publish
from app.release.gate import Decision

real = Dir.temp_dir

def made_then_killed(self, prefix, announce=None):
    real(self, prefix, announce)
    os.kill(os.getpid(), signal.SIGKILL)  # the moment after the directory is made

Dir.temp_dir = made_then_killed
with open_dir(Path(sys.argv[1]), create=False) as pub, publish._locked(pub) as lock:
    publish._write_version(Path(sys.argv[2]), pub, lock, {}, Decision(True, "", 0.1, None, None))
"""


def test_a_publish_killed_as_its_temporary_directory_is_made_is_cleaned_by_the_next(
    data, tmp_path: Path
) -> None:
    """A real publish SIGKILLed just after it made ``.1.<hex>/`` (before anything is in it):
    the lock file named it before it was made, so the next publish removes it."""
    from app.release.publish import publish

    models = tmp_path / "models"
    models.mkdir()
    export = _export(_linear(data), tmp_path / "cand")
    proc = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_MKDIR, str(models), str(export.path)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-2000:]
    (left,) = [p for p in models.iterdir() if p.name != ".lock"]
    assert left.name.startswith(".1.") and list(left.iterdir()) == []  # no marker inside
    (models / ".7.notes").mkdir()  # a user's directory of that shape: not named, kept
    decision = publish(export, models, data, {})
    assert decision.published and decision.version == 1
    assert sorted(p.name for p in models.iterdir()) == [".7.notes", ".lock", "1"]
    assert (models / ".lock").read_bytes() == b""  # names nothing once published


def test_too_few_test_rows_cannot_judge_a_champion(few_rows, tmp_path: Path) -> None:
    """60 test rows: a candidate is not published over the champion, whatever its RMSE;
    with no champion it is (the mean predictor is its only reference)."""
    from app.release.publish import publish

    assert few_rows.test_size < gate.MIN_ROWS
    models = tmp_path / "models"
    _version(_linear(few_rows, 0.3), models, "1")
    decision = publish(_export(_linear(few_rows), tmp_path / "cand"), models, few_rows, {})
    assert not decision.published and decision.champion_version == 1
    assert decision.reason.startswith(f"cannot judge: the test set has {few_rows.test_size} rows")
    assert f"at least {gate.MIN_ROWS}" in decision.reason
    assert layout.versions(models) == [1]
    (tmp_path / "empty").mkdir()
    first = publish(_export(_linear(few_rows), tmp_path / "c2"), tmp_path / "empty", few_rows, {})
    assert first.published and first.version == 1


def test_a_version_whose_files_are_fifos_or_devices_is_no_model_and_never_loaded(
    data, tmp_path: Path, logged
) -> None:
    """A FIFO among the variables made TensorFlow's loader wait for a writer, with the
    publish lock held; a saved_model.pb linked to /dev/zero, never end. Neither is a model:
    passed over as the champion, refused by predict, before TensorFlow opens anything."""
    from app.release.publish import publish

    models = tmp_path / "models"
    fifo = _version(_linear(data, 0.9), models, "1")
    (shard,) = (fifo / "variables").glob("variables.data-*")
    shard.unlink()
    os.mkfifo(shard)
    zero = _version(_linear(data, 0.9), models, "2")
    (zero / layout.SAVED_MODEL_FILE).unlink()
    (zero / layout.SAVED_MODEL_FILE).symlink_to("/dev/zero")
    record = _version(_linear(data, 0.9), models, "3") / layout.META_FILE
    record.unlink()
    os.mkfifo(record)  # a file TensorFlow does not open: still a model
    assert [(e.number, e.is_model, e.what) for e in layout.entries(models)] == [
        (1, False, f"variables/{shard.name} is not a regular file"),
        (2, False, "saved_model.pb is not a regular file"),
        (3, True, "a model"),
    ]  # fmt: skip
    with pytest.raises(ConfigError, match=f"{fifo}: not a model TensorFlow can load: variables/"):
        layout.resolve_model(fifo)
    decision = publish(_export(_linear(data), tmp_path / "cand"), models, data, {})
    assert decision.published and decision.champion_version == 3 and decision.version == 4
