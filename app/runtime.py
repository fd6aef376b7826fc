"""The only module that changes the process for TensorFlow: env vars and affinity.

``apply`` must run before the first ``import tensorflow`` in the process:
TensorFlow sizes its intra-op/inter-op pools once, when the first op runs, and
``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS`` are read at that point
(DESIGN.md "Facts learned the hard way").
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

from app.plan import ThreadPlan

# Defaults set only where the user has not set the variable:
# - TF C++ logging: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR. 2 keeps errors visible.
# - TensorFlow's BFC allocator on the CPU: reuses the fast model's ~58 MB patch matrix
#   instead of mapping it fresh every step (measured: ~14,000 page faults and 63 ms of
#   system time per step without it, ~1 with it; benchmarks/model_step.py).
DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_CPU_ALLOCATOR_USE_BFC": "true"}


def apply(plan: ThreadPlan, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Set TF's thread env vars and the CPU affinity from ``plan``.

    Returns one line per change made. Raises RuntimeError if TensorFlow is
    already imported (the pool sizes could no longer change).
    """
    if "tensorflow" in sys.modules:
        raise RuntimeError("app.runtime.apply() must run before TensorFlow is imported")
    env = os.environ if environ is None else environ
    done = []
    for name, value in (
        ("TF_NUM_INTRAOP_THREADS", plan.intra_op_threads),
        ("TF_NUM_INTEROP_THREADS", plan.inter_op_threads),
    ):
        env[name] = str(value)
        done.append(f"{name}={value}")
    for name, default in DEFAULTS.items():
        if name not in env:
            env[name] = default
            done.append(f"{name}={default}")
    if plan.pin_cpus is not None:
        os.sched_setaffinity(0, plan.pin_cpus)
        done.append(f"sched_setaffinity({list(plan.pin_cpus)})")
    return done
