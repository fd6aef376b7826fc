"""The CPU budget: detect (cgroups, topology, CPU model) → plan (pure) → apply (the process).

Nothing here imports TensorFlow except :func:`app.budget.apply.import_tensorflow`, and only
:mod:`app.budget.apply` changes the process (docs/architecture.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from app.budget import topology
from app.budget.cgroups.detect import detect_budget
from app.budget.plan import Overrides, PlanOptions, ThreadPlan, make_plan, overrides_from


def detect_plan(
    root: str = "/",
    options: PlanOptions | None = None,
    environ: Mapping[str, str] | None = None,
    bfloat16: bool = False,
) -> ThreadPlan:
    """Detect the budget, topology and CPU model under ``root`` and make the plan.

    ``environ`` (default ``os.environ``) supplies TensorFlow's own variables, which count
    as explicit settings; ``bfloat16``: the run may compute in bfloat16 (oneDNN then).
    No TensorFlow import; raises ConfigError for bad settings.
    """
    env = os.environ if environ is None else environ
    return plan_with(root, overrides_from(env, options, bfloat16))


def plan_with(root: str, overrides: Overrides) -> ThreadPlan:
    """Detect the budget under ``root`` now and plan with ``overrides`` (e.g. a running
    plan's own, to see whether a changed budget changes the plan)."""
    budget = detect_budget(root)
    topo = topology.detect_topology(root, budget.cpuset)
    return make_plan(budget, topo, overrides, topology.detect_cpu(root))
