"""Files that change under a run: a source read where it lies (the operator's .npy or HDF5
file, which a producer may rewrite) or a cache file cut short while the run reads it is that
file's error (exit 3 for a source, 4 for a cache file, one line naming it), never the
SIGBUS that ended the process (exit 135, no message, no ``end`` event); a rerun once the
file is whole resumes (app/data/cache/rows.py, app/signals.py ``watch_mapped``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from app.config import TrainConfig
from app.data.formats import textfile
from app.data.formats.base import Shape
from app.data.formats.npy import NpyArray
from app.data.formats.sources import ROLES
from app.data.input import stream
from app.errors import DataError
from tests.conftest import REPO, events, json_lines, popen_cli, prepare_cache, run_cli


@pytest.fixture(scope="module")
def npy_data(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny data set as four float32 .npy files (read where they lie)."""
    out = tmp_path_factory.mktemp("npy")
    for role in ROLES:
        np.save(
            out / f"{role}.npy",
            np.concatenate(list(textfile.iter_chunks(tiny_data / f"{role}.txt"))),
        )
    return out


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _lost(path: Path, size: int, end: int) -> str:
    return (
        f"{path}: truncated to {size:,} bytes (its rows need {end:,}) while this run read it "
        "where it lies (not a copy): the run stops here, its checkpoints kept; rerun once the "
        "file is complete (the same values resume the run)"
    )


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORETRAIN_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
        env=env, cwd=cwd, timeout=300,
    )  # fmt: skip


# --- maps: a SIGBUS is the file's error -------------------------------------------------------


@pytest.mark.parametrize("reader", ["numpy, holding the GIL", "a thread without the GIL"])
@pytest.mark.parametrize("container", ["npy", "hdf5"])
def test_a_mapped_source_cut_short_ends_the_run_with_its_error(
    npy_data: Path, tmp_path: Path, reader: str, container: str
) -> None:
    """A memory map of a source read in place, read after the file was cut short: the
    reader (numpy in Python, or native code in another thread, as TensorFlow's kernels read
    a held split) ends the process with exit 3 and one line naming the file."""
    if container == "npy":
        data, source = _copy(npy_data, tmp_path / "d"), tmp_path / "d" / "train_features.npy"
    else:
        data = source = tmp_path / "d.h5"
        with h5py.File(source, "w") as f:
            for role in ROLES:
                f[role] = np.load(npy_data / f"{role}.npy")
    read = (
        "x.sum()" if reader.startswith("numpy") else
        "t = threading.Thread(target=ctypes.memmove, args=(buf, x.ctypes.data, x.nbytes)); "
        "t.start(); t.join()"
    )  # fmt: skip
    proc = _python(
        f"""
        import ctypes, os, threading
        from app.config import TrainConfig
        from tests.conftest import prepare_cache
        from pathlib import Path
        cache = prepare_cache(TrainConfig.of(data_dir=Path({str(data)!r}), output_dir=Path("o")))
        assert "train_x.f32" in cache.in_place
        x = cache.features("train")
        buf = ctypes.create_string_buffer(x.nbytes)
        os.truncate({str(source)!r}, 4096)
        {read}
        print("read a file cut short")
        """,
        tmp_path,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        f"coretrain: {source.resolve()}: truncated to 4,096 bytes (its rows need "
    )
    assert line.endswith("rerun once the file is complete (the same values resume the run)")
    assert "read a file cut short" not in proc.stdout


def test_a_cache_file_cut_short_under_a_map_is_exit_4_naming_it(
    tiny_data: Path, tmp_path: Path
) -> None:
    proc = _python(
        f"""
        import os
        from app.config import TrainConfig
        from tests.conftest import prepare_cache
        from pathlib import Path
        config = TrainConfig.of(data_dir=Path({str(tiny_data)!r}), output_dir=Path("o"))
        cache = prepare_cache(config)
        x = cache.features("train")
        os.truncate(cache.path / "train_x.f32", 100)
        print(x.sum())
        """,
        tmp_path,
    )
    assert proc.returncode == 4, proc.stderr[-2000:]
    (line,) = proc.stderr.splitlines()
    cache = next((tmp_path / "o" / "cache").glob("*/train_x.f32")).parent
    assert line == (
        f"coretrain: {cache / 'train_x.f32'}: cache file truncated to 100 bytes (its rows "
        f"need 3,744,000) while this run read it; delete {cache}"
    )


def test_a_sigbus_of_a_file_no_one_watches_still_ends_the_process(tmp_path: Path) -> None:
    """The handler takes only the SIGBUS of a watched file: another (a map of some other
    file cut short) gets the kernel's action back, as before."""
    proc = _python(
        f"""
        import os
        import numpy as np
        from app import signals
        watched = {str(tmp_path / "watched")!r}
        other = {str(tmp_path / "other")!r}
        for path in (watched, other):
            with open(path, "wb") as f:
                f.write(bytes(1 << 16))
        with open(watched, "rb") as f:
            signals.watch_mapped(f.fileno(), 1 << 16, lambda what: AssertionError(what))
        x = np.memmap(other, np.uint8, "r")
        os.truncate(other, 10)
        print(x.sum())
        """,
        tmp_path,
    )
    assert proc.returncode == -7, proc.stderr[-2000:]  # SIGBUS


# --- reads: a short read is the file's error ------------------------------------------------


