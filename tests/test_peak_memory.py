"""memory.peak against the peaks it was calibrated on (docs/security.md, "Memory").

Each row is a measured run: its data, batch, whether the split was held in memory, and
the peak RSS measured (MiB). The estimate must cover every measured peak, and by no more
than the calibration's spread, so a rule that over-refuses fails as surely as one that
lets a run be OOM-killed. No TensorFlow: the rule is arithmetic on the run's shape.
"""

from __future__ import annotations

import os

import pytest

from app.budget import memory as residency
from app.errors import MemoryBudgetExceeded
from app.training.admit import memory

MIB = residency.MIB
LIMIT = 6 << 30  # the 6 GiB group most rows were measured in
#: (train samples, H, W, K, batch, held in memory, measured peak RSS MiB): the re-measured
#: table (an old page cache) and the fresh install's peak of the tiny set (732 MiB).
MEASURED = [
    (240, 20, 195, 3, 40, True, 571),
    (240, 20, 195, 3, 40, True, 732),
    (3000, 20, 195, 3, 1000, True, 770),
    (12000, 20, 195, 3, 1000, True, 906),
    (12000, 20, 195, 3, 4000, True, 1194),
    (25000, 20, 195, 3, 1000, True, 1131),
]
#: The widest estimate / peak the calibration accepted (docs/security.md: 1.08–1.30 with
#: the old base, plus the 165 MiB the fresh-install base adds).
MOST_ABOVE = 1.5


@pytest.mark.parametrize(("rows", "h", "w", "k", "batch", "held", "peak_mib"), MEASURED)
def test_the_estimate_covers_each_measured_peak_and_not_by_far(
    rows: int, h: int, w: int, k: int, batch: int, held: bool, peak_mib: int
) -> None:
    found = memory.peak(
        rows=rows, height=h, width=w, outputs=k, batch_size=batch, memory_limit=LIMIT
    )
    assert found.resident is held
    assert peak_mib * MIB <= found.total <= MOST_ABOVE * peak_mib * MIB


def test_the_tiny_set_s_estimate_is_the_documented_one() -> None:
    """docs/security.md: "With the 730 MiB base the tiny set's estimate is 814 MiB"."""
    found = memory.peak(
        rows=240, height=20, width=195, outputs=3, batch_size=40, memory_limit=LIMIT
    )
    assert round(found.total / MIB) == 814


def test_a_split_past_a_quarter_of_the_limit_is_streamed_and_costs_batches() -> None:
    limit = 1 << 30
    held = memory.peak(
        rows=1000, height=20, width=195, outputs=3, batch_size=100, memory_limit=limit
    )
    streamed = memory.peak(
        rows=100_000, height=20, width=195, outputs=3, batch_size=100, memory_limit=limit
    )
    assert held.resident and not streamed.resident
    # The chunks of batches read ahead, and the labels (mapped: 4 bytes × outputs a row).
    assert streamed.parts["data_bytes"] == (
        memory.STREAMED_BATCHES * 100 * 4 * (3900 + 3) + 100_000 * 4 * 3
    )
    assert streamed.parts["setup_bytes"] == 0


def test_a_streamed_split_counts_the_validation_rows_it_holds_and_only_those() -> None:
    limit, row = 1 << 30, 4 * (3900 + 3)
    shape = dict(rows=100_000, height=20, width=195, outputs=3, batch_size=100)
    bare = memory.peak(**shape, memory_limit=limit)
    held = memory.peak(**shape, memory_limit=limit, validation_rows=4_000)
    # 4,000 rows (62 MB) fit a quarter of the resident limit (64 MiB): held, counted once
    # while training and twice while they become a tensor.
    assert held.parts["data_bytes"] - bare.parts["data_bytes"] == 4_000 * row
    assert held.parts["setup_bytes"] == 2 * 4_000 * row
    # 4,500 rows (70 MB) do not: read at every evaluation, nothing held.
    over = memory.peak(**shape, memory_limit=limit, validation_rows=4_500)
    assert over.parts == bare.parts
    # A split held in memory gathers its validation rows from itself.
    small = dict(shape, rows=1000)
    assert memory.peak(**small, memory_limit=limit, validation_rows=100).parts == (
        memory.peak(**small, memory_limit=limit).parts
    )


def test_check_refuses_only_past_the_limit() -> None:
    found = memory.peak(rows=240, height=20, width=195, outputs=3, batch_size=40, memory_limit=None)
    memory.check(found, None, 40)
    memory.check(found, found.total, 40)
    with pytest.raises(MemoryBudgetExceeded, match="lower --batch-size"):
        memory.check(found, found.total - 1, 40)


