"""The CPU budget while the job runs: re-read at every progress event, re-plan on a change.

Kubernetes' in-place pod resize and ``docker update --cpus`` change a running container's
CFS quota (``cpu.max`` / ``cpu.cfs_quota_us``). TensorFlow's thread pools can't be
resized in a process, so when the new budget gives other thread counts (or affinity) the
controller saves a checkpoint and the job restarts itself with the new plan
(app.budget.apply.restart), continuing to the same absolute step. ``--replan never``
only logs the change. A multi-worker run never re-plans: every worker would have to
restart at the same step, and the workers' budgets change one pod at a time.
No TensorFlow here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app import logs
from app.budget import plan_with
from app.budget.plan import ThreadPlan
from app.budget.usage import THROTTLED_WARNING_RATIO
from app.training.loop.hooks import Hook

if TYPE_CHECKING:
    from app.training.extras import Context


@dataclass
class BudgetWatch(Hook):
    """The loop's re-plan hook: True when the plan must change (after logging why).

    ``enabled`` False (``--replan never``, several workers) logs changes only, with
    ``why_not``. ``detect`` re-plans from the budget found now (default: under ``/``
    with the running plan's overrides).
    """

    plan: ThreadPlan
    enabled: bool = True
    why_not: str = ""
    detect: Callable[[ThreadPlan], ThreadPlan] | None = None

    def replan(self) -> bool:
        new = (self.detect or _detect)(self.plan)
        old = self.plan
        if (new.cpu_budget, new.threads()) == (old.cpu_budget, old.threads()):
            return False
        replan = new.threads() != old.threads() and self.enabled
        if new.threads() == old.threads():
            why = "the thread plan stays the same"
        elif replan:
            why = "restarting TensorFlow with the new plan after a checkpoint"
        else:
            why = f"not applied: {self.why_not}"
        logs.event(
            "budget_changed",
            f"CPU budget {old.cpu_budget:g} → {new.cpu_budget:g} CPUs "
            f"(intra-op threads {old.intra_op_threads} → {new.intra_op_threads}, inter-op "
            f"{old.inter_op_threads} → {new.inter_op_threads}): {why}",
            level=logging.INFO if replan or new.threads() == old.threads() else logging.WARNING,
            old={"cpu_budget": old.cpu_budget, "cpu_quota": old.cpu_quota, **_threads(old)},
            new={"cpu_budget": new.cpu_budget, "cpu_quota": new.cpu_quota, **_threads(new)},
            replan=replan,
            reasons=list(new.reasons),
        )
        self.plan = new
        return replan


def _detect(plan: ThreadPlan) -> ThreadPlan:
    return plan_with("/", plan.overrides)


def _threads(plan: ThreadPlan) -> dict[str, object]:
    return {
        "intra_op_threads": plan.intra_op_threads,
        "inter_op_threads": plan.inter_op_threads,
        "pin_cpus": list(plan.pin_cpus) if plan.pin_cpus is not None else None,
    }


def warn_when_throttled(plan: ThreadPlan) -> Callable[[dict[str, Any]], None]:
    """A progress action: a ``cpu_throttled`` warning when an interval was throttled in
    more than :data:`THROTTLED_WARNING_RATIO` of its CFS periods, saying what to change."""

    def action(record: dict[str, Any]) -> None:
        ratio = record.get("cpu_throttled_ratio")
        if ratio is None or ratio <= THROTTLED_WARNING_RATIO:
            return
        quota = plan.cpu_quota
        limit = f"a quota of {quota:g} CPUs" if quota else "the CPU quota"
        threads = plan.intra_op_threads
        fewer = (
            "use --rounding floor or --intra-op-threads to run fewer threads, or "
            if threads > 1
            else ""  # one thread is the fewest: only the limit can change
        )
        logs.event(
            "cpu_throttled",
            f"the kernel stopped the job in {ratio:.0%} of its CFS periods "
            f"({record.get('cpu_throttled_s')} s) since the last progress event: "
            f"{threads} intra-op thread{'s' if threads > 1 else ''} run into {limit}; "
            f"{fewer}raise the CPU limit",
            level=logging.WARNING,
            step=record.get("step"),
            cpu_throttled_ratio=ratio,
            cpu_throttled_s=record.get("cpu_throttled_s"),
            cpu_quota=quota,
            intra_op_threads=plan.intra_op_threads,
        )

    return action


class ThrottledWarning(Hook):
    """The ``cpu_throttled`` warning (:func:`warn_when_throttled`) after each evaluation."""

    def __init__(self, plan: ThreadPlan) -> None:
        self.warn = warn_when_throttled(plan)

    def after_evaluation(self, record: dict[str, Any]) -> None:
        self.warn(record)


def hooks(context: Context) -> list[Hook]:
    """The throttling warning and the budget watch (re-planning only with ``--replan
    on-change`` in a single-process run)."""
    single = context.single
    watch = BudgetWatch(
        context.plan,
        enabled=context.replan == "on-change" and single,
        why_not="--replan never" if single else "a multi-worker run",
    )
    return [ThrottledWarning(context.plan), watch]
