"""The checkpoints (app/training/state/checkpointer.py): a resume falls back past missing and
truncated checkpoints, removes what killed writes left, refuses when none is readable; a
kill -9 at any moment never blocks the next run; a full disk or a diverging loss keeps
the last good checkpoint; a checkpoint written by an earlier version restores (its
layout is a contract).

Every scenario runs the real ``coretrain train`` in a subprocess on real files. The runs
that damage a copy of the finished ``reference`` run (tests/conftest.py) run in the
background (tests/runs.py) while the tests that train in place (the first two) run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.data.cache import marker as cache_marker
from tests import kill_harness
from tests.conftest import FIXTURES, SEED_RECIPE_ARGS, events, json_lines, run_cli
from tests.runs import (
    LOSS_TOLERANCE,
    STEPS,
    WAIT,
    Done,
    checkpoint_tensors,
    copy_output,
    digest,
    losses,
    mount_tmpfs,
    ref_data,
    reference_ok,
    start_in_background,
    train,
    truncate,
    umount,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _start_in_background(request: pytest.FixtureRequest) -> None:
    start_in_background(
        request, "reference", "fallback_run", "unreadable_run", "diverged_run", "disk_full_run"
    )


# --------------------------------------------------------------------------------------
# A checkpoint of an earlier version

OLD = FIXTURES / "checkpoints" / "v0.1.0-step3"
# Checkpoints of 0.1.0 were trained with the seed's recipe: a resume must give it.
OLD_ARGS = [
    "--batch-size", "40", "--eval-every", "6", "--checkpoint-every", "6", *SEED_RECIPE_ARGS,
]  # fmt: skip


def _train_as_0_1_0(data: Path, out: Path, steps: int, *extra: str) -> list[dict]:
    args = ["--data", str(data), "--output", str(out), "--max-steps", str(steps)]
    proc = run_cli("train", *args, *OLD_ARGS, *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json_lines(proc.stdout)


def test_a_checkpoint_of_version_0_1_0_restores_and_training_continues(
    tiny_data: Path, tmp_path: Path
) -> None:
    expected = json.loads((OLD / "expected.json").read_text())
    out = tmp_path / "out"
    shutil.copytree(OLD, out / "checkpoints", ignore=shutil.ignore_patterns("expected.json"))
    # Nothing left to train: the restored model itself is evaluated and exported.
    same = _train_as_0_1_0(tiny_data, out, expected["step"], "--seed", str(expected["seed"]))
    (resume,) = events(same, "resume")
    assert resume["step"] == expected["step"]
    end = events(same, "end")[-1]
    assert end["steps_trained"] == 0
    # The weights are the old run's: its test RMSE, up to the CPU's float32 rounding.
    assert end["test_rmse"] == pytest.approx(expected["test_rmse"], rel=1e-5)
    # The optimizer state came with them (the restore checks iterations == step), and
    # training goes on to the new absolute end.
    more = _train_as_0_1_0(tiny_data, out, 6, "--seed", str(expected["seed"]))
    assert events(more, "resume")[0]["step"] == expected["step"]
    end = events(more, "end")[-1]
    assert (end["status"], end["start_step"], end["final_step"]) == ("completed", 3, 6)
    restored = checkpoint_tensors(out / "checkpoints" / "ckpt-6")
    assert int(restored["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]) == 6


# --------------------------------------------------------------------------------------
# kill -9 at random moments


def test_random_kill_9_never_blocks_the_next_run(tiny_data: Path, tmp_path: Path) -> None:
    """tests/kill_harness.py with a small N (CORETRAIN_KILL_ROUNDS, default 3)."""
    n = int(os.environ.get("CORETRAIN_KILL_ROUNDS", "3"))
    summary = kill_harness.run(n, tmp_path, tiny_data, seed=1, log=print)
    assert summary["problems"] == [], json.dumps(summary, indent=2)
    assert len(summary["models"]) == n
    rounds = summary["rounds"]
    assert summary["killed"] == n, json.dumps(rounds, indent=2)
    # The first cache, checkpoint and export rounds kill at once when the operation's
    # temporary file appears: each kill must land inside that operation, or the rerun's
    # clean-up and restore were not exercised.
    first = [r for r in rounds[: len(kill_harness.TRIGGERS)] if r["trigger"] != "anytime"]
    assert first and all(r["inside"] for r in first), json.dumps(rounds, indent=2)


# --------------------------------------------------------------------------------------
# Fallback past missing and truncated checkpoints, leftovers of killed writes


def _key(out: Path) -> str:
    """The key of the one data cache in ``out/cache``."""
    return next(p.name for p in (out / "cache").iterdir() if cache_marker.KEY.fullmatch(p.name))


@pytest.fixture(scope="module")
def fallback_run(
    pool: ThreadPoolExecutor, reference: Future[Done], tmp_path_factory: pytest.TempPathFactory
) -> Future[tuple[Done, list[str]]]:
    """The reference output after: ckpt-10 deleted while the state file still names it,
    ckpt-8.index and ckpt-6.data truncated, and leftovers of killed writes planted."""
    workdir = tmp_path_factory.mktemp("fallback")

    def job() -> tuple[Done, list[str]]:
        ref = reference_ok(reference)
        out = copy_output(ref.out, workdir / "out")
        (out / "metrics.json").unlink()  # killed before its end: a rerun has work to do
        ckpt = out / "checkpoints"
        for f in ckpt.glob("ckpt-10.*"):
            f.unlink()
        truncate(ckpt / "ckpt-8.index")
        truncate(ckpt / "ckpt-6.data-00000-of-00001")
        planted = [
            ckpt / "ckpt-12_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate123",
            ckpt / "ckpt-4.index.tempstate987654321",
            ckpt / "checkpoint.tmp0123456789abcdef0123456789abcdef",
            out / ".model.k1ll3d" / "model.keras",
            out / "cache" / f".{_key(out)}.999999999.0000000e" / "train_x.f32",
        ]
        for p in planted:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"partial")
        work = planted[-1].parent  # as a killed conversion leaves it: marked as coretrain's
        key = work.name.split(".")[1]
        (work / cache_marker.MARKER).write_bytes(cache_marker.content(cache_marker.WORK, key))
        with open(out / "logs" / "train.jsonl", "ab") as log:
            log.write(b'{"level": "INFO", "event": "progr')  # a record cut by the kill
        return train(ref_data(ref), out), [str(p) for p in planted]

    return pool.submit(job)


def test_resume_falls_back_past_missing_and_truncated_checkpoints(
    fallback_run: Future[tuple[Done, list[str]]], reference: Future[Done]
) -> None:
    run, _ = fallback_run.result(timeout=WAIT)
    assert run.returncode == 0, run.why()
    records = run.records
    skipped = [Path(r["path"]).name for r in events(records, "checkpoint_unreadable")]
    assert skipped == ["ckpt-10", "ckpt-8", "ckpt-6"]
    for r in events(records, "checkpoint_unreadable"):
        assert r["level"] == "WARNING" and r["message"].startswith("skipping unreadable")
    fallback = events(records, "checkpoint_fallback")
    assert len(fallback) == 1 and fallback[0]["skipped"] == 3
    assert Path(fallback[0]["path"]).name == "ckpt-4"
    assert events(records, "resume")[0]["step"] == 4
    end = events(records, "end")[-1]
    assert (end["status"], end["final_step"]) == ("completed", STEPS)
    # Steps 5..10 retrained from checkpoint 4 give the reference losses again.
    ref_losses = losses(reference_ok(reference).records)
    got = losses(records)
    assert sorted(got) == list(range(5, STEPS + 1))
    assert max(abs(got[s] - ref_losses[s]) for s in got) <= LOSS_TOLERANCE
    ckpt = run.out / "checkpoints"
    assert {f"ckpt-{s}.index" for s in (4, 6, 8, 10)} <= {p.name for p in ckpt.iterdir()}


def test_leftovers_of_killed_writes_are_removed_and_the_log_stays_json_lines(
    fallback_run: Future[tuple[Done, list[str]]],
) -> None:
    run, planted = fallback_run.result(timeout=WAIT)
    assert run.returncode == 0, run.why()
    assert [p for p in planted if Path(p).exists()] == []
    assert not (run.out / "checkpoints" / "ckpt-12_temp").exists()
    assert not (run.out / ".model.k1ll3d").exists()
    cleanup = events(run.records, "checkpoint_cleanup")
    assert sorted(cleanup[0]["removed"]) == sorted(
        [
            "checkpoint.tmp0123456789abcdef0123456789abcdef",
            "ckpt-12_temp",
            "ckpt-4.index.tempstate987654321",
        ]
    )
    text = (run.out / "logs" / "train.jsonl").read_text()
    assert "progr\n" not in text and '"progr{' not in text
    file_records = json_lines(text)  # fails on any line that is not JSON
    assert [r["status"] for r in file_records if r["event"] == "end"] == ["completed"] * 2
    assert kill_harness.leftovers(run.out) == []


# --------------------------------------------------------------------------------------
# No checkpoint readable


def _rerun_on_a_copy(
    pool: ThreadPoolExecutor,
    reference: Future[Done],
    workdir: Path,
    damage: Callable[[Path], None],
    steps: int = STEPS,
    *extra: str,
) -> Future[tuple[Done, dict[str, str]]]:
    """Train again on a copy of the reference output, after ``damage(copy)``: the run and
    the digest of the copy's checkpoints before it."""

    def job() -> tuple[Done, dict[str, str]]:
        ref = reference_ok(reference)
        out = copy_output(ref.out, workdir / "out")
        (out / "metrics.json").unlink()  # killed before its end: a rerun has work to do
        damage(out)
        before = digest(out / "checkpoints")
        return train(ref_data(ref), out, steps, *extra), before

    return pool.submit(job)


