"""Multi-worker training (issue #5): the cluster, the strategy, timeouts and input shards.

Several copies of the same image train one model with TensorFlow's
``MultiWorkerMirroredStrategy`` (synchronous data parallelism: every step
all-reduces the gradients, so every worker holds the same weights). Where the
cluster comes from (:func:`resolve`, no TensorFlow import):

* ``TF_CONFIG`` (JSON, as TensorFlow and Kubeflow's TFJob write it):
  ``{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker",
  "index": i}}``; a ``chief`` job of one task is accepted and counts as worker 0.
* or derived from a Kubernetes Indexed Job: ``--workers N``, ``--worker-hosts``
  (a pattern such as ``coretrain-{index}.coretrain-workers:12345`` or a
  comma-separated list of N ``host[:port]``) and the worker index from
  ``--worker-index`` or the ``JOB_COMPLETION_INDEX`` variable Kubernetes sets.

Worker 0 is the chief: only it writes ``checkpoints/``, ``model/`` and
``metrics.json``. Worker i > 0 writes only under ``workers/worker-<i>/`` in the
output directory (its lock, its log, and the checkpoint copies TensorFlow's
multi-worker checkpointing wants every worker to save); its data cache is
``workers/worker-<i>/cache`` (or ``<--cache-dir>/worker-<i>``).

Batches: ``--batch-size`` is per worker; the global batch of step ``s`` is
the single-process batch of ``batch_size × workers`` samples for ``(seed, s)``
(:func:`app.data.pipeline.batch_indices`, sorted) and worker i trains on its
positions ``i::workers``, so the workers together see exactly the
single-process batches (and use the same dropout mask: app.train).

Failures (docs/distributed.md has the measured behaviour): TensorFlow's
coordination service (hosted by the chief) is configured here with

* ``cluster_timeout`` (``--cluster-timeout``): how long every worker waits for
  all N to register (a registration barrier); a worker that never arrives
  makes the others fail with :class:`ClusterError` (exit 6) after this time;
* ``heartbeat_timeout`` (``--heartbeat-timeout``): a worker that stops sending
  heartbeats (killed, node lost) is declared dead after this time; the
  service aborts the collectives of the others, which then exit 6. A dead
  chief is noticed sooner by the others (its connections close).

SIGTERM: TensorFlow's runtime replaces the process's SIGTERM handler while the
strategy starts (``tsl::SigtermNotifier``, for its PreemptionCheckpointHandler,
which would exit 42); :func:`create_strategy` puts the Python handler back, and
the training step all-reduces each worker's "stop requested" flag so that all
workers stop after the same step, save together and exit 143.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app import logs
from app.errors import AppError, ConfigError

if TYPE_CHECKING:
    import numpy as np

    from app.budget.plan import ThreadPlan
    from app.config import TrainConfig
    from app.data.cache import DataCache

#: Port used when a worker host is given without one.
DEFAULT_PORT = 12345
#: Seconds every worker waits for all workers to register (pods may start minutes apart).
DEFAULT_CLUSTER_TIMEOUT = 600.0
#: Seconds without heartbeats after which a worker counts as dead (TensorFlow's default is 10).
DEFAULT_HEARTBEAT_TIMEOUT = 30.0
INDEX_PLACEHOLDER = "{index}"
#: Prefix of the error a failing worker reports to the others (see report_failure).
REPORT_PREFIX = "coretrain worker"
WORKERS_DIR = "workers"
#: TF_CONFIG job names that train; a chief (at most one task) is worker 0.
TRAINING_JOBS = ("chief", "worker")


class ClusterError(AppError):
    """Another worker was lost, never arrived, or disagrees with this one. Exit 6.

    Every worker exits; rerunning all of them resumes from the last checkpoint.
    """

    exit_code = 6


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
# Resolution (no TensorFlow)
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


def resolve(
    environ: Mapping[str, str],
    *,
    workers: int | None = None,
    worker_index: int | None = None,
    hosts: str | None = None,
    cluster_timeout: float = DEFAULT_CLUSTER_TIMEOUT,
    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT,
) -> Cluster | None:
    """The multi-worker cluster of this process, or None to train in a single process.

    ``TF_CONFIG`` in ``environ`` is used when set and non-empty (then
    ``workers``/``hosts`` must not be given); otherwise ``workers`` > 1 derives
    it from ``hosts`` (see :func:`worker_hosts`) and ``worker_index``, which
    defaults to ``JOB_COMPLETION_INDEX`` (set by Kubernetes in Indexed Jobs).
    A cluster of one worker is a single process. Timeouts in seconds (> 0).
    Raises ConfigError for contradictory or incomplete settings.
    """
    if not cluster_timeout > 0 or not heartbeat_timeout > 0:
        raise ConfigError("--cluster-timeout and --heartbeat-timeout must be > 0 seconds")
    timeouts = {"cluster_timeout": cluster_timeout, "heartbeat_timeout": heartbeat_timeout}
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


# ---------------------------------------------------------------------------
# Where each worker writes
# ---------------------------------------------------------------------------


def worker_dir(output_dir: Path, cluster: Cluster | None) -> Path:
    """The directory this process owns: the output directory for a single
    process or the chief, ``<output>/workers/worker-<i>`` for worker i > 0."""
    if cluster is None or cluster.is_chief:
        return Path(output_dir)
    return Path(output_dir) / WORKERS_DIR / f"worker-{cluster.index}"


def worker_config(config: TrainConfig, cluster: Cluster | None) -> TrainConfig:
    """``config`` with this worker's own data cache directory.

    Two workers converting the same data into one directory would race on the
    final rename, so worker i > 0 uses ``<--cache-dir>/worker-<i>`` or
    ``<output>/workers/worker-<i>/cache``; the chief (and a single process)
    keeps ``config`` as is.
    """
    if cluster is None or cluster.is_chief:
        return config
    if config.cache_dir is not None:
        return replace(config, cache_dir=config.cache_dir / f"worker-{cluster.index}")
    return replace(config, cache_dir=worker_dir(config.output_dir, cluster) / "cache")


# ---------------------------------------------------------------------------
# Input shards
# ---------------------------------------------------------------------------


def shard_indices(
    seed: int, step: int, batch_size: int, n: int, workers: int, index: int
) -> np.ndarray:
    """Training rows of worker ``index`` for ``step``: shape (batch_size,), int64, sorted.

    The global batch is the single-process batch of ``batch_size·workers``
    samples, in the order the single-process pipeline feeds it (sorted
    :func:`app.data.pipeline.batch_indices`); this worker takes its positions
    ``index::workers``. The shards are disjoint and their union is the global
    batch; the training step picks the same positions of the global dropout mask.
    """
    import numpy as np

    from app.data.pipeline import batch_indices

    rows = np.sort(batch_indices(seed, step, batch_size * workers, n))
    return rows[index::workers]


def train_dataset(
    cache: DataCache,
    plan: ThreadPlan,
    cluster: Cluster,
    *,
    seed: int,
    batch_size: int,
    start_step: int,
    end_step: int,
    resident: bool | None = None,
) -> Any:
    """This worker's batches for steps ``start_step .. end_step-1`` (a tf.data.Dataset).

    Elements: x (batch_size, H, W, 1) raw float32, y (batch_size, K) raw; the
    rows are :func:`shard_indices`. The single-process pipeline, without
    autotuning (:func:`without_autotune`).
    """
    from app.data import pipeline

    n, workers, index = cache.train_size, cluster.count, cluster.index
    ds = pipeline.train_dataset(
        cache,
        plan,
        seed=seed,
        batch_size=batch_size,
        start_step=start_step,
        end_step=end_step,
        rows=lambda step: shard_indices(seed, step, batch_size, n, workers, index),
        resident=resident,
    )
    return without_autotune(ds)


def without_autotune(ds: Any) -> Any:
    """``ds`` with tf.data autotuning off (its map and prefetch sizes are fixed anyway).

    An iterator's destructor can wait for tf.data's autotune thread to wake up
    by itself (it sleeps 10 ms, 20 ms, … doubling between rounds) instead of
    cancelling it: the end of a 25 s training loop was held until 41 s after
    its start (seen with gdb: the main thread in ``~LogicalThreadWrapper`` of
    ``RootDataset::Iterator``, the other in ``Model::OptimizeLoop``). It
    happens intermittently, in single-process runs too.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return ds.with_options(options)


