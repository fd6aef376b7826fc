"""The run's expected peak memory, compared with the memory limit before training starts: a
model of this project's CNN in training (its constants are measured on it).

A process over its cgroup's memory limit is killed by the kernel: exit 137, no message,
no ``end`` event, and a Job retries it into the same wall. So a run is admitted
(app/training/admit/__init__.py) only when its peak, estimated from what is known once the
data are converted and before TensorFlow is imported, fits the memory bound
(:func:`check_peak`, the ``memory`` event); else it ends with exit 8 and one line
(:class:`app.errors.MemoryBudgetExceeded`). The bound is the memory limit, or the machine's
memory when that is smaller (:func:`app.budget.memory.memory_bound`): past either the
kernel's OOM killer ends the run the same way. What no rows can lower (:func:`floor`) is
checked before the conversion. No TensorFlow here.

The rule, bytes (constants measured on this project's model with TensorFlow 2.21 on 2
CPUs, peak RSS of whole ``coretrain train`` runs: docs/security.md, "Memory")::

    peak = (BASE + model + max(setup, training)) × (1 + MARGIN)
    setup    = RESIDENT_SETUP_COPIES × split            (a split held in memory)
             | 2 × validation                           (streamed: read, then a tensor)
    training = RESIDENT_COPIES × split                  (held in memory)
             | STREAMED_BATCHES × batch × row + labels  (read from the cache file)
               + validation
             + batch × (PER_FEATURE × H·W + PER_OUTPUT × K)

``split`` = training rows × row, ``row`` = 4 × (H·W + K) bytes, ``labels`` = training rows ×
4·K (a streamed run maps the labels file), ``validation`` = evaluated validation rows ×
row when a streamed split holds them (:func:`app.budget.memory.validation_held`, else 0);
``model`` = 16 bytes per
weight of the last layer (weights, gradient, momentum, a copy), the rest is in BASE. The
split is held in memory when it takes at most
:data:`app.budget.memory.RESIDENT_SHARE` of the limit (:func:`app.budget.memory.resident_limit`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app import logs
from app.budget.memory import MIB, memory_bound, resident_limit, split_bytes, validation_held
from app.data.cache import DataCache
from app.errors import MemoryBudgetExceeded
from app.geometry import DENSE_UNITS  # the hidden layer feeding the K outputs

#: Python, TensorFlow, Keras, the model's graphs and their working set at a batch of ~0:
#: their heap, and TensorFlow's shared libraries as the kernel maps them, which is more when
#: their files were freshly written (a new image or venv: the page cache in large folios)
#: than when they sit in an old page cache (docs/security.md, "Memory").
HEAP = 270 * MIB
CODE = 460 * MIB
BASE = HEAP + CODE
#: While a split is put in memory: the variables it is written into (the chunks on the
#: way are in BASE's margin; app/data/input/pipeline.py load_resident).
RESIDENT_SETUP_COPIES = 1
#: Copies of a split held in memory while training: once, in the variables.
RESIDENT_COPIES = 1
#: Batches held when the split is read from the file: three chunks of 8 steps' rows (the
#: one gathered from, the one being read, the one the batches in flight came from:
#: app/data/input/stream.py CHUNKS_HELD × app/data/input/order.py WINDOW_STEPS), and the
#: step's batch: gathered, and standardised in two operations.
STREAMED_BATCHES = 3 * 8 + 3
#: Bytes per sample of a batch, per feature value and per output: activations, their
#: gradients and the fast formulation's patch matrices (app/model/fast_formulation.py).
PER_FEATURE = 44
PER_OUTPUT = 40
#: Room for what the rule does not see (allocator slack, page cache of written files).
MARGIN = 0.10


@dataclass(frozen=True)
class Estimate:
    """The expected peak (``total`` bytes) and its parts (bytes, by name), for the log."""

    total: int
    parts: dict[str, int]
    resident: bool
    at_least: bool = False  # :func:`floor`: the least, before the rows are counted

    def to_json(self) -> dict[str, Any]:
        return {"peak_bytes": self.total, "resident": self.resident, **self.parts}


def peak(
    *, rows: int, height: int, width: int, outputs: int, batch_size: int,
    memory_limit: int | None, validation_rows: int = 0,
) -> Estimate:  # fmt: skip
    """The peak of a run training on ``rows`` samples of ``height``×``width`` features and
    ``outputs`` labels in batches of ``batch_size`` (per process), ``validation_rows`` of
    them evaluated while it trains, by the module's rule."""
    values = height * width
    row = split_bytes(1, values, outputs)
    split = rows * row
    resident = split <= resident_limit(memory_limit)
    validation = validation_rows * row
    if resident or not validation_held(validation, memory_limit):
        validation = 0
    streamed = STREAMED_BATCHES * batch_size * row + rows * 4 * outputs + validation
    data = RESIDENT_COPIES * split if resident else streamed
    steps = batch_size * (PER_FEATURE * values + PER_OUTPUT * outputs)
    parts = {
        "base_bytes": BASE,
        "model_bytes": 16 * (DENSE_UNITS + 1) * outputs,
        "setup_bytes": RESIDENT_SETUP_COPIES * split if resident else 2 * validation,
        "data_bytes": data,
        "batch_bytes": steps,
    }
    during = max(parts["setup_bytes"], data + steps)
    total = int((BASE + parts["model_bytes"] + during) * (1 + MARGIN))
    return Estimate(total, parts, resident)


