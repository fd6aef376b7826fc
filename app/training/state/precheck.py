"""The checks that can refuse a run before its data are converted, fitted or timed.

A run that will be refused should be refused in a fraction of a second, not after minutes
of converting text, fitting the ridge and timing the formulations. What can be decided from
the output directory and the options alone is checked first (app/training/run.py): the
publish directory (app/release/preflight.py), then :func:`before_data`: checkpoints already
past ``--max-steps`` (a rerun with a lower one) are exit 2; a resume whose
``checkpoints/run.json`` records other identity options, another worker count or another
precision than an explicit ``--precision`` is exit 2 with the same one line the full check
gives (app/training/state/identity.py). The data's part of the identity (the fingerprints) needs
the converted cache: it is checked as soon as the cache is there, before the memory check,
the baselines and TensorFlow (:func:`with_data`). Records of older versions (no ``data`` or
``options``) are left to the full check. No TensorFlow here.
"""

from __future__ import annotations

from typing import Any

from app.config import TrainConfig
from app.data.cache import DataCache
from app.errors import ConfigError
from app.training.state import identity
from app.training.state.workspace import Workspace


def before_data(ws: Workspace, config: TrainConfig, workers: int) -> None:
    """Refuse (ConfigError, exit 2) a resume whose record differs from this run in its
    options, worker count or precision; StorageError (exit 4) for an unreadable record
    beside checkpoints; then checkpoints past ``--max-steps`` (:func:`_refuse_past_end`).
    Nothing for a fresh start or a worker (the chief checks)."""
    kept = _recorded(ws)
    if kept is not None:
        recorded = str(kept.get("precision", "float32"))
        refused = identity.other_precision(recorded, config.compute.precision)
        if refused is not None:
            raise refused
        # the data as recorded: the options and the worker count alone
        _refuse(ws, kept, identity.Identity(kept["data"], identity.options_of(config), workers))
    _refuse_past_end(ws, config)  # this run's own checkpoints: another run's named above


def _refuse_past_end(ws: Workspace, config: TrainConfig) -> None:
    """ConfigError (exit 2) when the checkpoints are already past ``--max-steps`` (the
    largest ``ckpt-N``): resumed, such a run trains nothing and would export its later
    weights as this run's and record a schedule they were never trained with."""
    steps = identity.checkpoint_steps(ws.checkpoints)
    end = config.schedule.max_steps
    if ws.is_chief and steps and max(steps) > end:
        raise ConfigError(
            f"{ws.checkpoints}: this run is already at step {max(steps)}, past --max-steps "
            f"{end}: nothing to train, and its model and records stay as they are. To train "
            f"a model of {end} steps, train into a new --output; to go on, raise --max-steps"
        )


def with_data(ws: Workspace, config: TrainConfig, data: DataCache, workers: int) -> None:
    """The whole identity (data included) against the record, once the cache is there (the
    chief only; its warnings are the session's full check's). Raises ConfigError (exit 2)."""
    kept = _recorded(ws)
    if kept is not None:
        _refuse(ws, kept, identity.of_run(config, data, workers))


def _recorded(ws: Workspace) -> dict[str, Any] | None:
    """The chief's record of the checkpoints it would resume, when it holds an identity;
    None for a fresh start, a worker or an older record (the full check decides)."""
    if not ws.is_chief or not identity.has_checkpoints(ws.checkpoints):
        return None
    kept = identity.read(ws.checkpoints)
    return kept if kept is not None and "data" in kept and "options" in kept else None


def _refuse(ws: Workspace, kept: dict[str, Any], mine: identity.Identity) -> None:
    found = identity.differences(kept, mine)
    if found:
        raise identity.another_run(ws.checkpoints, found)
