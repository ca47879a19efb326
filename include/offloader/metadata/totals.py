"""Totals over the whole metadata, what people look at: rows by state (``offloader
status``), each topic's bytes and ledgers per tier now, and the changes of bytes per tier
and of the lags over time (offloader/status.py turns those into the tiered-storage view's
histories).

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

The lags' history is derived the same way. A sealed ledger with entries adds its size to
the offload lag at ``sealed_ms`` and takes it away when it stopped waiting: offloaded, its
hot copy gone or retention deleting it (the earliest of ``offloaded_ms``,
``hot_deleted_ms``, ``deleting_ms``, ``deleted_ms``), so the last point is the lag the
metrics count (metrics/observe.py) but for ledgers a trim cut short left unmarked. A
deletion-queue key adds one to the deletion backlog at ``enqueued_ms`` and takes it away
at ``done_ms``.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.metadata import schema
from offloader.metadata.records import (
    DeletionState,
    HotState,
    OffloadState,
    SegmentState,
    TopicTiers,
)

T, L, A, D = schema.topics, schema.ledgers, schema.offload_attempts, schema.deletion_queue
G = schema.segments


def counts(conn: Connection) -> dict[str, object]:
    """Rows by state, table by table, and the oldest pending deletion: ``offloader status``."""

    def grouped(*cols: sa.Column) -> dict[str, int]:
        query = sa.select(*cols, sa.func.count()).group_by(*cols)
        return {"/".join(str(v) for v in row[:-1]): row[-1] for row in conn.execute(query)}

    oldest = conn.execute(
        sa.select(sa.func.min(D.c.enqueued_ms)).where(D.c.state == "pending")
    ).scalar()
    return {
        "topics": conn.execute(sa.select(sa.func.count()).select_from(T)).scalar(),
        "ledgers_by_state": grouped(L.c.state, L.c.offload_state, L.c.hot_state),
        "attempts_by_state": grouped(A.c.state),
        "deletions_by_state": grouped(D.c.state),
        "oldest_pending_deletion_ms": oldest,
        # streaming segments (PIP-76); streamed ledgers are in ledgers_by_state as
        # offloaded, like the ones offloaded ledger by ledger
        "segments_by_state": grouped(schema.segments.c.state),
        # who wrote them: the stream, or a rewrite (compaction, format migration)
        "segments_by_origin": grouped(schema.segments.c.origin, schema.segments.c.state),
    }


def topic_tiers(conn: Connection) -> list[TopicTiers]:
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


def tier_changes(conn: Connection) -> list[tuple[int, int, int]]:
    """Every change of bytes per tier as (at_ms, hot delta, offloaded delta), unordered,
    derived from the ledgers' and segments' timestamps (module docstring)."""
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
    return changes


def lag_changes(conn: Connection) -> list[tuple[int, int, int]]:
    """Every change of the lags as (at_ms, offload lag bytes delta, deletion backlog keys
    delta), unordered, derived from the ledgers' and the deletion queue's timestamps
    (module docstring)."""
    sealed = conn.execute(
        sa.select(
            L.c.size_bytes,
            L.c.sealed_ms,
            L.c.offload_state,
            L.c.offloaded_ms,
            L.c.hot_deleted_ms,
            L.c.deleting_ms,
            L.c.deleted_ms,
        ).where(L.c.sealed_ms.is_not(None), L.c.entry_count > 0)
    ).all()
    queued = conn.execute(sa.select(D.c.enqueued_ms, D.c.state, D.c.done_ms)).all()
    changes: list[tuple[int, int, int]] = []  # (at_ms, offload lag delta, backlog delta)
    for size, sealed_ms, offload, offloaded, hot_gone, deleting, deleted in sealed:
        changes.append((sealed_ms, size, 0))
        if offload != OffloadState.OFFLOADED.value:
            offloaded = None  # a failed re-offload's leftover stamp (tier_changes' tests)
        ends = [t for t in (offloaded, hot_gone, deleting, deleted) if t is not None]
        if ends:
            changes.append((max(min(ends), sealed_ms), -size, 0))
    for enqueued, state, done in queued:
        changes.append((enqueued, 0, 1))
        if state != "pending":
            changes.append((max(done or enqueued, enqueued), 0, -1))
    return changes
