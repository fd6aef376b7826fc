"""``coretrain bench-scaling``: the training step over threads and processes on this machine,
measured (app/bench/step_scaling.py) and printed as a table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.options import check_bounds, option


@dataclass(frozen=True)
class ScalingConfig:
    """How far to measure and where to write the report."""

    max_threads: int | None = option(
        None, "Measure up to this many threads.", minimum=1, shown_default="the CPU budget's"
    )
    batch_size: int = option(1000, "Samples per training step.", minimum=1)
    out: Path | None = option(
        None, "Also write the JSON report here.", shown_default="none", output=True
    )

    def __post_init__(self) -> None:
        check_bounds(self)


def run(config: ScalingConfig) -> str:
    """Measure (progress lines on stderr) and return the report as a table."""
    from app.bench import step_scaling as scaling

    return table(scaling.run(config.max_threads, config.batch_size, config.out))


def table(report: dict[str, Any]) -> str:
    """The report as text a person reads."""
    lines = [
        f"CPU: {report['cpu_model']}, {report['cpus']} CPUs, budget {report['budget_threads']} "
        f"threads, oneDNN {'on' if report['onednn'] else 'off'}",
        "",
        f"{'step':16} {'threads':>7} {'samples/s':>10} {'speed-up':>9} {'efficiency':>10}",
    ]
    for name, result in report["threads"].items():
        for row in result["rows"]:
            rate = row["samples_per_s"]
            lines.append(
                f"{name:16} {row['threads']:>7} {rate if rate else '-':>10} "
                f"{row['speedup'] or '-':>9} {row['efficiency'] or '-':>10}"
            )
        knee = result["knee"]
        lines.append(f"{'':16} knee: {knee if knee else 'none within the budget'}")
    for row in report.get("processes", []):
        lines.append(
            f"processes: {row['workers']} × {row.get('threads_per_worker', '-')} threads: "
            f"{row.get('samples_per_s') or row.get('error')} samples/s (end to end)"
        )
    if "hyperthreads" in report:
        h = report["hyperthreads"]
        lines.append(f"one per physical core: {h['physical_cores'].get('samples_per_s')} samples/s")
    lines.append(f"({report.get('seconds')} s)")
    return "\n".join(lines)
