"""Where the training step runs: one process, or one worker of a multi-worker run.

The trainer is written once for N replicas; a single process is the case N = 1
(:class:`Replicas` itself), as orbit passes a strategy rather than subclassing its trainer.
:class:`Workers` is one worker of a ``MultiWorkerMirroredStrategy`` run
(:mod:`app.cluster`): its variables are mirrored, every step all-reduces the gradients,
and the host-side collectives (sums, agreement checks, the chief's state sent to the
others) go through :class:`app.cluster.collectives.Peers`.

Every collective is wrapped in :meth:`Replicas.guard`, which turns a lost peer into exit
6 naming it. All workers must call the same collectives in the same order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from app.cluster import collectives, strategy
from app.cluster.spec import Cluster


class Replicas:
    """One process: a single replica (``count`` 1, ``index`` 0, the chief)."""

    count = 1
    index = 0
    is_chief = True
    cluster: Cluster | None = None

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        """Where variables are created (the strategy's scope for several workers)."""
        return contextlib.nullcontext()

    def run(self, fn: Callable[..., tuple], args: tuple) -> tuple:
        """Call the replica function ``fn`` on this worker's ``args``; its local results."""
        return tuple(fn(*args))

    def all_reduce(self, value: tf.Tensor) -> tf.Tensor:
        """Inside ``run``: the sum of ``value`` over the replicas."""
        return value

    def guard(self, what: str) -> contextlib.AbstractContextManager[Any]:
        """Around a collective: a lost peer becomes ClusterError (exit 6) naming ``what``."""
        return contextlib.nullcontext()

    def sum(self, values: Sequence[float], what: str) -> np.ndarray:
        """Element-wise sum over the workers, on the host: float64 array."""
        return np.asarray(values, np.float64)

    def check_same(self, what: str, **values: int) -> None:
        """Raise ClusterError unless every worker passes the same ``values``."""

    def broadcast(self, variables: Sequence[tf.Variable], what: str) -> None:
        """Give every worker the chief's values of ``variables``."""

    def shard(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """This worker's part of an evaluation dataset."""
        return dataset

    def report_failure(self, exc: BaseException) -> None:
        """Tell the other workers this one is failing (so they stop waiting for it)."""

    def describe(self) -> dict[str, Any]:
        """Fields for the ``start`` event."""
        return {}


class Workers(Replicas):
    """This process as worker ``cluster.index`` of ``cluster.count`` (one replica each).

    Creating it starts the worker's server and waits for the others (at most
    ``--cluster-timeout``); it must happen before the first TensorFlow op.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.count, self.index, self.is_chief = cluster.count, cluster.index, cluster.is_chief
        self.strategy = strategy.create_strategy(cluster)
        self.peers = collectives.Peers(self.strategy, cluster)

    def scope(self) -> contextlib.AbstractContextManager[Any]:
        return self.strategy.scope()

    def run(self, fn: Callable[..., tuple], args: tuple) -> tuple:
        out = self.strategy.run(fn, args=args)
        return tuple(self.strategy.experimental_local_results(v)[0] for v in out)

    def all_reduce(self, value: tf.Tensor) -> tf.Tensor:
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)

    def guard(self, what: str) -> contextlib.AbstractContextManager[Any]:
        return collectives.collective(self.cluster, what)  # type: ignore[arg-type]

    def sum(self, values: Sequence[float], what: str) -> np.ndarray:
        return self.peers.sum(values, what)

    def check_same(self, what: str, **values: int) -> None:
        self.peers.check_same(what, **values)

    def broadcast(self, variables: Sequence[tf.Variable], what: str) -> None:
        self.peers.broadcast(variables, what)

    def shard(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.shard(self.count, self.index)

    def report_failure(self, exc: BaseException) -> None:
        strategy.report_failure(self.cluster, exc)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        return {"cluster": self.cluster.to_json()} if self.cluster else {}


def create(cluster: Cluster | None) -> Replicas:
    """:class:`Replicas` for a single process, :class:`Workers` for a multi-worker run."""
    return Replicas() if cluster is None else Workers(cluster)
