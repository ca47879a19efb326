"""What the tier metrics observe, read in a fixed handful of aggregate statements: per topic
the lags (what waits to be offloaded, streamed, or have its hot copy deleted) and the
counts of tiered objects, and the rows of every metadata table. Never an object-store
request, never a loop over ledgers in Python: the number of statements does not grow with
the number of ledgers (offloader/metrics/observe.py shapes the result, and says what each
figure means).

Every time is the database's: ``now_ms`` is read once, first, and the per-topic hot-copy
deletion lag (its policy's ``deletion_lag_seconds``) is applied in SQL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.metadata import schema, totals
from offloader.metadata._rows import topic_from_row
from offloader.metadata.clock import db_now_ms
from offloader.metadata.engine import Database
from offloader.metadata.records import (
    DeletionState,
    HotState,
    LedgerState,
    OffloadMode,
    OffloadState,
    Record,
    SegmentOrigin,
    SegmentState,
    Topic,
    TopicTiers,
)

T, L, A, D, G = (
    schema.topics,
    schema.ledgers,
    schema.offload_attempts,
    schema.deletion_queue,
    schema.segments,
)
_OPEN = [SegmentState.ASSIGNED.value, SegmentState.CLOSING.value]


class TopicFacts(Record):
    """One topic's raw figures (times in epoch milliseconds, database clock)."""

    topic: Topic
    tiers: TopicTiers  # what `offloader status` shows of it (metadata/totals.py)
    # live sealed ledgers with entries, not offloaded, hot copy present (what offload waits on)
    unoffloaded_ledgers: int = 0
    unoffloaded_bytes: int = 0
    oldest_unoffloaded_sealed_ms: int | None = None
    # live offloaded ledgers whose hot copy is not deleted though their deletion lag passed
    hot_overdue_ledgers: int = 0
    hot_overdue_bytes: int = 0
    oldest_hot_due_ms: int | None = None  # offloaded_ms + deletion lag of the oldest
    ledger_objects: int = 0  # data and index objects of offloaded ledgers (ledger mode)
    offloaded_segments: int = 0
    open_segment_assigned_ms: int | None = None  # the stream's open segment, if any
    failing_deletions: int = 0  # its pending keys tried >= failing_tries times


class MetadataFacts(Record):
    now_ms: int
    topics: list[TopicFacts]
    rows: dict[str, int]  # per metadata table (its SQL name)