def test_a_streamed_source_cut_short_is_its_error(npy_data: Path, tmp_path: Path) -> None:
    data = _copy(npy_data, tmp_path / "d")
    cache = prepare_cache(TrainConfig.of(data_dir=data, output_dir=tmp_path / "o"))
    reader = stream.Reader(cache, None, seed=1, batch_size=40, end_step=30)
    first = reader.element(0)[0].copy()
    source = data / "train_features.npy"
    source.write_bytes(source.read_bytes()[:5000])  # a producer rewriting the file
    with pytest.raises(DataError) as caught:
        stream.read_features(cache, np.arange(10), np.empty((10, 20, 195, 1), np.float32))
    assert str(caught.value) == _lost(source.resolve(), 5000, 128 + 240 * 3900 * 4)
    assert first.shape[0] > 0
    reader.close()


def test_an_npy_cut_short_while_it_is_scanned_is_its_error_not_a_sigbus(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.ones((2000, 20 * 195), np.float32))
    chunks = NpyArray(path).chunks(Shape(3900, hw=(20, 195)), False)
    assert next(chunks).shape == (512, 3900)
    os.truncate(path, 4 * 3900 * 600)
    with pytest.raises(DataError) as caught:
        list(chunks)
    assert str(caught.value) == f"{path}: truncated: rows 513-1024 can't be read"


# --- a real run ------------------------------------------------------------------------------

ARGS = ["--max-steps", "150", "--batch-size", "40", "--eval-every", "50",
        "--checkpoint-every", "50"]  # fmt: skip


@pytest.mark.slow
def test_a_source_cut_short_while_the_run_trains_is_exit_3_and_the_rerun_ends_as_if_never_cut(
    npy_data: Path, tmp_path: Path
) -> None:
    """A producer rewrites the features .npy a run reads where it lies (truncated, then
    written again): the run ends with exit 3, one line naming the file and an ``end``
    event, every line of stdout whole; the rerun on the file made whole again resumes from
    its checkpoint and ends with the weights of a run that was never cut."""
    whole = run_cli("train", "--data", str(_copy(npy_data, tmp_path / "a")), "--output",
                    str(tmp_path / "whole"), *ARGS)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-2000:]
    data, out = _copy(npy_data, tmp_path / "b"), tmp_path / "cut"
    source = data / "train_features.npy"
    original = source.read_bytes()
    proc = popen_cli("train", "--data", str(data), "--output", str(out), *ARGS)
    assert proc.stdout is not None and proc.stderr is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if '"event": "checkpoint"' in line:  # training: the producer truncates the file now
            with open(source, "r+b") as f:
                f.truncate(100_000)
            break
    lines += proc.stdout.readlines()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=600) == 3, stderr[-2000:]
    (line,) = stderr.splitlines()
    assert line == f"coretrain: {_lost(source.resolve(), 100_000, len(original))}"
    records = json_lines("".join(lines))  # every line whole
    assert records[-1]["event"] == "end" and records[-1]["exit_code"] == 3
    source.write_bytes(original)  # the producer's file complete again
    rerun = run_cli("train", "--data", str(data), "--output", str(out), *ARGS)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    (resumed,) = events(json_lines(rerun.stdout), "resume")
    assert resumed["step"] >= 50
    got, want = (json.loads((o / "metrics.json").read_text()) for o in (out, tmp_path / "whole"))
    assert got["weights"] == want["weights"]
    assert (got["test_rmse"], got["exported_step"]) == (want["test_rmse"], want["exported_step"])


def test_a_run_that_diverges_on_a_source_changed_in_place_is_that_source_s_error(
    npy_data: Path, tmp_path: Path
) -> None:
    """NaN written into a .npy the run reads where it lies made the loss diverge: exit 5
    advised a lower learning rate. The source changed under the run: its exit 3, naming it
    (and a divergence with the sources unchanged stays one)."""
    from types import SimpleNamespace

    from app.errors import TrainingDiverged
    from app.training.admit.sources import find
    from app.training.run import _changed_under

    data = _copy(npy_data, tmp_path / "d")
    config = TrainConfig.of(data_dir=data, output_dir=tmp_path / "o")
    admitted = SimpleNamespace(sources=find(config.data), data=prepare_cache(config))
    diverged = TrainingDiverged("loss became nan at step 51")
    assert _changed_under(diverged, admitted) is None  # the sources as they were
    source = data / "train_features.npy"
    with open(source, "r+b") as f:  # a producer writes NaN into the rows, in place
        f.seek(-4 * 3900, os.SEEK_END)
        f.write(np.full(3900, np.nan, np.float32).tobytes())
    changed = _changed_under(diverged, admitted)
    assert isinstance(changed, DataError) and str(source.resolve()) in str(changed)
    assert "changed while this run trained on it" in str(changed)
    assert _changed_under(DataError("other"), admitted) is None  # only a divergence


_TWO_ENDINGS = """
import threading
from app import logs
from app.errors import DataError
from app.signals import end_now
logs.setup()
both = threading.Barrier(4)
def find(n):
    both.wait()
    end_now(DataError(f"x.npy: truncated, found by thread {n}"))
threads = [threading.Thread(target=find, args=(n,)) for n in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def test_failures_found_by_several_threads_at_once_end_the_process_with_one_line() -> None:
    """Several of TensorFlow's threads reading a map cut short fault together, each ending
    the run (app/signals.py ``end_now``): one ``end`` event and one stderr line, its code."""
    for _ in range(8):
        proc = subprocess.run([sys.executable, "-c", _TWO_ENDINGS], capture_output=True,
                              text=True, cwd=REPO, timeout=60)  # fmt: skip
        assert proc.returncode == 3, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert line.startswith("coretrain: x.npy: truncated, found by thread ")
        ends = [r for r in json_lines(proc.stdout) if r.get("event") == "end"]
        assert len(ends) == 1 and ends[0]["exit_code"] == 3
