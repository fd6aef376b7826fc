"""The run's identity in checkpoints/run.json: a resume on other data or with other
weight-changing options stops with one line; old records resume by the documented rule."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.config import TrainConfig
from app.errors import ClusterError, ConfigError, StorageError
from app.options import identity_fields
from app.training.admit import identity as admission
from app.training.admit.facts import Previous
from app.training.state import identity
from tests.conftest import TINY_TRAIN_ARGS, events, json_lines, prepare_cache, run_cli

#: The options that change what the weights mean, as the config declares them. A new
#: training option (an optimizer, a schedule, a validation share) joins by being declared
#: with option(identity=True); this list is here to make that a visible decision.
IDENTITY = [
    "height", "width", "batch_size", "optimizer", "learning_rate", "lr_schedule",
    "lr_warmup_steps", "lr_decay", "lr_decay_steps", "momentum", "weight_decay", "keep_prob",
    "validation_fraction", "seed", "standardize",
]  # fmt: skip


def test_the_identity_options_are_the_declared_ones() -> None:
    assert [f.name for f in identity_fields(TrainConfig)] == IDENTITY


@pytest.fixture(scope="module")
def data(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    out = tmp_path_factory.mktemp("identity")
    return prepare_cache(TrainConfig.of(data_dir=tiny_data, output_dir=out))


def _config(tmp_path: Path, **changes: object) -> TrainConfig:
    return TrainConfig.of(data_dir=tmp_path, output_dir=tmp_path, **changes)  # type: ignore[arg-type]


def _options(tmp_path: Path, **changes: object) -> dict:
    """The identity options of a run of ``changes``."""
    return identity.options_of(_config(tmp_path, **changes))


def _check(ckpt: Path, mine: identity.Identity) -> None:
    """The admission's check of ``mine`` against the checkpoints in ``ckpt``."""
    previous = Previous(identity.read(ckpt), identity.has_checkpoints(ckpt))
    admission.check(ckpt, previous, mine)


def _recorded(tmp_path: Path, mine: identity.Identity) -> Path:
    ckpt = tmp_path / "checkpoints"
    identity.record(ckpt, "fast", "float32", mine)
    (ckpt / "ckpt-3.index").write_bytes(b"")
    return ckpt


def test_the_same_run_resumes_and_every_difference_is_named(
    tmp_path: Path,
    data,
    logged: list[logging.LogRecord],  # type: ignore[no-untyped-def]
) -> None:
    mine = identity.of_run(_options(tmp_path), data, 1)
    assert mine.data["train"] == {"samples": 240, "fingerprint": data.fingerprint("train")}
    assert mine.options["learning_rate"] == 0.01 and mine.options["standardize"] is True
    ckpt = _recorded(tmp_path, mine)
    assert json.loads((ckpt / "run.json").read_text())["options"] == mine.options
    constant = identity.of_run(_options(tmp_path, lr_schedule="constant"), data, 1)
    ckpt_constant = _recorded(tmp_path / "constant", constant)
    # --max-steps is part of the run only where the schedule ends there (cosine).
    longer = _options(tmp_path, lr_schedule="constant", max_steps=9999)
    _check(ckpt_constant, identity.of_run(longer, data, 1))
    logged.clear()  # under cosine, it is allowed and said (the learning rate changes)
    _check(ckpt, identity.of_run(_options(tmp_path, max_steps=9999), data, 1))
    (warning,) = logged
    assert (warning.event, warning.recorded_end, warning.end) == ("lr_schedule_changed", 3300, 9999)
    other = identity.of_run(_options(tmp_path, learning_rate=0.05, standardize=False), data, 2)
    with pytest.raises(ConfigError) as caught:
        _check(ckpt, other)
    message = str(caught.value)
    assert message.startswith(f"{ckpt}: the checkpoints are of another run: ")
    assert "--learning-rate 0.01 recorded, --learning-rate 0.05 now" in message
    assert "--standardize recorded, --no-standardize now" in message
    assert "1 worker(s) recorded, 2 now" in message
    assert "train into a new --output" in message and "\n" not in message


