"""The cluster of a multi-worker run: who the workers are and which one this process is.

Several copies of the same image train one model with TensorFlow's
``MultiWorkerMirroredStrategy`` (synchronous data parallelism; docs/distributed.md).
Where the cluster comes from (:func:`resolve`; no TensorFlow here):

* ``TF_CONFIG`` (JSON, as TensorFlow and Kubeflow's TFJob write it):
  ``{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker",
  "index": i}}``; a ``chief`` job of one task is accepted and counts as worker 0.
* or derived from a Kubernetes Indexed Job: ``--workers N``, ``--worker-hosts``
  (a pattern such as ``coretrain-{index}.coretrain-workers:12345`` or a
  comma-separated list of N ``host[:port]``) and the worker index from
  ``--worker-index`` or the ``JOB_COMPLETION_INDEX`` variable Kubernetes sets.

Worker 0 is the chief. Timeouts (``--cluster-timeout``, ``--heartbeat-timeout``) are
applied by :mod:`app.cluster.strategy`.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.errors import ConfigError
from app.options import check_bounds, option

#: Port used when a worker host is given without one.
DEFAULT_PORT = 12345
#: Seconds every worker waits for all workers to register (pods may start minutes apart).
DEFAULT_CLUSTER_TIMEOUT = 600.0
#: Seconds without heartbeats after which a worker counts as dead (TensorFlow's default is 10).
DEFAULT_HEARTBEAT_TIMEOUT = 30.0
INDEX_PLACEHOLDER = "{index}"
#: TF_CONFIG job names that train; a chief (at most one task) is worker 0.
TRAINING_JOBS = ("chief", "worker")


@dataclass(frozen=True)
class ClusterOptions:
    """The ``train`` options that make this process one worker of several."""

    workers: int | None = option(
        None,
        "Train with N worker processes (MultiWorkerMirroredStrategy), e.g. the pods of an "
        "Indexed Job; --batch-size is per worker. TF_CONFIG, if set, defines the cluster "
        "instead.",
        minimum=1,
        shown_default="1, or TF_CONFIG's",
    )
    worker_hosts: str | None = option(
        None,
        'Every worker\'s host[:port]: a pattern with "{index}" (e.g. '
        '"coretrain-{index}.coretrain-workers:12345") or N comma-separated hosts; the port '
        "defaults to 12345.",
        shown_default="none",
        metavar="HOSTS",
    )
    worker_index: int | None = option(
        None, "This worker's index, 0 = chief.", minimum=0, shown_default="JOB_COMPLETION_INDEX"
    )
    cluster_timeout: float = option(
        DEFAULT_CLUSTER_TIMEOUT,
        "Seconds to wait for all workers to start before failing (exit 6).",
        above=0,
        metavar="SECONDS",
    )
    heartbeat_timeout: float = option(
        DEFAULT_HEARTBEAT_TIMEOUT,
        "Seconds without heartbeats after which a worker counts as lost; the others then "
        "stop (exit 6).",
        above=0,
        metavar="SECONDS",
    )

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class Cluster:
    """This process's place in a multi-worker run.

    ``jobs`` maps TF_CONFIG job names ("chief", "worker") to ``host:port``
    addresses; ``task_type``/``task_id`` name this process in TensorFlow's
    terms. ``index`` is the worker index (0 = chief, then the "worker" tasks in
    order) and ``count`` the number of workers. Timeouts in seconds.
    """

    jobs: Mapping[str, tuple[str, ...]]
    task_type: str
    task_id: int
    source: str
    cluster_timeout: float = DEFAULT_CLUSTER_TIMEOUT
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every worker's ``host:port`` in worker-index order (chief first)."""
        return tuple(h for job in TRAINING_JOBS for h in self.jobs.get(job, ()))

    @property
    def count(self) -> int:
        """Number of workers (≥ 2)."""
        return len(self.hosts)

    @property
    def index(self) -> int:
        """This worker's index: 0 for the chief, then the "worker" tasks in order."""
        offset = len(self.jobs.get("chief", ())) if self.task_type == "worker" else 0
        return offset + self.task_id

    @property
    def is_chief(self) -> bool:
        """True on worker 0, the one that writes checkpoints, the export and metrics."""
        return self.index == 0

    def tf_config(self) -> dict[str, Any]:
        """The equivalent ``TF_CONFIG`` value (a dict; ``json.dumps`` it for the variable)."""
        return {
            "cluster": {job: list(hosts) for job, hosts in self.jobs.items()},
            "task": {"type": self.task_type, "index": self.task_id},
        }

    def to_json(self) -> dict[str, Any]:
        """JSON-ready description for the ``start`` event."""
        return {
            "workers": self.count,
            "index": self.index,
            "chief": self.is_chief,
            "hosts": list(self.hosts),
            "source": self.source,
            "tf_config": self.tf_config(),
            "cluster_timeout_s": self.cluster_timeout,
            "heartbeat_timeout_s": self.heartbeat_timeout,
        }


# ---------------------------------------------------------------------------
# Resolution
# ---------------------------------------------------------------------------


def _with_port(host: str) -> str:
    host = host.strip()
    if not host:
        raise ConfigError("--worker-hosts: empty host name")
    if re.search(r":\d+$", host):
        return host
    if ":" in host.rsplit("]", 1)[-1]:
        raise ConfigError(f"--worker-hosts: {host!r}: the port must be a number")
    return f"{host}:{DEFAULT_PORT}"


