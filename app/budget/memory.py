"""How much of the memory limit a training split may take to be held in memory rather than
read from the cache file batch by batch (app/data/input/pipeline.py). The run's expected peak, the
model of the CNN's training memory that builds on it, is app/training/admit/memory.py.
No TensorFlow here.
"""

from __future__ import annotations

import os

MIB = 1 << 20
#: Share of the memory limit (physical memory without one) a training split may take to
#: be held in memory rather than read from the cache file batch by batch.
RESIDENT_SHARE = 0.25
#: Share of the memory limit a training split's features file may take to be held all the
#: same when it is over the resident share: held, it is the page cache's pages, mapped,
#: not a copy (app/data/input/pipeline.py ``choose_input``).
PAGE_CACHE_SHARE = 0.75
#: Share of :func:`resident_limit` a streamed split's evaluated validation rows may take
#: to be read once and held in memory rather than read at every evaluation.
HELD_VALIDATION_SHARE = 0.25


def physical_memory() -> int:
    """Bytes of this machine's memory (``sysconf``), as the kernel reports it inside a
    container too: what a run without a memory limit is OOM-killed past."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_bound(memory_limit: int | None) -> int:
    """Bytes a run may use: ``memory_limit`` or physical memory, the smaller (a limit above
    the machine's memory does not make more of it)."""
    machine = physical_memory()
    return machine if memory_limit is None else min(memory_limit, machine)


def resident_limit(memory_limit: int | None) -> int:
    """Bytes of training split (features + labels) held in memory rather than streamed:
    :data:`RESIDENT_SHARE` of ``memory_limit``, or of physical memory when there is none."""
    return int(memory_bound(memory_limit) * RESIDENT_SHARE)


def page_cache_limit(memory_limit: int | None) -> int:
    """Bytes of a training split's features file held (from the page cache) though over
    :func:`resident_limit`: :data:`PAGE_CACHE_SHARE` of ``memory_limit`` (or physical
    memory)."""
    return int(memory_bound(memory_limit) * PAGE_CACHE_SHARE)


def validation_held(nbytes: int, memory_limit: int | None) -> bool:
    """Whether a streamed split's evaluated validation rows, ``nbytes`` (features and
    labels), are held in memory: at most :data:`HELD_VALIDATION_SHARE` of
    :func:`resident_limit`."""
    return nbytes <= resident_limit(memory_limit) * HELD_VALIDATION_SHARE


def split_bytes(rows: int, values: int, outputs: int) -> int:
    """Bytes of ``rows`` samples of ``values`` features and ``outputs`` labels as float32."""
    return 4 * rows * (values + outputs)
