"""The serving signature a model of this run would have (H·W inputs, K outputs) against the
champion's in ``--publish-dir``: another one is refused (NotPublished, exit 7: its clients
would break) unless ``--publish-allow-signature-change`` (a ``signature_change`` warning),
on the chief, before the first step. Cheapest first: before the data are converted
(:func:`hint`) the newest version's record (app/release/layout.py) says when it may differ,
and only then is the champion loaded (TensorFlow), the labels parsed whole first (a line
that differs is the conversion's exit 3, not a signature refusal); otherwise the champion
itself is compared once the data are there (:func:`served`). The gate compares again when
it publishes (app/release/publish.py): another run may have published since.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app import logs
from app.budget.apply import import_tensorflow
from app.config import PublishConfig
from app.data.formats.sources import Sources
from app.errors import NotPublished
from app.release import layout
from app.release.layout import Signature
from app.training.admit import shape


def hint(publishing: PublishConfig, mine: Signature, found: Sources) -> None:
    """Before the data are converted: NotPublished (exit 7) when the newest version's
    record says its signature is not ``mine`` and the champion confirms it, the labels of
    ``found`` parsed whole first (DataError, exit 3, for a line that differs)."""
    if publishing.publish_dir is None or publishing.publish_allow_signature_change:
        return
    newest = layout.newest(publishing.publish_dir)
    if newest is None or not _may_differ(newest, mine):
        return  # checked on the champion itself once the data are there
    for role in ("train_labels", "test_labels"):
        shape.rows(found, role, mine.outputs, first_only=False)
    served(publishing, mine)


def served(publishing: PublishConfig, mine: Signature) -> Signature | None:
    """The champion's signature (None: no publish directory, or no version that loads),
    loaded with TensorFlow. Raises NotPublished (exit 7) when it is not ``mine``; with
    ``--publish-allow-signature-change`` logs a ``signature_change`` warning instead."""
    if publishing.publish_dir is None or not layout.entries(publishing.publish_dir):
        return None
    import_tensorflow()
    from app.release import publish

    champion = publish.champion(publishing.publish_dir)
    change = publish.signature_change(champion, mine)
    if change is not None and not publishing.publish_allow_signature_change:
        raise NotPublished(f"model not published: {change}")
    if change is not None:
        logs.event("signature_change", change, level=logging.WARNING)
    return champion.signature if champion is not None else None


def _may_differ(version: Path, mine: Signature) -> bool:
    """Whether ``version``'s record says its signature is not ``mine``: its K and H×W, or
    its H×W alone (an earlier coretrain's record); False without a record."""
    recorded = layout.recorded_signature(version)
    if recorded is not None:
        return recorded != mine
    hw = layout.input_hw(version)
    return hw is not None and hw[0] * hw[1] != mine.inputs
