"""The run's identity: what the checkpoints of an output directory were trained on and with.

``checkpoints/run.json`` is written before the first checkpoint (atomically) and holds::

    {"formulation": "fast", "precision": "float32",          # the choice (choose.py)
     "evaluation": "plain",                 # the evaluation's formulation (absent: formulation)
     "data": {"train": {"samples": 240, "fingerprint": "…"},   # DataCache.fingerprint
              "test": {"samples": 60, "fingerprint": "…"}, "outputs": 3},
     "options": {"batch_size": 40, "learning_rate": 0.1, …},  # option(identity=True)
     "workers": 1}

``options`` holds every option declared with ``option(identity=True)`` in app/config.py
(the ones that change what the weights mean); a new option joins by being declared so.
A resume (checkpoints present) compares the record with this run; any difference stops it
with one line naming what differs and how to start fresh (exit 2), before anything is
written. The rules for records of older versions (docs/architecture.md, "Run identity"):

- no ``data``/``options`` (written before the identity was recorded), or no ``run.json`` at
  all: the resume goes on without the check, with an ``identity_unchecked`` warning, and
  the record is completed from then on;
- no ``options`` at all (an older coretrain's record): the recipe must be the seed's,
  which such runs trained with (:data:`BEFORE`), else exit 2 naming the options;
- an option missing from ``options`` (added to coretrain after the record was written)
  counts as the value such a run trained with: :data:`BEFORE` where the default changed
  since, else its default;
- under the cosine schedule the learning rate reaches 0 at ``--max-steps``
  (:data:`HORIZON`): a resume with another ``--max-steps`` goes on, with an
  ``lr_schedule_changed`` warning (training on past the end is a common, deliberate use);
- an option in the record that coretrain no longer has is ignored.

A ``run.json`` that can't be read while checkpoints exist is exit 4 (it is written by
rename, so it is damage, not an interrupted write). In a multi-worker run the chief checks
the record and every worker compares its own identity with the chief's (exit 6 naming what
differs). No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app import logs
from app.atomic import write_json
from app.config import TrainConfig
from app.data.cache import DataCache
from app.errors import ClusterError, ConfigError, StorageError
from app.options import flag_of, flat, identity_fields

RUN_FILE = "run.json"
#: The splits and how a message names them.
SPLITS = {"train": "training data", "test": "test data"}
#: Options whose default changed after records without them were written, and the value
#: such runs trained with: the seed's recipe, the defaults before the recipe was chosen by
#: measurement (docs/quality.md), and no validation split.
BEFORE = {
    "optimizer": "sgd",
    "learning_rate": 0.1,
    "lr_schedule": "exponential",
    "keep_prob": 0.5,
    "validation_fraction": 0.0,
}
#: Under the cosine schedule the learning rate reaches 0 at --max-steps, so that step is
#: part of the run (recorded under this name; None under the other schedules).
HORIZON = "lr_horizon"


class Agreeing(Protocol):
    """What :func:`agree` needs of app.training.loop.replicas.Replicas."""

    count: int
    index: int
    is_chief: bool

    def sum(self, values: list[float], what: str) -> Any: ...


@dataclass(frozen=True)
class Identity:
    """This run's identity: ``data`` (samples and fingerprint per split, outputs),
    ``options`` (the identity options by field name) and ``workers``."""

    data: dict[str, Any]
    options: dict[str, Any]
    workers: int

    def to_json(self) -> dict[str, Any]:
        return {"data": self.data, "options": self.options, "workers": self.workers}


def of_run(config: TrainConfig, data: DataCache, workers: int) -> Identity:
    """The identity of a run of ``config`` on ``data`` with ``workers`` processes."""
    splits = {
        split: {
            "samples": data.train_size if split == "train" else data.test_size,
            "fingerprint": data.fingerprint(split),
        }
        for split in SPLITS
    }
    return Identity({**splits, "outputs": data.num_outputs}, options_of(config), workers)


def options_of(config: TrainConfig) -> dict[str, Any]:
    """The identity options of ``config`` by field name (and :data:`HORIZON`)."""
    values = flat(config)
    options = {f.name: values[f.name] for f in identity_fields(TrainConfig)}
    options[HORIZON] = config.schedule.max_steps if config.recipe.lr_schedule == "cosine" else None
    return options


#: The checkpoints' name prefix (``ckpt-N``: the CheckpointManager's ``checkpoint_name``,
#: app/training/state/checkpointer.py).
PREFIX = "ckpt"
#: A numbered checkpoint's index file, ``ckpt-N.index``: ``N`` is its step.
NUMBERED = re.compile(rf"^{PREFIX}-(\d+)\.index$")


def has_checkpoints(checkpoints: Path) -> bool:
    """Whether ``checkpoints`` holds a checkpoint (``ckpt-N.index``): a run to resume."""
    return any(checkpoints.glob(f"{PREFIX}-*.index"))


def checkpoint_steps(checkpoints: Path) -> list[int]:
    """The steps ``N`` of the numbered checkpoints (:data:`NUMBERED`) in ``checkpoints``."""
    found = (NUMBERED.match(p.name) for p in checkpoints.glob(f"{PREFIX}-*.index"))
    return [int(m.group(1)) for m in found if m]


def read(checkpoints: Path) -> dict[str, Any] | None:
    """The record in ``checkpoints/run.json``; None when there is none, or it can't be read
    and there is no checkpoint it would describe. Raises StorageError (exit 4) when it can't
    be read but checkpoints exist."""
    path = checkpoints / RUN_FILE
    try:
        found = json.loads(path.read_text())
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
        return found
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        if not has_checkpoints(checkpoints):
            return None
        raise StorageError(
            f"{path}: unreadable ({exc}); it records what the checkpoints beside it were "
            "trained on: restore it, or move it away to resume without that check"
        ) from exc


def record(
    checkpoints: Path, formulation: str, precision: str, identity: Identity,
    evaluation: str | None = None,
) -> None:  # fmt: skip
    """Write ``run.json`` (before the first checkpoint): the choice (``evaluation``: the
    formulation the evaluation computes in, default ``formulation``) and the identity."""
    checkpoints.mkdir(parents=True, exist_ok=True)
    kept = {"formulation": formulation, "precision": precision,
            "evaluation": evaluation or formulation, **identity.to_json()}  # fmt: skip
    write_json(checkpoints / RUN_FILE, kept)


def differences(kept: dict[str, Any], mine: Identity) -> list[str]:
    """What differs between the record ``kept`` and ``mine``, in words (empty: the same)."""
    found = []
    for split, name in SPLITS.items():
        was, now = kept["data"].get(split, {}), mine.data[split]
        if was != now:
            found.append(f"the {name} ({_split(was)} recorded, {_split(now)} now)")
    if kept["data"].get("outputs") != mine.data["outputs"]:
        found.append(f"the labels per sample ({kept['data'].get('outputs')} recorded, "
                     f"{mine.data['outputs']} now)")  # fmt: skip
    for f in identity_fields(TrainConfig):
        was = kept["options"].get(f.name, BEFORE.get(f.name, f.default))
        if was != mine.options[f.name]:
            found.append(f"{_flag(f, was)} recorded, {_flag(f, mine.options[f.name])} now")
    if kept.get("workers", 1) != mine.workers:
        found.append(f"{kept.get('workers', 1)} worker(s) recorded, {mine.workers} now")
    return found


def _warn_if_extended(kept: dict[str, Any], mine: Identity, checkpoints: Path) -> None:
    """A resume with another ``--max-steps`` under the cosine schedule is allowed (training
    on, or a shorter run) but changes the learning rate from the resumed step on: logged as
    the ``lr_schedule_changed`` warning."""
    was, now = kept["options"].get(HORIZON), mine.options.get(HORIZON)
    if was is None or now is None or was == now:
        return
    logs.event(
        "lr_schedule_changed",
        f"{checkpoints}: the checkpoints were trained with the cosine schedule ending at step "
        f"{was}, this run ends it at step {now}: from the resumed step on the learning rate "
        "follows the new schedule (it is not the run that was interrupted)",
        level=logging.WARNING,
        recorded_end=was,
        end=now,
    )


def legacy_differences(mine: Identity) -> list[str]:
    """For checkpoints whose record has no options (an older coretrain's): the recipe
    options of ``mine`` that are not the seed's recipe those runs trained with."""
    fields = {f.name: f for f in identity_fields(TrainConfig)}
    return [
        f"{_flag(fields[name], was)} recorded, {_flag(fields[name], mine.options[name])} now"
        for name, was in BEFORE.items()
        if mine.options[name] != was
    ]


def _split(entry: dict[str, Any]) -> str:
    return f"{entry.get('samples', '?')} samples, fingerprint {entry.get('fingerprint', '?')}"


def _flag(f: dataclasses.Field[Any], value: Any) -> str:
    """``--learning-rate 0.1``; ``--no-standardize`` for an on/off pair."""
    spelling = flag_of(f)
    if "/" in spelling:
        on, off = spelling.split("/")
        return on if value else off
    return f"{spelling} {'default' if value is None else value}"


def check(checkpoints: Path, mine: Identity) -> None:
    """Before resuming from ``checkpoints``: the record there must be ``mine`` (module
    docstring). Raises ConfigError (exit 2) naming what differs, StorageError (exit 4) for
    an unreadable record; logs ``identity_unchecked`` for a record without an identity."""
    if not has_checkpoints(checkpoints):
        return  # a fresh start: the record is written anew
    kept = read(checkpoints)
    if kept is None or "data" not in kept or "options" not in kept:
        changed = legacy_differences(mine)
        if changed:
            raise ConfigError(
                f"{checkpoints}: the checkpoints were trained by an older coretrain, with the "
                f"seed's recipe: {'; '.join(changed)}. To resume them, give the seed's recipe "
                '(README, "The recipe", and --validation-fraction 0); to start fresh, train '
                f"into a new --output (or move {checkpoints} away)"
            )
        logs.event(
            "identity_unchecked",
            f"{checkpoints / RUN_FILE} does not record the data and options the checkpoints "
            "were trained on (an older coretrain wrote them): resuming without that check; "
            "this run's are recorded from now on",
            level=logging.WARNING,
            path=str(checkpoints / RUN_FILE),
        )
        return
    found = differences(kept, mine)
    if found:
        raise another_run(checkpoints, found)
    _warn_if_extended(kept, mine, checkpoints)


def other_precision(kept: str, asked: str) -> ConfigError | None:
    """The exit-2 error of resuming checkpoints trained in ``kept`` with ``--precision
    asked`` (auto keeps theirs); None when it may resume."""
    if asked in ("auto", kept):
        return None
    return ConfigError(
        f"the checkpoints were trained in {kept}; resume with --precision {kept} "
        "(or auto), or train into a new output directory"
    )


def another_run(checkpoints: Path, found: list[str]) -> ConfigError:
    """The exit-2 error of a resume whose record differs from this run in ``found``."""
    return ConfigError(
        f"{checkpoints}: the checkpoints are of another run: {'; '.join(found)}. To start "
        f"fresh, train into a new --output (or move {checkpoints} away); to resume, "
        "use the recorded data and options"
    )


def agree(mine: Identity, replicas: Agreeing) -> None:
    """Every worker's identity must be the chief's (two collectives: all workers call it).
    The chief's parts are sent to all; each worker flags the parts where its own differ;
    the flags are summed, so every worker names the same parts. Raises ClusterError
    (exit 6) on every worker when any worker's data, options or worker count differ."""
    if replicas.count == 1:
        return
    parts = _parts(mine)
    sent = [float(v) if replicas.is_chief else 0.0 for v in parts.values()]
    chief = replicas.sum(sent, "agreeing on the run's identity")
    flags = [0.0 if v == c else 1.0 for v, c in zip(parts.values(), chief, strict=True)]
    flagged = replicas.sum(flags, "agreeing on the run's identity")
    differ = [name for name, n in zip(parts, flagged, strict=True) if n > 0]
    if differ:
        raise ClusterError(
            f"worker {replicas.index}: the workers disagree on the run's identity "
            f"({', '.join(differ)} not the chief's on {int(max(flagged))} worker(s); give "
            "every worker the same data and options)"
        )


def _parts(mine: Identity) -> dict[str, int]:
    """Each part of ``mine`` as a 48-bit number (a sum with zeros carries it exactly)."""
    named = {name: mine.data[split] for split, name in SPLITS.items()}
    named["labels per sample"] = mine.data["outputs"]
    named.update({flag_of(f).split("/")[0]: mine.options[f.name]
                  for f in identity_fields(TrainConfig)})  # fmt: skip
    named["worker count"] = mine.workers
    return {
        name: int(hashlib.sha256(json.dumps(value).encode()).hexdigest()[:12], 16)
        for name, value in named.items()
    }
