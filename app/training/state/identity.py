"""The run's identity: what the checkpoints of an output directory were trained on and with.

``checkpoints/run.json`` is written before the first checkpoint (atomically) and holds::

    {"formulation": "fast", "precision": "float32",          # the choice (choose.py)
     "evaluation": "plain",                 # the evaluation's formulation (absent: formulation)
     "data": {"train": {"samples": 240, "fingerprint": "…"},   # DataCache.fingerprint
              "test": {"samples": 60, "fingerprint": "…"}, "outputs": 3},
     "options": {"batch_size": 40, "learning_rate": 0.1, …},  # option(identity=True)
     "workers": 1}

``options`` holds every option declared with ``option(identity=True)`` in app/config.py
(the ones that change what the weights mean), and :data:`HORIZON`; a new option joins by
being declared so. Whether a run may resume checkpoints whose record this is, is decided
before it trains (app/training/admit/identity.py); this module is the record's format, its
reading and writing, and the workers' agreement on it. A ``run.json`` that can't be read
while checkpoints exist is exit 4 (it is written by rename, so it is damage, not an
interrupted write). In a multi-worker run every worker compares its own identity with the
chief's (:func:`agree`, exit 6 naming what differs). No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.atomic import read_record, write_json
from app.config import FORMULATION_CHOICES, PRECISION_CHOICES, TrainConfig
from app.data.cache import DataCache
from app.errors import ClusterError, StorageError
from app.options import flag_of, flat, identity_fields

RUN_FILE = "run.json"
#: What a record's ``formulation``/``evaluation`` and ``precision`` may be: a choice made.
FORMULATIONS = tuple(c for c in FORMULATION_CHOICES if c != "auto")
PRECISIONS = tuple(c for c in PRECISION_CHOICES if c != "auto")
#: The splits and how a message names them.
SPLITS = {"train": "training data", "test": "test data"}
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


def of_run(options: dict[str, Any], data: DataCache, workers: int) -> Identity:
    """The identity of a run with the identity ``options`` (:func:`options_of`) on ``data``
    with ``workers`` processes."""
    splits = {
        split: {
            "samples": data.train_size if split == "train" else data.test_size,
            "fingerprint": data.fingerprint(split),
        }
        for split in SPLITS
    }
    return Identity({**splits, "outputs": data.num_outputs}, options, workers)


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
    and there is no checkpoint it would describe. Read as a record (app/atomic.py
    ``read_record``: a FIFO or a device there is not waited for nor read). Raises
    StorageError (exit 4) when it can't be read, or is not of the form this module writes
    (:func:`_problem`), while checkpoints exist."""
    path = checkpoints / RUN_FILE
    try:
        found = read_record(path)
        problem = _problem(found)
        if problem:
            raise ValueError(problem)
        return dict(found)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        if not has_checkpoints(checkpoints):
            return None
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise StorageError(
            f"{path}: unreadable ({why}); it records what the checkpoints beside it were "
            "trained on: restore it, or move it away to resume without that check"
        ) from exc


def _problem(found: Any) -> str:
    """Why ``found`` is not a record of the module docstring's form ("" when it is one):
    each part that is there of its type (an older record lacks some)."""
    if not isinstance(found, dict):
        return "not a JSON object"
    for name, choices in (("formulation", FORMULATIONS), ("precision", PRECISIONS),
                          ("evaluation", FORMULATIONS)):  # fmt: skip
        if name in found and found[name] not in choices:
            return f"{name} {found[name]!r} is none of {', '.join(choices)}"
    data, options, workers = (
        found.get("data", {}),
        found.get("options", {}),
        found.get("workers", 1),
    )
    parts = [data.get(split) for split in SPLITS] if isinstance(data, dict) else [None]
    counted = isinstance(data, dict) and isinstance(data.get("outputs", 1), int)
    if "data" in found and not (all(isinstance(p, dict) for p in parts) and counted):
        return "data is not the samples and fingerprint of each split and the outputs"
    if not isinstance(options, dict):
        return "options is not an object"
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        return f"workers {workers!r} is not a count"
    return ""


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
