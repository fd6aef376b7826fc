"""The publish gate's rule: is the candidate worse than the champion beyond noise?

Both models are evaluated on the same test rows (app/release/publish.py), so their
difference is judged *paired*: the per-row squared errors of the two are resampled
together (:data:`RESAMPLES` bootstrap resamples of the rows, seeded, so a decision is
repeatable) and the relative difference of their RMSEs, ``candidate / champion − 1``, gets
a :data:`CONFIDENCE` interval. That interval is the test set's sampling noise. Training has
noise of its own: the same recipe on the same data with another seed ends elsewhere, by the
run-to-run spread that ``benchmarks/quality.py`` measures (docs/quality.md). So by default
(rule ``noise``) a candidate is refused only when even the interval's lower end is worse
than the champion by more than :data:`NOISE_TOLERANCE`, the spread two runs of the default
recipe differ by; anything closer is the same model up to noise, and the newer one (trained
on the newer data) is published. ``--publish-tolerance X`` (rule ``tolerance``) is the
explicit override: published when the candidate's RMSE is at most the champion's × (1 + X),
no interval. Under either rule a candidate must beat the mean predictor, and is compared
with a champion only on :data:`MIN_ROWS` test rows or more: on fewer the gate cannot judge
and does not publish over the champion. Numpy only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

RESAMPLES = 2000
CONFIDENCE = 0.95
#: Relative difference of the test RMSEs of two runs of the default recipe that differ only
#: by their seed, at the edge of what the measured spread allows: 1.96 × √2 × the largest
#: coefficient of variation measured for it (docs/quality.md, "The spread": 7.1 %, 600
#: steps on 20,000 rows), the 95 % range of the difference of two such runs.
NOISE_TOLERANCE = 0.20
#: The standard normal quantile of :data:`CONFIDENCE` (two-sided): 1.96.
_Z = statistics.NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
#: The fewest test rows a candidate is compared with a champion on: 97. The interval's
#: half-width is the test set's noise, z × the standard error of log(candidate RMSE /
#: champion RMSE). For two models whose errors on a row are independent Gaussians of one
#: output (a squared error is σ²χ²₁: Var(log RMSE) = Var(mean e²) / 4σ⁴ = 1/2n each, 1/n
#: for their ratio) it is z/√n, which is within :data:`NOISE_TOLERANCE` from (z / 0.20)²
#: rows. With fewer, the rows alone may move the ratio by more than the tolerance, and a
#: bootstrap on them, which sees no row it was not given, does not show it (on one row its
#: interval is a point): the comparison is "cannot judge" (docs/deploy.md, "The gate").
MIN_ROWS = math.ceil((_Z / NOISE_TOLERANCE) ** 2)
#: Resamples drawn at a time (bounds the index array: rows × this).
_BLOCK = 50


@dataclass(frozen=True)
class Decision:
    """What the gate decided and why. RMSEs in raw label units; ``difference`` is
    ``candidate / champion − 1`` and ``interval`` its bootstrap interval (None without a
    champion to compare with); ``rule`` is "noise" or "tolerance"; ``version`` the number
    published (or already holding the weights) in ``directory``."""

    published: bool
    reason: str
    candidate_rmse: float | None
    champion_rmse: float | None
    champion_version: int | None
    rule: str = "noise"
    tolerance: float = NOISE_TOLERANCE
    difference: float | None = None
    interval: tuple[float, float] | None = None
    version: int | None = None
    directory: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The decision as strict JSON: a non-finite number is null."""
        out = {k: _finite(v) for k, v in self.__dict__.items()}
        out["interval"] = [_finite(v) for v in self.interval] if self.interval else None
        out["confidence"] = CONFIDENCE if self.rule == "noise" else None
        return out

    @classmethod
    def from_json(cls, record: Any) -> Decision | None:
        """The decision :meth:`to_json` wrote (``coretrain.json``'s ``publish``, the
        summary's); None for a record that isn't one (another program's, an older one's)."""
        if not isinstance(record, dict) or not isinstance(record.get("published"), bool):
            return None
        kinds = {f.name: _KINDS.get(f.name, (str,)) for f in fields(cls)}
        known = {k: v for k, v in record.items() if _fits(v, kinds.get(k))}
        known["published"] = record["published"]
        interval = record.get("interval")
        if isinstance(interval, list) and all(isinstance(v, (int, float)) for v in interval):
            known["interval"] = tuple(interval) if len(interval) == 2 else None
        return cls(**{"reason": "", "candidate_rmse": None, "champion_rmse": None,
                      "champion_version": None, **known})  # fmt: skip


#: The types a recorded decision's fields must have to be read back (else left out).
_KINDS: dict[str, tuple[type, ...]] = {
    "candidate_rmse": (int, float), "champion_rmse": (int, float), "difference": (int, float),
    "tolerance": (int, float), "champion_version": (int,), "version": (int,), "interval": (),
    "directory": (str,),
}  # fmt: skip


