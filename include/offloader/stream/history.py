"""Splitting sealed history into segments of about the maximum size (PIP-76 on a topic that
turns streaming on with a backlog of sealed, not yet offloaded ledgers).

The boundaries are found by binary search over cumulative sizes: first over the ledgers'
recorded sizes, then, inside the ledger where the limit falls, over its entries' sizes. A
size counts an entry's payload plus its 12-byte frame, as the v2 blocks store it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from offloader.format.layout import ENTRY_FRAME
from offloader.metadata.records import Position


@dataclass(frozen=True)
class SealedSpan:
    """A sealed ledger's entries from ``first_entry_id`` to its end, and their bytes."""

    ledger_id: int
    first_entry_id: int
    entry_count: int  # of the whole ledger
    size_bytes: int  # framed bytes from first_entry_id to the end

    @property
    def last_entry_id(self) -> int:
        return self.entry_count - 1


EntrySizes = Callable[[int, int], Iterable[int]]  # (ledger_id, first entry) -> payload sizes


def plan_segment_end(
    spans: Sequence[SealedSpan], max_bytes: int, entry_sizes: EntrySizes
) -> Position | None:
    """The last position of a segment starting at ``spans[0]`` and holding about
    ``max_bytes``: the first entry at which the cumulative size reaches ``max_bytes``.
    None when the whole history is smaller (the segment goes on into live data)."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    spans = [s for s in spans if s.first_entry_id < s.entry_count]
    cumulative = list(itertools.accumulate(s.size_bytes for s in spans))
    i = bisect.bisect_left(cumulative, max_bytes)
    if i == len(spans):
        return None
    span = spans[i]
    before = cumulative[i - 1] if i else 0
    sizes = itertools.accumulate(
        size + ENTRY_FRAME for size in entry_sizes(span.ledger_id, span.first_entry_id)
    )
    inside = list(sizes)
    j = bisect.bisect_left(inside, max_bytes - before)
    entry_id = span.first_entry_id + min(j, len(inside) - 1)
    return Position(ledger_id=span.ledger_id, entry_id=min(entry_id, span.last_entry_id))
