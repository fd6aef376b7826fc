"""Checkpoint restore with fallback: newest valid checkpoint first, never a silent restart.

``tf.train.latest_checkpoint`` returns None when the newest files are missing,
which silently trains from scratch (DESIGN.md); a truncated ``.index``/``.data``
file raises on restore. Here every ``ckpt-N`` found on disk or named in the
state file is tried from the newest down, and a directory that has
checkpoints but none readable is a StorageError (exit 4).
"""

from __future__ import annotations

import re
from pathlib import Path

import tensorflow as tf

from app import logs
from app.errors import StorageError

PREFIX = "ckpt"
_NUMBERED = re.compile(rf"^{PREFIX}-(\d+)\.index$")


def candidates(directory: Path, manager: tf.train.CheckpointManager) -> list[str]:
    """Checkpoint prefixes to try, newest (highest number) first."""
    found = {
        str(directory / m.group(0)[: -len(".index")])
        for p in directory.glob("*.index")
        if (m := _NUMBERED.match(p.name))
    }
    found.update(manager.checkpoints)

    def number(prefix: str) -> int:
        return int(prefix.rsplit("-", 1)[1])

    return sorted(found, key=number, reverse=True)


def restore(
    ckpt: tf.train.Checkpoint, manager: tf.train.CheckpointManager, directory: Path
) -> str | None:
    """Restore the newest readable checkpoint into ``ckpt``; return its prefix or None.

    None means the directory holds no checkpoint at all (a fresh start).
    Raises StorageError when checkpoints exist but none can be restored.
    """
    tried = candidates(directory, manager)
    errors = []
    for prefix in tried:
        try:
            ckpt.restore(prefix).assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, AssertionError) as exc:
            reason = (
                str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            )
            errors.append(f"{prefix}: {reason}")
            logs.event(
                "checkpoint_unreadable",
                f"skipping unreadable checkpoint {prefix}: {reason}",
                level=30,
                path=prefix,
            )
            continue
        if errors:
            logs.event(
                "checkpoint_fallback",
                f"fell back to older checkpoint {prefix}",
                level=30,
                path=prefix,
                skipped=len(errors),
            )
        return prefix
    if tried:
        raise StorageError(
            f"{directory}: none of {len(tried)} checkpoints can be restored "
            f"(newest: {errors[0]}); move the directory away to start from scratch"
        )
    return None
