"""The end of a run for each outcome (app/training/finish.py), with stand-ins for the
workspace and the export: what is logged, written and returned. The export itself is
pinned by tests/test_release.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.release.export import Exported
from app.release.gate import Decision
from app.training import finish
from app.training.loop.outcome import Completed, Replan, Stopped, TargetReached

DATA = SimpleNamespace(
    baseline_rmse=1.5, train_size=240, test_size=60, path=Path("/cache/0123456789abcdef")
)


def _ws(tmp_path: Path, chief: bool = True) -> SimpleNamespace:
    return SimpleNamespace(is_chief=chief, metrics=tmp_path / "metrics.json", model=tmp_path / "m")


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[bool]:
    """The export replaced by a stand-in that records each call."""
    done: list[bool] = []

    def fake(ws: object, model: object, data: object, standardize: bool) -> Exported:
        done.append(standardize)
        return Exported(tmp_path / "m", "w" * 32, "f" * 32)

    monkeypatch.setattr(finish, "_export", fake)
    return done


def test_the_summary_counts_the_steps_trained_and_their_rate() -> None:
    outcome = Completed(start_step=100, step=300, eval_rmse=0.2, loop_seconds=4.0, steps_per_loop=5)
    summary = finish.summarize(outcome, DATA, 10, exported_step=250)  # type: ignore[arg-type]
    assert summary["steps_trained"] == 200 and summary["final_step"] == 300
    assert summary["examples_per_sec"] == 500.0  # 200 steps × 10 samples / 4 s
    assert summary["status"] == "completed" and summary["last_eval_rmse"] == 0.2
    assert summary["data_key"] == "0123456789abcdef"  # what a rerun checks its sources by
    assert list(summary)[-1] == "exported_step"  # the facts come last, in their order


def test_a_stopped_run_logs_its_end_and_exports_nothing(
    tmp_path: Path, exports: list[bool], logged: list[logging.LogRecord]
) -> None:
    outcome = Stopped(start_step=0, step=7, eval_rmse=None, loop_seconds=1.0, steps_per_loop=1)
    result = finish.finish(_ws(tmp_path), outcome, {"status": "preempted"}, None, DATA, True)  # type: ignore[arg-type]
    assert exports == [] and not (tmp_path / "metrics.json").exists()
    assert [r.event for r in logged] == ["end"] and "preempted at step 7" in logged[0].getMessage()
    assert result.outcome is outcome and result.decision is None


def test_a_run_that_must_replan_logs_it_and_exports_nothing(
    tmp_path: Path, exports: list[bool], logged: list[logging.LogRecord]
) -> None:
    outcome = Replan(start_step=0, step=9, eval_rmse=0.3, loop_seconds=1.0, steps_per_loop=1)
    finish.finish(_ws(tmp_path), outcome, {}, None, DATA, True)  # type: ignore[arg-type]
    assert exports == [] and [r.event for r in logged] == ["replan"]


def test_a_worker_that_is_not_the_chief_ends_without_export_or_metrics(
    tmp_path: Path, exports: list[bool], logged: list[logging.LogRecord]
) -> None:
    outcome = Completed(start_step=0, step=9, eval_rmse=0.3, loop_seconds=1.0, steps_per_loop=1)
    summary = {"status": "completed", "final_step": 9, "test_rmse": 0.25}
    finish.finish(_ws(tmp_path, chief=False), outcome, summary, None, DATA, True)  # type: ignore[arg-type]
    assert exports == [] and not (tmp_path / "metrics.json").exists()
    assert [r.event for r in logged] == ["end"]


def test_the_chief_exports_publishes_and_writes_the_metrics(
    tmp_path: Path, exports: list[bool], logged: list[logging.LogRecord]
) -> None:
    outcome = TargetReached(
        start_step=0, step=9, eval_rmse=0.01, loop_seconds=1.0, steps_per_loop=1
    )
    summary = {"status": "target_reached", "final_step": 9, "test_rmse": 0.25}
    refused = Decision(False, "worse than version 3", 0.25, 0.2, 3)
    offered: list[Exported] = []
    result = finish.finish(
        _ws(tmp_path), outcome, summary, None, DATA, False,  # type: ignore[arg-type]
        publish=lambda exported: offered.append(exported) or refused,
    )  # fmt: skip
    assert exports == [False] and [e.weights for e in offered] == ["w" * 32]
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["weights"] == "w" * 32 and written["publish"]["published"] is False
    assert [r.event for r in logged] == ["publish_rejected", "end"]
    end = logged[-1]  # a refused model's run exits 7: its end says so, not only metrics.json
    assert end.levelno == logging.WARNING and end.exit_code == 7  # type: ignore[attr-defined]
    assert end.getMessage().endswith("; not published: worse than version 3")
    assert (
        result.decision == refused
        and result.refused == "worse than version 3"
        and result.summary["export"] == str(tmp_path / "m")
    )
