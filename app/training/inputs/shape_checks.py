"""What the data's shape alone can refuse, checked before the data are converted.

A run's shape is known long before its rows are: H×W from the options, K from the first
line (or the header) of the training labels (app/data/cache/bounds.py ``label_width``).
The refusals that need nothing more come before a conversion that can take minutes, the
baselines and the timing (app/training/run.py), in this order:

- an H×W the CNN can't take (app/geometry.py): ConfigError, exit 2, checked by the command
  before the output directory is touched (:func:`check_geometry`);
- the first row of each file (training and test, labels and features), parsed as the
  conversion will parse it: a header line, a comma-separated file or a ``--width`` the
  lines don't have is the conversion's own one line (DataError, exit 3), and K is a count
  of numbers;
- a memory limit (without one, the machine's memory) below what a run of this shape needs
  whatever its rows (app/training/inputs/peak_memory.py ``floor``: TensorFlow, the model
  and a batch): MemoryBudgetExceeded, exit 8; the rows' share is checked once they are
  counted (app/training/inputs/load.py ``check_memory``);
- a serving signature that is not the champion's in ``--publish-dir`` (without
  ``--publish-allow-signature-change``): NotPublished, exit 7. The newest version's record
  (app/release/layout.py ``recorded_signature``) says when it may differ; only then is
  TensorFlow started, the champion loaded and its own signature compared
  (app/release/publish.py). Without a record (another program's model, an earlier
  coretrain's), or when the record agrees, the same check runs once TensorFlow is up,
  still before the first step (app/training/session.py).

An output directory holding this run finished already skips them: whether its rerun has
anything to do is known only from its data (app/training/state/rerun.py), and each check
comes again later. No TensorFlow here, but for the signature's confirmation.
"""

from __future__ import annotations

from pathlib import Path

from app.budget.plan import ThreadPlan
from app.config import TrainConfig
from app.data.cache import bounds
from app.data.formats.sources import ROLES, Sources
from app.errors import ConfigError, NotPublished
from app.geometry import geometry
from app.release import layout
from app.training.inputs import peak_memory


def check_geometry(config: TrainConfig) -> None:
    """Raise ConfigError (exit 2) naming the options when the CNN can't take H×W."""
    height, width = config.data.height, config.data.width
    try:
        geometry(height, width)
    except ConfigError as exc:
        raise ConfigError(f"--height {height} --width {width}: {exc}") from None


def check(config: TrainConfig, found: Sources, plan: ThreadPlan, chief: bool = True) -> None:
    """The refusals of the module docstring after the geometry, for ``config`` on the data
    ``found``; the signature on the ``chief`` only (the one that publishes). Raises
    DataError (exit 3), MemoryBudgetExceeded (exit 8), NotPublished (exit 7)."""
    k = bounds.label_width(found)
    for role in ROLES:
        _rows(found, role, k, config.data.allow_nonfinite, first_only=True)
    height, width = config.data.height, config.data.width
    least = peak_memory.floor(
        height=height, width=width, outputs=k, batch_size=config.recipe.batch_size
    )
    peak_memory.check(least, plan.memory_limit, config.recipe.batch_size)
    if chief:
        _signature(config, layout.Signature(height * width, k), found)


def _rows(found: Sources, role: str, k: int, allow_nonfinite: bool, first_only: bool) -> None:
    """Parse ``role``'s first row (``first_only``: its reader's first read) or all of its
    rows, as the conversion will. Raises DataError naming the file (and line, field): the
    conversion's message."""
    shape = bounds.shape(found, role, k)
    rows = found.array(role).chunks(shape, allow_nonfinite, *((1,) if first_only else ()))
    try:
        for _ in rows:
            if first_only:
                break
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()


def _signature(config: TrainConfig, mine: layout.Signature, found: Sources) -> None:
    """NotPublished (exit 7) when the champion's signature is not ``mine``: confirmed on
    the model itself, and only when the newest version's record says it differs; the
    labels (K values a row: a small share of the data) are parsed whole first, so a K of
    the first line alone is not refused for the signature but for the line that differs
    (DataError, exit 3, as the conversion would)."""
    publishing = config.publishing
    if publishing.publish_dir is None or publishing.publish_allow_signature_change:
        return
    newest = layout.newest(publishing.publish_dir)
    if newest is None or not _may_differ(newest, mine):
        return  # checked on the champion itself once TensorFlow is up
    for role in ("train_labels", "test_labels"):
        _rows(found, role, mine.outputs, config.data.allow_nonfinite, first_only=False)
    from app.budget.apply import import_tensorflow

    import_tensorflow()
    from app.release import publish

    change = publish.signature_change(publish.champion(publishing.publish_dir), mine)
    if change is not None:
        raise NotPublished(f"model not published: {change}")


def _may_differ(version: Path, mine: layout.Signature) -> bool:
    """Whether ``version``'s record says its signature is not ``mine``: its K and H×W, or
    its H×W alone (an earlier coretrain's record); False without a record."""
    recorded = layout.recorded_signature(version)
    if recorded is not None:
        return recorded != mine
    hw = layout.input_hw(version)
    return hw is not None and hw[0] * hw[1] != mine.inputs
