"""Collectives between the workers, and what their failures mean (exit 6).

:func:`collective` turns TensorFlow's "peer gone" errors into :class:`ClusterError`
naming the lost worker; :class:`Peers` does the small host-side all-reduces (sums,
"do we all agree", the chief's state sent to everyone). Every method of :class:`Peers`
is a collective: all workers call the same ones in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import tensorflow as tf

from app.cluster.spec import Cluster
from app.errors import ClusterError, short_message

#: Prefix of the error a failing worker reports to the others (app.cluster.strategy).
REPORT_PREFIX = "coretrain worker"
_TASK = re.compile(r"/job:(chief|worker)/replica:\d+/task:(\d+)")


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
        f"{short_message(exc)}; all workers stop, rerun them to resume from the last checkpoint"
    )


@contextmanager
def collective(cluster: Cluster, what: str) -> Iterator[None]:
    """Turn TensorFlow's "peer gone" errors inside the block into ClusterError (exit 6).

    UnavailableError, DeadlineExceededError, AbortedError and CancelledError
    are what collectives raise when the coordination service aborts them (and
    any error carrying another worker's report_failure message); other
    errors pass through unchanged.
    """
    try:
        yield
    except Exception as exc:
        if _is_cluster_failure(exc):
            raise lost_worker_error(exc, cluster, what) from exc
        raise


class Peers:
    """Small all-reduces over the workers of ``strategy`` (collectives, not free).

    Every method is a collective: all workers must call the same methods in
    the same order, or they wait for each other until a timeout.
    """

    def __init__(self, strategy: Any, cluster: Cluster) -> None:
        self.strategy = strategy
        self.cluster = cluster

        device = strategy.extended.worker_devices[0]

        def replica_sum(v: Any) -> Any:
            # An input passed straight through has no device, and the all-reduce
            # then finds no destination ("destinations can not be empty").
            with tf.device(device):
                v = tf.nest.map_structure(tf.identity, v)
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, v)

        @tf.function
        def total(v: Any) -> Any:
            out = strategy.run(replica_sum, args=(v,))
            return tf.nest.map_structure(lambda t: strategy.experimental_local_results(t)[0], out)

        self._total = total

    def sum(self, values: Sequence[float] | np.ndarray, what: str = "all-reduce") -> np.ndarray:
        """Element-wise sum over the workers: float64 array of ``len(values)``."""
        with collective(self.cluster, what):
            out = self._total(tf.constant(np.asarray(values, np.float64)))
            return np.asarray(out.numpy(), np.float64)

    def broadcast(self, variables: Sequence[Any], what: str = "restore") -> None:
        """Give every worker the chief's values of ``variables`` (tf.Variables, any shapes).

        An all-reduce SUM to which only the chief contributes: x + 0 = x exactly, so the
        others end with the chief's bits. Everything travels as float64 (float32 values
        exactly, integers below 2**53). The other workers need no file for it: a restore
        reads only on the chief.
        """
        tensors = [tf.convert_to_tensor(v) for v in variables]  # Keras variables too
        values = [tf.cast(t, tf.float64) for t in tensors]  # one dtype for one all-reduce
        if not self.cluster.is_chief:
            values = [tf.zeros_like(v) for v in values]
        with collective(self.cluster, what):
            totals = self._total(values)
        for variable, tensor, total in zip(variables, tensors, totals, strict=True):
            variable.assign(tf.cast(total, tensor.dtype))

    def check_same(self, what: str, **values: int) -> None:
        """Raise ClusterError unless every worker passes the same ``values``.

        (Equal iff N·Σv² = (Σv)², for the small integers compared here.)
        """
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
