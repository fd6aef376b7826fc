"""Saving and restoring the training step's state (app/training/loop/step.py) when the controller
asks; never deciding when.

Restore falls back: newest valid checkpoint first, never a silent restart.

``tf.train.latest_checkpoint`` returns None when the newest files are missing,
which silently trains from scratch; a truncated ``.index``/``.data``
file raises on restore. Here every ``ckpt-N`` found on disk or named in the
state file is tried from the newest down, and a directory that has
checkpoints but none readable is a StorageError (exit 4).

A save killed half-way (kill -9, OOM) leaves only temporary files: TF writes
``ckpt-N_temp/`` (SaveV2's shard directory), ``*.tempstate<random>`` (its
BundleWriter renames them into place when complete) and ``checkpoint.tmp<uuid>``
(``atomic_write_string_to_file`` of the state file). They are removed before
restoring; the output lock guarantees no other run is writing them.

TensorFlow opens these files by path itself. The directory is opened once by the run
(app/atomic.py: not a symlink, the run's own) and, before every save, checked to be still
the one the path reaches, with no entry planted under the one temporary name TensorFlow
derives from the step (``ckpt-N_temp``); a failed check is exit 4 and nothing is saved.
What the checks can't cover (a swap in the moment between the check and TensorFlow's open,
or a random temporary name guessed by someone who may write in the directory) is in
docs/security.md.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path

import tensorflow as tf

from app import logs
from app.atomic import Dir
from app.errors import StorageError, TrainingDiverged, short_message
from app.training.loop.replicas import Replicas
from app.training.loop.step import TrainStep
from app.training.state import best
from app.training.state.identity import NUMBERED, PREFIX

# Temporary names of a save in progress (see the module docstring).
_PARTIAL = re.compile(
    rf"^(?:(?:{PREFIX}|{best.PREFIX})-\d+_temp.*|.*\.tempstate\d*|checkpoint\.tmp[0-9a-f]*)$"
)


def remove_partial(directory: Path) -> list[str]:
    """Delete what killed saves left in ``directory``; return the names removed (sorted).

    Only temporary names are touched (``ckpt-N_temp*``, ``best-N_temp*``, ``*.tempstate*``,
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


def candidates(directory: Path, manager: tf.train.CheckpointManager) -> list[str]:
    """Checkpoint prefixes to try, newest (highest number) first."""
    found = {
        str(directory / m.group(0)[: -len(".index")])
        for p in directory.glob("*.index")
        if (m := NUMBERED.match(p.name))
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
            level=logging.WARNING,
            removed=removed,
        )
    tried = candidates(directory, manager)
    errors = []
    for prefix in tried:
        try:
            ckpt.restore(prefix).assert_existing_objects_matched()
        except Exception as exc:  # TF's reader raises OpError, ValueError, AssertionError,
            # and IndexError ("Read less bytes than requested") for a truncated .data file
            reason = f"{type(exc).__name__}: {short_message(exc)}"
            errors.append(f"{prefix}: {reason}")
            logs.event(
                "checkpoint_unreadable",
                f"skipping unreadable checkpoint {prefix}: {reason}",
                level=logging.WARNING,
                path=prefix,
            )
            continue
        if errors:
            logs.event(
                "checkpoint_fallback",
                f"fell back to older checkpoint {prefix}",
                level=logging.WARNING,
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


#: What TensorFlow opens by name in a checkpoint directory: the state file and each
#: checkpoint's (and best step's) index and data files (``ckpt-N.index``, ``ckpt-N.data-…``).
OPENED = re.compile(rf"^(checkpoint|(?:{PREFIX}|{best.PREFIX})-\d+\.(index|data-.+))$")


def _only_files(directory: Dir) -> None:
    """Raise StorageError (exit 4) naming the first entry of ``directory`` TensorFlow would
    open (:data:`OPENED`) that is not a regular file: a FIFO there would block its open
    past a stop request, a device feed it endless bytes, a symlink lead it elsewhere."""
    for name in directory.names():
        if OPENED.match(name) and not directory.is_file(name):
            raise StorageError(
                f"{directory.path / name}: not a regular file where a checkpoint's file "
                "belongs (a FIFO, a device or a symlink): move it away, then rerun"
            )


class Checkpointer:
    """The run's checkpoints: one ``tf.train.Checkpoint`` (step, model, optimizer).

    On the chief (and a single process) ``directory`` is ``<output>/checkpoints`` with
    the newest ``keep`` checkpoints. Another worker saves too (TensorFlow's multi-worker
    saving wants every worker to) but into its own scratch directory, one checkpoint
    kept, and never reads it: at restore the chief reads its newest valid checkpoint and
    sends the state to the others (:meth:`Replicas.broadcast`), so a worker needs no
    shared storage.
    """

    def __init__(
        self, step: TrainStep, directory: Dir, keep: int, replicas: Replicas,
        nonfinite_data: bool = False,
    ) -> None:  # fmt: skip
        self.train_step, self.replicas = step, replicas
        #: What to change when training diverges (:meth:`remedy`): the training data may
        #: hold NaN/Inf (``--allow-nonfinite``), which no learning rate helps.
        self.nonfinite_data = nonfinite_data
        self.held, self.directory = directory, directory.path
        _only_files(directory)  # before TensorFlow opens any of them by name
        self.manager = tf.train.CheckpointManager(
            step.checkpoint,
            str(self.directory),
            max_to_keep=keep if replicas.is_chief else 1,
            checkpoint_name=PREFIX,
        )

    def restore(self) -> int:
        """Restore the newest readable checkpoint (on the chief) everywhere; return its step.

        0 means a fresh start; a resume is logged with ``read_s`` (the chief's restore from
        the files) and ``broadcast_s`` (the state sent to the others; on those it includes
        the wait for the chief's read). Raises StorageError when checkpoints exist but none
        can be restored, or the optimizer state was not restored with them; ClusterError
        when the workers end up disagreeing.
        """
        prefix, t0 = None, time.perf_counter()
        if self.replicas.is_chief:
            prefix = restore(self.train_step.checkpoint, self.manager, self.directory)
        else:
            for name in self.held.names():  # scratch: only old copies
                self.held.remove(name)
        t1 = time.perf_counter()
        self.replicas.broadcast(self.train_step.state(), "restore")
        start = self.train_step.global_step
        iterations = int(self.train_step.optimizer.iterations.numpy())
        if iterations != start:
            raise StorageError(
                f"{prefix or self.directory}: optimizer state not restored "
                f"(iterations {iterations}, step {start})"
            )
        self.replicas.check_same("the checkpoint to resume from", start_step=start)
        if start:
            logs.event(
                "resume",
                f"resuming from step {start} ({prefix or 'the chief'})",
                step=start,
                path=prefix,
                read_s=round(t1 - t0, 3) if self.replicas.is_chief else None,
                broadcast_s=round(time.perf_counter() - t1, 3) if self.replicas.count > 1 else None,
            )
        return start

    def check(self, step: int) -> None:
        """Before TensorFlow writes checkpoint ``step``: the directory is still the one the
        run opened, and TensorFlow's temporary name for the step is not planted. Raises
        StorageError naming the path."""
        if not self.held.still_at(self.directory):
            raise StorageError(
                f"{self.directory}: the checkpoint directory was replaced during the run; "
                f"checkpoint {step} not saved"
            )
        self.held.check(f"{PREFIX}-{step}_temp", "checkpoint's temporary directory")

    def remedy(self) -> str:
        """What to change when training diverges, for a divergence message."""
        if self.nonfinite_data:
            return (
                "lower --learning-rate, or remove the NaN/Inf values --allow-nonfinite let "
                "into the training data (a batch holding one has a NaN loss)"
            )
        return "lower --learning-rate"

    def kept(self) -> str:
        """Where the last good checkpoint is, for a divergence message."""
        if self.manager.latest_checkpoint is None:
            return "no checkpoint had been saved yet"
        return f"the last good checkpoint is kept in {self.directory}"

    def save(self, step: int) -> str:
        """Save checkpoint ``step``; never one holding NaN/Inf (TrainingDiverged instead).

        Raises StorageError when it can't be written (the previous ones stay).
        """
        t0 = time.perf_counter()
        self.check(step)
        if not self.train_step.finite():
            raise TrainingDiverged(
                f"weights became NaN/Inf at step {step} (not saved); {self.kept()}; {self.remedy()}"
            )
        try:
            with self.replicas.guard(f"checkpoint {step}"):
                path = self.manager.save(checkpoint_number=step)
        except (OSError, tf.errors.OpError) as exc:
            raise StorageError(
                f"{self.directory}: cannot save checkpoint {step}: {short_message(exc)}"
            ) from exc
        logs.event(
            "checkpoint",
            f"saved checkpoint at step {step}",
            step=step,
            path=path,
            seconds=round(time.perf_counter() - t0, 3),
        )
        return str(path)