# ---------------------------------------------------------------------------
# The strategy (TensorFlow)
# ---------------------------------------------------------------------------

_TASK = re.compile(r"/job:(chief|worker)/replica:\d+/task:(\d+)")


def _summary(exc: BaseException, limit: int = 300) -> str:
    """The first informative line of a TensorFlow error message."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    skip = ("Graph execution error", "Detected at node", "File ", "Additional GRPC", ":", "[[")
    useful = [ln for ln in lines if not ln.startswith(skip)]
    text = " ".join(useful[:3]) if useful else type(exc).__name__
    return text[:limit]


def _named_workers(exc: BaseException, cluster: Cluster) -> list[int]:
    """Worker indices named in a TensorFlow error (other than this worker)."""
    chief = len(cluster.jobs.get("chief", ()))
    found = []
    for job, task in _TASK.findall(str(exc)):
        idx = int(task) if job == "chief" else chief + int(task)
        if idx != cluster.index and idx not in found:
            found.append(idx)
    return found


def _is_cluster_failure(exc: BaseException) -> bool:
    import tensorflow as tf

    if isinstance(exc, tf.errors.OpError) and REPORT_PREFIX in str(exc):
        return True  # another worker's report_failure()
    return isinstance(
        exc,
        tf.errors.UnavailableError
        | tf.errors.DeadlineExceededError
        | tf.errors.AbortedError
        | tf.errors.CancelledError,
    )


def lost_worker_error(exc: BaseException, cluster: Cluster, what: str) -> ClusterError:
    """A ClusterError for a collective that failed because a peer is gone."""
    reported = re.search(rf"{REPORT_PREFIX} (\d+) failed: ([^\n]*)", str(exc))
    if reported:
        return ClusterError(
            f"worker {cluster.index}: {what} failed: worker {reported.group(1)} failed "
            f"({reported.group(2)[:300]}); all workers stop, rerun them to resume from the "
            "last checkpoint"
        )
    named = _named_workers(exc, cluster)
    who = ("worker " + ", ".join(map(str, named))) if named else "another worker"
    return ClusterError(
        f"worker {cluster.index}: {what} failed: {who} stopped responding "
        f"(heartbeat timeout {cluster.heartbeat_timeout:g} s or closed connection): "
        f"{_summary(exc)}; all workers stop, rerun them to resume from the last checkpoint"
    )


@contextmanager
def collective(cluster: Cluster, what: str) -> Iterator[None]:
    """Turn TensorFlow's "peer gone" errors inside the block into ClusterError (exit 6).

    UnavailableError, DeadlineExceededError, AbortedError and CancelledError
    are what collectives raise when the coordination service aborts them (and
    any error carrying another worker's :func:`report_failure` message); other
    errors pass through unchanged.
    """
    try:
        yield
    except Exception as exc:
        if _is_cluster_failure(exc):
            raise lost_worker_error(exc, cluster, what) from exc
        raise


def _configure_coordination(cluster: Cluster) -> None:
    """Set the coordination service's timeouts before the strategy starts it.

    MultiWorkerMirroredStrategy configures the service itself (with
    TensorFlow's defaults: wait for all workers up to 1 hour on the chief and
    no registration timeout on the others, 10 s heartbeat timeout) unless one
    is configured already; this is its own configuration
    (``collective_all_reduce_strategy.py``) plus our timeouts and a
    registration *barrier*, so that every worker, the chief included, gives up
    after ``cluster_timeout`` (``coordination_config.proto``). TensorFlow has no
    public API for it (``tensorflow.python.eager.context``; TF 2.21).
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    ctx = context.context()
    if ctx._context_handle is not None:
        raise RuntimeError(
            "the multi-worker strategy must be created before the first TensorFlow op runs"
        )
    spec = {job: list(hosts) for job, hosts in cluster.jobs.items()}
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        heartbeat_timeout_in_ms=int(cluster.heartbeat_timeout * 1000),
        cluster_register_timeout_in_ms=int(cluster.cluster_timeout * 1000),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(hosts))
            for job, hosts in cluster.jobs.items()
        ],
    )
    ctx.coordination_service.cluster_register_with_barrier = True