def test_the_bound_is_the_smaller_of_the_limit_and_the_machine_s_memory() -> None:
    """Past either, the kernel's OOM killer ends the run: a limit above the machine's
    memory (or none) is bound by the machine's."""
    machine = residency.physical_memory()
    assert residency.memory_bound(None) == machine
    assert residency.memory_bound(machine + 1) == machine
    assert residency.memory_bound(machine - 1) == machine - 1
    found = memory.peak(rows=240, height=20, width=195, outputs=3, batch_size=40, memory_limit=None)
    beyond = memory.Estimate(machine + 1, found.parts, found.resident)
    with pytest.raises(MemoryBudgetExceeded, match=r"this machine's .* of memory"):
        memory.check(beyond, 2 * machine, 40)  # below the limit, above the machine
    memory.check(found, 2 * machine, 40)


def test_the_parts_are_the_memory_event_s_fields() -> None:
    found = memory.peak(
        rows=240, height=20, width=195, outputs=3, batch_size=40, memory_limit=LIMIT
    )
    assert sorted(found.to_json()) == [
        "base_bytes", "batch_bytes", "data_bytes", "model_bytes", "peak_bytes", "resident",
        "setup_bytes",
    ]  # fmt: skip
    assert found.parts["base_bytes"] == memory.BASE
    assert found.parts["batch_bytes"] == 40 * (memory.PER_FEATURE * 3900 + memory.PER_OUTPUT * 3)


def test_a_split_of_exactly_a_quarter_of_the_limit_is_held() -> None:
    row = 4 * (3900 + 3)
    limit = 4 * row * 1000  # a quarter of it is 1000 rows exactly
    held = memory.peak(
        rows=1000, height=20, width=195, outputs=3, batch_size=10, memory_limit=limit
    )
    streamed = memory.peak(
        rows=1001, height=20, width=195, outputs=3, batch_size=10, memory_limit=limit
    )
    assert held.resident and not streamed.resident


def test_without_a_limit_a_quarter_of_physical_memory_decides() -> None:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert residency.resident_limit(None) == int(physical * residency.RESIDENT_SHARE)


def test_the_refusal_names_the_peak_the_limit_and_what_to_change() -> None:
    found = memory.peak(
        rows=240, height=20, width=195, outputs=3, batch_size=40, memory_limit=LIMIT
    )
    with pytest.raises(MemoryBudgetExceeded) as caught:
        memory.check(found, 810 * MIB, 40)  # above TensorFlow's ~803 MiB with the margin
    assert str(caught.value) == (
        f"the run would need about {found.total / MIB:,.0f} MiB of memory at its peak "
        "(TensorFlow 730 MiB, training split held in memory, batches of 40), more than the "
        "memory limit of 810 MiB; lower --batch-size or raise the limit"
    )


def test_below_what_tensorflow_alone_needs_the_advice_is_to_raise_the_limit() -> None:
    found = memory.peak(rows=240, height=20, width=195, outputs=3, batch_size=1, memory_limit=LIMIT)
    with pytest.raises(MemoryBudgetExceeded) as caught:
        memory.check(found, 600 * MIB, 1)  # a smaller batch can't help
    assert str(caught.value).endswith(
        "more than the memory limit of 600 MiB; raise the limit: TensorFlow alone needs about "
        "that much"
    )


def test_a_split_is_four_bytes_per_feature_value_and_label_of_each_row() -> None:
    assert residency.split_bytes(1000, 3900, 3) == 15_612_000  # float32: 4 × 1000 × (3900 + 3)


def test_the_tiny_set_s_estimate_part_by_part() -> None:
    """The rule of the module docstring on the tiny set, held in memory: 240 rows of 20×195
    features and 3 labels, batches of 40."""
    found = memory.peak(
        rows=240, height=20, width=195, outputs=3, batch_size=40, memory_limit=LIMIT
    )
    assert found.parts == {
        "base_bytes": 730 * MIB,
        "model_bytes": 1008,  # 16 bytes × (20 hidden units + a bias) × 3 outputs
        "setup_bytes": 3_746_880,  # the split: 240 × 4 × (3900 + 3)
        "data_bytes": 3_746_880,
        "batch_bytes": 6_868_800,  # 40 × (44 × 3900 + 40 × 3)
    }
    assert found.total == int((730 * MIB + 1008 + max(3_746_880, 3_746_880 + 6_868_800)) * 1.1)


def test_the_refusal_of_a_streamed_split_says_it_is_read_batch_by_batch() -> None:
    found = memory.peak(
        rows=100_000, height=20, width=195, outputs=3, batch_size=100, memory_limit=1 << 30
    )
    assert not found.resident
    with pytest.raises(MemoryBudgetExceeded, match="training split read batch by batch, batches"):
        memory.check(found, 800 * MIB, 100)
