"""Which stream cut a topic's retention policy truncates at (PDP-19), as pure functions.

A truncation at cut ``c`` removes everything before ``c`` and keeps ``end.offset_bytes -
c.offset_bytes`` committed bytes, where ``end`` is a cut taken at the topic's end now.

- Time (keep at least T): the newest cut taken at or before ``now - T``. Everything it
  removes was written before that cut was taken, so it is at least T old.
- Size (keep at least S): PDP-19's lowest upper bound, the cut whose retained size is the
  smallest that is still >= S, i.e. the cut with the largest offset <= ``end - S``.
- Both: each rule sets a minimum to keep; the *stricter* rule is the one whose cut keeps
  more data, i.e. the earlier cut. Truncating there satisfies both minimums (the other
  rule's cut lies at or after it, so it keeps at least what that rule asks for). When a
  rule finds no cut, it forbids any truncation, and nothing is trimmed.

The bounds are computed once here; the metadata store applies the same bounds in SQL
(newest qualifying cut through an index) so nothing loads a topic's cut history;
:func:`in_list` applies them to a list. :func:`choose_cut` combines the rules for both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from offloader.policy import OffloadPolicy


class Cut(Protocol):
    """The fields of a stream cut the rules look at (``StreamCut`` has them)."""

    @property
    def ledger_id(self) -> int: ...
    @property
    def entry_id(self) -> int: ...
    @property
    def created_ms(self) -> int: ...
    @property
    def offset_bytes(self) -> int: ...


C = TypeVar("C", bound=Cut)


@dataclass(frozen=True)
class RetentionBounds:
    """The latest a truncation cut may lie under each rule the policy sets (None: unset)."""

    created_at_most_ms: int | None  # time rule: taken at or before this instant
    offset_at_most: int | None  # size rule: at most this many bytes from the first entry

    @property
    def active(self) -> bool:
        return self.created_at_most_ms is not None or self.offset_at_most is not None


def retention_bounds(policy: OffloadPolicy, now_ms: int, end_offset: int) -> RetentionBounds:
    """The bounds ``policy`` sets at database time ``now_ms`` for a topic ``end_offset``
    committed bytes long. A size bound below 0 (the topic holds less than S) is kept as is:
    no cut satisfies it, so nothing is trimmed."""
    created = None
    if policy.retention_time_seconds is not None:
        # whole milliseconds, rounded up: a fraction of a millisecond keeps more, not less
        created = now_ms - math.ceil(round(policy.retention_time_seconds * 1000, 6))
    offset = None
    if policy.retention_size_bytes is not None:
        offset = end_offset - policy.retention_size_bytes
    return RetentionBounds(created_at_most_ms=created, offset_at_most=offset)


def position(cut: Cut) -> tuple[int, int]:
    return (cut.ledger_id, cut.entry_id)


def stricter(time_cut: C | None, size_cut: C | None, bounds: RetentionBounds) -> C | None:
    """The cut to truncate at given each active rule's choice: the earlier one (it keeps
    more); None when an active rule found no cut or no rule is active."""
    chosen: list[C] = []
    for bound, cut in ((bounds.created_at_most_ms, time_cut), (bounds.offset_at_most, size_cut)):
        if bound is None:
            continue
        if cut is None:
            return None
        chosen.append(cut)
    return min(chosen, key=position, default=None)


Newest = Callable[[str, int], C | None]
"""``newest(field, at_most)``: the newest cut whose ``field`` (``created_ms`` or
``offset_bytes``) is at most ``at_most``; a list (:func:`in_list`) or SQL provides it."""


def choose_cut(bounds: RetentionBounds, newest: Newest[C]) -> C | None:
    """The cut the policy truncates at: each active rule's cut, the stricter of them."""
    by_time = by_size = None
    if bounds.created_at_most_ms is not None:
        by_time = newest("created_ms", bounds.created_at_most_ms)
    if bounds.offset_at_most is not None:
        by_size = newest("offset_bytes", bounds.offset_at_most)
    return stricter(by_time, by_size, bounds)


def in_list(cuts: Iterable[C]) -> Newest[C]:
    """:data:`Newest` over a list of cuts in any order. Cuts of a topic only move forward
    in time, bytes and position together; ties on ``field`` go to the later position
    (cuts at the same offset keep the same bytes, the later one also drops empty ledgers)."""
    listed = list(cuts)

    def newest(field: str, at_most: int) -> C | None:
        eligible = [c for c in listed if getattr(c, field) <= at_most]
        return max(eligible, key=lambda c: (getattr(c, field), position(c)), default=None)

    return newest


def newest_by_time(cuts: Iterable[C], created_at_most_ms: int) -> C | None:
    """The time rule: the newest cut taken at or before ``created_at_most_ms``."""
    return in_list(cuts)("created_ms", created_at_most_ms)


def lowest_upper_bound(cuts: Iterable[C], offset_at_most: int) -> C | None:
    """The size rule: the cut with the largest offset <= ``offset_at_most``."""
    return in_list(cuts)("offset_bytes", offset_at_most)