def _fits(value: Any, kinds: tuple[type, ...] | None) -> bool:
    """Whether a recorded field's ``value`` has one of its ``kinds`` (never a bool)."""
    return kinds is not None and isinstance(value, kinds) and not isinstance(value, bool)


def _finite(value: Any) -> Any:
    """``value``, or None for a non-finite float (JSON has no NaN or Infinity)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def rmse(errors: np.ndarray) -> float:
    """RMSE from per-row mean squared errors (n,)."""
    return math.sqrt(float(np.mean(errors))) if len(errors) else math.nan


def interval(candidate: np.ndarray, champion: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """The :data:`CONFIDENCE` paired-bootstrap interval of ``rmse(candidate) /
    rmse(champion) − 1`` over the rows: per-row mean squared errors, shape (n,) each."""
    rng = np.random.default_rng(seed)
    n, ratios = len(candidate), []
    for start in range(0, RESAMPLES, _BLOCK):
        rows = rng.integers(0, n, (min(_BLOCK, RESAMPLES - start), n))
        ratios.append(np.sqrt(candidate[rows].mean(1) / np.maximum(champion[rows].mean(1), 1e-300)))
    tail = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(np.concatenate(ratios) - 1, [tail, 1 - tail])
    return float(lo), float(hi)


def rule_of(tolerance: float | None) -> tuple[str, float]:
    """(rule, tolerance) of ``--publish-tolerance``: the noise rule when unset."""
    return ("noise", NOISE_TOLERANCE) if tolerance is None else ("tolerance", tolerance)


def judge(
    candidate: np.ndarray | None, champion: np.ndarray | None, champion_version: int | None,
    baseline: float, tolerance: float | None = None,
) -> Decision:  # fmt: skip
    """The rule of the module docstring on per-row mean squared errors (n,) of the candidate
    and the champion on the same rows (``champion`` None: none, or it can't be evaluated on
    these data); ``tolerance`` None for the noise rule."""
    rule, tol = rule_of(tolerance)
    cand = rmse(candidate) if candidate is not None else None
    champ = rmse(champion) if champion is not None else None

    def decided(published: bool, why: str, **more: Any) -> Decision:
        return Decision(published, why, cand, champ, champion_version, rule, tol, **more)

    if candidate is None or cand is None or not math.isfinite(cand):
        return decided(False, f"the candidate's test RMSE is {cand}: it can't be published")
    if cand >= baseline:
        return decided(
            False,
            f"test RMSE {cand:.6g} is not below the mean predictor's {baseline:.6g}: the "
            "model has learned nothing (check the training data)",
        )
    if champ is not None and not math.isfinite(champ):
        return decided(
            True,
            f"champion version {champion_version}'s test RMSE on these data is {champ}: no "
            f"comparison; test RMSE {cand:.6g} beats the mean predictor",
        )
    if champion is None or champ is None:
        if champion_version is None:
            return decided(
                True, f"no version published yet; test RMSE {cand:.6g} beats the mean predictor"
            )
        return decided(
            True,
            f"champion version {champion_version} can't be evaluated on these data (other "
            f"input or output size); test RMSE {cand:.6g} beats the mean predictor",
        )
    if len(candidate) < MIN_ROWS:
        return decided(
            False,
            f"cannot judge: the test set has {len(candidate)} rows, and comparing with champion "
            f"version {champion_version} takes at least {MIN_ROWS} (below that the rows alone "
            f"move the RMSE ratio by more than {NOISE_TOLERANCE:.0%}: docs/deploy.md, 'The "
            "gate'); not published over it",
        )
    if champ == 0:  # no ratio to resample: only an exact candidate is as good
        return decided(
            cand == 0,
            f"champion version {champion_version}'s test RMSE on these data is 0: only a "
            f"candidate as exact is published; test RMSE {cand:.6g}",
        )
    return _compared(candidate, champion, champion_version, rule, tol, decided)


def _compared(
    candidate: np.ndarray, champion: np.ndarray, version: int | None, rule: str, tol: float,
    decided: Callable[..., Decision],
) -> Decision:  # fmt: skip
    """The candidate's per-row errors against the champion's (version ``version``, its RMSE
    above 0) by ``rule``: the bootstrap interval of their RMSE ratio (noise) or the ratio
    itself (tolerance), against ``tol``."""
    cand, champ = rmse(candidate), rmse(champion)
    diff = cand / champ - 1
    span = interval(candidate, champion) if rule == "noise" else None
    worse = (span[0] if span else diff) > tol
    why = f"test RMSE {cand:.6g} vs champion version {version}'s {champ:.6g}: {diff:+.2%}"
    if span:
        verdict = "worse" if worse else "not worse"
        why += (
            f", {CONFIDENCE:.0%} interval {span[0]:+.2%}..{span[1]:+.2%}: {verdict} beyond the "
            f"noise ({tol:.0%})"
        )
    else:
        why += f", {'over' if worse else 'within'} --publish-tolerance {tol:g}"
    return decided(not worse, why, difference=diff, interval=span)
