"""What the data's shape alone refuses before the conversion (app/training/admit/shape.py,
memory.py, signature.py): the CNN's geometry, the memory floor, and the record a signature
check starts from. The signature's early refusal on real published models:
tests/test_publish.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.atomic import RECORD_BYTES
from app.budget import detect_plan
from app.budget import memory as residency
from app.config import TrainConfig
from app.errors import ConfigError, DataError
from app.geometry import geometry
from app.release import layout
from app.training.admit import by_shape
from app.training.admit import memory as peak_memory
from app.training.admit.sources import find
from benchmarks.cgroup_run import MEMORY_MOUNT, memory_cgroup, unavailable_reason
from tests.conftest import REPO, events, json_lines, run_cli

MIB = residency.MIB
MEMORY_REASON = unavailable_reason(MEMORY_MOUNT, "memory")


def _check(config: TrainConfig, plan: object) -> None:
    """What the data's shape refuses before the conversion, on the chief."""
    memory_limit = plan.memory_limit  # type: ignore[attr-defined]
    by_shape(find(config.data), config.publishing, config.recipe.batch_size, memory_limit, True)


def _cache_files(out: Path) -> list[str]:
    """What the run put in its data cache (nothing, when refused before converting)."""
    cache = out / "cache"
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*")) if cache.exists() else []


@pytest.mark.parametrize(("height", "width"), [(7, 195), (20, 54), (1, 1)])
def test_an_input_the_cnn_cannot_take_is_exit_2_before_the_data_are_read(
    tiny_data: Path, tmp_path: Path, height: int, width: int
) -> None:
    out = tmp_path / "out"
    proc = run_cli(
        "train", "--data", str(tiny_data), "--output", str(out),
        "--height", str(height), "--width", str(width),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"coretrain: --height {height} --width {width}: input {height}×{width} is too small "
        "for the seed CNN (needs height ≥ 8 and width ≥ 55 to leave one position after pool2)"
    ]
    assert not out.exists()  # refused before the output directory is made
    assert events(json_lines(proc.stdout), "end")[-1]["exit_code"] == 2


def test_the_smallest_input_is_the_geometry_s_own_bound() -> None:
    assert geometry(8, 55).pool2 == (1, 1)
    for height, width in ((7, 55), (8, 54)):
        with pytest.raises(ConfigError, match="too small for the seed CNN"):
            geometry(height, width)


def test_the_floor_is_the_least_peak_of_any_row_count() -> None:
    shape = dict(height=20, width=195, outputs=3, batch_size=1000)
    least = peak_memory.floor(**shape)
    assert least.at_least and least.parts["data_bytes"] == 0
    for rows in (1, 240, 100_000, 10_000_000):
        for limit in (None, 1 << 30, 8 << 30):
            assert peak_memory.peak(rows=rows, memory_limit=limit, **shape).total >= least.total
    with pytest.raises(peak_memory.MemoryBudgetExceeded) as caught:
        peak_memory.check(least, least.total - 1, 1000)
    assert str(caught.value).startswith(
        f"the run would need at least {least.total / MIB:,.0f} MiB of memory at its peak "
        f"(TensorFlow {peak_memory.BASE / MIB:.0f} MiB, whatever its rows, batches of 1000)"
    )
    peak_memory.check(least, least.total, 1000)  # up to the limit: not refused


