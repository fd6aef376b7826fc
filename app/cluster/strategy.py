"""The strategy: this worker's TensorFlow server, the coordination service and its timeouts.

TensorFlow's coordination service (hosted by the chief) is configured here with

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

import signal
import sys
import threading
import time
from typing import Any

import tensorflow as tf

from app import logs
from app.cluster.collectives import REPORT_PREFIX
from app.cluster.spec import Cluster
from app.errors import ClusterError, Preempted, TrainingDiverged, short_message


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
            f"{cluster.cluster_timeout:g} s (--cluster-timeout): {short_message(exc)}"
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
