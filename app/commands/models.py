"""``coretrain models``: the versions published in a directory, as a table or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.options import option
from app.release.layout import Listed, listing


@dataclass(frozen=True)
class ModelsReport:
    """How to print the published versions."""

    format: str = option("table", "Output format.", choices=("table", "json"))


def run(directory: Path, report: ModelsReport) -> str:
    """The entries of ``directory`` (an existing directory) that TensorFlow Serving counts
    as versions, oldest first, the one it serves (the largest number) marked; an entry
    that is not a model says so (app/release/layout.py)."""
    rows = listing(directory)
    if report.format == "json":
        return json.dumps([row.to_json() for row in rows], indent=2)
    if not rows:
        return f"no published versions in {directory}"
    lines = [f"{'version':>7}  {'published_at':25}  {'test_rmse':>10}  {'steps':>6}  data"]
    lines += [_line(row) for row in rows]
    return "\n".join(lines)


def _line(row: Listed) -> str:
    """One version as a table row."""
    fields = row.to_json()
    rmse = "-" if fields["test_rmse"] is None else f"{fields['test_rmse']:.6g}"
    if not row.entry.is_model:
        note = f"not a model ({row.entry.what}): TF Serving can't load it"
        mark = f"  (served: {note})" if row.served else f"  ({note})"
    else:
        mark = "  (served)" if row.served else ""
    return (
        f"{fields['version']:>7}  {fields['published_at'] or '-':25}  {rmse:>10}  "
        f"{fields['final_step'] or '-':>6}  {fields['data'] or '-'}{mark}"
    )