@pytest.fixture(scope="module")
def unreadable_run(
    pool: ThreadPoolExecutor, reference: Future[Done], tmp_path_factory: pytest.TempPathFactory
) -> Future[tuple[Done, dict[str, str]]]:
    def damage(out: Path) -> None:
        for index in (out / "checkpoints").glob("*.index"):
            truncate(index, keep=0.1)

    return _rerun_on_a_copy(pool, reference, tmp_path_factory.mktemp("unreadable"), damage)


def test_all_checkpoints_unreadable_exits_4_and_touches_nothing(
    unreadable_run: Future[tuple[Done, dict[str, str]]],
) -> None:
    run, before = unreadable_run.result(timeout=WAIT)
    assert run.returncode == 4, run.why()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"coretrain: {run.out / 'checkpoints'}: none of 5 checkpoints")
    assert "move the directory away to start from scratch" in lines[0]
    assert events(run.records, "progress") == [] and events(run.records, "resume") == []
    assert len(events(run.records, "checkpoint_unreadable")) == 5
    assert digest(run.out / "checkpoints") == before  # nothing deleted, nothing overwritten


# --------------------------------------------------------------------------------------
# Disk full while saving


@dataclass
class DiskFull:
    failed: Done
    before: dict[str, str]
    after: dict[str, str]
    rerun: Done | None
    skip: str | None = None


