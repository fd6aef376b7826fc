"""Who writes where: the one place that knows the chief/worker rules for files.

A single process and the chief (worker 0) own the output directory: ``checkpoints/``,
``model/``, ``metrics.json``, ``logs/train.jsonl``, ``.lock`` and (without a cache directory)
``cache/``. Worker i > 0 owns only ``<output>/workers/worker-<i>/``: its lock, its log and
the checkpoint copies TensorFlow's multi-worker saving wants every worker to write (a
scratch directory: it never reads them back, the chief's state reaches it by broadcast);
its data cache is ``<cache directory>/worker-<i>`` or ``workers/worker-<i>/cache``, as two
workers converting into one directory would race on the final rename. The cache directory
is ``--cache-dir``, else the per-user one (app/data/cache/userdir.py), if there is one.

Every directory is opened by :func:`app.atomic.open_dir` below the directory the operator
named (``--output`` or the cache directory): each component the job creates is opened without
following symlinks and must be the run's own. Before anything is written, the names this
process will write in its directory are checked the same way (:func:`open_log`), so a
planted symlink stops the run with exit 4 before it touches anything.
No TensorFlow here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from app import logs
from app.atomic import Dir, open_dir, probe_writable
from app.cluster.spec import Cluster
from app.config import TrainConfig
from app.data.cache import userdir
from app.errors import StorageError

WORKERS_DIR = "workers"
LOG_NAME = "train.jsonl"
#: What every process writes in its own directory, and what only the chief writes there.
OWN_NAMES = ("logs", "checkpoints", "cache")
CHIEF_NAMES = ("model", "metrics.json", "tensorboard", WORKERS_DIR)


@dataclass(frozen=True)
class Workspace:
    """The directories of this process in one run.

    ``output``: the run's output directory (the chief's); ``own``: what this process
    writes (``output`` for a single process and the chief); ``cache``: its data cache;
    ``worker``: the worker index in a multi-worker run, else None; ``cache_top``: the
    directory the operator named that the cache lies in (the cache directory, else ``output``);
    ``workers``: the processes of the run (1, or the workers of a multi-worker run);
    ``cache_note``: what the per-user cache directory's choice has to say (why there is
    none, a variable ignored), logged as a ``cache_default`` warning; "" if nothing.
    """

    output: Path
    own: Path
    cache: Path
    is_chief: bool
    worker: int | None
    cache_top: Path
    workers: int = 1
    cache_note: str = ""

    def open(self, path: Path, what: str = "directory") -> Dir:
        """``path`` (the output, the cache or a directory below them) opened by the rules of
        :func:`app.atomic.open_dir`, created if missing. Raises StorageError."""
        path = Path(path)
        below = self.output if path.is_relative_to(self.output) else self.cache_top
        return open_dir(path, what, below=below)

    @property
    def checkpoints(self) -> Path:
        """Checkpoints this process saves (the chief's are the ones a rerun restores)."""
        return self.own / "checkpoints"

    @property
    def log_file(self) -> Path:
        return self.own / "logs" / LOG_NAME

    @property
    def plan_file(self) -> Path:
        """The whole thread plan with what it was decided from (the ``start`` event's
        ``plan_file``), beside the log: written at every start, as the log is, so a rerun of
        a finished run writes nothing else."""
        return self.own / "logs" / "plan.json"

    @property
    def model(self) -> Path:
        """The final export (written by the chief only)."""
        return self.output / "model"

    @property
    def metrics(self) -> Path:
        """The final summary (written by the chief only)."""
        return self.output / "metrics.json"


def for_run(
    config: TrainConfig, cluster: Cluster | None = None, environ: Mapping[str, str] | None = None
) -> Workspace:
    """The workspace of this process: the chief's rules for a single process or worker 0.
    The cache directory: ``--cache-dir``, else the per-user one of ``environ`` (default
    os.environ; app/data/cache/userdir.py, made here if missing), else none."""
    out = Path(config.output_dir)
    top, note = config.cache.cache_dir, ""
    if top is None:
        top, note = userdir.locate(os.environ if environ is None else environ)
    if cluster is None or cluster.is_chief:
        own = out
        cache = top if top is not None else out / "cache"
    else:
        own = out / WORKERS_DIR / f"worker-{cluster.index}"
        cache = top / f"worker-{cluster.index}" if top is not None else own / "cache"
    return Workspace(
        output=out,
        own=own,
        cache=cache,
        is_chief=cluster is None or cluster.is_chief,
        worker=None if cluster is None else cluster.index,
        cache_top=top if top is not None else out,
        workers=1 if cluster is None else cluster.count,
        cache_note=note,
    )


def _written_names(ws: Workspace) -> tuple[str, ...]:
    """The names this process writes directly in ``ws.own``."""
    names = tuple(n for n in OWN_NAMES if n != "cache" or ws.cache == ws.own / "cache")
    return names + (CHIEF_NAMES if ws.is_chief else ())


def open_log(ws: Workspace) -> None:
    """Check ``ws.own`` and the names this process writes there, and add the JSON log file.

    The names (:data:`OWN_NAMES`, and :data:`CHIEF_NAMES` on the chief) must not be
    symlinks, nor belong to another user. Raises StorageError (exit 4) naming the path,
    before anything is written, or when the directory or its log can't be written.
    """
    with ws.open(ws.own, "output directory") as own:
        probe_writable(own, "output directory")
        for name in _written_names(ws):
            own.check(name, "file" if "." in name else "directory")
        with own.sub("logs", "log directory") as directory:
            fd = directory.open(LOG_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT, "log file")
    try:
        logs.add_file(fd, worker=ws.worker)
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"{ws.log_file}: cannot write the log: {exc.strerror}") from exc


def log_cache_note(ws: Workspace) -> None:
    """Log ``ws.cache_note``, if any, as a ``cache_default`` warning naming the cache
    directory used; called after the ``start`` event (a run's first record is its start)."""
    if ws.cache_note:
        logs.event("cache_default", f"{ws.cache_note}: the data cache is {ws.cache}",
                   level=logging.WARNING, path=str(ws.cache))  # fmt: skip