def create_strategy(cluster: Cluster) -> Any:
    """Start this worker's server and return a ``MultiWorkerMirroredStrategy``.

    Blocks until all ``cluster.count`` workers have registered (at most
    ``cluster.cluster_timeout`` seconds; then ClusterError, exit 6). Must run
    before the first TensorFlow op of the process and after the thread plan
    was applied (the pools are sized once). The Python SIGTERM handler that was
    installed before is installed again afterwards (TensorFlow's runtime
    replaces it; a SIGTERM that arrives *while* waiting for the cluster is
    taken by TensorFlow's handler and lost).
    """
    import tensorflow as tf

    previous = signal.getsignal(signal.SIGTERM)
    t0 = time.perf_counter()
    logs.event(
        "cluster_wait",
        f"worker {cluster.index} of {cluster.count}: waiting up to "
        f"{cluster.cluster_timeout:g} s for all workers ({', '.join(cluster.hosts)})",
        workers=cluster.count,
        index=cluster.index,
    )
    try:
        _configure_coordination(cluster)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({job: list(hosts) for job, hosts in cluster.jobs.items()}),
            task_type=cluster.task_type,
            task_id=cluster.task_id,
            rpc_layer="grpc",
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    except tf.errors.OpError as exc:
        raise ClusterError(
            f"worker {cluster.index}: the {cluster.count} workers did not all start within "
            f"{cluster.cluster_timeout:g} s (--cluster-timeout): {_summary(exc)}"
        ) from exc
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
    logs.event(
        "cluster",
        f"all {cluster.count} workers connected; this is worker {cluster.index}"
        + (" (chief)" if cluster.is_chief else ""),
        workers=cluster.count,
        index=cluster.index,
        seconds=round(time.perf_counter() - t0, 2),
    )
    return strategy