def test_other_data_are_named_by_split(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    mine = identity.of_run(_options(tmp_path), data, 1)
    ckpt = _recorded(tmp_path, mine)
    swapped = dataclasses.replace(data, checksums={**data.checksums, "train_y.f32": "0" * 64})
    with pytest.raises(ConfigError, match=r"the training data \(240 samples, fingerprint ") as e:
        _check(ckpt, identity.of_run(_options(tmp_path), swapped, 1))
    assert "test data" not in str(e.value)


def test_a_fresh_start_is_not_checked(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    mine = identity.of_run(_options(tmp_path), data, 1)
    ckpt = tmp_path / "checkpoints"
    identity.record(ckpt, "fast", "float32", mine)  # stopped before its first checkpoint
    _check(ckpt, identity.of_run(_options(tmp_path, seed=5), data, 1))


def test_a_record_without_identity_resumes_with_a_warning(
    tmp_path: Path,
    data,
    logged: list[logging.LogRecord],  # type: ignore[no-untyped-def]
) -> None:
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "ckpt-3.index").write_bytes(b"")
    for old in ('{"formulation": "fast", "precision": "float32"}', None):
        if old is None:
            (ckpt / "run.json").unlink()
        else:
            (ckpt / "run.json").write_text(old)
        logged.clear()
        _check(ckpt, identity.of_run(_options(tmp_path, **admission.BEFORE), data, 1))
        (warning,) = logged
        assert warning.event == "identity_unchecked" and warning.levelno == logging.WARNING
        # Such runs trained with the seed's recipe: today's defaults are another run.
        with pytest.raises(ConfigError, match=r"older coretrain, with the seed's recipe: "
                           r"--optimizer sgd recorded, --optimizer adam now; "):  # fmt: skip
            _check(ckpt, identity.of_run(_options(tmp_path), data, 1))


def test_an_option_added_later_counts_as_its_default(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    mine = identity.of_run(_options(tmp_path), data, 1)
    ckpt = _recorded(tmp_path, mine)
    kept = json.loads((ckpt / "run.json").read_text())
    del kept["options"]["lr_warmup_steps"]  # a record written before the option existed
    kept["options"]["gone"] = 1  # an option coretrain no longer has
    (ckpt / "run.json").write_text(json.dumps(kept))
    _check(ckpt, mine)
    with pytest.raises(
        ConfigError, match=r"--lr-warmup-steps default recorded, --lr-warmup-steps 5"
    ):
        _check(ckpt, identity.of_run(_options(tmp_path, lr_warmup_steps=5), data, 1))
    # An option whose default changed counts as the value such runs trained with.
    del kept["options"]["optimizer"]
    (ckpt / "run.json").write_text(json.dumps(kept))
    with pytest.raises(ConfigError, match=r"--optimizer sgd recorded, --optimizer adam now"):
        _check(ckpt, mine)


def test_an_unreadable_record_beside_checkpoints_is_a_storage_error(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "run.json").write_text('{"formulation": "fa')
    assert identity.read(ckpt) is None  # nothing it would describe
    (ckpt / "ckpt-3.index").write_bytes(b"")
    with pytest.raises(StorageError, match=r"run\.json: unreadable"):
        _check(ckpt, identity.of_run(_options(tmp_path), data, 1))


@pytest.mark.parametrize(
    ("what", "says"),
    [
        ("fifo", "a FIFO, not a regular file"),
        ("device", "a device, not a regular file"),
        ('{"options": "x"}', "options is not an object"),
        ('{"data": {"train": 5, "test": {}, "outputs": 3}}', "data is not the samples"),
        ('{"data": []}', "data is not the samples"),
        ('{"precision": null}', "precision None is none of float32, bfloat16"),
        ('{"formulation": 5}', "formulation 5 is none of fast, plain"),
        ('{"workers": "two"}', "workers 'two' is not a count"),
    ],
)
def test_a_record_not_of_its_form_is_unreadable_not_waited_for_nor_swallowed(
    tmp_path: Path, what: str, says: str
) -> None:
    """A FIFO under run.json is not waited for (the run held its lock, SIGTERM ignored), a
    device not read (/dev/zero filled the memory), a record of other types not followed
    into a traceback: each is the record's exit 4, naming it."""
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "ckpt-3.index").write_bytes(b"")
    record = ckpt / "run.json"
    if what == "fifo":
        os.mkfifo(record)
    elif what == "device":
        record.symlink_to("/dev/zero")
    else:
        record.write_text(what)
    with pytest.raises(StorageError, match=rf"run\.json: unreadable \({re.escape(says)}"):
        identity.read(ckpt)


class _Workers(SimpleNamespace):
    """One worker of a run of two: ``sum`` adds what the other sends (``theirs``, one list
    per call) to what this one sends, and records what this one sent."""

    def sum(self, values: list[float], what: str) -> list[float]:
        self.sent.append(values)
        return [a + b for a, b in zip(self.theirs.pop(0), values, strict=True)]


def _pair(chief: identity.Identity, other: identity.Identity) -> list[Exception | None]:
    """Run agree() on both workers of a pair, replaying each one's sends to the other."""
    n = len(identity._parts(chief))
    # Round 1: only the chief's parts travel. Round 2: the flags of each.
    zeros = [0.0] * n
    probe = _Workers(count=2, index=0, is_chief=True, theirs=[zeros, zeros], sent=[])
    identity.agree(chief, probe)  # what the chief sends, when the other flags nothing
    chief_parts = probe.sent[0]
    flags = [
        0.0 if a == b else 1.0
        for a, b in zip(identity._parts(other).values(), chief_parts, strict=True)
    ]
    results: list[Exception | None] = []
    for index, mine, theirs in ((0, chief, [zeros, flags]), (1, other, [chief_parts, zeros])):
        worker = _Workers(count=2, index=index, is_chief=index == 0, theirs=theirs, sent=[])
        try:
            identity.agree(mine, worker)
            results.append(None)
        except ClusterError as exc:
            results.append(exc)
    return results


def test_workers_agree_on_the_chief_s_identity(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    chief = identity.of_run(_options(tmp_path), data, 2)
    assert _pair(chief, identity.of_run(_options(tmp_path), data, 2)) == [None, None]
    other = identity.of_run(_options(tmp_path, momentum=0.9), data, 2)
    for index, exc in enumerate(_pair(chief, other)):
        assert str(exc) == (
            f"worker {index}: the workers disagree on the run's identity (--momentum not the "
            "chief's on 1 worker(s); give every worker the same data and options)"
        )


# --- the CLI --------------------------------------------------------------------------


def _train(data: Path, out: Path, steps: int, *extra: str) -> tuple[int, list[dict], str]:
    proc = run_cli(
        "train", "--data", str(data), "--output", str(out), "--max-steps", str(steps),
        *TINY_TRAIN_ARGS, *extra,
    )  # fmt: skip
    return proc.returncode, json_lines(proc.stdout), proc.stderr


@pytest.mark.slow
def test_a_resume_on_replaced_data_or_options_stops_in_one_line(
    tiny_data: Path, tmp_path: Path
) -> None:
    from app.data import synthetic

    data = shutil.copytree(tiny_data, tmp_path / "data")
    out = tmp_path / "out"
    code, _, err = _train(data, out, 3)
    assert code == 0, err[-2000:]
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    run_json = (out / "checkpoints" / "run.json").read_text()
    # The nightly data landed under the same --data before the retried run.
    shutil.rmtree(data)
    synthetic.generate(data, train=240, test=60, seed=2)
    code, records, err = _train(data, out, 6)
    assert code == 2, err[-2000:]
    (line,) = err.splitlines()
    assert line.startswith(f"coretrain: {out / 'checkpoints'}: the checkpoints are of another run")
    assert "the training data (240 samples, fingerprint" in line and "train into a new" in line
    assert events(records, "resume") == [] and events(records, "progress") == []
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == kept  # nothing touched
    assert (out / "checkpoints" / "run.json").read_text() == run_json
    # The recorded data back, another weight-changing option: named too.
    shutil.rmtree(data)
    shutil.copytree(tiny_data, data)
    code, _, err = _train(data, out, 6, "--momentum", "0.5")
    assert code == 2
    (line,) = err.splitlines()
    assert "--momentum 0.8 recorded, --momentum 0.5 now" in line and "training data" not in line
    code, records, err = _train(data, out, 6)  # the same run, trained on: resumes
    assert code == 0, err[-2000:]
    assert events(records, "resume")[0]["step"] == 3
    (changed,) = events(records, "lr_schedule_changed")  # the cosine schedule ends later
    assert (changed["recorded_end"], changed["end"]) == (3, 6)