def parse_tf_config(text: str) -> tuple[dict[str, tuple[str, ...]], str, int]:
    """Parse a ``TF_CONFIG`` value → (jobs, task type, task index).

    Only "chief" (one task) and "worker" jobs are supported (no parameter
    servers or evaluators: MultiWorkerMirroredStrategy has no use for them).
    Raises ConfigError naming the problem.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"TF_CONFIG is not valid JSON: {exc}") from None
    if not isinstance(value, dict) or not isinstance(value.get("cluster"), dict):
        raise ConfigError('TF_CONFIG needs a "cluster" object, e.g. {"worker": ["host:port"]}')
    task = value.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ConfigError('TF_CONFIG needs a "task" object with "type" and "index"')
    jobs: dict[str, tuple[str, ...]] = {}
    for job, hosts in value["cluster"].items():
        if job not in TRAINING_JOBS:
            raise ConfigError(
                f"TF_CONFIG: job {job!r} is not supported (only chief and worker: "
                "MultiWorkerMirroredStrategy has no parameter servers or evaluators)"
            )
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
            raise ConfigError(f'TF_CONFIG: cluster "{job}" must be a non-empty list of "host:port"')
        jobs[job] = tuple(hosts)
    if len(jobs.get("chief", ())) > 1:
        raise ConfigError("TF_CONFIG: a cluster has at most one chief")
    task_type = task["type"]
    index = task.get("index", 0)
    if task_type not in jobs:
        raise ConfigError(f"TF_CONFIG: task type {task_type!r} is not a job of the cluster")
    if (
        not isinstance(index, int)
        or isinstance(index, bool)
        or not 0 <= index < len(jobs[task_type])
    ):
        raise ConfigError(
            f"TF_CONFIG: task index {index!r} is not in 0..{len(jobs[task_type]) - 1} "
            f'for job "{task_type}"'
        )
    return jobs, task_type, index


def worker_hosts(spec: str, workers: int) -> tuple[str, ...]:
    """Expand ``--worker-hosts`` into ``workers`` addresses ``host:port``.

    ``spec`` is either a pattern containing ``{index}`` (an Indexed Job's pod
    host names behind a headless Service: ``coretrain-{index}.coretrain-workers``
    resolves to pod ``coretrain-<index>`` when the pod template sets
    ``subdomain: coretrain-workers``) or a comma-separated list of exactly
    ``workers`` hosts. A missing port is :data:`DEFAULT_PORT`. Raises ConfigError.
    """
    if INDEX_PLACEHOLDER in spec:
        hosts = [spec.replace(INDEX_PLACEHOLDER, str(i)) for i in range(workers)]
    else:
        hosts = [h for h in spec.split(",") if h.strip()]
        if len(hosts) != workers:
            raise ConfigError(
                f"--worker-hosts lists {len(hosts)} hosts for --workers {workers}; give "
                f"{workers} comma-separated hosts or a pattern with {INDEX_PLACEHOLDER}"
            )
    resolved = tuple(_with_port(h) for h in hosts)
    if len(set(resolved)) != len(resolved):
        raise ConfigError(f"--worker-hosts: the same address appears twice in {list(resolved)}")
    return resolved


def resolve(environ: Mapping[str, str], options: ClusterOptions | None = None) -> Cluster | None:
    """The multi-worker cluster of this process, or None to train in a single process.

    ``TF_CONFIG`` in ``environ`` is used when set and non-empty (then
    ``workers``/``hosts`` must not be given); otherwise ``workers`` > 1 derives
    it from ``hosts`` (see :func:`worker_hosts`) and ``worker_index``, which
    defaults to ``JOB_COMPLETION_INDEX`` (set by Kubernetes in Indexed Jobs).
    A cluster of one worker is a single process. Timeouts in seconds (> 0).
    Raises ConfigError for contradictory or incomplete settings.
    """
    opts = options or ClusterOptions()
    workers, worker_index, hosts = opts.workers, opts.worker_index, opts.worker_hosts
    timeouts = {
        "cluster_timeout": opts.cluster_timeout,
        "heartbeat_timeout": opts.heartbeat_timeout,
    }
    raw = environ.get("TF_CONFIG", "").strip()
    if raw:
        if workers is not None or hosts is not None or worker_index is not None:
            raise ConfigError(
                "TF_CONFIG is set: don't also give --workers/--worker-hosts/--worker-index "
                "(CORETRAIN_WORKERS/_WORKER_HOSTS/_WORKER_INDEX)"
            )
        jobs, task_type, task_id = parse_tf_config(raw)
        cluster = Cluster(jobs, task_type, task_id, source="TF_CONFIG", **timeouts)
        return cluster if cluster.count > 1 else None
    if workers is None or workers == 1:
        if hosts is not None or worker_index is not None:
            raise ConfigError("--worker-hosts/--worker-index need --workers N (N > 1)")
        return None
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if not hosts:
        raise ConfigError(
            f"--workers {workers} needs --worker-hosts (e.g. "
            f'"coretrain-{INDEX_PLACEHOLDER}.coretrain-workers:{DEFAULT_PORT}")'
        )
    source = "--workers/--worker-hosts/--worker-index"
    if worker_index is None:
        raw_index = environ.get("JOB_COMPLETION_INDEX", "").strip()
        if not raw_index:
            raise ConfigError(
                "--workers needs the worker index: --worker-index, or JOB_COMPLETION_INDEX "
                "(set by Kubernetes in an Indexed Job)"
            )
        if not raw_index.isdigit():
            raise ConfigError(f"JOB_COMPLETION_INDEX={raw_index!r}: not a worker index")
        worker_index = int(raw_index)
        source = "--workers/--worker-hosts and JOB_COMPLETION_INDEX"
    if not 0 <= worker_index < workers:
        raise ConfigError(f"worker index {worker_index} is not in 0..{workers - 1}")
    jobs = {"worker": worker_hosts(hosts, workers)}
    return Cluster(jobs, "worker", worker_index, source=source, **timeouts)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 now, for workers on one host: bound to
    port 0 together, then released (another process may still take one before a worker
    binds it)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
