"""Bad input data end to end (app/training/admit/sources.py and the parser behind it): the real
``coretrain train`` stops before TensorFlow with exit 3, one line naming file:line, and
no partial cache; ``--allow-nonfinite`` accepts what the default rejects; the accepted
formats train end to end.

The accepted formats train in one run as a non-root UID without a home, so the test of
that UID lives here too, next to the run it shares (tests/test_workspace.py has the
output directory's other checks). The runs go in the background (tests/runs.py).
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.config import TrainConfig
from app.data.cache import marker as cache_marker
from app.errors import DataError
from tests import kill_harness
from tests.conftest import REPO, SMALLEST, SMALLEST_VALUES, events, prepare_cache, run_cli, widen
from tests.runs import IS_ROOT, WAIT, Done, no_partial_cache, start_in_background

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).parent / "fixtures" / "data"
NON_ROOT_UID = 10001  # the image's user (Dockerfile)


@pytest.fixture(scope="module", autouse=True)
def _start_in_background(request: pytest.FixtureRequest) -> None:
    # The run that trains first: the bad runs stop before TensorFlow, one after the other
    # on the second worker.
    start_in_background(request, "non_root_run", "bad_runs")


# --------------------------------------------------------------------------------------
# Bad input data: exit 3, one line naming file:line, no partial cache

# case -> (role the corpus file plays, location after the path, what the line says)
BAD_CORPUS: dict[str, tuple[str, str, str]] = {
    "wrong_width": ("train_features", ":3: ", "expected 440 fields (H×W = 8×55), found 439"),
    "too_many_fields": ("train_labels", ":2: ", "expected 6 fields (K = 6 labels), found 7"),
    "one_field_on_a_line": ("test_labels", ":2: ", "expected 6 fields (K = 6 labels), found 1"),
    "not_a_number": ("test_features", ":2: ", "field 4: not a number: 'abc'"),
    "decimal_comma": ("test_labels", ":2: ", "field 5: not a number: '5,5'"),
    "nan": ("train_features", ":2: ", "field 3: non-finite value 'nan'"),
    "inf": ("test_features", ":3: ", "field 1: non-finite value '-inf'"),
    "float32_overflow": ("train_labels", ":2: ", "field 5: non-finite value '3.5e38'"),
    "empty": ("test_labels", ": ", "empty file"),
    "only_blank_lines": ("train_features", ": ", "empty file"),
    "blank_line_then_data": ("test_features", ":3: ", "blank line followed by more data"),
    "blank_line_then_bad_data": ("train_features", ":2: ", "blank line followed by more data"),
    "control_byte": ("train_labels", ":2: ", "field 2: not a number"),
    "not_utf8": ("test_labels", ":2: ", "field 6: not a number"),
    "long_field": ("train_features", ":2: ", "field 6: not a number"),
}
GOOD_LINES = {"train": 4, "test": 2}  # labels K = 6, features 6 fields widened to 8×55


def _good_data(directory: Path) -> Path:
    """The data the bad cases spoil: features of --height 8 --width 55 (:data:`SMALLEST`:
    the corpus's 6 fields a line, :func:`widen`), 6 labels a line."""
    directory.mkdir(parents=True)
    for split, n in GOOD_LINES.items():
        for kind in ("features", "labels"):
            lines = [" ".join(f"{i + j / 8:g}" for j in range(6)) for i in range(n)]
            text = ("\n".join(lines) + "\n").encode()
            (directory / f"{split}_{kind}.txt").write_bytes(
                widen(text) if kind == "features" else text
            )
    return directory


def _bad_case(name: str, data: Path) -> tuple[Path, list[str], str, str]:
    """Make the data set of case ``name``: (the file to blame, extra args, where, what)."""
    if name in BAD_CORPUS:
        role, where, what = BAD_CORPUS[name]
        path = data / f"{role}.txt"
        text = (CORPUS / "bad" / f"{name}.txt").read_bytes()
        path.write_bytes(widen(text) if "features" in role else text)
        return path, [], where, what
    if name == "line_count_mismatch":
        path = data / "train_labels.txt"
        path.write_text("\n".join(path.read_text().splitlines()[:-1]) + "\n")
        return path, [], ": ", f"3 label rows but {data / 'train_features.txt'} has 4 feature"
    if name == "width_not_h_times_w":
        return data / "train_features.txt", ["--width", "56"], ":1: ", "expected 448 fields (H×W"
    if name == "missing_file":
        (data / "test_labels.txt").unlink()
        return data / "test_labels.txt", [], ": ", "missing data file (test labels; also looked"
    if name == "unreadable_file":
        path = data / "train_features.txt"
        if IS_ROOT:  # root reads any file whatever its mode: a directory can't be read
            path.unlink()
            path.mkdir()
            return path, [], ": ", "data file is a directory, not a regular file"
        path.chmod(0)
        return path, [], ": ", "cannot read: Permission denied"
    if name == "truncated_gzip":
        path = data / "test_features.txt.gz"
        packed = gzip.compress(widen(b"1 2 3 4 5 6\n") * 3000)
        path.write_bytes(packed[: len(packed) // 2])
        (data / "test_features.txt").unlink()
        return path, ["--test-features", path.name], ": ", "truncated gzip data"
    raise AssertionError(name)


GENERATED = ["line_count_mismatch", "width_not_h_times_w", "missing_file", "unreadable_file"]
BAD_CASES = [*sorted(BAD_CORPUS), *GENERATED, "truncated_gzip"]


def test_every_bad_corpus_file_has_an_end_to_end_case() -> None:
    assert sorted(BAD_CORPUS) == sorted(p.stem for p in (CORPUS / "bad").iterdir())


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
        args = ["--data", str(workdir / "data"), "--output", str(out), *SMALLEST, *extra]

        def job(
            args: list[str] = args, out: Path = out, b: tuple = (blamed, where, what)
        ) -> BadRun:
            proc = run_cli("train", *args, timeout=WAIT)
            return BadRun(Done(out, proc.returncode, proc.stdout, proc.stderr), *b)

        futures[name] = pool.submit(job)
    return futures


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
    """The option reaches the converter (in process, on the bad cases' data)."""
    data = _good_data(tmp_path / "data")
    nonfinite = (CORPUS / "good" / "nonfinite.txt").read_bytes()
    (data / "test_features.txt").write_bytes(widen(nonfinite))
    config = TrainConfig.of(data_dir=data, output_dir=tmp_path / "out", height=8, width=55)
    with pytest.raises(DataError, match=r"test_features\.txt:2: field 2: non-finite"):
        prepare_cache(config)
    loaded = prepare_cache(config.with_options(allow_nonfinite=True))
    x = np.asarray(loaded.features("test")).reshape(2, SMALLEST_VALUES)
    assert np.isnan(x[1, 1]) and x[1, 2] == -np.inf and x[1, 3] == np.inf


# --------------------------------------------------------------------------------------
# Accepted input, and a non-root UID without a home, in one run

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
            caches = (out / "cache").iterdir()  # the data cache, not the kept measurements
            key_dir = next(p for p in caches if cache_marker.KEY.fullmatch(p.name))
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
