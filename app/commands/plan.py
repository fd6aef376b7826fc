"""``coretrain plan``: the CPU budget and thread plan, printed (never imports TensorFlow)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.budget import detect_plan
from app.budget.plan import PlanOptions, format_text
from app.options import check_bounds, option


@dataclass(frozen=True)
class PlanReport:
    """Where to read and how to print."""

    format: str = option("json", "Output format.", choices=("json", "text"))
    root: Path = option(
        Path("/"),
        "Read /proc and /sys under this directory instead of / (support cases, tests).",
        directory=True,
    )

    def __post_init__(self) -> None:
        check_bounds(self)


def run(report: PlanReport, options: PlanOptions) -> str:
    """The plan of this machine (or of the tree under ``report.root``) as JSON or text.
    Raises ConfigError for contradictory options."""
    plan = detect_plan(str(report.root), options)
    if report.format == "json":
        return json.dumps(plan.to_json(), indent=2)
    return format_text(plan)