@pytest.mark.skipif(MEMORY_REASON is not None, reason=f"no real memory cgroup: {MEMORY_REASON}")
def test_a_batch_no_memory_limit_can_hold_is_exit_8_before_the_data_are_converted(
    tiny_data: Path, tmp_path: Path
) -> None:
    """--batch-size 20000 of 20×195 needs about 3.8 GB whatever the rows: in a 1 GiB group
    the run ends with exit 8 and one line, its data never converted."""
    out = tmp_path / "out"
    args = ["train", "--data", str(tiny_data), "--output", str(out), "--batch-size", "20000"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
    with memory_cgroup(1 << 30, prefix="coretrain-test-memory") as group:
        proc = subprocess.run(
            group.command([sys.executable, "-m", "app", *args]),
            capture_output=True, text=True, cwd=REPO, env=env, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 8, proc.stderr
    least = peak_memory.floor(height=20, width=195, outputs=3, batch_size=20000)
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"coretrain: the run would need at least {least.total / MIB:,.0f} MiB of memory at its "
        f"peak (TensorFlow {peak_memory.BASE / MIB:.0f} MiB, whatever its rows, batches of "
        "20000), more than the memory limit of 1,024 MiB; lower --batch-size or raise the limit"
    )
    records = json_lines(proc.stdout)
    assert not events(records, "cache") and _cache_files(out) == []


@pytest.mark.parametrize(
    ("record", "signature", "hw"),
    [
        ({"height": 20, "width": 195, "outputs": 3}, "(n, 3900) → (n, 3)", (20, 195)),
        ({"height": 20, "width": 195}, None, (20, 195)),  # an earlier coretrain's export
        ({"height": 20, "width": 195, "outputs": 0}, None, (20, 195)),
        ({"height": 20, "width": 195, "outputs": True}, None, (20, 195)),
        ({"height": "20", "width": 195, "outputs": 3}, None, None),
        ([20, 195, 3], None, None),
        (None, None, None),  # no record: another program's model
    ],
)
def test_a_version_s_record_is_read_only_when_whole(
    tmp_path: Path, record: object, signature: str | None, hw: tuple[int, int] | None
) -> None:
    if record is not None:
        (tmp_path / layout.INPUT_FILE).parent.mkdir()
        (tmp_path / layout.INPUT_FILE).write_text(json.dumps(record))
    found = layout.recorded_signature(tmp_path)
    assert (str(found) if found is not None else None) == signature
    assert layout.input_hw(tmp_path) == hw


def test_without_a_memory_limit_a_batch_past_the_machine_s_memory_is_exit_8_at_once(
    tiny_data: Path, tmp_path: Path
) -> None:
    """The kernel's OOM killer is the limit of a run without one: a batch whose working set
    alone is twice the machine's memory ends in a second, not after its data's conversion
    and an OOM kill (exit 137, no message)."""
    if detect_plan("/").memory_limit is not None:
        pytest.skip("this process has a memory limit: the machine's memory is not the bound")
    per_sample = peak_memory.floor(height=20, width=195, outputs=3, batch_size=1).parts
    batch = 2 * residency.physical_memory() // per_sample["batch_bytes"]
    least = peak_memory.floor(height=20, width=195, outputs=3, batch_size=batch)
    out = tmp_path / "out"
    proc = run_cli(
        "train", "--data", str(tiny_data), "--output", str(out), "--batch-size", str(batch)
    )
    assert proc.returncode == 8, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line == (
        f"coretrain: the run would need at least {least.total / MIB:,.0f} MiB of memory at its "
        f"peak (TensorFlow {peak_memory.BASE / MIB:.0f} MiB, whatever its rows, batches of "
        f"{batch}), more than this machine's {residency.physical_memory() / MIB:,.0f} MiB of "
        "memory (no memory limit); lower --batch-size"
    )
    assert not events(json_lines(proc.stdout), "cache") and _cache_files(out) == []


@pytest.mark.parametrize("what", ["fifo", "device", "huge", "directory"])
def test_a_record_that_is_not_a_small_regular_file_is_no_record(tmp_path: Path, what: str) -> None:
    """A version's record sits where others may write: a FIFO would block its open until a
    writer came (and a stop request with it), /dev/zero would fill the memory."""
    record = tmp_path / layout.INPUT_FILE
    record.parent.mkdir()
    if what == "fifo":
        os.mkfifo(record)
    elif what == "device":
        record.symlink_to("/dev/zero")
    elif what == "huge":
        padding = " " * RECORD_BYTES
        record.write_text(f'{{"height": 20, "width": 195, "outputs": 3}}{padding}')
    else:
        record.mkdir()
    assert layout.recorded_signature(tmp_path) is None and layout.input_hw(tmp_path) is None
    assert layout.read_meta(record.parent) == {}


def _copy(tiny_data: Path, to: Path) -> Path:
    shutil.copytree(tiny_data, to)
    return to


@pytest.mark.parametrize(
    ("case", "blamed", "what"),
    [
        ("header", "train_labels.txt:1: ", "field 1: not a number: 'y1'"),
        ("csv", "train_labels.txt:1: ", "comma-separated"),
        ("width", "train_features.txt:1: ", "expected 3900000 fields (H×W = 20×195000)"),
    ],
)
def test_a_first_row_the_conversion_would_refuse_is_exit_3_before_the_memory_check(
    tiny_data: Path, tmp_path: Path, case: str, blamed: str, what: str
) -> None:
    """The label count comes from a row of numbers: a header line or a comma-separated file
    is the conversion's exit 3 (not a memory or signature refusal from a wrong K), and so is
    a --width the lines don't have (a batch of that width would not fit either)."""
    data = _copy(tiny_data, tmp_path / "data")
    labels = data / "train_labels.txt"
    extra: list[str] = []
    if case == "header":
        labels.write_text("y1 y2 y3\n" + labels.read_text())
    elif case == "csv":
        labels.write_text(labels.read_text().replace(" ", ","))
    else:
        extra = ["--width", "195000"]
    out = tmp_path / "out"
    proc = run_cli("train", "--data", str(data), "--output", str(out), *extra)
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"coretrain: {data}/{blamed}") and what in line, line
    assert not events(json_lines(proc.stdout), "cache") and _cache_files(out) == []


