"""The facts a run is admitted on, as values: what the loader, the session and the end of the
run read instead of checking anything again (app/training/admit/__init__.py decides them).
No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.data.cache import DataCache
from app.data.formats.sources import Sources
from app.release.layout import Signature
from app.training.state.identity import Identity


@dataclass(frozen=True)
class Previous:
    """What the output directory holds of an earlier run, read once.

    ``record``: ``checkpoints/run.json`` (app/training/state/identity.py), None without one;
    ``resuming``: checkpoints are there to resume from; ``summary``: ``metrics.json`` of a
    run finished where this one would end, its export in place (app/training/admit/previous.py
    ``over``), else None; ``last_step``: the newest numbered checkpoint's step. A worker of
    a multi-worker run reads nothing: the chief decides.
    """

    record: dict[str, Any] | None = None
    resuming: bool = False
    summary: dict[str, Any] | None = None
    last_step: int | None = None

    @property
    def has_identity(self) -> bool:
        """Whether the record holds the data and options the checkpoints were trained on
        (records of older versions do not)."""
        return self.record is not None and "data" in self.record and "options" in self.record

    def kept_choice(self) -> dict[str, Any] | None:
        """The formulation and precision the checkpoints were trained in: the record's, or,
        for checkpoints without one (written before precision was a choice), the fast
        formulation in float32; None for a fresh start."""
        if self.record is not None:
            return self.record
        return {"formulation": "fast", "precision": "float32"} if self.resuming else None


@dataclass(frozen=True)
class Admitted:
    """A run that may train: ``sources`` (the data files) and ``data``, their cache (keyed by
    the sources: ``data.path.name``); ``previous``, what the output holds of an earlier run;
    ``identity``, this run's, agreeing with the checkpoints it resumes; ``peak_bytes``, the
    expected peak memory, within the memory bound; ``served``, the serving signature of the
    champion in ``--publish-dir`` this model may replace (None: none, or no publish
    directory)."""

    sources: Sources
    data: DataCache
    previous: Previous
    identity: Identity
    peak_bytes: int
    served: Signature | None
