"""The state of the tiers for people: per topic the hot and offloaded bytes and ledgers and
the deletions still queued for it, the global deletion backlog (``offloader status``'s), and
the bytes per tier over time.

The metadata store reads the totals and the changes (metadata/totals.py says how the
history is derived from the ledger and segment rows); this module shapes them.
"""

from __future__ import annotations

from collections.abc import Iterable

from offloader.metadata import MetadataStore
from offloader.metadata.records import DeletionBacklog, Record, TopicTiers

#: The most points a history holds; longer ones keep evenly spread change points.
HISTORY_POINTS = 200


class TierSample(Record):
    """Bytes in each tier from ``at_ms`` on (a step function over all topics)."""

    at_ms: int
    hot_bytes: int
    offloaded_bytes: int


class TiersReport(Record):
    now_ms: int
    topics: list[TopicTiers]
    deletion_backlog: DeletionBacklog
    history: list[TierSample]


def tiers_report(metadata: MetadataStore, failing_tries: int) -> TiersReport:
    """Everything the tiered-storage view shows, read in a few queries."""
    return TiersReport(
        now_ms=metadata.db_now_ms(),
        topics=metadata.topic_tiers(),
        deletion_backlog=metadata.deletions.backlog(failing_tries),
        history=tier_history(metadata),
    )


def tier_history(metadata: MetadataStore, points: int = HISTORY_POINTS) -> list[TierSample]:
    """Bytes per tier over time, at most ``points`` samples (metadata/totals.py)."""
    return _thin(list(_steps(metadata.tier_changes())), points)


def _steps(changes: list[tuple[int, int, int]]) -> Iterable[TierSample]:
    """Cumulative sums, one sample per distinct time."""
    hot = offloaded = 0
    changes.sort()
    for i, (at, d_hot, d_off) in enumerate(changes):
        hot += d_hot
        offloaded += d_off
        if i + 1 == len(changes) or changes[i + 1][0] != at:
            yield TierSample(at_ms=at, hot_bytes=hot, offloaded_bytes=offloaded)


def _thin(samples: list[TierSample], points: int) -> list[TierSample]:
    """At most ``points`` samples, evenly spread, always keeping the first and the last."""
    if points < 2:
        raise ValueError(f"points must be >= 2, got {points}")
    if len(samples) <= points:
        return samples
    step = (len(samples) - 1) / (points - 1)
    return [samples[round(i * step)] for i in range(points)]