def _served(models: Path, outputs: int) -> Path:
    """A publish directory whose version 1 records a signature of 3900 inputs and
    ``outputs`` outputs (no model needed for what is refused before TensorFlow)."""
    version = models / "1"
    (version / "assets.extra").mkdir(parents=True)
    (version / layout.SAVED_MODEL_FILE).write_bytes(b"pb")
    (version / layout.INPUT_FILE).write_text(
        json.dumps({"height": 20, "width": 195, "outputs": outputs})
    )
    return models


@pytest.mark.parametrize(
    ("case", "blamed", "what"),
    [
        ("first line wider", "train_labels.txt:2: ", "expected 4 fields (K = 4 labels), found 3"),
        ("test labels narrower", "test_labels.txt:1: ", "expected 2 fields (K = 2 labels)"),
    ],
)
def test_a_signature_is_refused_only_for_labels_that_parse_whole(
    tiny_data: Path, tmp_path: Path, case: str, blamed: str, what: str
) -> None:
    """K from the first line decides nothing alone: before a signature refusal the labels
    are parsed whole, and a line that differs is the conversion's exit 3."""
    data = _copy(tiny_data, tmp_path / "data")
    for labels in (data / "train_labels.txt", data / "test_labels.txt"):
        lines = labels.read_text().splitlines()
        if case == "first line wider":  # each file's first row passes: K = 4 there
            labels.write_text("\n".join([lines[0] + " 0.5", *lines[1:]]) + "\n")
        elif labels.name == "train_labels.txt":
            labels.write_text("".join(" ".join(ln.split()[:2]) + "\n" for ln in lines))
    config = TrainConfig.of(
        data_dir=data, output_dir=tmp_path / "out", publish_dir=_served(tmp_path / "m", 3)
    )
    with pytest.raises(DataError) as caught:
        _check(config, detect_plan("/"))
    assert str(caught.value).startswith(f"{data}/{blamed}") and what in str(caught.value)


def test_every_file_s_first_row_comes_before_the_memory_floor(
    tiny_data: Path, tmp_path: Path
) -> None:
    data = _copy(tiny_data, tmp_path / "data")
    features = data / "test_features.txt"
    features.write_text("x\n" + features.read_text())
    config = TrainConfig.of(data_dir=data, output_dir=tmp_path / "out")
    small = dataclasses.replace(detect_plan("/"), memory_limit=100 * MIB)
    with pytest.raises(DataError, match=r"test_features\.txt:1: expected 3900 fields"):
        _check(config, small)
    features.write_text(features.read_text().split("\n", 1)[1])
    with pytest.raises(peak_memory.MemoryBudgetExceeded):
        _check(config, small)
