"""A finished run rerun (app/training/admit/previous.py): nothing to do only when every piece of
evidence is there, in real files; anything missing or different goes on as a resume."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

from app.config import TrainConfig
from app.release import layout
from app.training.admit import previous as rerun
from app.training.loop.outcome import Completed, TargetReached
from app.training.state import identity, workspace
from tests.conftest import TINY_TRAIN_ARGS, json_lines, prepare_cache, run_cli


def _finished(ws, config: TrainConfig, data, workers: int):  # type: ignore[no-untyped-def]
    """Whether the run of ``config`` on the cache ``data`` is finished in ``ws``."""
    before = rerun.read(ws, config.schedule, workers)
    mine = identity.of_run(identity.options_of(config), data, workers).to_json()
    return rerun.finished(ws, before, mine, config.publishing)


def _finished_unchanged(ws, config: TrainConfig, key: str, workers: int):  # type: ignore[no-untyped-def]
    """Whether the run of ``config`` on the sources of cache key ``key`` is finished in ``ws``,
    known before the data are read."""
    before = rerun.read(ws, config.schedule, workers)
    unknown = {"options": identity.options_of(config), "workers": workers}
    return rerun.finished_unchanged(ws, before, key, unknown, config.publishing)


@pytest.fixture
def done(tiny_data: Path, tmp_path: Path):
    """A finished run's output as the finish writes it: metrics.json, model/, run.json, and
    version 4 of the publish directory holding its weights."""
    config = TrainConfig.of(
        data_dir=tiny_data, output_dir=tmp_path / "out", max_steps=30,
        publish_dir=tmp_path / "models", lr_schedule="constant",  # --max-steps: not identity
    )  # fmt: skip
    data = prepare_cache(config)
    ws = workspace.for_run(config)
    identity.record(
        ws.checkpoints, "fast", "float32", identity.of_run(identity.options_of(config), data, 1)
    )
    (ws.model / layout.SAVED_MODEL_DIR).mkdir(parents=True)
    (ws.model / layout.SAVED_MODEL_DIR / layout.SAVED_MODEL_FILE).write_bytes(b"pb")
    (ws.model / layout.KERAS_FILE).write_bytes(b"keras")
    decision = {
        "published": True, "reason": "better", "candidate_rmse": 0.1, "version": 4,
        "directory": str(config.publishing.publish_dir),
    }  # fmt: skip
    summary = {
        "status": "completed", "final_step": 30, "weights": "abc", "last_eval_rmse": 0.1,
        "steps_per_loop": 5, "target_loss": config.schedule.target_loss, "publish": decision,
        "export_files": layout.files_digest(ws.model),
    }  # fmt: skip
    ws.metrics.write_text(json.dumps(summary))
    version = tmp_path / "models" / "4"
    version.mkdir(parents=True)
    (version / layout.SAVED_MODEL_FILE).write_bytes(b"pb")
    (version / layout.META_FILE).write_text(json.dumps({"weights": "abc"}))
    return config, data, ws


def test_a_finished_run_is_recognised_from_its_files(done, logged) -> None:
    config, data, ws = done
    result = _finished(ws, config, data, 1)
    assert isinstance(result.outcome, Completed) and result.outcome.step == 30
    assert result.decision.published and result.decision.version == 4
    assert result.summary["weights"] == "abc" and result.refused is None
    assert [r.event for r in logged] == ["already_finished", "end"]


def test_target_reached_needs_the_same_target(done) -> None:
    config, data, ws = done
    summary = json.loads(ws.metrics.read_text())
    ws.metrics.write_text(json.dumps({**summary, "status": "target_reached", "final_step": 12}))
    found = _finished(ws, config, data, 1)
    assert isinstance(found.outcome, TargetReached) and found.outcome.step == 12
    other = config.with_options(target_loss=config.schedule.target_loss / 2)
    assert _finished(ws, other, data, 1) is None


@pytest.mark.parametrize(
    "change",
    [
        "more steps",
        "fewer steps",
        "another seed",
        "no export",
        "damaged export",
        "another publish dir",
        "unfinished",
        "workers",
        "a multi-worker run",
        "no digest",
    ],
)
def test_anything_missing_or_different_goes_on(done, change: str) -> None:
    config, data, ws = done
    workers = 1
    summary = json.loads(ws.metrics.read_text())
    mine = identity.of_run(identity.options_of(config), data, 1)
    assert _finished(ws, config, data, workers) is not None  # as done, before the change
    if change == "more steps":  # the same identity (a constant rate), not at its end
        config = config.with_options(max_steps=31)
    elif change == "fewer steps":
        config = config.with_options(max_steps=29)
    elif change == "another seed":
        config = config.with_options(seed=config.recipe.seed + 1)
    elif change == "no export":
        (ws.model / layout.KERAS_FILE).unlink()
    elif change == "damaged export":
        (ws.model / layout.SAVED_MODEL_DIR / layout.SAVED_MODEL_FILE).write_bytes(b"pX")
    elif change == "another publish dir":
        config = config.with_options(publish_dir=config.publishing.publish_dir.parent / "other")
    elif change == "unfinished":
        ws.metrics.write_text(json.dumps({**summary, "status": "preempted"}))
    elif change == "workers":
        workers = 2
    elif change == "a multi-worker run":  # its record says 2 workers, as this run does
        identity.record(ws.checkpoints, "fast", "float32", dataclasses.replace(mine, workers=2))
        workers = 2
    elif change == "no digest":
        ws.metrics.write_text(json.dumps({**summary, "weights": None}))
    assert _finished(ws, config, data, workers) is None


def test_a_version_withdrawn_since_is_not_published_again(done, logged) -> None:
    """The operator rolled version 4 back (moved it out): the rerun respects that."""
    config, data, ws = done
    (config.publishing.publish_dir / "4").rename(config.publishing.publish_dir / "rolled-back")
    result = _finished(ws, config, data, 1)
    assert result.decision.published and result.decision.version == 4
    assert result.decision.reason == rerun.WITHDRAWN
    events = [r.event for r in logged]
    assert events == ["publish_withdrawn", "already_finished", "end"]
    assert "was withdrawn" in logged[1].getMessage()
    assert layout.entries(config.publishing.publish_dir) == []


@pytest.mark.parametrize("spelling", ["relative", "through a symlink"])
def test_a_withdrawn_version_is_respected_however_the_directory_is_spelled(
    done, logged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    """Published to ``--publish-dir $PWD/models``, rolled back, rerun with ``--publish-dir
    models`` (or through a symlink): the same directory, so the same rollback."""
    config, data, ws = done
    models = config.publishing.publish_dir
    (models / "4").rename(models / "rolled-back")
    if spelling == "relative":
        monkeypatch.chdir(models.parent)
        other = Path(models.name)
    else:
        other = tmp_path / "linked"
        other.symlink_to(models)
    result = _finished(ws, config.with_options(publish_dir=other), data, 1)
    assert result is not None and result.decision.reason == rerun.WITHDRAWN


def test_a_planted_fifo_metrics_json_is_no_finished_run_and_is_not_waited_for(done) -> None:
    config, _, ws = done
    ws.metrics.unlink()
    os.mkfifo(ws.metrics)
    assert rerun.over(ws, config.schedule, 1) is None


def test_the_same_sources_unchanged_are_known_without_the_cache(done, logged) -> None:
    config, data, ws = done
    summary = json.loads(ws.metrics.read_text())
    assert _finished_unchanged(ws, config, data.path.name, 1) is None  # an older record
    ws.metrics.write_text(json.dumps({**summary, "data_key": data.path.name}))
    assert _finished_unchanged(ws, config, "0" * 16, 1) is None  # the sources changed
    other = config.with_options(seed=config.recipe.seed + 1)
    assert _finished_unchanged(ws, other, data.path.name, 1) is None  # another option
    assert _finished_unchanged(ws, config, data.path.name, 2) is None  # workers
    assert logged == []
    result = _finished_unchanged(ws, config, data.path.name, 1)
    assert isinstance(result.outcome, Completed) and result.outcome.step == 30
    assert [r.event for r in logged] == ["already_finished", "end"]


def test_a_finished_runs_rerun_does_not_convert_its_evicted_cache_again(
    tiny_data: Path, tmp_path: Path
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    args = ["train", "--data", str(tiny_data), "--output", str(out), "--cache-dir", str(cache),
            "--max-steps", "3", *TINY_TRAIN_ARGS]  # fmt: skip
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert json.loads((out / "metrics.json").read_text())["data_key"] in os.listdir(cache)
    shutil.rmtree(cache)  # evicted, or a temporary cache directory that went with its pod
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    records = json_lines(again.stdout)
    assert [r["event"] for r in records if r["event"] in ("already_finished", "cache")] == [
        "already_finished"
    ]
    assert not cache.exists()  # nothing converted to learn there was nothing to do