def floor(*, height: int, width: int, outputs: int, batch_size: int) -> Estimate:
    """The least any run of this shape needs, whatever its rows: :func:`peak` of no rows
    (TensorFlow, the model and a batch's working set), known before the rows are counted."""
    found = peak(
        rows=0, height=height, width=width, outputs=outputs, batch_size=batch_size,
        memory_limit=None,
    )  # fmt: skip
    return Estimate(found.total, found.parts, found.resident, at_least=True)


def check(found: Estimate, memory_limit: int | None, batch_size: int) -> None:
    """Raise MemoryBudgetExceeded (exit 8) when ``found`` is more than the memory the run
    may use: ``memory_limit`` or the machine's memory, the smaller (None: no limit, the
    machine's): past either the kernel's OOM killer ends the run (exit 137, no message)."""
    bound = memory_bound(memory_limit)
    limited = bound == memory_limit  # else the machine's memory is the smaller
    if found.total <= bound:
        return
    where = (
        f"the memory limit of {bound / MIB:,.0f} MiB"
        if limited
        else f"this machine's {bound / MIB:,.0f} MiB of memory"
        + (" (no memory limit)" if memory_limit is None else " (below its memory limit)")
    )
    held = "held in memory" if found.resident else "read batch by batch"
    split = f"training split {held}, " if not found.at_least else "whatever its rows, "
    raise MemoryBudgetExceeded(
        f"the run would need {'at least' if found.at_least else 'about'} "
        f"{found.total / MIB:,.0f} MiB of memory at its peak "
        f"(TensorFlow {BASE / MIB:.0f} MiB, {split}batches of "
        f"{batch_size}), more than {where}; {_advice(found, bound, batch_size, limited)}"
    )


def _advice(found: Estimate, bound: int, batch_size: int, limited: bool) -> str:
    """What to change: the limit when TensorFlow alone passes it, the row's size when one
    sample does (--height/--width), else the batch."""
    fixed = int((BASE + found.parts["model_bytes"]) * (1 + MARGIN))  # whatever the batch
    sample = found.parts["batch_bytes"] // max(batch_size, 1)
    more = "raise the limit" if limited else "run it with more memory"
    if fixed > bound:
        return f"{more}: TensorFlow alone needs about that much"
    if fixed + int(sample * (1 + MARGIN)) > bound:
        return (
            f"one sample alone needs {sample / MIB:,.0f} MiB ({PER_FEATURE} bytes a feature "
            "value): check --height and --width"
        )
    return "lower --batch-size" + (" or raise the limit" if limited else "")


def check_peak(
    data: DataCache, batch_size: int, evaluated_rows: int, memory_limit: int | None
) -> Estimate:
    """The expected peak of training on ``data`` in batches of ``batch_size``, with
    ``evaluated_rows`` validation rows evaluated while it trains, logged as the ``memory``
    event and returned. Raises MemoryBudgetExceeded (exit 8) when it can't fit."""
    found = peak(
        rows=data.train_size, height=data.height, width=data.width, outputs=data.num_outputs,
        batch_size=batch_size, memory_limit=memory_limit, validation_rows=evaluated_rows,
    )  # fmt: skip
    logs.event(
        "memory",
        f"expected peak memory {found.total / MIB:,.0f} MiB"
        + (f" of a {memory_limit / MIB:,.0f} MiB limit" if memory_limit else ""),
        memory_limit=memory_limit,
        **found.to_json(),
    )
    check(found, memory_limit, batch_size)
    return found
