"""Admission: every fact a run needs, established once, cheapest first, before TensorFlow
trains anything (docs/architecture.md, "One way in"). :func:`admit` returns the facts
(:class:`~app.training.admit.facts.Admitted`) or, for this very run finished already, its
recorded result; each refusal is raised as the :class:`app.errors.AppError` of its exit
code. One module per fact: the publish directory (publish_dir.py), the previous run
(previous.py), the run's identity (identity.py), the sources and their cache (sources.py),
the data's shape (shape.py), the memory bound (memory.py), the served signature
(signature.py). What the options and the data's shape can refuse comes before the data are
converted; when the output holds this run finished, it waits until the data say whether
there is anything to do (a rerun on copied data is a no-op, not a refusal).
"""

from __future__ import annotations

from collections.abc import Callable

from app.budget.plan import ThreadPlan
from app.config import PublishConfig, TrainConfig
from app.data.cache import source_key
from app.data.formats.sources import Sources
from app.data.input.split import evaluated_count
from app.release.layout import Signature
from app.training.admit import identity, memory, previous, publish_dir, shape, signature, sources
from app.training.admit.facts import Admitted
from app.training.loop.outcome import Result
from app.training.state import identity as record
from app.training.state.workspace import Workspace


def check_arguments(config: TrainConfig, chief: bool) -> None:
    """What the arguments alone refuse, before anything is written into --output: a --data
    that does not exist, an H×W the CNN can't take (ConfigError, exit 2), and, on the
    ``chief``, a --publish-dir that does not exist."""
    sources.check_exists(config.data.data_dir)
    shape.check_geometry(config.data.height, config.data.width)
    if chief and config.publishing.publish_dir is not None:
        publish_dir.exists(config.publishing.publish_dir)


def admit(
    ws: Workspace, config: TrainConfig, plan: ThreadPlan, stop: Callable[[], bool]
) -> Admitted | Result:
    """The facts of this run (module docstring), or the result of this very run, finished.
    Raises ConfigError (2), DataError (3), StorageError (4), NotPublished (7),
    MemoryBudgetExceeded (8), Preempted (a stop while converting)."""
    publishing, chief = config.publishing, ws.is_chief
    if chief and publishing.publish_dir is not None:
        publish_dir.check(publishing.publish_dir)
    before = previous.read(ws, config.schedule, ws.workers)
    options = record.options_of(config)
    identity.before_data(ws.checkpoints, before, config.compute.precision, options, ws.workers)
    previous.refuse_past_end(ws, before, config.schedule)
    found = sources.find(config.data)
    key = source_key(found)
    unknown = {"options": options, "workers": ws.workers}  # the identity but for the data
    if before.summary is None:
        by_shape(found, config.publishing, config.recipe.batch_size, plan.memory_limit, chief)
    elif done := previous.finished_unchanged(ws, before, key, unknown, publishing):
        return done  # the same sources, unchanged: the cache is not needed to know
    data = sources.convert(
        found, key, ws, config.cache, config.recipe.standardize, plan.intra_op_threads, stop
    )
    mine = record.of_run(options, data, ws.workers)
    if before.summary is not None and (
        done := previous.finished(ws, before, mine.to_json(), publishing)
    ):
        return done
    if chief:
        identity.check(ws.checkpoints, before, mine)
    evaluated = evaluated_count(
        data.train_size, config.data.validation_fraction, config.schedule.eval_rows
    )
    peak = memory.check_peak(data, config.recipe.batch_size, evaluated, plan.memory_limit)
    mine_signature = Signature(data.height * data.width, data.num_outputs)
    served = signature.served(publishing, mine_signature) if chief else None
    return Admitted(found, data, before, mine, peak.total, served)


def by_shape(
    found: Sources, publishing: PublishConfig, batch_size: int, memory_limit: int | None,
    chief: bool,
) -> None:  # fmt: skip
    """Before the data are converted: each file's first row, the memory floor and, on the
    ``chief``, the signature's hint (shape.py, memory.py, signature.py)."""
    k = shape.first_rows(found)
    least = memory.floor(height=found.height, width=found.width, outputs=k, batch_size=batch_size)
    memory.check(least, memory_limit, batch_size)  # no row count could fit
    if chief:
        signature.hint(publishing, Signature(found.height * found.width, k), found)
