"""plan_segment_end (stream/history.py): the binary search over sealed history's cumulative
framed sizes agrees with a linear scan, for any ledger and entry sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offloader.format.layout import ENTRY_FRAME
from offloader.metadata.records import Position
from offloader.stream.history import SealedSpan, plan_segment_end

# ledger id -> its entries' payload sizes
History = dict[int, list[int]]


@st.composite
def histories(draw: st.DrawFn) -> tuple[History, dict[int, int], int]:
    """Sealed ledgers (ids rising, not contiguous), each with a first entry the stream
    starts from (past the end for a ledger already streamed), and a max_bytes."""
    count = draw(st.integers(1, 6))
    ids = sorted(draw(st.sets(st.integers(0, 50), min_size=count, max_size=count)))
    history = {lid: draw(st.lists(st.integers(0, 300), min_size=1, max_size=25)) for lid in ids}
    firsts = {lid: draw(st.integers(0, len(sizes))) for lid, sizes in history.items()}
    total = sum(
        sum(s + ENTRY_FRAME for s in sizes[firsts[lid] :]) for lid, sizes in history.items()
    )
    max_bytes = draw(st.integers(1, total + 200))
    return history, firsts, max_bytes


def linear_end(history: History, firsts: dict[int, int], max_bytes: int) -> Position | None:
    total = 0
    for lid, sizes in history.items():
        for entry_id in range(firsts[lid], len(sizes)):
            total += sizes[entry_id] + ENTRY_FRAME
            if total >= max_bytes:
                return Position(ledger_id=lid, entry_id=entry_id)
    return None


def spans(history: History, firsts: dict[int, int]) -> list[SealedSpan]:
    return [
        SealedSpan(lid, firsts[lid], len(sizes), sum(s + ENTRY_FRAME for s in sizes[firsts[lid] :]))
        for lid, sizes in history.items()
    ]


@given(histories())
def test_the_split_is_the_first_position_reaching_max_bytes(
    case: tuple[History, dict[int, int], int],
) -> None:
    history, firsts, max_bytes = case
    reads: list[tuple[int, int]] = []

    def entry_sizes(ledger_id: int, first: int) -> list[int]:
        reads.append((ledger_id, first))
        return history[ledger_id][first:]

    end = plan_segment_end(spans(history, firsts), max_bytes, entry_sizes)
    assert end == linear_end(history, firsts, max_bytes)
    # entry sizes are read only for the one ledger the limit falls in
    assert len(reads) == (0 if end is None else 1)
    if end is not None:
        assert reads == [(end.ledger_id, firsts[end.ledger_id])]


def test_history_smaller_than_a_segment_plans_no_end() -> None:
    sizes = {1: [10, 10], 2: [5]}
    history = [SealedSpan(1, 0, 2, 44), SealedSpan(2, 0, 1, 17)]
    assert plan_segment_end(history, 62, lambda lid, first: sizes[lid][first:]) is None
    assert plan_segment_end(history, 61, lambda lid, first: sizes[lid][first:]) == Position(
        ledger_id=2, entry_id=0
    )
    assert plan_segment_end([], 1, lambda lid, first: []) is None


def test_exact_boundaries() -> None:
    sizes = {3: [88, 88, 88]}  # 100 bytes framed each
    history = [SealedSpan(3, 0, 3, 300)]

    def entry_sizes(lid: int, first: int) -> list[int]:
        return sizes[lid][first:]

    assert plan_segment_end(history, 1, entry_sizes) == Position(ledger_id=3, entry_id=0)
    assert plan_segment_end(history, 100, entry_sizes) == Position(ledger_id=3, entry_id=0)
    assert plan_segment_end(history, 101, entry_sizes) == Position(ledger_id=3, entry_id=1)
    assert plan_segment_end(history, 300, entry_sizes) == Position(ledger_id=3, entry_id=2)
    assert plan_segment_end(history, 301, entry_sizes) is None
    # a stream resuming mid-ledger counts from its first entry
    resumed = [SealedSpan(3, 1, 3, 200)]
    assert plan_segment_end(resumed, 101, entry_sizes) == Position(ledger_id=3, entry_id=2)
    with pytest.raises(ValueError, match="max_bytes must be positive"):
        plan_segment_end(history, 0, entry_sizes)
