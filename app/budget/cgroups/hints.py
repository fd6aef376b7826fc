"""The Downward API hints ``CPU_LIMIT`` and ``CPU_REQUEST``, read when cgroups give no quota.

Kubernetes sets them from the container's ``limits.cpu``/``requests.cpu`` through
``resourceFieldRef``; the manifests use ``divisor: 1m``, so a value is in millicores. A
manifest without it gets the default ``divisor: 1``: whole CPUs, rounded up ("2" for a
limit of 1.5). A plain integer below :data:`FEWEST_MILLICORES` can't be a training job's
millicores, so it is read as such whole CPUs, with a warning (it used to be 0.002 CPUs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from app.budget.rootfiles import RootFiles

#: Downward API variables (k8s manifests use ``divisor: 1m``, so values are millicores).
CPU_LIMIT_ENV = "CPU_LIMIT"
CPU_REQUEST_ENV = "CPU_REQUEST"
#: The fewest millicores a plain integer hint is read as (0.1 CPU); below, whole CPUs.
FEWEST_MILLICORES = 100


def parse_cpu_hint(value: str) -> float:
    """CPUs from a Downward API value: ``"1500"`` (millicores, ``divisor: 1m``), ``"1500m"``,
    or cores with a decimal point ``"1.5"``.

    Raises:
        ValueError: not a number, or not a finite positive amount.
    """
    text = value.strip()
    if text.endswith("m"):
        cpus = float(text[:-1]) / 1000
    elif "." in text or "e" in text.lower():
        cpus = float(text)
    else:
        cpus = int(text) / 1000
    if not math.isfinite(cpus) or cpus <= 0:
        raise ValueError(f"{value!r} is not a positive CPU amount")
    return cpus


def read_hints(env: Mapping[str, str], probe: RootFiles) -> tuple[float | None, float | None]:
    """``(limit, request)`` in CPUs from ``CPU_LIMIT`` and ``CPU_REQUEST`` (None: unset or not
    a CPU amount, warned); each value given is noted, the request as a hint only."""
    limit = _env_hint(CPU_LIMIT_ENV, env, probe)
    if limit is not None:
        probe.note(f"cpu quota: cgroups set none; {CPU_LIMIT_ENV} gives {limit:g} CPUs")
    request = _env_hint(CPU_REQUEST_ENV, env, probe)
    if request is not None:
        probe.note(f"cpu request: {CPU_REQUEST_ENV} gives {request:g} CPUs (a hint only)")
    return limit, request


def _env_hint(name: str, env: Mapping[str, str], probe: RootFiles) -> float | None:
    """CPUs from the variable ``name`` of ``env`` (:func:`parse_cpu_hint`), recorded as the
    input ``"env NAME"``; None when unset, or not a CPU amount (warned)."""
    value = env.get(name)
    if value is None:
        return None
    probe.inputs[f"env {name}"] = value.strip()
    try:
        cpus = parse_cpu_hint(value)
    except ValueError:
        probe.warn(f"{name}={value!r} is not a CPU amount (millicores like 1500, or 1.5): ignored")
        return None
    text = value.strip()
    if text.isdigit() and int(text) < FEWEST_MILLICORES:
        probe.warn(
            f"{name}={text} read as {int(text)} CPUs, not {cpus:g}: a plain integer under "
            f"{FEWEST_MILLICORES} is Kubernetes' default divisor 1 (whole CPUs, rounded up); "
            "set divisor: 1m in the manifest for the exact value"
        )
        return float(int(text))
    return cpus
