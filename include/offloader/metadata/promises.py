"""The metadata's side of `offloader verify` (offloader/verify/): read-only questions about
what the rows promise, each one statement, none of them a scan of the object store.

- :func:`expected_objects`: the objects a store must hold in a range of keys (committed v1
  offloads of live ledgers, offloaded segments), with their recorded data lengths; the key
  range is compared in byte order, the order a LIST returns keys in, so a listing can be
  merged with it page by page in constant memory;
- :func:`recorded_keys`: which keys any row names at all (invariant 1: a key is recorded
  before its first byte), in whatever state;
- :func:`double_commits`: ledgers with more than one committed offload;
- :func:`live_below_start`: ledgers wholly below their topic's start that are not on their
  way out;
- :func:`queued_but_referenced`: pending deletions of keys a live row still references.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from offloader.metadata import schema
from offloader.metadata.engine import Database
from offloader.metadata.records import (
    AttemptState,
    DeletionState,
    OffloadMode,
    OffloadState,
    SegmentState,
    TopicState,
)

T, L, A, D = schema.topics, schema.ledgers, schema.offload_attempts, schema.deletion_queue
G = schema.segments
LIVE_SEGMENTS = (SegmentState.ASSIGNED, SegmentState.CLOSING, SegmentState.OFFLOADED)


@dataclass(frozen=True)
class ExpectedObject:
    """An object a row promises: its key, the data length recorded (None for an index,
    whose length no row records) and what it belongs to."""

    key: str
    size: int | None
    topic: str
    ledger_id: int | None  # a v1 offload's ledger
    segment_id: str | None  # a segment's objects

    @property
    def owner(self) -> str:
        if self.segment_id is not None:
            return f"segment {self.segment_id} of topic {self.topic!r}"
        return f"ledger {self.topic}/{self.ledger_id}"


def _binary(db: Database, column: Any) -> ColumnElement[Any]:
    """``column`` compared byte by byte (a LIST's order), whatever the database's collation."""
    return column.collate("C") if db.engine.dialect.name == "postgresql" else column


def expected_objects(
    db: Database,
    store_id: int,
    *,
    after: str | None,
    up_to: str | None,
    committed_by_ms: int,
    topic: str | None = None,
) -> list[ExpectedObject]:
    """The objects ``store_id`` must hold with keys in (``after``, ``up_to``] (None: open
    ended), committed at or before ``committed_by_ms`` (a commit made while verify listed
    is not judged): the data and index objects of every live ledger offloaded in ledger
    mode at or above its topic's start ledger, and of every offloaded segment; of ``topic``
    only, if given."""
    at_or_above_start = sa.exists().where(
        T.c.name == L.c.topic, L.c.ledger_id >= T.c.start_ledger_id
    )  # a live ledger below the start is a breach of its own (live_below_start)
    ledger_rows = sa.and_(
        at_or_above_start,
        L.c.store_id == store_id,
        L.c.offload_state == OffloadState.OFFLOADED,
        L.c.offload_mode == OffloadMode.LEDGER,
        L.c.deletion_state == DeletionState.NONE,
        L.c.offloaded_ms <= committed_by_ms,
    )
    segment_rows = sa.and_(
        G.c.store_id == store_id,
        G.c.state == SegmentState.OFFLOADED,
        G.c.offloaded_ms <= committed_by_ms,
    )
    if topic is not None:
        ledger_rows = sa.and_(ledger_rows, L.c.topic == topic)
        segment_rows = sa.and_(segment_rows, G.c.topic == topic)
    null_id = sa.null().cast(sa.String)
    null_size = sa.null().cast(sa.BigInteger)
    selects = []
    for key, size in ((L.c.data_key, L.c.data_len), (L.c.index_key, null_size)):
        where = sa.and_(ledger_rows, _in_range(db, key, after, up_to))
        selects.append(
            sa.select(key.label("k"), size.label("size"), L.c.topic, L.c.ledger_id, null_id).where(
                where
            )
        )
    for key, size in ((G.c.data_key, G.c.data_len), (G.c.index_key, null_size)):
        where = sa.and_(segment_rows, _in_range(db, key, after, up_to))
        selects.append(
            sa.select(key, size, G.c.topic, sa.null().cast(sa.BigInteger), G.c.segment_id).where(
                where
            )
        )
    with db.engine.connect() as conn:
        rows = conn.execute(sa.union_all(*selects)).all()
    return [ExpectedObject(*row) for row in rows]


def _in_range(db: Database, key: Any, after: str | None, up_to: str | None) -> ColumnElement[bool]:
    conditions: list[ColumnElement[bool]] = [key.is_not(None)]
    if after is not None:
        conditions.append(_binary(db, key) > after)
    if up_to is not None:
        conditions.append(_binary(db, key) <= up_to)
    return sa.and_(*conditions)


def recorded_keys(db: Database, keys: Iterable[str]) -> set[str]:
    """Which of ``keys`` any row names, whatever its state: a ledger, an attempt, a
    segment, a deletion (pending or done). A key no row names was never recorded."""
    keys = list(keys)
    if not keys:
        return set()
    query = sa.union(
        sa.select(L.c.data_key.label("k")).where(L.c.data_key.in_(keys)),
        sa.select(L.c.index_key).where(L.c.index_key.in_(keys)),
        sa.select(A.c.data_key).where(A.c.data_key.in_(keys)),
        sa.select(A.c.index_key).where(A.c.index_key.in_(keys)),
        sa.select(G.c.data_key).where(G.c.data_key.in_(keys)),
        sa.select(G.c.index_key).where(G.c.index_key.in_(keys)),
        sa.select(D.c.object_key).where(D.c.object_key.in_(keys)),
    )
    with db.engine.connect() as conn:
        return set(conn.execute(query).scalars())


@dataclass(frozen=True)
class DoubleCommit:
    """A ledger whose committed attempts are not exactly the offload its row names."""

    topic: str
    ledger_id: int
    committed: tuple[str, ...]  # its attempts in state committed
    recorded: str | None  # the attempt its row names (offload_uuid)
    mode: str  # its offload mode: a streamed ledger names no attempt


def double_commits(db: Database, topic: str | None = None) -> list[DoubleCommit]:
    """Ledgers with two committed attempts, or a committed attempt their row does not name
    as its offload (a streamed ledger's v1 attempt must have been superseded)."""
    committed = A.c.state == AttemptState.COMMITTED
    joined = A.join(L, sa.and_(L.c.topic == A.c.topic, L.c.ledger_id == A.c.ledger_id))
    stray = sa.or_(
        L.c.offload_uuid.is_(None),
        L.c.offload_uuid != A.c.attempt_id,
        L.c.offload_mode != OffloadMode.LEDGER,
    )
    twice = (
        sa.select(A.c.topic, A.c.ledger_id)
        .where(committed)
        .group_by(A.c.topic, A.c.ledger_id)
        .having(sa.func.count() > 1)
    )
    strays = sa.select(A.c.topic, A.c.ledger_id).select_from(joined).where(committed, stray)
    if topic is not None:
        twice = twice.where(A.c.topic == topic)
        strays = strays.where(A.c.topic == topic)
    bad = sa.union(twice, strays).subquery()
    query = (
        sa.select(L.c.topic, L.c.ledger_id, L.c.offload_uuid, L.c.offload_mode, A.c.attempt_id)
        .select_from(bad)
        .join(L, sa.and_(L.c.topic == bad.c.topic, L.c.ledger_id == bad.c.ledger_id))
        .join(A, sa.and_(A.c.topic == L.c.topic, A.c.ledger_id == L.c.ledger_id))
        .where(committed)
        .order_by(L.c.topic, L.c.ledger_id, A.c.attempt_id)
    )
    found: dict[tuple[str, int], DoubleCommit] = {}
    with db.engine.connect() as conn:
        for name, ledger_id, recorded, mode, attempt_id in conn.execute(query):
            seen = found.get((name, ledger_id))
            attempts = (*seen.committed, attempt_id) if seen else (attempt_id,)
            found[(name, ledger_id)] = DoubleCommit(name, ledger_id, attempts, recorded, mode)
    return list(found.values())


@dataclass(frozen=True)
class LiveBelowStart:
    """A ledger wholly below its topic's start that is not deleting or deleted."""

    topic: str
    ledger_id: int
    start: str  # the topic's start, L:E
    offload_state: str
    hot_state: str


def live_below_start(db: Database, topic: str | None = None) -> list[LiveBelowStart]:
    """Ledgers of topics not deleted whose id is below the topic's start ledger and whose
    deletion state is still ``none`` (invariant 4: the start moves, then they go)."""
    query = (
        sa.select(
            L.c.topic,
            L.c.ledger_id,
            T.c.start_ledger_id,
            T.c.start_entry_id,
            L.c.offload_state,
            L.c.hot_state,
        )
        .join(T, T.c.name == L.c.topic)
        .where(
            T.c.state != TopicState.DELETED,
            L.c.ledger_id < T.c.start_ledger_id,
            L.c.deletion_state == DeletionState.NONE,
        )
        .order_by(L.c.topic, L.c.ledger_id)
    )
    if topic is not None:
        query = query.where(L.c.topic == topic)
    with db.engine.connect() as conn:
        return [
            LiveBelowStart(name, ledger_id, f"{sl}:{se}", offload, hot)
            for name, ledger_id, sl, se, offload, hot in conn.execute(query)
        ]


def last_entry_below(db: Database, topic: str, start_ledger_id: int) -> tuple[int, int] | None:
    """(ledger id, entry id) of the last entry of the last non-empty ledger below
    ``start_ledger_id``; None when there is none."""
    query = (
        sa.select(L.c.ledger_id, L.c.entry_count)
        .where(L.c.topic == topic, L.c.ledger_id < start_ledger_id, L.c.entry_count > 0)
        .order_by(L.c.ledger_id.desc())
        .limit(1)
    )
    with db.engine.connect() as conn:
        row = conn.execute(query).first()
    return None if row is None else (row[0], row[1] - 1)


@dataclass(frozen=True)
class QueuedButReferenced:
    """A pending deletion of a key a live row still references."""

    deletion_id: int
    key: str
    reason: str
    topic: str
    owner: str  # what references it: ``ledger T/L`` or ``segment <id>``


def queued_but_referenced(db: Database, topic: str | None = None) -> list[QueuedButReferenced]:
    """Pending deletions whose key is a live ledger's committed v1 object (offloaded, ledger
    mode, not deleting) or a segment's while it is assigned, closing or offloaded."""
    pending = D.c.state == "pending"
    live_ledger = sa.and_(
        L.c.offload_state == OffloadState.OFFLOADED,
        L.c.offload_mode == OffloadMode.LEDGER,
        L.c.deletion_state == DeletionState.NONE,
    )
    selects = []
    for key in (L.c.data_key, L.c.index_key):
        ledger_id = sa.cast(L.c.ledger_id, sa.String)
        owner = sa.literal("ledger ") + L.c.topic + sa.literal("/") + ledger_id
        where = sa.and_(pending, live_ledger, D.c.object_key == key)
        if topic is not None:
            where = sa.and_(where, L.c.topic == topic)
        selects.append(
            sa.select(D.c.id, D.c.object_key, D.c.reason, L.c.topic, owner.label("owner")).where(
                where
            )
        )
    for key in (G.c.data_key, G.c.index_key):
        where = sa.and_(pending, G.c.state.in_(LIVE_SEGMENTS), D.c.object_key == key)
        if topic is not None:
            where = sa.and_(where, G.c.topic == topic)
        owner = sa.literal("segment ") + G.c.segment_id
        selects.append(sa.select(D.c.id, D.c.object_key, D.c.reason, G.c.topic, owner).where(where))
    with db.engine.connect() as conn:
        rows = conn.execute(sa.union(*selects)).all()
    return sorted((QueuedButReferenced(*row) for row in rows), key=lambda q: q.deletion_id)
