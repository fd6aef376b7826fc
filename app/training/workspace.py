"""Who writes where: the one place that knows the chief/worker rules for files.

A single process and the chief (worker 0) own the output directory: ``checkpoints/``,
``model/``, ``metrics.json``, ``logs/train.jsonl``, ``.lock`` and (unless ``--cache-dir``)
``cache/``. Worker i > 0 owns only ``<output>/workers/worker-<i>/``: its lock, its log and
the checkpoint copies TensorFlow's multi-worker saving wants every worker to write (a
scratch directory: it never reads them back, the chief's state reaches it by broadcast);
its data cache is ``<--cache-dir>/worker-<i>`` or ``workers/worker-<i>/cache``, as two
workers converting into one directory would race on the final rename.
No TensorFlow here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app import logs
from app.atomic import ensure_dir
from app.cluster.spec import Cluster
from app.config import TrainConfig
from app.errors import StorageError

WORKERS_DIR = "workers"


@dataclass(frozen=True)
class Workspace:
    """The directories of this process in one run.

    ``output``: the run's output directory (the chief's); ``own``: what this process
    writes (``output`` for a single process and the chief); ``cache``: its data cache;
    ``worker``: the worker index in a multi-worker run, else None.
    """

    output: Path
    own: Path
    cache: Path
    is_chief: bool
    worker: int | None

    @property
    def checkpoints(self) -> Path:
        """Checkpoints this process saves (the chief's are the ones a rerun restores)."""
        return self.own / "checkpoints"

    @property
    def log_file(self) -> Path:
        return self.own / "logs" / "train.jsonl"

    @property
    def model(self) -> Path:
        """The final export (written by the chief only)."""
        return self.output / "model"

    @property
    def metrics(self) -> Path:
        """The final summary (written by the chief only)."""
        return self.output / "metrics.json"


def for_run(config: TrainConfig, cluster: Cluster | None = None) -> Workspace:
    """The workspace of this process: the chief's rules for a single process or worker 0."""
    out = Path(config.output_dir)
    if cluster is None or cluster.is_chief:
        own = out
        cache = config.resolved_cache_dir
    else:
        own = out / WORKERS_DIR / f"worker-{cluster.index}"
        cache = (
            config.cache_dir / f"worker-{cluster.index}"
            if config.cache_dir is not None
            else own / "cache"
        )
    return Workspace(
        output=out,
        own=own,
        cache=cache,
        is_chief=cluster is None or cluster.is_chief,
        worker=None if cluster is None else cluster.index,
    )


def open_log(ws: Workspace) -> None:
    """Check that ``ws.own`` is writable and add the JSON log file there.

    Raises StorageError (exit 4) when the directory or its log can't be written.
    """
    ensure_dir(ws.own)
    try:
        logs.add_file(ws.log_file, worker=ws.worker)
    except OSError as exc:
        raise StorageError(f"{ws.log_file}: cannot write the log: {exc.strerror}") from exc