@pytest.fixture(scope="module")
def disk_full_run(
    pool: ThreadPoolExecutor, reference: Future[Done], tmp_path_factory: pytest.TempPathFactory
) -> Future[DiskFull]:
    """The reference output on a small tmpfs filled to 16 KiB free; --max-steps 12 must save
    checkpoint 12 (~34 KB). Then the filler goes and the run is repeated."""
    workdir = tmp_path_factory.mktemp("disk-full")
    mnt = workdir / "tmpfs"

    def job() -> DiskFull:
        ref = reference_ok(reference)
        used = sum(p.stat().st_size for p in ref.out.rglob("*") if p.is_file())
        used -= sum(p.stat().st_size for p in (ref.out / "cache").rglob("*") if p.is_file())
        size_kib = used // 1024 + 3 * 1024  # room for the new export next to the old one
        skip = mount_tmpfs(mnt, f"size={size_kib}k")
        if skip:
            empty = Done(mnt, -1, "", "")
            return DiskFull(empty, {}, {}, None, skip)
        try:
            out = copy_output(ref.out, mnt / "out", with_cache=False)
            st = os.statvfs(mnt)
            free = st.f_bavail * st.f_frsize
            (mnt / "filler").write_bytes(b"\0" * (free - 16 * 1024))
            extra = ("--cache-dir", str(ref.out / "cache"))
            before = digest(out / "checkpoints")
            failed = train(ref_data(ref), out, 12, *extra)
            after = digest(out / "checkpoints")
            (mnt / "filler").unlink()
            rerun = train(ref_data(ref), out, 12, *extra) if failed.returncode == 4 else None
            return DiskFull(failed, before, after, rerun)
        finally:
            umount(mnt)

    return pool.submit(job)


def test_disk_full_while_saving_exits_4_and_keeps_the_previous_checkpoint(
    disk_full_run: Future[DiskFull],
) -> None:
    result = disk_full_run.result(timeout=WAIT)
    if result.skip:
        pytest.skip(result.skip)
    run = result.failed
    assert run.returncode == 4, run.why()
    last = run.stderr.strip().splitlines()[-1]
    # The first save past 10: a best validated checkpoint (an evaluation every step: 11 or
    # 12, whichever improves on the validation rows first), or checkpoint 12.
    assert re.match(
        rf"coretrain: {re.escape(str(run.out / 'checkpoints'))}: cannot save (checkpoint 12|"
        r"the best checkpoint 1[12]): ",
        last,
    ), last
    assert last.endswith("No space left on device"), last
    assert "/proc/self/fd" not in last  # the file a person can find
    assert "{{" not in last and "[Op:" not in last  # TF's noise is cut
    assert events(run.records, "resume")[0]["step"] == STEPS
    assert events(run.records, "end")[-1]["exit_code"] == 4
    # Checkpoint 10 and the state file naming it: byte for byte as before.
    assert result.after == result.before


