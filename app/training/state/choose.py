"""The formulation and precision of a run, chosen by measurement on the CPU that runs it.

The fast and the plain formulation compute the same function with the same variables,
in float32 or with bfloat16 products; which is fastest depends on the CPU (oneDNN on or
off, AVX512_BF16/AMX or not) and the thread count. With ``--formulation auto`` and/or
``--precision auto`` every candidate is traced and warmed up, then timed in
:data:`ROUNDS` interleaved rounds of :data:`TIMED_STEPS` steps, on one real batch of this
run's shape with the planned threads, and the fastest best round wins.

``--precision auto`` measures bfloat16 only when ``app.config.BFLOAT16_IN_AUTO`` is set and the
CPU has native bfloat16 dot products (``/proc/cpuinfo`` flags ``avx512_bf16`` or
``amx_bf16``, Arm's ``bf16``; elsewhere it is emulated and slow). It is set because
bfloat16's mean test RMSE over seeds lies within float32's seed spread for the default
recipe on both sets of the quality benchmark (docs/quality.md, "bfloat16"): a faster step
then trains the same model up to noise. ``--precision bfloat16`` trains in it anywhere. The
measurement costs a few seconds, so it is kept in the workspace (``choice.json``) keyed
by the CPU model and flags, the threads, the shapes and TensorFlow's version, and reused
by later runs and resumes there. In a multi-worker run the chief decides and sends its
choice to the others.

A run keeps its precision once it has checkpoints: it is recorded next to them
(``checkpoints/run.json``, with the run's identity: app/training/state/identity.py) and a resume
uses it, so an exact resume stays exact.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from app import logs
from app import model as model_lib
from app.atomic import write_json
from app.budget.plan import ThreadPlan
from app.config import TrainConfig
from app.data.cache import DataCache
from app.errors import ConfigError
from app.training import phases
from app.training.loop.replicas import Replicas
from app.training.loop.step import TrainStep, repeated
from app.training.state import identity

WARMUP_STEPS = 2
TIMED_STEPS = 2
ROUNDS = 3
CHOICE_FILE = "choice.json"


@dataclass(frozen=True)
class Choice:
    """The formulation and precision of the run and why (``timings``: ms per step)."""

    formulation: str
    precision: str
    reason: str
    timings: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def options_json(self, config: TrainConfig) -> dict[str, Any]:
        """``config``'s options as JSON with this decision in place of the asked
        ``formulation`` and ``precision`` (the TensorBoard text, a published version's meta)."""
        return {**config.to_json(), "formulation": self.formulation, "precision": self.precision}


def recorded(checkpoints: Path) -> dict[str, Any] | None:
    """The record of the checkpoints in ``checkpoints`` (app/training/state/identity.py), with the
    formulation and precision they were trained in; None for a fresh start. Checkpoints
    without the record were written before precision was a choice: float32, the fast
    formulation. Raises StorageError for a record that can't be read beside checkpoints."""
    kept = identity.read(checkpoints)
    if kept is not None:
        return kept
    if identity.has_checkpoints(checkpoints):
        return {"formulation": "fast", "precision": "float32"}
    return None


def choose(
    config: TrainConfig, plan: ThreadPlan, data: DataCache, replicas: Replicas,
    workspace: Path, checkpoints: Path,
) -> Choice:  # fmt: skip
    """Decide the run's formulation and precision (module docstring). Raises ConfigError
    when an explicit precision contradicts the one the checkpoints were trained in."""
    choice = _decide(config, plan, data, workspace, checkpoints) if replicas.is_chief else None
    if replicas.count == 1:
        assert choice is not None
        return choice
    mine = ALL.index((choice.formulation, choice.precision)) + 1 if choice else 0
    agreed = ALL[int(replicas.sum([float(mine)], "agreeing on the formulation")[0]) - 1]
    return choice or Choice(*agreed, "the chief's choice", {})


#: Every (formulation, precision), in the order their index is sent between workers.
ALL = [(f, p) for f in model_lib.FORMULATIONS for p in model_lib.PRECISIONS]


def _decide(
    config: TrainConfig, plan: ThreadPlan, data: DataCache, workspace: Path, checkpoints: Path
) -> Choice:
    kept = recorded(checkpoints)
    if kept is not None:
        return _resumed(config, kept)
    asked = config.compute.formulation
    formulations = ["fast", "plain"] if asked == "auto" else [asked]
    precisions = config.compute.precisions(plan.native_bf16)
    candidates = [(f, p) for f in formulations for p in precisions]
    if len(candidates) == 1:
        ((f, p),) = candidates
        reason = "as asked (--formulation, --precision)"
        if config.compute.precision == "auto":
            reason += f"; float32 under --precision auto ({_why_float32(plan)})"
        return Choice(f, p, reason, {})
    key = _key(plan, data, config, candidates)
    cached = _cached(workspace / CHOICE_FILE, key)
    if cached is not None:
        return cached
    phases.timing(candidates, config.recipe.batch_size)
    timings = _measure(candidates, data, config)
    (f, p), ms = min(timings.items(), key=lambda item: item[1])
    names = {f"{a}/{b}": round(t, 2) for (a, b), t in timings.items()}
    reason = f"fastest of {len(candidates)} measured: {ms:.1f} ms/step"
    if "bfloat16" not in precisions:
        reason += f" ({_why_float32(plan)})"
    choice = Choice(f, p, reason, names)
    write_json(workspace / CHOICE_FILE, {"key": key, **choice.to_json()})
    return choice


def _why_float32(plan: ThreadPlan) -> str:
    if not plan.native_bf16:
        return "bfloat16: no native support on this CPU"
    return "bfloat16 not measured: not allowed under --precision auto (app.config)"


def _resumed(config: TrainConfig, kept: dict[str, str]) -> Choice:
    precision = kept.get("precision", "float32")
    if config.compute.precision not in ("auto", precision):
        raise ConfigError(
            f"the checkpoints were trained in {precision}; resume with --precision {precision} "
            "(or auto), or train into a new output directory"
        )
    formulation = kept.get("formulation", "fast")
    if config.compute.formulation not in ("auto", formulation):
        formulation = config.compute.formulation  # the same function: only the last bits differ
    return Choice(formulation, precision, "kept from the checkpoints being resumed", {})


def _key(plan: ThreadPlan, data: DataCache, config: TrainConfig, candidates: list) -> str:
    parts = [
        plan.cpu_model, plan.inputs.get("/proc/cpuinfo", ""), plan.intra_op_threads,
        plan.inter_op_threads, plan.onednn, data.height, data.width, data.num_outputs,
        config.recipe.batch_size, tf.__version__, candidates,
    ]  # fmt: skip
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _cached(path: Path, key: str) -> Choice | None:
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if saved.get("key") != key:
        return None
    reason = f"{saved['reason']}; measured earlier on this CPU ({path})"
    return Choice(saved["formulation"], saved["precision"], reason, saved["timings"])


def _measure(
    candidates: list[tuple[str, str]], data: DataCache, config: TrainConfig
) -> dict[tuple[str, str], float]:
    """ms per training step of each candidate on one real batch of the run's shape: every
    candidate traced and warmed up, then :data:`ROUNDS` rounds of :data:`TIMED_STEPS`
    steps each, the candidates interleaved, and the best round of each (a moment of load
    from elsewhere then hurts one round, not one candidate)."""
    n = min(config.recipe.batch_size, data.train_size)
    x = tf.constant(np.asarray(data.features("train")[:n])[..., None])
    y = tf.constant(np.asarray(data.labels("train")[:n]))
    t0 = time.perf_counter()
    steps = {c: train_step(*c, x, y, config) for c in candidates}
    for step in steps.values():
        for _ in range(WARMUP_STEPS):
            step().numpy()
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(ROUNDS):
        for c, step in steps.items():
            best[c] = min(best[c], _ms_per_step(step, TIMED_STEPS))
    logs.event(
        "choice_measured",
        f"timed {len(candidates)} formulations in {time.perf_counter() - t0:.1f} s",
        seconds=round(time.perf_counter() - t0, 2),
    )
    return best


def _ms_per_step(step: Any, count: int) -> float:
    t0 = time.perf_counter()
    for _ in range(count):
        step().numpy()
    return (time.perf_counter() - t0) / count * 1e3


def train_step(
    formulation: str, precision: str, x: tf.Tensor, y: tf.Tensor, config: TrainConfig
) -> Callable[[], tf.Tensor]:
    """The run's training step (:class:`app.training.loop.step.TrainStep`, one process) of the
    candidate on a fresh model, over the batch ``x`` (B, H, W, 1), ``y`` (B, K) repeated:
    each call runs one step, as the trainer runs it, and returns its loss (1,)."""
    candidate = Choice(formulation, precision, "a candidate", {})
    shape = (x.shape[1], x.shape[2], y.shape[-1])
    step = TrainStep(config.recipe, config.schedule.max_steps, candidate, shape, Replicas())
    batches, one, go = repeated(x, y), tf.constant(1), tf.constant(0.0)
    return lambda: step.run(batches, one, go)[0]


def step_time(
    formulation: str, precision: str, x: tf.Tensor, y: tf.Tensor, config: TrainConfig,
    steps: int = TIMED_STEPS, warmup: int = WARMUP_STEPS,
) -> float:  # fmt: skip
    """Milliseconds per training step of :func:`train_step`: the mean of ``steps`` steps
    after ``warmup`` (the first traces it)."""
    step = train_step(formulation, precision, x, y, config)
    for _ in range(warmup):
        step().numpy()
    return _ms_per_step(step, steps)
