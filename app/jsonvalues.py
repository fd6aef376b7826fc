"""JSON every parser reads: NaN and ±Infinity, which Python's ``json`` writes as bare
``NaN`` / ``Infinity`` though RFC 8259 has no such values (Go, JavaScript's ``JSON.parse``
and strict collectors refuse the whole line), are written as ``null``.

Where a non-finite value can come from: an RMSE over labels with NaN let in by
``--allow-nonfinite``, a diverged loss. ``metrics.json`` (app/training/finish.py:
:func:`finite`) and every log line (app/logs.py: :func:`dumps`) are for other programs; the
job's own records (the cache's manifest, kept measurements), which it reads back, keep
Python's NaN.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float, at any depth of dicts, lists and tuples, None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(value) for value in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(obj)``; raises ValueError rather than write a
    non-finite number (one a ``default`` function returns)."""
    return json.dumps(finite(obj), allow_nan=False, **kwargs)
