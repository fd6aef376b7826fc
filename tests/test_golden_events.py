"""The event sequence of real runs, held against a golden record: what a run says, in which
order, and how it exits, for the ways into the first step (a fresh run, a resume, a
finished rerun) and the refusals on the way (a serving signature, other data under a
resume, the memory bound).

The record, tests/fixtures/golden/events.json, holds for each case the exit code and the
event names in order (a ``phase`` event as ``phase:<phase>``), without the events whose
presence depends on the machine's speed or load (:data:`MACHINE`). Regenerate it only for
a change that means to change what a run says: ``CORETRAIN_WRITE_GOLDEN=1 pytest
tests/test_golden_events.py``, then read the diff.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, json_lines, run_cli

GOLDEN = FIXTURES / "golden" / "events.json"
#: Events that come or go with the machine's speed, load or environment (``cache_default``:
#: whether HOME offers a per-user cache), not with the run's way (and
#: ``cache_progress`` every few seconds of a conversion); ``input_loaded`` comes with a split
#: held in memory, which the measured costs of holding and streaming decide.
MACHINE = {
    "cpu_throttled", "budget_changed", "steps_per_loop", "choice_measured", "input_loaded",
    "cache_default",
}  # fmt: skip
ARGS = [
    "--batch-size", "40", "--eval-every", "3", "--checkpoint-every", "3", "--seed", "3",
    "--lr-schedule", "constant", "--steps-per-loop", "1",
]  # fmt: skip

pytestmark = pytest.mark.slow


def _names(stdout: str) -> list[str]:
    names = []
    for record in json_lines(stdout):
        event = record.get("event")
        if event in MACHINE or (event == "cache_progress" and "bytes_done" in record):
            continue  # the time-based progress of a conversion: as many as it takes seconds
        names.append(f"phase:{record['phase']}" if event == "phase" else str(event))
    return names


def _train(data: Path, out: Path, steps: int, *extra: str) -> dict[str, object]:
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--max-steps", str(steps),
        *ARGS, *extra,
    )  # fmt: skip
    return {"exit": proc.returncode, "events": _names(proc.stdout)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    from app.data import synthetic

    root = tmp_path_factory.mktemp("golden")
    data, other, wide = root / "data", root / "other", root / "wide"
    synthetic.generate(data, train=240, test=60, seed=1)
    synthetic.generate(other, train=240, test=60, seed=2)
    synthetic.generate(wide, train=240, test=60, seed=1, kind="lines")  # 15 labels, not 3
    pub = root / "models"
    pub.mkdir()
    found = {}
    found["fresh"] = _train(data, root / "fresh", 6, "--publish-dir", str(pub))
    found["finished_rerun"] = _train(data, root / "fresh", 6, "--publish-dir", str(pub))
    _train(data, root / "short", 3)
    shutil.copytree(root / "short", root / "short-copy")
    found["resume"] = _train(data, root / "short", 6)
    found["other_data_under_resume"] = _train(other, root / "short-copy", 6)
    found["signature_refusal"] = _train(wide, root / "wide-out", 6, "--publish-dir", str(pub))
    found["memory_refusal"] = _train(data, root / "huge", 6, "--batch-size", str(10**9))
    return found


def test_the_event_sequences_are_the_golden_ones(runs: dict[str, dict[str, object]]) -> None:
    if os.environ.get("CORETRAIN_WRITE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(runs, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert {case: run["exit"] for case, run in runs.items()} == {
        "fresh": 0, "finished_rerun": 0, "resume": 0, "other_data_under_resume": 2,
        "signature_refusal": 7, "memory_refusal": 8,
    }  # fmt: skip
    for case, run in golden.items():
        assert runs[case] == run, f"{case}: {runs[case]} != {run}"
