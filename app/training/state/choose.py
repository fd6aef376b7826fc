"""The formulation and precision of a run, chosen by measurement on the CPU that runs it.

The fast and the plain formulation compute the same function with the same variables,
in float32 or with bfloat16 products; which is fastest depends on the CPU (oneDNN on or
off, AVX512_BF16/AMX or not) and the thread count. With ``--formulation auto`` and/or
``--precision auto`` every candidate is traced and warmed up, then timed in
:data:`ROUNDS` interleaved rounds of :data:`TIMED_STEPS` steps, on one real batch of this
run's shape with the planned threads, and the fastest best round wins. A candidate whose
first round is over :data:`CANNOT_WIN` times the fastest's is not timed again: no round
of it could win (the rounds of one candidate move by a quarter at most on a shared VM).
Under ``--formulation auto`` the evaluation's formulation is chosen the same way, by
timing the forward pass alone in each formulation at the chosen precision: without a
gradient the fastest is not always the step's (on an Intel Xeon with AMX the plain
formulation's forward pass in bfloat16 was 1.7× the fast one's, whose step was the
faster; docs/performance.md, "Evaluation").

``--precision auto`` measures bfloat16 only when ``app.config.BFLOAT16_IN_AUTO`` is set and the
CPU has native bfloat16 dot products (``/proc/cpuinfo`` flags ``avx512_bf16`` or
``amx_bf16``, Arm's ``bf16``; elsewhere it is emulated and slow). It is set because
bfloat16's mean test RMSE over seeds lies within float32's seed spread for the default
recipe on both sets of the quality benchmark (docs/quality.md, "bfloat16"): a faster step
then trains the same model up to noise. ``--precision bfloat16`` trains in it anywhere. The
measurement costs seconds, so its timings are kept beside the data cache (it outlives
output directories: app/data/cache/measured.py), keyed by everything they depend on (the CPU
model and flags, TensorFlow's version, the thread plan, the batch size, H×W, the
candidates: app/training/state/kept.py), and reused by later runs while all of it is the same;
a damaged or foreign entry is measured again. In a multi-worker run the chief decides and
sends its choice to the others. The ``choice`` event's ``source`` says where the choice
came from: ``measured``, ``cached``, ``resumed`` (the checkpoints'), ``given`` (one
candidate: nothing to measure) or ``chief`` (a worker's).

A run keeps its precision once it has checkpoints: it is recorded next to them
(``checkpoints/run.json``, with the run's identity: app/training/state/identity.py) and a resume
uses it, so an exact resume stays exact (an explicit ``--precision`` that is not theirs is
refused at admission: app/training/admit/identity.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
from app.training.state import kept

WARMUP_STEPS = 2
TIMED_STEPS = 2
ROUNDS = 3
#: A candidate slower than this many times the fastest in the first round is not timed again.
CANNOT_WIN = 1.5
#: How candidates are timed: part of what a kept choice depends on.
TIMING = {
    "warmup": WARMUP_STEPS, "steps": TIMED_STEPS, "rounds": ROUNDS, "cannot_win": CANNOT_WIN,
    "evaluation": "forward pass per formulation",
}  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """The formulation and precision of the run and why (``timings``: ms per step;
    ``source``: module docstring); ``evaluation``: the formulation the evaluation computes
    in (the training formulation unless measured faster: ``evaluation_timings``, ms per
    forward pass of a batch)."""

    formulation: str
    precision: str
    reason: str
    timings: dict[str, float]
    source: str = "measured"
    evaluation: str = ""
    evaluation_timings: dict[str, float] = field(default_factory=dict)

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


def _decide(
    compute: ComputeConfig, recipe: RecipeConfig, max_steps: int, plan: ThreadPlan,
    data: DataCache, store: measured.Store | None, resumed: dict[str, Any] | None,
) -> Choice:  # fmt: skip
    if resumed is not None:
        return _resumed(compute, resumed)
    asked = compute.formulation
    formulations = ["fast", "plain"] if asked == "auto" else [asked]
    precisions = compute.precisions(plan.native_bf16)
    candidates = [(f, p) for f in formulations for p in precisions]
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
    timings = _measure(candidates, data, recipe, max_steps)
    (f, p), ms = min(timings.items(), key=lambda item: item[1])
    names = {f"{a}/{b}": round(t, 2) for (a, b), t in timings.items()}
    reason = f"fastest of {len(candidates)} measured: {ms:.1f} ms/step"
    if "bfloat16" not in precisions:
        reason += f" ({_why_float32(plan)})"
    forward = _forward_ms(formulations, p, data, recipe.batch_size)
    evaluation = min(forward, key=lambda e: forward[e]) if forward else f
    if evaluation != f:
        reason += (f"; evaluated in the {evaluation} formulation, {forward[evaluation]:.1f} ms "
                   f"a forward pass against {forward[f]:.1f}")  # fmt: skip
    forward_names = {f"{e}/{p}": round(t, 2) for e, t in forward.items()}
    choice = Choice(f, p, reason, names, evaluation=evaluation, evaluation_timings=forward_names)
    measured.keep(store, "choice", depends, choice.to_json())
    return choice


def _cached(found: dict[str, Any] | None, candidates: list[tuple[str, str]]) -> Choice | None:
    """The kept choice ``found`` (app/data/cache/measured.py), when it names a candidate
    and a formulation to evaluate in."""
    if found is None or (found.get("formulation"), found.get("precision")) not in candidates:
        return None
    if found.get("evaluation") not in model_lib.FORMULATIONS:
        return None
    timings, forward = found.get("timings"), found.get("evaluation_timings")
    reason = f"{found.get('reason')}; measured earlier on this CPU, kept beside the data cache"
    return Choice(
        found["formulation"], found["precision"], reason,
        timings if isinstance(timings, dict) else {}, "cached", found["evaluation"],
        forward if isinstance(forward, dict) else {},
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
) -> dict[tuple[str, str], float]:
    """ms per training step of each candidate on one real batch of the run's shape
    (:func:`_batch`): every candidate traced and warmed up, then :data:`ROUNDS` rounds of
    :data:`TIMED_STEPS` steps each, the candidates interleaved, and the best round of each
    (a moment of load from elsewhere then hurts one round, not one candidate); a candidate
    that cannot win (:data:`CANNOT_WIN`) leaves the rounds, its best so far kept."""
    x, y = _batch(data, recipe.batch_size)
    t0 = time.perf_counter()
    best = _best_rounds({c: train_step(*c, x, y, recipe, max_steps) for c in candidates})
    logs.event(
        "choice_measured",
        f"timed {len(candidates)} formulations in {time.perf_counter() - t0:.1f} s",
        seconds=round(time.perf_counter() - t0, 2),
    )
    return best


def _forward_ms(
    formulations: list[str], precision: str, data: DataCache, batch_size: int
) -> dict[str, float]:
    """ms per forward pass (inference, no gradient) of the batch :func:`_batch` in each of
    ``formulations`` at ``precision``, timed as :func:`_measure` times steps
    (:func:`_best_rounds`); empty for a single formulation: nothing to choose."""
    if len(formulations) < 2:
        return {}
    x, _ = _batch(data, batch_size)
    shape = dict(height=data.height, width=data.width, precision=precision)
    model = model_lib.build_model(data.num_outputs, **shape)
    traced = {f: tf.function(functools.partial(model.infer, formulation=f)) for f in formulations}
    return _best_rounds({f: functools.partial(traced[f], x) for f in formulations})


def _best_rounds(calls: dict[Any, Callable[[], tf.Tensor]]) -> dict[Any, float]:
    """ms per call of each of ``calls``: each warmed up (:data:`WARMUP_STEPS` calls), then
    :data:`ROUNDS` rounds of :data:`TIMED_STEPS` calls, interleaved, the best round of each;
    one slower than :data:`CANNOT_WIN` times the fastest leaves the rounds, its best so far
    kept."""
    for call in calls.values():
        for _ in range(WARMUP_STEPS):
            call().numpy()
    best = dict.fromkeys(calls, float("inf"))
    timed = list(calls)
    for _ in range(ROUNDS):
        for c in timed:
            best[c] = min(best[c], _ms_per_step(calls[c], TIMED_STEPS))
        fastest = min(best.values())
        timed = [c for c in timed if best[c] <= CANNOT_WIN * fastest]
    return best


def _ms_per_step(step: Any, count: int) -> float:
    t0 = time.perf_counter()
    for _ in range(count):
        step().numpy()
    return (time.perf_counter() - t0) / count * 1e3


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
    max_steps: int, steps: int = TIMED_STEPS, warmup: int = WARMUP_STEPS,
) -> float:  # fmt: skip
    """Milliseconds per training step of :func:`train_step`: the mean of ``steps`` steps
    after ``warmup`` (the first traces it)."""
    step = train_step(formulation, precision, x, y, recipe, max_steps)
    for _ in range(warmup):
        step().numpy()
    return _ms_per_step(step, steps)