class AgreedStop:
    """The stop request as all workers agree on it: callable like :class:`StopRequest`.

    ``local`` is this process's own request (a signal handler's flag). The
    training step all-reduces :meth:`local_flag` and hands the result to
    :meth:`update`, so ``stop()`` turns True on every worker after the same
    step and never between two agreement points (a worker deciding alone to
    evaluate or save would leave the others waiting in a collective).
    """

    def __init__(self, local: Any) -> None:
        self.local = local
        self.agreed = False

    def local_flag(self) -> float:
        """1.0 if this worker was asked to stop, else 0.0 (summed over the workers)."""
        return 1.0 if self.local() else 0.0

    def update(self, total: float) -> bool:
        """Record the all-reduced sum of the workers' flags; return the agreed request."""
        self.agreed = self.agreed or total > 0
        return self.agreed

    def __call__(self) -> bool:
        return self.agreed


def report_failure(cluster: Cluster, exc: BaseException) -> bool:
    """Tell the other workers that this one is failing; return True if it was sent.

    Without it they would wait in their next collective for this worker (a
    clean exit sends no heartbeat timeout). The coordination service aborts
    their collectives with this message, so they exit 6 naming this worker
    and the error. Does nothing before the strategy started (no cluster yet)
    and for failures every worker meets at the same step (ClusterError,
    Preempted, TrainingDiverged: reporting those would race with the others'
    own last collective).
    """
    import sys

    from app.errors import Preempted, TrainingDiverged

    if isinstance(exc, ClusterError | Preempted | TrainingDiverged):
        return False
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.eager import context

    ctx = context.context()
    if ctx._context_handle is None or ctx.coordination_service is None:
        return False
    message = f"{REPORT_PREFIX} {cluster.index} failed: {type(exc).__name__}: {exc}"
    try:
        ctx.report_error_to_cluster(10, message[:1000])  # 10 = ABORTED (tf.errors codes)
    except Exception:
        return False
    return True


class Peers:
    """Small all-reduces over the workers of ``strategy`` (collectives, not free).

    Every method is a collective: all workers must call the same methods in
    the same order, or they wait for each other until a timeout.
    """

    def __init__(self, strategy: Any, cluster: Cluster) -> None:
        import tensorflow as tf

        self.strategy = strategy
        self.cluster = cluster

        device = strategy.extended.worker_devices[0]

        def replica_sum(v: Any) -> Any:
            # An input passed straight through has no device, and the all-reduce
            # then finds no destination ("destinations can not be empty").
            with tf.device(device):
                v = tf.identity(v)
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, v)

        @tf.function
        def total(v: Any) -> Any:
            return strategy.experimental_local_results(strategy.run(replica_sum, args=(v,)))[0]

        self._total = total

    def sum(self, values: Sequence[float] | np.ndarray, what: str = "all-reduce") -> np.ndarray:
        """Element-wise sum over the workers: float64 array of ``len(values)``."""
        import numpy as np
        import tensorflow as tf

        with collective(self.cluster, what):
            out = self._total(tf.constant(np.asarray(values, np.float64)))
            return np.asarray(out.numpy(), np.float64)

    def check_same(self, what: str, **values: int) -> None:
        """Raise ClusterError unless every worker passes the same ``values``.

        (Equal iff N·Σv² = (Σv)², for the small integers compared here.)
        """
        import numpy as np

        names = sorted(values)
        local = np.array([float(values[k]) for k in names])
        total = self.sum(np.concatenate([local, local * local]), what)
        n = self.cluster.count
        differ = [
            k for i, k in enumerate(names) if n * total[len(names) + i] != total[i] * total[i]
        ]
        if differ:
            mine = ", ".join(f"{k}={values[k]}" for k in differ)
            raise ClusterError(
                f"worker {self.cluster.index}: the workers disagree on {what} ({mine} here; "
                "give every worker the same data and options)"
            )
