"""The state of the tiers for people: per topic the hot and offloaded bytes and ledgers and
the deletions still queued for it, the global deletion backlog (``offloader status``'s), and
the bytes per tier over time.

Nothing records a history of the tiers: it is derived from the ledger rows, which stay after
retention deletes a ledger (``DeletionState.DELETED``). A ledger counts as hot from its
``created_ms`` (with its final size: an open ledger's growth is not spread over time) until
``hot_deleted_ms``, and as offloaded (``data_len``, the data object) from ``offloaded_ms``
until ``deleted_ms``. The history's last point therefore equals the current totals.

A ledger offloaded by streaming (PIP-76) counts as an offloaded ledger, but has no objects
of its own: the offloaded bytes of a topic also hold its segments' data objects
(``segments.data_len``) from the segment's ``offloaded_ms`` until retention releases it
(state ``deleted``, ``finished_ms``). Open segments' uploaded parts are in flight and count
nowhere; nor do failed segments' leftovers.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from offloader.metadata import MetadataStore
from offloader.metadata.clock import db_now_ms
from offloader.metadata.records import (
    DeletionBacklog,
    DeletionState,
    HotState,
    OffloadState,
    Record,
    SegmentState,
)
from offloader.metadata.schema import deletion_queue as D
from offloader.metadata.schema import ledgers as L
from offloader.metadata.schema import offload_attempts as A
from offloader.metadata.schema import segments as G
from offloader.metadata.schema import topics as T

#: The most points a history holds; longer ones keep evenly spread change points.
HISTORY_POINTS = 200


class TopicTiers(Record):
    """One topic's tiers now. Ledgers deleted by retention count nowhere; a ledger whose hot
    copy is being deleted still counts as hot (its files may still be there)."""

    topic: str
    state: str
    hot_ledgers: int
    hot_bytes: int
    offloaded_ledgers: int
    offloaded_bytes: int
    pending_deletions: int
    oldest_pending_deletion_ms: int | None


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
    with metadata.engine.connect() as conn:
        now = db_now_ms(conn)
    return TiersReport(
        now_ms=now,
        topics=topic_tiers(metadata),
        deletion_backlog=metadata.deletions.backlog(failing_tries),
        history=tier_history(metadata),
    )


def topic_tiers(metadata: MetadataStore) -> list[TopicTiers]:
    """Per topic (by name, deleted topics too) the bytes and ledgers in each tier and the
    pending deletions of its ledgers and of its offload attempts' leftovers. Offloaded bytes
    are the ledgers' own data objects plus the topic's offloaded segments'."""
    live = L.c.deletion_state != DeletionState.DELETED.value
    hot = sa.and_(live, L.c.hot_state != HotState.DELETED.value)
    offloaded = sa.and_(live, L.c.offload_state == OffloadState.OFFLOADED.value)
    tiers = sa.select(
        L.c.topic,
        sa.func.count().filter(hot),
        sa.func.coalesce(sa.func.sum(L.c.size_bytes).filter(hot), 0),
        sa.func.count().filter(offloaded),
        sa.func.coalesce(sa.func.sum(L.c.data_len).filter(offloaded), 0),
    ).group_by(L.c.topic)
    owner = sa.func.coalesce(D.c.topic, A.c.topic)
    deletions = (
        sa.select(owner, sa.func.count(), sa.func.min(D.c.enqueued_ms))
        .select_from(D.outerjoin(A, A.c.attempt_id == D.c.attempt_id))
        .where(D.c.state == "pending", owner.is_not(None))
        .group_by(owner)
    )
    segments = (
        sa.select(G.c.topic, sa.func.coalesce(sa.func.sum(G.c.data_len), 0))
        .where(G.c.state == SegmentState.OFFLOADED.value)
        .group_by(G.c.topic)
    )
    with metadata.engine.connect() as conn:
        names = conn.execute(sa.select(T.c.name, T.c.state).order_by(T.c.name)).all()
        by_topic = {row[0]: row[1:] for row in conn.execute(tiers)}
        queued = {row[0]: row[1:] for row in conn.execute(deletions)}
        streamed = {topic: int(size) for topic, size in conn.execute(segments)}
    result = []
    for name, state in names:
        hot_n, hot_b, off_n, off_b = by_topic.get(name, (0, 0, 0, 0))
        off_b += streamed.get(name, 0)
        pending, oldest = queued.get(name, (0, None))
        result.append(
            TopicTiers(
                topic=name,
                state=state,
                hot_ledgers=hot_n,
                hot_bytes=hot_b,
                offloaded_ledgers=off_n,
                offloaded_bytes=off_b,
                pending_deletions=pending,
                oldest_pending_deletion_ms=oldest,
            )
        )
    return result


def tier_history(metadata: MetadataStore, points: int = HISTORY_POINTS) -> list[TierSample]:
    """Bytes per tier over time, derived from the ledgers' timestamps (module docstring)."""
    columns = (
        L.c.size_bytes,
        L.c.created_ms,
        L.c.hot_state,
        L.c.hot_deleted_ms,
        L.c.offload_state,
        L.c.data_len,
        L.c.offloaded_ms,
        L.c.deletion_state,
        L.c.deleted_ms,
    )
    kept = [SegmentState.OFFLOADED.value, SegmentState.DELETED.value]
    with metadata.engine.connect() as conn:
        rows = conn.execute(sa.select(*columns)).all()
        segments = conn.execute(
            sa.select(G.c.data_len, G.c.offloaded_ms, G.c.state, G.c.finished_ms).where(
                G.c.state.in_(kept), G.c.offloaded_ms.is_not(None)
            )
        ).all()
    changes: list[tuple[int, int, int]] = []  # (at_ms, hot delta, offloaded delta)
    for size, created, hot, hot_gone, offload, data_len, offloaded, deletion, deleted in rows:
        changes.append((created, size, 0))
        if hot == HotState.DELETED.value or deletion == DeletionState.DELETED.value:
            changes.append((hot_gone or deleted or created, -size, 0))
        if offload == OffloadState.OFFLOADED.value and offloaded is not None:
            changes.append((offloaded, 0, data_len or 0))
            if deletion == DeletionState.DELETED.value:
                changes.append((max(deleted or offloaded, offloaded), 0, -(data_len or 0)))
    for data_len, offloaded, state, finished in segments:  # streamed ledgers' bytes
        changes.append((offloaded, 0, data_len))
        if state == SegmentState.DELETED.value:
            changes.append((max(finished or offloaded, offloaded), 0, -data_len))
    return _thin(list(_steps(changes)), points)


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