class ObservationStore:
    """``metadata.observations``: the figures of offloader/metrics/observe.py."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def read(self, failing_tries: int) -> MetadataFacts:
        """Every figure, from one snapshot where the database gives one (PostgreSQL's
        repeatable read; SQLite's transaction holds the database lock anyway). A topic
        created between two statements elsewhere is left out rather than half read."""
        with self.db.engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn = conn.execution_options(isolation_level="REPEATABLE READ")
            now = db_now_ms(conn)
            topics = [topic_from_row(r) for r in conn.execute(sa.select(T)).mappings()]
            tiers = {t.topic: t for t in totals.topic_tiers(conn)}
            facts: dict[str, dict[str, object]] = {
                t.name: {"topic": t, "tiers": tiers[t.name]} for t in topics if t.name in tiers
            }
            figures: list[Mapping[str, Mapping[str, object]]] = [
                _ledger_figures(conn, topics, now),
                _segment_figures(conn),
                {
                    n: {"failing_deletions": f}
                    for n, f in _failing_deletions(conn, failing_tries).items()
                },
            ]
            for found in figures:
                for name, values in found.items():
                    if name in facts:
                        facts[name].update(values)
            rows = row_counts(conn)
        return MetadataFacts(
            now_ms=now,
            topics=[TopicFacts.model_validate(facts[name]) for name in sorted(facts)],
            rows=rows,
        )


def _ledger_figures(
    conn: Connection, topics: Sequence[Topic], now: int
) -> dict[str, dict[str, int | None]]:
    """One grouped statement over the ledgers: the offload and hot-deletion lags and the
    ledgers' own objects. The deletion lag is the topic's, as a CASE on the topic."""
    if not topics:
        return {}
    lag_ms = {t.name: int(t.policy.deletion_lag_seconds * 1000) for t in topics}
    due_at = L.c.offloaded_ms + sa.case(lag_ms, value=L.c.topic, else_=0)
    live = sa.and_(
        L.c.deletion_state == DeletionState.NONE.value, L.c.ledger_id >= T.c.start_ledger_id
    )
    waiting = sa.and_(
        live,
        L.c.state == LedgerState.SEALED.value,
        L.c.entry_count > 0,
        L.c.offload_state != OffloadState.OFFLOADED.value,
        L.c.hot_state == HotState.PRESENT.value,
    )
    overdue = sa.and_(
        live,
        L.c.offload_state == OffloadState.OFFLOADED.value,
        L.c.hot_state != HotState.DELETED.value,
        due_at <= now,
    )
    own_objects = sa.and_(
        L.c.deletion_state != DeletionState.DELETED.value,  # as status counts offloaded
        L.c.offload_state == OffloadState.OFFLOADED.value,
        L.c.offload_mode == OffloadMode.LEDGER.value,
    )
    query = (
        sa.select(
            L.c.topic,
            sa.func.count().filter(waiting),
            sa.func.coalesce(sa.func.sum(L.c.size_bytes).filter(waiting), 0),
            sa.func.min(L.c.sealed_ms).filter(waiting),
            sa.func.count().filter(overdue),
            sa.func.coalesce(sa.func.sum(L.c.size_bytes).filter(overdue), 0),
            sa.func.min(due_at).filter(overdue),
            sa.func.count(L.c.data_key).filter(own_objects)
            + sa.func.count(L.c.index_key).filter(own_objects),
        )
        .join_from(L, T, T.c.name == L.c.topic)
        .group_by(L.c.topic)
    )
    names = (
        "unoffloaded_ledgers",
        "unoffloaded_bytes",
        "oldest_unoffloaded_sealed_ms",
        "hot_overdue_ledgers",
        "hot_overdue_bytes",
        "oldest_hot_due_ms",
        "ledger_objects",
    )
    return {row[0]: dict(zip(names, _ints(row[1:]), strict=True)) for row in conn.execute(query)}


def _segment_figures(conn: Connection) -> dict[str, dict[str, int | None]]:
    """Offloaded segments (any writer) and the stream's open one, per topic."""
    stream_open = sa.and_(G.c.state.in_(_OPEN), G.c.origin == SegmentOrigin.STREAM.value)
    query = sa.select(
        G.c.topic,
        sa.func.count().filter(G.c.state == SegmentState.OFFLOADED.value),
        sa.func.min(G.c.assigned_ms).filter(stream_open),
    ).group_by(G.c.topic)
    names = ("offloaded_segments", "open_segment_assigned_ms")
    return {row[0]: dict(zip(names, _ints(row[1:]), strict=True)) for row in conn.execute(query)}


def _failing_deletions(conn: Connection, failing_tries: int) -> dict[str, int]:
    """Pending keys tried ``failing_tries`` times or more, per owning topic (the owner as
    ``status`` counts pending deletions: the ledger's topic, else the attempt's)."""
    owner = sa.func.coalesce(D.c.topic, A.c.topic)
    query = (
        sa.select(owner, sa.func.count())
        .select_from(D.outerjoin(A, A.c.attempt_id == D.c.attempt_id))
        .where(D.c.state == "pending", D.c.tries >= failing_tries, owner.is_not(None))
        .group_by(owner)
    )
    return {name: int(count) for name, count in conn.execute(query)}


def row_counts(conn: Connection) -> dict[str, int]:
    """Rows of every table of the schema, in one statement (Kafka's
    RemoteLogMetadataCount, table by table)."""
    tables = schema.metadata.sorted_tables
    query = sa.union_all(
        *(
            sa.select(sa.literal(t.name).label("t"), sa.func.count().label("n")).select_from(t)
            for t in tables
        )
    )
    return {name: int(count) for name, count in conn.execute(query)}


def _ints(values: Sequence[object]) -> list[int | None]:
    """Aggregates as ints (PostgreSQL's SUM of BIGINT is NUMERIC)."""
    return [None if v is None else int(v) for v in values]  # type: ignore[call-overload]
