"""Checkpoint restore with fallback: newest valid checkpoint first, never a silent restart.

``tf.train.latest_checkpoint`` returns None when the newest files are missing,
which silently trains from scratch (DESIGN.md); a truncated ``.index``/``.data``
file raises on restore. Here every ``ckpt-N`` found on disk or named in the
state file is tried from the newest down, and a directory that has
checkpoints but none readable is a StorageError (exit 4).

A save killed half-way (kill -9, OOM) leaves only temporary files: TF writes
``ckpt-N_temp/`` (SaveV2's shard directory), ``*.tempstate<random>`` (its
BundleWriter renames them into place when complete) and ``checkpoint.tmp<uuid>``
(``atomic_write_string_to_file`` of the state file). They are removed before
restoring; the output lock guarantees no other run is writing them.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import tensorflow as tf

from app import logs
from app.errors import StorageError

PREFIX = "ckpt"
_NUMBERED = re.compile(rf"^{PREFIX}-(\d+)\.index$")
# Temporary names of a save in progress (see the module docstring).
_PARTIAL = re.compile(rf"^(?:{PREFIX}-\d+_temp.*|.*\.tempstate\d*|checkpoint\.tmp[0-9a-f]*)$")


def remove_partial(directory: Path) -> list[str]:
    """Delete what killed saves left in ``directory``; return the names removed (sorted).

    Only temporary names are touched (``ckpt-N_temp*``, ``*.tempstate*``,
    ``checkpoint.tmp*``), never a ``ckpt-N.index``/``.data-*`` file or the state
    file. The caller must hold the output lock (app.lock): a concurrent save's
    temporary files would look the same. Raises StorageError if one can't be removed.
    """
    removed: list[str] = []
    if not directory.is_dir():
        return removed
    for path in sorted(directory.iterdir()):
        if not _PARTIAL.match(path.name):
            continue
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError as exc:
            raise StorageError(f"{path}: cannot remove a partial save: {exc.strerror}") from exc
        removed.append(path.name)
    return removed


def describe(exc: BaseException) -> str:
    """One short line for a TF/OS error: no ``{{function_node ...}}`` or ``[Op:...]`` noise."""
    text = exc.message if isinstance(exc, tf.errors.OpError) else str(exc)
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:\w+\]", "", text).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


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
    Partial saves are removed first (:func:`remove_partial`; logged as
    ``checkpoint_cleanup``). Raises StorageError when checkpoints exist but none
    can be restored.
    """
    removed = remove_partial(directory)
    if removed:
        logs.event(
            "checkpoint_cleanup",
            f"removed {len(removed)} partial checkpoint file(s) of an interrupted save",
            level=30,
            removed=removed,
        )
    tried = candidates(directory, manager)
    errors = []
    for prefix in tried:
        try:
            ckpt.restore(prefix).assert_existing_objects_matched()
        except Exception as exc:  # TF's reader raises OpError, ValueError, AssertionError,
            # and IndexError ("Read less bytes than requested") for a truncated .data file
            reason = f"{type(exc).__name__}: {describe(exc)}"
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
