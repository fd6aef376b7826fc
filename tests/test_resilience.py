"""Lose nothing: kill -9, bad data, full disks, diverging loss, overlap.

Every scenario runs the real ``coretrain train`` in a subprocess on real files. The
TensorFlow runs are independent of each other, so the module starts them all at once
in a pool of two workers (the machine has 2 cores; TensorFlow's import alone is ~6 CPU
seconds) and each test waits for the result it asserts on. Runs that need a finished
reference run (fallback, all-unreadable, diverged, disk full) copy its output directory
(the ``reference`` fixture of tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.config import TrainConfig
from app.data import cache, cache_convert
from app.errors import DataError
from tests import kill_harness
from tests.conftest import REPO, events, json_lines, prepare_cache, run_cli
from tests.runs import (
    IS_ROOT,
    LOSS_TOLERANCE,
    STEPS,
    WAIT,
    Done,
    copy_output,
    digest,
    losses,
    mount_tmpfs,
    no_partial_cache,
    ref_data,
    reference_ok,
    start_in_background,
    train,
    truncate,
    umount,
)

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).parent / "fixtures" / "data"
NON_ROOT_UID = 10001  # the image's user (Dockerfile)


# --------------------------------------------------------------------------------------
# Background runs: one fixture per scenario, each a Future. The autouse fixture below
# starts every scenario the selected tests need, independent ones first, so the two
# workers stay busy while earlier tests assert.


INDEPENDENT = ("reference", "bad_runs", "non_root_run")
DEPENDENT = ("fallback_run", "unreadable_run", "diverged_run", "disk_full_run")


@pytest.fixture(scope="module", autouse=True)
def _start_in_background(request: pytest.FixtureRequest) -> None:
    start_in_background(request, *INDEPENDENT, *DEPENDENT)


# --------------------------------------------------------------------------------------
# 2. kill -9: checkpoint fallback, all unreadable, the random-kill harness


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
            out / "cache" / f".{next((out / 'cache').iterdir()).name}.999999999.x" / "train_x.f32",
        ]
        for p in planted:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"partial")
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
# 3. (exact resume: test_resumed_run_reproduces_the_uninterrupted_losses above)
# 4. Bad input data: exit 3, one line naming file:line, no partial cache

# case -> (role the corpus file plays, location after the path, what the line says)
BAD_CORPUS: dict[str, tuple[str, str, str]] = {
    "wrong_width": ("train_features", ":3: ", "expected 6 fields (H×W = 2×3), found 5"),
    "too_many_fields": ("train_labels", ":2: ", "expected 6 fields (K = 6 labels), found 7"),
    "not_a_number": ("test_features", ":2: ", "field 4: not a number: 'abc'"),
    "decimal_comma": ("test_labels", ":2: ", "field 5: not a number: '5,5'"),
    "nan": ("train_features", ":2: ", "field 3: non-finite value 'nan'"),
    "inf": ("test_features", ":3: ", "field 1: non-finite value '-inf'"),
    "float32_overflow": ("train_labels", ":2: ", "field 5: non-finite value '3.5e38'"),
    "empty": ("test_labels", ": ", "empty file"),
    "only_blank_lines": ("train_features", ": ", "empty file"),
    "blank_line_then_data": ("test_features", ":3: ", "blank line followed by more data"),
    "control_byte": ("train_labels", ":2: ", "field 2: not a number"),
    "not_utf8": ("test_labels", ":2: ", "field 6: not a number"),
    "long_field": ("train_features", ":2: ", "field 6: not a number"),
}
GOOD_LINES = {"train": 4, "test": 2}  # 6 fields each: features 2×3, labels K = 6


def _good_data(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for split, n in GOOD_LINES.items():
        for kind in ("features", "labels"):
            lines = [" ".join(f"{i + j / 8:g}" for j in range(6)) for i in range(n)]
            (directory / f"{split}_{kind}.txt").write_text("\n".join(lines) + "\n")
    return directory


def _bad_case(name: str, data: Path) -> tuple[Path, list[str], str, str]:
    """Make the data set of case ``name``: (the file to blame, extra args, where, what)."""
    if name in BAD_CORPUS:
        role, where, what = BAD_CORPUS[name]
        path = data / f"{role}.txt"
        shutil.copyfile(CORPUS / "bad" / f"{name}.txt", path)
        return path, [], where, what
    if name == "line_count_mismatch":
        path = data / "train_labels.txt"
        path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
        return path, [], ": ", f"3 label lines but {data / 'train_features.txt'} has 4 feature"
    if name == "width_not_h_times_w":
        return data / "train_features.txt", ["--width", "4"], ":1: ", "expected 8 fields (H×W"
    if name == "missing_file":
        (data / "test_labels.txt").unlink()
        return data / "test_labels.txt", [], ": ", "missing data file (test labels; also looked"
    if name == "unreadable_file":
        path = data / "train_features.txt"
        if IS_ROOT:  # root reads any file whatever its mode: a directory can't be read
            path.unlink()
            path.mkdir()
            return path, [], ": ", "cannot read: Is a directory"
        path.chmod(0)
        return path, [], ": ", "cannot read: Permission denied"
    if name == "truncated_gzip":
        path = data / "test_features.txt.gz"
        packed = gzip.compress(b"1 2 3 4 5 6\n" * 3000)
        path.write_bytes(packed[: len(packed) // 2])
        (data / "test_features.txt").unlink()
        return path, ["--test-features", path.name], ": ", "truncated gzip data"
    raise AssertionError(name)


GENERATED = ["line_count_mismatch", "width_not_h_times_w", "missing_file", "unreadable_file"]
BAD_CASES = [*sorted(BAD_CORPUS), *GENERATED, "truncated_gzip"]


@dataclass
class BadRun:
    run: Done
    blamed: Path
    where: str
    what: str


@pytest.fixture(scope="module")
def bad_runs(
    pool: ThreadPoolExecutor, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Future[BadRun]]:
    futures = {}
    for name in BAD_CASES:
        workdir = tmp_path_factory.mktemp(f"bad-{name}")
        blamed, extra, where, what = _bad_case(name, _good_data(workdir / "data"))
        out = workdir / "out"
        args = ["--data", str(workdir / "data"), "--output", str(out), "--height", "2"]
        args += ["--width", "3", *extra]

        def job(
            args: list[str] = args, out: Path = out, b: tuple = (blamed, where, what)
        ) -> BadRun:
            proc = run_cli("train", *args, timeout=WAIT)
            return BadRun(Done(out, proc.returncode, proc.stdout, proc.stderr), *b)

        futures[name] = pool.submit(job)
    return futures


def test_every_bad_corpus_file_has_an_end_to_end_case() -> None:
    assert sorted(BAD_CORPUS) == sorted(p.stem for p in (CORPUS / "bad").iterdir())


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_data_exits_3_with_one_line_and_leaves_no_cache(
    case: str, bad_runs: dict[str, Future[BadRun]]
) -> None:
    bad = bad_runs[case].result(timeout=WAIT)
    run = bad.run
    assert run.returncode == 3, run.why()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"coretrain: {bad.blamed}{bad.where}"), lines[0]
    assert bad.what in lines[0]
    end = events(run.records, "end")[-1]
    assert (end["status"], end["exit_code"]) == ("failed", 3)
    assert no_partial_cache(run.out) == []
    assert not (run.out / "checkpoints").exists()


def test_allow_nonfinite_accepts_what_the_default_rejects(tmp_path: Path) -> None:
    """The option reaches the converter (in process: the 2×3 data can't train the CNN)."""
    data = _good_data(tmp_path / "data")
    shutil.copyfile(CORPUS / "good" / "nonfinite.txt", data / "test_features.txt")
    config = TrainConfig(data_dir=data, output_dir=tmp_path / "out", height=2, width=3)
    with pytest.raises(DataError, match=r"test_features\.txt:2: field 2: non-finite"):
        prepare_cache(config)
    loaded = prepare_cache(dataclasses.replace(config, allow_nonfinite=True))
    x = np.asarray(loaded.features("test")).reshape(2, 6)
    assert np.isnan(x[1, 1]) and x[1, 2] == -np.inf and x[1, 3] == np.inf


# --------------------------------------------------------------------------------------
# Accepted input + 8. non-root without a home, in one run


STYLES = ["{:.6e}", "{:.5f}", "{:g}", "{:.3E}", "{:.9g}"]
SEPARATORS = [" ", "\t", "  ", " \t "]


def _tokens(values: np.ndarray, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[STYLES[rng.integers(len(STYLES))].format(v) for v in row] for row in values]


def _join(row: list[str], i: int) -> str:
    return SEPARATORS[i % len(SEPARATORS)].join(row)


def _as_float32(tokens: list[list[str]]) -> np.ndarray:
    return np.array([[float(t) for t in row] for row in tokens], np.float64).astype(np.float32)


def _accepted_formats_data(data: Path) -> dict[str, np.ndarray]:
    """All accepted variations in one data set; returns the float32 values each must give.

    train_features: UTF-8 BOM, CRLF, mixed separators, trailing whitespace, exponents,
    blank lines at the end. train_labels.txt.gz: multi-member gzip. test_features: last
    line without a newline. test_labels: trailing spaces and blank lines at the end.
    """
    from app.data import synthetic

    rng = np.random.default_rng(21)
    data.mkdir(parents=True)
    expected = {}
    for split, n in (("train", 60), ("test", 20)):
        x, y = synthetic.make_samples(n, rng)
        expected[f"{split}_x"], expected[f"{split}_y"] = x.reshape(n, -1), y
    tok = {k: _tokens(v, i) for i, (k, v) in enumerate(expected.items())}
    rows = [_join(r, i) + ("  " if i % 3 == 0 else "") for i, r in enumerate(tok["train_x"])]
    (data / "train_features.txt").write_bytes(
        b"\xef\xbb\xbf" + ("\r\n".join(rows) + "\r\n\r\n\r\n").encode()
    )
    labels = "".join(_join(r, i) + "\n" for i, r in enumerate(tok["train_y"])).encode()
    cut = len(labels) // 3
    (data / "train_labels.txt.gz").write_bytes(
        gzip.compress(labels[:cut]) + gzip.compress(labels[cut:])
    )
    rows = [_join(r, i) for i, r in enumerate(tok["test_x"])]
    (data / "test_features.txt").write_text("\n".join(rows))
    rows = [_join(r, i) + " \t" for i, r in enumerate(tok["test_y"])]
    (data / "test_labels.txt").write_text("\n".join(rows) + "\n\n\n")
    return {k: _as_float32(v) for k, v in tok.items()}


@dataclass
class NonRoot:
    run: Done
    uid: int
    expected: dict[str, np.ndarray]
    cache_files: dict[str, np.ndarray]
    owners: dict[str, int]


@pytest.fixture(scope="module")
def non_root_run(pool: ThreadPoolExecutor) -> Iterator[Future[NonRoot]]:
    """Accepted formats, trained as UID 10001 (root drops to it) with HOME=/nonexistent.

    The drop uses setpriv. This machine's Python lives under /root (0700), so the child
    keeps one capability, CAP_DAC_READ_SEARCH (read files, search directories; no
    writing anywhere it has no permission), or the UID could not start the interpreter.
    """
    base = Path(tempfile.mkdtemp(prefix="coretrain-nonroot-"))  # pytest's tmp dirs are 0700
    base.chmod(0o755)
    data, out = base / "data", base / "out"
    expected = _accepted_formats_data(data)
    out.mkdir()
    setpriv = shutil.which("setpriv")
    prefix: list[str] = []
    uid = os.getuid()
    if IS_ROOT and setpriv:
        uid = NON_ROOT_UID
        os.chown(out, uid, uid)
        prefix = [setpriv, "--reuid", str(uid), "--regid", str(uid), "--clear-groups"]
        prefix += ["--inh-caps", "+dac_read_search", "--ambient-caps", "+dac_read_search"]

    def job() -> NonRoot:
        env = kill_harness.child_env()
        env["HOME"] = "/nonexistent"
        args = ["--data", str(data), "--output", str(out), "--max-steps", "2"]
        args += ["--batch-size", "20", "--eval-every", "2", "--checkpoint-every", "2"]
        args += ["--train-labels", "train_labels.txt.gz"]
        proc = subprocess.run(
            [*prefix, sys.executable, "-m", "app", "train", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env,
            timeout=WAIT,
        )
        done = Done(out, proc.returncode, proc.stdout, proc.stderr)
        found: dict[str, np.ndarray] = {}
        owners: dict[str, int] = {}
        if proc.returncode == 0:
            key_dir = next(p for p in (out / "cache").iterdir() if not p.name.startswith("."))
            for name, width in (("train_x", 3900), ("train_y", 3), ("test_x", 3900)):
                found[name] = np.fromfile(key_dir / f"{name}.f32", np.float32).reshape(-1, width)
            found["test_y"] = np.fromfile(key_dir / "test_y.f32", np.float32).reshape(-1, 3)
            for rel in ("metrics.json", "checkpoints/ckpt-2.index", "model/model.keras"):
                owners[rel] = (out / rel).stat().st_uid
        return NonRoot(done, uid, expected, found, owners)

    yield pool.submit(job)
    shutil.rmtree(base, ignore_errors=True)


def test_accepted_formats_end_to_end(non_root_run: Future[NonRoot]) -> None:
    result = non_root_run.result(timeout=WAIT)
    run = result.run
    assert run.returncode == 0, run.why()
    end = events(run.records, "end")[-1]  # every stdout line is JSON (json_lines)
    summary = (end["status"], end["final_step"], end["train_size"], end["test_size"])
    assert summary == ("completed", 2, 60, 20)
    for name, values in result.expected.items():  # bit for bit what float() makes of the text
        got = result.cache_files[name]
        assert got.shape == values.shape, name
        np.testing.assert_array_equal(got.view(np.uint32), values.view(np.uint32), err_msg=name)


def test_runs_as_a_non_root_uid_without_a_home(non_root_run: Future[NonRoot]) -> None:
    result = non_root_run.result(timeout=WAIT)
    assert result.run.returncode == 0, result.run.why()
    assert not Path("/nonexistent").exists()  # nothing created a home
    if result.uid == 0:
        pytest.skip("running as root without setpriv: no non-root UID to switch to")
    assert set(result.owners.values()) == {result.uid}  # every file it wrote is its own


# --------------------------------------------------------------------------------------
# 5. Storage faults


@pytest.mark.parametrize("how", ["file_in_the_way", "read_only_mount", "under_proc"])
def test_output_not_writable_exits_4_before_training(how: str, tmp_path: Path) -> None:
    """Root ignores file modes, so: a regular file where a directory should be, a
    read-only tmpfs mount (needs root), and a path under /proc (nothing can be created)."""
    if how == "file_in_the_way":  # the parent: an existing --output file is click's exit 2
        (tmp_path / "volume").write_text("not a directory\n")
        out = tmp_path / "volume" / "out"
        reason = "Not a directory"
    elif how == "read_only_mount":
        mnt = tmp_path / "ro"
        skip = mount_tmpfs(mnt, "ro,size=64k")
        if skip:
            pytest.skip(skip)
        out = mnt / "out"
        reason = "Read-only file system"
    else:
        out = Path("/proc/coretrain-test/out")
        reason = "No such file or directory"
    try:
        proc = run_cli("train", "--data", str(tmp_path), "--output", str(out))
    finally:
        if how == "read_only_mount":
            umount(tmp_path / "ro")
    assert proc.returncode == 4, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"coretrain: {out}: output directory not writable: {reason}"]
    names = [r["event"] for r in json_lines(proc.stdout)]
    assert "start" not in names and "progress" not in names  # refused before TensorFlow


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


# --------------------------------------------------------------------------------------
# 6. Overlapping runs sharing a cache directory (the output lock: tests/test_lock.py)


def test_two_conversions_of_the_same_data_into_one_cache_dir_both_succeed(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run B finishes the same conversion while run A is still converting: A's rename
    finds B's complete cache (ENOTEMPTY) and uses it instead of failing."""
    shared = tmp_path / "shared-cache"
    config_a = TrainConfig(data_dir=tiny_data, output_dir=tmp_path / "a", cache_dir=shared)
    config_b = TrainConfig(data_dir=tiny_data, output_dir=tmp_path / "b", cache_dir=shared)
    real = cache_convert.convert
    finished_b: list[cache.DataCache] = []

    def convert_while_b_finishes(run: Any) -> dict:
        manifest = real(run)
        if not finished_b:
            monkeypatch.setattr(cache_convert, "convert", real)
            finished_b.append(prepare_cache(config_b))
        return manifest

    monkeypatch.setattr(cache_convert, "convert", convert_while_b_finishes)
    a = prepare_cache(config_a)
    assert a.path == finished_b[0].path
    assert sorted(p.name for p in shared.iterdir()) == [a.path.name]  # A's temp dir is gone
    assert not (a.path / cache.OWNER).exists()
    assert np.array_equal(a.features("train"), finished_b[0].features("train"))


HOLD_OWNER = """
import fcntl, sys, time
f = open(sys.argv[1], "rb")
fcntl.flock(f, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(120)
"""


def test_conversion_temp_dirs_live_by_their_owner_lock_not_their_pid(
    tiny_data: Path, tmp_path: Path
) -> None:
    """Containers sharing a cache volume have their own PID namespaces (both may be pid 7):
    a temporary dir is in use while its .owner file is flock-ed, whatever pid it names."""
    config = TrainConfig(data_dir=tiny_data, output_dir=tmp_path / "out")
    root = config.resolved_cache_dir
    live = root / ".0123456789abcdef.999999999.live"  # no such pid here, but a live owner
    dead = root / f".0123456789abcdef.{os.getpid()}.dead"  # "our" pid, but nobody owns it
    for d in (live, dead):
        d.mkdir(parents=True)
        (d / cache.OWNER).write_bytes(b"")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_OWNER, str(live / cache.OWNER)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        prepare_cache(config)
        assert live.exists() and not dead.exists()
    finally:
        holder.kill()
        holder.wait()
    prepare_cache(config)  # reused: the owner is gone now, so is its directory
    assert not live.exists()
