"""``coretrain models``: the versions published in a directory, as a table or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.options import option
from app.serving.layout import listing


@dataclass(frozen=True)
class ModelsReport:
    """How to print the published versions."""

    format: str = option("table", "Output format.", choices=("table", "json"))


def run(directory: Path, report: ModelsReport) -> str:
    """The versions of ``directory`` (an existing directory), oldest first, the served
    (newest) one marked."""
    rows = listing(directory)
    if report.format == "json":
        return json.dumps(rows, indent=2)
    if not rows:
        return f"no published versions in {directory}"
    lines = [f"{'version':>7}  {'published_at':25}  {'test_rmse':>10}  {'steps':>6}  data"]
    for row in rows:
        rmse = "-" if row["test_rmse"] is None else f"{row['test_rmse']:.6g}"
        mark = "  (served)" if row["champion"] else ""
        lines.append(
            f"{row['version']:>7}  {row['published_at'] or '-':25}  {rmse:>10}  "
            f"{row['final_step'] or '-':>6}  {row['data'] or '-'}{mark}"
        )
    return "\n".join(lines)
