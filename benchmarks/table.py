"""``make bench``'s report as a fixed-width text table (also pasted into docs/performance.md):
the measurements of benchmarks/run.py, then its ratios against their targets."""

from __future__ import annotations

from typing import Any


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(report: dict[str, Any]) -> str:
    """The report as a fixed-width text table (also pasted into docs/performance.md)."""
    rows: list[tuple[str, str, str, str, str]] = []
    model = report.get("model", {})
    for precision in ("float32", "bfloat16"):
        probe = model.get(f"probe/{precision}", {})
        label = f"(a) matmul probe 2048², {precision}"
        rows.append((label, "", "", _fmt(probe.get("gflops")) + " GFLOP/s", ""))
    names = [
        *(f"{f}/{p}" for f in ("plain", "fast") for p in ("float32", "bfloat16")),
        "torch/eager", "torch/bf16", "torch/compile", "jax/jit",
    ]  # fmt: skip
    for name in names:
        r = model.get(name)
        label = f"(b) train step, {name}"
        if r is None:
            note = model.get("jax_note" if name.startswith("jax") else "torch_note", "")
            if name.startswith(("torch", "jax")):
                rows.append((label, "-", "-", "-", note))
            continue
        if "error" in r:
            rows.append((label, "failed", "", str(r["error"])[:60], ""))
            continue
        note = f"step {_fmt(1e3 * r['wall_s'] if 'wall_s' in r else None, 0)} ms"
        if name.startswith("torch"):
            fastest = _fmt(1e3 * r["wall_min_s"] if "wall_min_s" in r else None, 0)
            note += f" (fastest {fastest} ms); torch {r.get('torch', '?')}"
        rows.append(
            (
                label,
                _fmt(r.get("samples_per_s"), 0),
                "",
                _fmt(r.get("gflops"), 2) + " GFLOP/s",
                note,
            )
        )
    e2e = report.get("end_to_end", {})
    for name, label in (
        ("cache", "on-disk cache"),
        ("memory", "in-memory tensors"),
        ("memory_one_batch", "one batch reused"),
    ):
        r = e2e.get(name, {})
        per_round = [_fmt(x.get("samples_per_s"), 0) for x in r.get("rounds", [])]
        rows.append(
            (
                f"(c) train(), {label}",
                _fmt(r.get("samples_per_s"), 0) if "error" not in r else "failed",
                "",
                f"{_fmt(r.get('samples_per_cpu_s'), 0)} samples/CPU-s",
                f"peak RSS {_fmt(r.get('peak_rss_mb'), 0)} MB"
                + (f"; median of {len(per_round)}: {' / '.join(per_round)}" if per_round else "")
                + (
                    f"; input alone {_fmt(r['input_cpu_ms_per_batch'])} CPU-ms/batch"
                    if r.get("input_cpu_ms_per_batch") is not None
                    else ""
                ),
            )
        )
    round_ratios = [_fmt(x.get("samples_per_s"), 2) for x in e2e.get("round_ratios", [])]
    if round_ratios:
        rows.append(
            ("(c) cache / memory, per round", "", "", " / ".join(round_ratios), "interleaved")
        )
    ing = report.get("ingest", {})
    names = [
        ("decode_csv", "decode_csv (seed)"),
        ("pandas", "pandas read_csv"),
        ("pandas_one_cpu", "pandas read_csv, 1 CPU"),
    ]
    names += [
        (k, k.replace("_", " ").replace("1t", "1 thread").replace("2t", "2 threads"))
        for k in ing
        if k.startswith("converter_") and k != "converter_profile"
    ]
    names.append(("npy_in_place", ".npy read in place"))
    for key, label in names:
        r = ing.get(key)
        if not isinstance(r, dict) or key == "converter_profile":
            if key == "pandas":
                rows.append(("(d) pandas read_csv", "-", "-", "-", ing.get("pandas_note", "")))
            continue
        if "error" in r:
            rows.append((f"(d) {label}", "failed", "", str(r["error"])[:60], ""))
            continue
        rows.append(
            (
                f"(d) {label}",
                _fmt(r.get("samples_per_s"), 0),
                _fmt(r.get("mb_per_s")),
                f"{_fmt(r.get('mb_per_cpu_s'))} MB/CPU-s",
                f"peak RSS {_fmt(r.get('peak_rss_mb'), 0)} MB ({_fmt(r.get('mb'))} MB file)"
                f"; {_fmt(r.get('cpu_s_measured'), 2)} CPU-s",
            )
        )
    prep = report.get("prepare", {})
    rows.append(
        (
            f"(e) cache conversion, {prep.get('threads', '?')} threads",
            "",
            "",
            f"{_fmt(prep.get('wall_s'))} s",
            f"peak RSS {_fmt(prep.get('peak_rss_mb'), 0)} MB",
        )
    )
    head = ("measurement", "samples/s", "MB/s", "other", "notes")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append("")
    lines.append("ratios (target)")
    for key, value in report.get("ratios", {}).items():
        target = report.get("targets", {}).get(key)
        mark = ""
        if target is not None and value is not None:
            mark = f"  (target >= {target}: {'met' if value >= target else 'NOT met'})"
        lines.append(f"  {key:38s} {_fmt(value, 2)}{mark}")
    m = report.get("machine", {})
    lines.append("")
    flags = " ".join(m.get("cpu_flags") or []) or "no deciding flags"
    lines.append(
        f"machine: {m.get('cpu_model')} (family {m.get('cpu_family')} model "
        f"{m.get('cpu_model_number')}; {flags}), "
        f"{m.get('cpus')} CPUs; load average "
        f"{m.get('loadavg')} before, {report.get('loadavg_end')} after; driver RSS "
        f"{report.get('driver_rss_mb')} MB (included in every peak RSS)"
    )
    return "\n".join(lines)
