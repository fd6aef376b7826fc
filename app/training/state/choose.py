"""The formulation and precision of a run, chosen by measurement on the CPU that runs it.

The fast and the plain formulation compute the same function with the same variables,
in float32 or with bfloat16 products; which is fastest depends on the CPU (oneDNN on or
off, AVX512_BF16/AMX or not) and the thread count. With ``--formulation auto`` and/or
``--precision auto`` every candidate's training step is timed on one real batch of this
run's shape with the planned threads, by the process CPU time a step takes, in interleaved
rounds (app/training/state/timing.py: why CPU time, how the rounds run, the spread and the
load they saw). Under ``--formulation auto`` the evaluation's formulation is chosen the
same way, by timing the forward pass alone in each formulation at the chosen precision:
without a gradient the fastest is not always the step's (on an Intel Xeon with AMX the
plain formulation's forward pass in bfloat16 was 1.7× the fast one's, whose step was the
faster; docs/performance.md, "Evaluation").

**The decision holds under load** (the rule; docs/architecture.md "A choice that holds"):
the same seed, data, options and CPU must train the same weights whether the machine was
quiet or busy when the candidates were timed. So a candidate wins only by more than
:data:`MARGIN` of CPU time: the first candidate of :data:`ORDER` whose CPU time is within
:data:`MARGIN` of the least is taken (for the evaluation, the training formulation first,
within :data:`EVALUATION_MARGIN`).
The margin covers what load moves (Zen 4, 2 vCPUs, batch 1,000: the ratio of the two fast
candidates' CPU times 1.38–1.41 quiet, 1.38–1.42 beside busy loops pinned to both vCPUs,
1.41–1.44 beside memory-bound processes; the two forward passes' 1.13–1.19, 1.12–1.16 and
1.16–1.28) and what CPU time does not see (the share of a step a thread sits idle, up to
10 % apart between candidates): docs/performance.md, "A choice that holds". Where a CPU's
two best candidates sit near the margin itself (Zen 4's fast ones at batch 40: 1.06–1.27)
the answer can still differ between runs: the rule makes that rare, it can't rule it out.
**A close decision is timed longer**: while a candidate still timed and ahead of the least in
the order (the only ones the margin can take instead) has a CPU time over the least within
:data:`CLOSE` of the margin's edge (1 + margin) either way, more rounds are timed (up to
timing.py's ``MAX_ROUNDS``): a slow spell of the VM that lasts a whole measurement is what takes
a clear lead under the margin (Zen 4, batch 1,000: fast/float32 over fast/bfloat16 1.28–1.58 in
24 processes quiet or loaded, once 1.21; one loaded run under 1.15 chose fast/float32).
The order: the fast formulation first (its step was the faster on every CPU
measured, 3–5×), float32 before bfloat16 (exact products when they cost no more).

``--precision auto`` measures bfloat16 only when ``app.config.BFLOAT16_IN_AUTO`` is set and the
CPU has native bfloat16 dot products (``/proc/cpuinfo`` flags ``avx512_bf16`` or
``amx_bf16``, Arm's ``bf16``; elsewhere it is emulated and slow). It is set because
bfloat16's mean test RMSE over seeds lies within float32's seed spread for the default
recipe on both sets of the quality benchmark (docs/quality.md, "bfloat16"): a faster step
then trains the same model up to noise. ``--precision bfloat16`` trains in it anywhere. The
measurement costs seconds, so the choice is kept beside the data cache (it outlives
output directories: app/data/cache/measured.py), keyed by everything it depends on (the CPU
model and flags, TensorFlow's version, the thread plan, the batch size, H×W, the
candidates and how they are timed: app/training/state/kept.py), and reused by later runs
while all of it is the same; a damaged or foreign entry is measured again. **A choice whose
timing was noisy is not kept** (a later run times again): a candidate's spread over
app/training/state/timing.py ``NOISE`` after its extra rounds, or a stolen share of the
CPUs over it. Other processes' CPU use is recorded (``measurement.others``) but no reason
not to keep: the CPU time a step needs does not move with it beyond the margin. In a
multi-worker run the chief decides and sends its choice to the others. The ``choice``
event's ``source`` says where the choice came from: ``measured``, ``cached``, ``resumed``
(the checkpoints'), ``given`` (one candidate: nothing to measure) or ``chief`` (a
worker's).

A run keeps its precision once it has checkpoints: it is recorded next to them
(``checkpoints/run.json``, with the run's identity: app/training/state/identity.py) and a resume
uses it, so an exact resume stays exact (an explicit ``--precision`` that is not theirs is
refused at admission: app/training/admit/identity.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import tensorflow as tf

from app import logs
from app import model as model_lib
from app.budget.plan import ThreadPlan
from app.config import ComputeConfig, RecipeConfig
from app.data.cache import DataCache, measured
from app.training import phases
from app.training.loop.replicas import Replicas
from app.training.loop.step import TrainStep, repeated
from app.training.state import kept, timing

#: A candidate is taken over one earlier in :data:`ORDER` only when that one's CPU time per
#: step is over (1 + this) × its own (module docstring).
MARGIN = 0.15
#: The same for the evaluation's forward pass, against the training formulation's: wider, as
#: the forward passes' ratio moved more under load and the evaluation is a small part of a
#: run (module docstring).
EVALUATION_MARGIN = 0.4
#: A decision is timed over more rounds while a candidate's CPU time over the least lies
#: between (1 + margin) / (1 + this) and (1 + margin) × (1 + this) (module docstring).
CLOSE = 0.10
#: The order candidates within :data:`MARGIN` of the least CPU time are taken in.
ORDER = [("fast", "float32"), ("fast", "bfloat16"), ("plain", "float32"), ("plain", "bfloat16")]
#: How candidates are timed and decided: part of what a kept choice depends on.
TIMING = {
    **timing.RULE, "margin": MARGIN, "order": [f"{f}/{p}" for f, p in ORDER],
    "evaluation": "forward pass per formulation, the training formulation first",
    "evaluation_margin": EVALUATION_MARGIN, "close": CLOSE,
}  # fmt: skip

C = TypeVar("C", bound=Hashable)


@dataclass(frozen=True)
class Choice:
    """The formulation and precision of the run and why (``timings``: process CPU ms per step, what
    decided; ``source``: module docstring); ``evaluation``: the formulation the evaluation
    computes in (the training formulation unless measured faster: ``evaluation_timings``, CPU ms
    per forward pass of a batch). ``wall_timings``: wall ms per step of each candidate (its
    least round); ``measurement``: how the timing went (``rounds``, the largest ``spread`` of
    the candidates that could win, the ``others`` and ``steal`` shares of the CPUs, whether it
    was ``kept``, the ``margin`` and ``evaluation_margin`` that decided), empty when nothing was
    measured."""

    formulation: str
    precision: str
    reason: str
    timings: dict[str, float]
    source: str = "measured"
    evaluation: str = ""
    evaluation_timings: dict[str, float] = field(default_factory=dict)
    wall_timings: dict[str, float] = field(default_factory=dict)
    measurement: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.evaluation:
            object.__setattr__(self, "evaluation", self.formulation)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def options_json(self, options: dict[str, Any]) -> dict[str, Any]:
        """The run's ``options`` (as JSON, by name) with this decision in place of the asked
        ``formulation`` and ``precision`` (the TensorBoard text, a published version's meta)."""
        return {**options, "formulation": self.formulation, "precision": self.precision}


def choose(
    compute: ComputeConfig, recipe: RecipeConfig, max_steps: int, plan: ThreadPlan,
    data: DataCache, replicas: Replicas, store: measured.Store | None,
    kept: dict[str, Any] | None,
) -> Choice:  # fmt: skip
    """Decide the run's formulation and precision as ``compute`` asks (module docstring) for
    a step of ``recipe`` to ``max_steps``; a resume keeps the choice its checkpoints were
    trained in, ``kept`` (app/training/admit/facts.py ``Previous.kept_choice``; the
    precision's agreement with ``--precision`` is checked at admission). Timings are kept
    in ``store`` (None: not kept)."""
    chief = replicas.is_chief
    choice = _decide(compute, recipe, max_steps, plan, data, store, kept) if chief else None
    if replicas.count == 1:
        assert choice is not None
        return choice
    mine = ALL.index((choice.formulation, choice.precision, choice.evaluation)) + 1 if choice else 0
    f, p, e = ALL[int(replicas.sum([float(mine)], "agreeing on the formulation")[0]) - 1]
    return choice or Choice(f, p, "the chief's choice", {}, "chief", e)


#: Every (formulation, precision, evaluation's formulation), in the order their index is
#: sent between workers.
ALL = [
    (f, p, e)
    for f in model_lib.FORMULATIONS
    for p in model_lib.PRECISIONS
    for e in model_lib.FORMULATIONS
]


def pick(figures: dict[C, timing.Timed], order: list[C], margin: float) -> C:
    """The first of ``order`` timed in ``figures`` whose CPU time is within ``margin``
    (relative) of the least (module docstring), compared as the choice event reports them
    (ms to 2 places), so that a reader of the event reaches the same decision."""
    ms = {c: _reported(t) for c, t in figures.items()}
    least = min(ms.values())
    return next(c for c in order if c in ms and ms[c] <= least * (1 + margin))


def settled(order: list[C], margin: float) -> Callable[[dict[C, timing.Timed]], bool]:
    """Whether figures decide :func:`pick` under ``order`` and ``margin`` clearly (timing.py
    ``time_calls``'s ``settled``): no candidate ahead of the least in ``order`` (the only ones
    the margin can take instead) has a CPU time over the least within :data:`CLOSE` of
    1 + ``margin`` either way."""

    def clear(figures: dict[C, timing.Timed]) -> bool:
        fastest = min(figures, key=lambda c: figures[c].cpu_ms)
        least, edge = figures[fastest].cpu_ms, 1 + margin
        ahead = [figures[c].cpu_ms for c in order[: order.index(fastest)] if c in figures]
        return least <= 0 or not any(
            edge / (1 + CLOSE) < ms / least < edge * (1 + CLOSE) for ms in ahead
        )

    return clear


def _decide(
    compute: ComputeConfig, recipe: RecipeConfig, max_steps: int, plan: ThreadPlan,
    data: DataCache, store: measured.Store | None, resumed: dict[str, Any] | None,
) -> Choice:  # fmt: skip
    if resumed is not None:
        return _resumed(compute, resumed)
    asked = compute.formulation
    formulations = ["fast", "plain"] if asked == "auto" else [asked]
    precisions = compute.precisions(plan.native_bf16)
    candidates = [c for c in ORDER if c[0] in formulations and c[1] in precisions]
    if len(candidates) == 1:
        ((f, p),) = candidates
        reason = "as asked (--formulation, --precision)"
        if compute.precision == "auto":
            reason += f"; float32 under --precision auto ({_why_float32(plan)})"
        return Choice(f, p, reason, {}, "given")
    depends = kept.choice_depends(plan, recipe, data, candidates, tf.__version__, TIMING)
    cached = _cached(measured.lookup(store, "choice", depends), candidates)
    if cached is not None:
        return cached
    phases.timing(candidates, recipe.batch_size)
    steps, load = _measure(candidates, data, recipe, max_steps)
    f, p = pick(steps, candidates, MARGIN)
    reason = _why(steps, (f, p), "a step", MARGIN)
    if "bfloat16" not in precisions:
        reason += f" ({_why_float32(plan)})"
    order = [f, *(e for e in formulations if e != f)]
    forward, forward_load = _forward(order, p, data, recipe.batch_size)
    load = load.worst(forward_load)
    evaluation = pick(forward, order, EVALUATION_MARGIN) if forward else f
    if forward:
        why = _why(forward, evaluation, "a forward pass", EVALUATION_MARGIN)
        reason += f"; evaluated in the {evaluation} formulation: {why}"
    kept_it = _trusted(steps, forward, load)
    if not kept_it:
        reason += "; not kept: its timing was noisy (measurement), a later run times again"
    choice = Choice(
        f, p, reason, _ms(steps, "cpu_ms", lambda c: f"{c[0]}/{c[1]}"), evaluation=evaluation,
        evaluation_timings=_ms(forward, "cpu_ms", lambda e: f"{e}/{p}"),
        wall_timings=_ms(steps, "wall_ms", lambda c: f"{c[0]}/{c[1]}"),
        measurement=_measurement(steps, forward, load, kept_it),
    )  # fmt: skip
    if kept_it:
        measured.keep(store, "choice", depends, choice.to_json())
    return choice


def _why(figures: dict[C, timing.Timed], taken: C, per: str, margin: float) -> str:
    """Why ``taken`` of ``figures``: the least CPU time beyond ``margin``, or within it of
    the least and earlier in the order."""
    fastest = min(figures, key=lambda c: _reported(figures[c]))
    ms = figures[taken].cpu_ms
    if taken == fastest:
        return f"the least CPU time of {len(figures)} measured, {ms:.1f} ms {per}"
    return (
        f"{ms:.1f} CPU-ms {per}, within {margin:.0%} of the least "
        f"({figures[fastest].cpu_ms:.1f} ms) and first in the order"
    )


def _ms(figures: dict[C, timing.Timed], which: str, name: Callable[[C], str]) -> dict[str, float]:
    return {name(c): _reported(t, which) for c, t in figures.items()}


def _reported(t: timing.Timed, which: str = "cpu_ms") -> float:
    """A figure of ``t`` as the ``choice`` event reports it (ms to 2 places): what decides."""
    return float(round(getattr(t, which), 2))


def _trusted(
    steps: dict[Any, timing.Timed], forward: dict[Any, timing.Timed], load: timing.Load
) -> bool:
    """Whether a choice timed so may be kept for later runs (module docstring)."""
    stolen = load.steal is not None and load.steal > timing.NOISE
    return not stolen and not timing.noisy(_contending(steps, forward))


def _contending(
    steps: dict[Any, timing.Timed], forward: dict[Any, timing.Timed]
) -> list[timing.Timed]:
    """The figures of the steps and forward passes that could win (timing.contenders): what
    a spread of the measurement is judged on."""
    return [*timing.contenders(steps).values(), *timing.contenders(forward).values()]


def _measurement(
    steps: dict[Any, timing.Timed], forward: dict[Any, timing.Timed], load: timing.Load,
    kept_it: bool,
) -> dict[str, Any]:  # fmt: skip
    return {
        "rounds": max(t.rounds for t in [*steps.values(), *forward.values()]),
        "spread": round(max(t.spread for t in _contending(steps, forward)), 3),
        **load.to_json(),
        "kept": kept_it,
        "margin": MARGIN,
        "evaluation_margin": EVALUATION_MARGIN,
    }


def _cached(found: dict[str, Any] | None, candidates: list[tuple[str, str]]) -> Choice | None:
    """The kept choice ``found`` (app/data/cache/measured.py), when it names a candidate
    and a formulation to evaluate in."""
    if found is None or (found.get("formulation"), found.get("precision")) not in candidates:
        return None
    if found.get("evaluation") not in model_lib.FORMULATIONS:
        return None
    reason = f"{found.get('reason')}; measured earlier on this CPU, kept beside the data cache"
    dicts = [found.get(k) for k in ("timings", "evaluation_timings", "wall_timings", "measurement")]
    timings, forward, wall, how = (d if isinstance(d, dict) else {} for d in dicts)
    return Choice(
        found["formulation"], found["precision"], reason, timings, "cached", found["evaluation"],
        forward, wall, how,
    )  # fmt: skip


def _why_float32(plan: ThreadPlan) -> str:
    if not plan.native_bf16:
        return "bfloat16: no native support on this CPU"
    return "bfloat16 not measured: not allowed under --precision auto (app.config)"


def _resumed(compute: ComputeConfig, kept: dict[str, Any]) -> Choice:
    precision = kept.get("precision", "float32")
    formulation = kept.get("formulation", "fast")
    # The evaluation's formulation too: a resumed run's validation RMSE is computed as before.
    evaluation = kept.get("evaluation", formulation)
    if compute.formulation not in ("auto", formulation):
        formulation = compute.formulation  # the same function: only the last bits differ
    return Choice(
        formulation, precision, "kept from this run's record (checkpoints/run.json)", {}, "resumed",
        evaluation if evaluation in model_lib.FORMULATIONS else formulation,
    )  # fmt: skip


def _batch(data: DataCache, batch_size: int) -> tuple[tf.Tensor, tf.Tensor]:
    """The first batch of the training file, raw: x (B, H, W, 1), y (B, K)."""
    n = min(batch_size, data.train_size)
    x = tf.constant(np.asarray(data.features("train")[:n])[..., None])
    return x, tf.constant(np.asarray(data.labels("train")[:n]))


def _measure(
    candidates: list[tuple[str, str]], data: DataCache, recipe: RecipeConfig, max_steps: int
) -> tuple[dict[tuple[str, str], timing.Timed], timing.Load]:
    """Each candidate's training step timed (app/training/state/timing.py) on one real batch
    of the run's shape (:func:`_batch`), and the load the CPUs saw meanwhile."""
    x, y = _batch(data, recipe.batch_size)
    t0 = time.perf_counter()
    steps = {c: train_step(*c, x, y, recipe, max_steps) for c in candidates}
    timed = timing.time_calls(steps, settled(candidates, MARGIN))
    logs.event(
        "choice_measured",
        f"timed {len(candidates)} formulations in {time.perf_counter() - t0:.1f} s",
        seconds=round(time.perf_counter() - t0, 2),
    )
    return timed


def _forward(
    formulations: list[str], precision: str, data: DataCache, batch_size: int
) -> tuple[dict[str, timing.Timed], timing.Load | None]:
    """The forward pass (inference, no gradient) of the batch :func:`_batch` in each of
    ``formulations`` (in the order the evaluation's margin takes them) at ``precision``, timed
    as :func:`_measure` times steps, and the load seen; empty (None) for a single formulation:
    nothing to choose."""
    if len(formulations) < 2:
        return {}, None
    x, _ = _batch(data, batch_size)
    shape = dict(height=data.height, width=data.width, precision=precision)
    model = model_lib.build_model(data.num_outputs, **shape)
    traced = {f: tf.function(functools.partial(model.infer, formulation=f)) for f in formulations}
    calls: dict[str, Callable[[], Any]] = {f: functools.partial(traced[f], x) for f in formulations}
    return timing.time_calls(calls, settled(formulations, EVALUATION_MARGIN))


def train_step(
    formulation: str, precision: str, x: tf.Tensor, y: tf.Tensor, recipe: RecipeConfig,
    max_steps: int,
) -> Callable[[], tf.Tensor]:  # fmt: skip
    """The run's training step (:class:`app.training.loop.step.TrainStep`, one process, of
    ``recipe`` to ``max_steps``) of the candidate on a fresh model, over the batch ``x``
    (B, H, W, 1), ``y`` (B, K) repeated: each call runs one step, as the trainer runs it,
    and returns its loss (1,)."""
    candidate = Choice(formulation, precision, "a candidate", {})
    shape = (x.shape[1], x.shape[2], y.shape[-1])
    step = TrainStep(recipe, max_steps, candidate, shape, Replicas())
    batches, one, go = repeated(x, y), tf.constant(1), tf.constant(0.0)
    return lambda: step.run(batches, one, go)[0]


def step_time(
    formulation: str, precision: str, x: tf.Tensor, y: tf.Tensor, recipe: RecipeConfig,
    max_steps: int, steps: int, warmup: int,
) -> float:  # fmt: skip
    """Wall milliseconds per training step of :func:`train_step`: the mean of ``steps`` steps
    after ``warmup`` (the first traces it)."""
    step = train_step(formulation, precision, x, y, recipe, max_steps)
    for _ in range(warmup):
        step().numpy()
    t0 = time.perf_counter()
    for _ in range(steps):
        step().numpy()
    return (time.perf_counter() - t0) / steps * 1e3