def test_after_a_full_disk_the_previous_checkpoint_restores(
    disk_full_run: Future[DiskFull],
) -> None:
    result = disk_full_run.result(timeout=WAIT)
    if result.skip:
        pytest.skip(result.skip)
    assert result.rerun is not None, result.failed.why()
    rerun = result.rerun
    assert rerun.returncode == 0, rerun.why()
    assert events(rerun.records, "resume")[0]["step"] == STEPS
    assert events(rerun.records, "checkpoint_unreadable") == []
    removed = events(rerun.records, "checkpoint_cleanup")[0]["removed"]
    assert set(removed) & {"ckpt-12_temp", "best-11_temp", "best-12_temp"}, removed
    end = events(rerun.records, "end")[-1]
    assert (end["status"], end["final_step"]) == ("completed", 12)


# --------------------------------------------------------------------------------------
# A diverging loss


@pytest.fixture(scope="module")
def diverged_run(
    pool: ThreadPoolExecutor, reference: Future[Done], tmp_path_factory: pytest.TempPathFactory
) -> Future[tuple[Done, dict[str, str]]]:
    """--learning-rate 1e30 from checkpoint 10, checkpointing every step. Another learning
    rate than the recorded one is refused (the run identity: tests/test_identity.py), so
    the copy's record is made to say 1e30 (a run that was always going to diverge)."""
    args = ("--learning-rate", "1e30", "--checkpoint-every", "1")
    workdir = tmp_path_factory.mktemp("diverged")

    def recorded_at_1e30(out: Path) -> None:
        record = out / "checkpoints" / "run.json"
        kept = json.loads(record.read_text())
        kept["options"]["learning_rate"] = 1e30
        record.write_text(json.dumps(kept))

    return _rerun_on_a_copy(pool, reference, workdir, recorded_at_1e30, 14, *args)


def test_diverging_loss_exits_5_and_keeps_the_last_good_checkpoint(
    diverged_run: Future[tuple[Done, dict[str, str]]],
) -> None:
    """The first step at lr 1e30 still has a finite loss but leaves ~1e30 weights; they
    must not be checkpointed (their test RMSE is not finite)."""
    run, before = diverged_run.result(timeout=WAIT)
    assert run.returncode == 5, run.why()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "lower --learning-rate" in lines[0]
    assert f"the last good checkpoint is kept in {run.out / 'checkpoints'}" in lines[0]
    assert events(run.records, "resume")[0]["step"] == STEPS
    assert events(run.records, "checkpoint") == []
    assert events(run.records, "identity_unchecked") == []  # the record says 1e30
    after = {k: v for k, v in digest(run.out / "checkpoints").items() if k != "run.json"}
    assert after == {k: v for k, v in before.items() if k != "run.json"}  # 10 still the newest
    end = events(run.records, "end")[-1]
    assert (end["status"], end["exit_code"]) == ("failed", 5)


@pytest.mark.parametrize(
    "name", ["checkpoint", "ckpt-3.index", "ckpt-3.data-00000-of-00001", "best-2.index"]
)
@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero"])
def test_a_file_tensorflow_would_open_that_is_not_a_regular_file_is_exit_4_unopened(
    tmp_path: Path, name: str, kind: str
) -> None:
    """TensorFlow opens a checkpoint's files by name: a FIFO there blocked the run (its
    lock held, a SIGTERM ended it as exit 4, not 143), /dev/zero would feed it endlessly.
    Refused before any is opened, naming it; other names are none of its business."""
    from app.atomic import open_dir
    from app.errors import StorageError
    from app.training.state.checkpointer import _only_files

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "notes.fifo").touch()
    os.mkfifo(ckpt / "other-fifo")  # not a name TensorFlow opens
    planted = ckpt / name
    if kind == "fifo":
        os.mkfifo(planted)
    else:
        planted.symlink_to("/dev/zero")
    with open_dir(ckpt, "checkpoint directory") as held:
        with pytest.raises(StorageError, match=re.escape(f"{planted}: not a regular file")):
            _only_files(held)
        planted.unlink()
        _only_files(held)  # the rest passes
