"""Whether this run may resume the checkpoints in its output directory: its identity (the data,
the options that change what the weights mean, the worker count; the record's format is
app/training/state/identity.py) against the record ``checkpoints/run.json``. A difference
stops the run with one line naming it and how to start fresh (exit 2), before anything is
written: the options alone before the data are converted (:func:`before_data`), the whole
identity once the cache is there (:func:`check`). Records of older versions
(docs/architecture.md, "Run identity"): no identity in the record, or no record: resumed
with an ``identity_unchecked`` warning, and refused when the recipe is not the seed's those
runs trained with (:data:`BEFORE`); an option the record lacks counts as :data:`BEFORE`'s
value or its default; another ``--max-steps`` under the cosine schedule is resumed with an
``lr_schedule_changed`` warning; an option coretrain no longer has is ignored. The chief
checks; the workers' agreement with it is the session's. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from app import logs
from app.config import TrainConfig
from app.errors import ConfigError
from app.options import flag_of, identity_fields
from app.training.admit.facts import Previous
from app.training.state.identity import HORIZON, RUN_FILE, SPLITS, Identity

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


def before_data(
    checkpoints: Path, previous: Previous, precision: str, options: dict[str, Any], workers: int
) -> None:
    """Before the data are converted: raise ConfigError (exit 2) when the checkpoints were
    trained in another precision than an explicit ``precision`` (``--precision``), or their
    record holds an identity whose identity ``options`` (app/training/state/identity.py
    ``options_of``) or worker count are not this run's, its data taken as recorded.
    Nothing for a fresh start or a worker (the chief checks)."""
    kept = previous.kept_choice()
    if kept is not None:
        refused = other_precision(str(kept.get("precision", "float32")), precision)
        if refused is not None:
            raise refused
    if previous.resuming and previous.record is not None and previous.has_identity:
        record = previous.record
        _refuse(checkpoints, record, Identity(record["data"], options, workers))


def check(checkpoints: Path, previous: Previous, mine: Identity) -> None:
    """Before resuming from ``checkpoints``: the record there must be ``mine`` (module
    docstring). Raises ConfigError (exit 2) naming what differs; logs
    ``identity_unchecked`` for a record without an identity."""
    if not previous.resuming:
        return  # a fresh start: the record is written anew
    if previous.record is None or not previous.has_identity:
        _unchecked(checkpoints, mine)
        return
    _refuse(checkpoints, previous.record, mine)
    _warn_if_extended(previous.record, mine, checkpoints)


def _refuse(checkpoints: Path, kept: dict[str, Any], mine: Identity) -> None:
    found = differences(kept, mine)
    if found:
        raise ConfigError(
            f"{checkpoints}: the checkpoints are of another run: {'; '.join(found)}. To start "
            f"fresh, train into a new --output (or move {checkpoints} away); to resume, "
            "use the recorded data and options"
        )


def _unchecked(checkpoints: Path, mine: Identity) -> None:
    """A record without an identity: refused when the recipe is not the seed's those runs
    trained with (ConfigError), else resumed with the ``identity_unchecked`` warning."""
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


def other_precision(kept: str, asked: str) -> ConfigError | None:
    """The exit-2 error of resuming checkpoints trained in ``kept`` with ``--precision
    asked`` (auto keeps theirs); None when it may resume."""
    if asked in ("auto", kept):
        return None
    return ConfigError(
        f"the checkpoints were trained in {kept}; resume with --precision {kept} "
        "(or auto), or train into a new output directory"
    )
