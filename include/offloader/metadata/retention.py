"""Retention's metadata: stream cuts (PDP-19), the topic's start (invariant 4: reads below
it fail), topic deletion, and the deletion of the ledgers below the start, mark first and
delete second: a trim marks ledgers deleting with their keys queued in one transaction,
their hot copies go next, and a ledger becomes deleted once nothing of it is left queued
(the segments no ledger needs any more released in that same transaction).
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.exceptions import NotFoundError
from offloader.metadata import schema
from offloader.metadata._rows import cas, read_topic, refuse_deleted, topic_from_row
from offloader.metadata.clock import db_now, db_now_ms
from offloader.metadata.deletions import queue_selected
from offloader.metadata.engine import Database
from offloader.metadata.pieces import release_deleted
from offloader.metadata.records import (
    AttemptState,
    DeletionState,
    HotState,
    Ledger,
    LedgerState,
    OffloadState,
    Position,
    StreamCut,
    Topic,
    TopicState,
)

T, L, A, D = schema.topics, schema.ledgers, schema.offload_attempts, schema.deletion_queue
C = schema.stream_cuts


class RetentionStore:
    """Retention's half of the metadata store (``metadata.retention``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- stream cuts --------------------------------------------------------------------
    def create_cut(self, topic: str) -> StreamCut:
        """A cut at the current end of the topic's sealed data (the open ledger's entries
        have no recorded length yet), taken at the database's now, with the bytes of every
        ledger below it, deleted ones included (their rows stay). The bytes are the
        previous cut's plus those of the ledgers sealed since, so the cost follows what
        is new, not the topic's history."""
        with self.db.transaction() as conn:
            current = read_topic(conn, topic)
            refuse_deleted(current, "cut")
            end, offset = _end_and_offset(conn, current)
            cut_id = conn.execute(
                C.insert()
                .values(
                    topic=topic,
                    ledger_id=end.ledger_id,
                    entry_id=end.entry_id,
                    created_ms=db_now(),
                    offset_bytes=int(offset),
                )
                .returning(C.c.cut_id)
            ).scalar_one()
            return _cut(conn, topic, cut_id)

    def end_cut(self, topic: str) -> StreamCut:
        """The cut :meth:`create_cut` would take now, not stored (``cut_id`` 0): what a
        dry run of retention measures against."""
        with self.db.engine.connect() as conn:
            current = read_topic(conn, topic)
            refuse_deleted(current, "cut")
            end, offset = _end_and_offset(conn, current)
            return StreamCut(
                topic=topic,
                cut_id=0,
                ledger_id=end.ledger_id,
                entry_id=end.entry_id,
                created_ms=db_now_ms(conn),
                offset_bytes=offset,
            )

    def newest_cut(self, topic: str, field: str, at_most: int) -> StreamCut | None:
        """The topic's newest cut whose ``field`` (``created_ms`` or ``offset_bytes``) is
        at most ``at_most`` (retention's rules). Cuts of a topic grow in id, time, offset
        and position together, so this walks the topic's cut index back from the newest
        and stops at the first match: it reads the cuts newer than the bound, not the
        topic's history."""
        if field not in ("created_ms", "offset_bytes"):
            raise ValueError(f"cuts are selected by created_ms or offset_bytes, not {field!r}")
        with self.db.engine.connect() as conn:
            return _newest_cut(conn, topic, C.c[field] <= at_most)

    def list_cuts(self, topic: str) -> list[StreamCut]:
        """The topic's cuts, oldest first."""
        with self.db.engine.connect() as conn:
            read_topic(conn, topic)
            rows = conn.execute(
                sa.select(C).where(C.c.topic == topic).order_by(C.c.cut_id)
            ).mappings()
            return [StreamCut.model_validate(dict(r)) for r in rows]

    def get_cut(self, topic: str, cut_id: int) -> StreamCut:
        with self.db.engine.connect() as conn:
            read_topic(conn, topic)
            return _cut(conn, topic, cut_id)

    def end_of_sealed(self, topic: str) -> Position:
        """The position just past the topic's last sealed entry (see create_cut)."""
        with self.db.engine.connect() as conn:
            return _end_of_sealed(conn, read_topic(conn, topic))

    # --- the topic's start ------------------------------------------------------------
    def move_start(self, topic: Topic, position: Position) -> Topic:
        """Move the topic's start to ``position`` by CAS on the version ``topic`` was read
        at: reads below it fail from this commit on (invariant 4). Only forward."""
        if position <= topic.start:
            raise ValueError(f"start {topic.start} of topic {topic.name!r} only moves forward")
        return self._cas_active_topic(
            topic, start_ledger_id=position.ledger_id, start_entry_id=position.entry_id
        )

    def stores_holding(self, topic: str) -> list[int]:
        """Ids of the stores any ledger or segment of ``topic`` was offloaded to: where its
        recorded start must be (offloader/retention/start_record.py)."""
        S = schema.segments
        query = sa.union(
            sa.select(L.c.store_id).where(L.c.topic == topic, L.c.store_id.is_not(None)),
            sa.select(S.c.store_id).where(S.c.topic == topic),
        )
        with self.db.engine.connect() as conn:
            return sorted(int(x) for x in conn.execute(query).scalars())

    def delete_topic(self, topic: Topic) -> Topic:
        """Mark the topic deleted by CAS: its start moves past every ledger (open ones
        too) and its writer epoch moves on, so a live writer is fenced."""
        return self._cas_active_topic(
            topic,
            state=TopicState.DELETED,
            deleted_ms=db_now(),
            writer_epoch=T.c.writer_epoch + 1,
            start_ledger_id=T.c.next_ledger_id,
            start_entry_id=0,
        )

    def _cas_active_topic(self, topic: Topic, **values: object) -> Topic:
        """CAS on a topic that must still be active (a deleted topic never changes)."""
        with self.db.transaction() as conn:
            where = sa.and_(T.c.name == topic.name, T.c.state == TopicState.ACTIVE)
            cas(conn, T, where, topic.version, f"topic {topic.name!r}", **values)
            return read_topic(conn, topic.name)

    # --- ledger deletion: mark first, delete second -------------------------------------
    def ledgers_to_trim(self, topic: str, below: int) -> list[int]:
        """Ids of the live ledgers below ``below`` (what a trim there would mark)."""
        query = sa.select(L.c.ledger_id).where(_unmarked_below(topic, below))
        with self.db.engine.connect() as conn:
            return list(conn.execute(query.order_by(L.c.ledger_id)).scalars())

    def count_keys_to_trim(self, topic: str, below: int) -> int:
        """How many object keys a trim below ``below`` would queue (committed and in flight)."""
        with self.db.engine.connect() as conn:
            return 2 * int(
                conn.execute(
                    sa.select(
                        sa.func.count(L.c.offload_uuid) + sa.func.count(L.c.attempt_id)
                    ).where(_unmarked_below(topic, below))
                ).scalar_one()
            )

    def mark_ledgers_deleting(self, topic: str, below: int, limit: int) -> tuple[list[int], int]:
        """Mark up to ``limit`` live ledgers below ``below`` as deleting, in one transaction
        with their intent: committed objects and any attempt in flight queued for deletion
        (its attempt superseded, so a zombie that wrote late requeues its keys), hot copies
        marked deleting (mark first). Set-based: a few statements, whatever the count.
        Returns (marked ledger ids, keys queued)."""
        with self.db.transaction() as conn:
            last = conn.execute(
                sa.select(sa.func.max(sa.literal_column("ledger_id"))).select_from(
                    sa.select(L.c.ledger_id)
                    .where(_unmarked_below(topic, below))
                    .order_by(L.c.ledger_id)
                    .limit(limit)
                    .subquery()
                )
            ).scalar()
            if last is None:
                return [], 0
            hot = sa.case(
                (L.c.hot_state == HotState.PRESENT, HotState.DELETING), else_=L.c.hot_state
            )
            ids = sorted(
                conn.execute(
                    L.update()
                    .where(_unmarked_below(topic, last + 1))
                    .values(
                        version=L.c.version + 1,
                        deletion_state=DeletionState.DELETING,
                        deleting_ms=db_now(),
                        hot_state=hot,
                    )
                    .returning(L.c.ledger_id)
                ).scalars()
            )
            chunk = sa.and_(L.c.topic == topic, L.c.ledger_id.in_(ids))
            in_flight = sa.and_(
                chunk, A.c.attempt_id == L.c.attempt_id, A.c.state == AttemptState.STARTED
            )
            # (reason, the two keys, attempt, store, which rows): committed objects and
            # those of an attempt in flight, each queued with its store and its ledger
            sources = (
                (
                    "ledger trimmed",
                    L,
                    L.c.offload_uuid,
                    sa.and_(chunk, L.c.offload_uuid.is_not(None)),
                ),
                ("attempt of a trimmed ledger", A, A.c.attempt_id, in_flight),
            )
            queued = 0
            for reason, table, attempt, where in sources:
                for key in (table.c.data_key, table.c.index_key):
                    columns = (key, sa.literal(reason), attempt, table.c.store_id)
                    selected = sa.select(*columns, L.c.topic, L.c.ledger_id).where(where)
                    queued += queue_selected(conn, selected)
            conn.execute(
                A.update()
                .where(
                    A.c.attempt_id.in_(sa.select(L.c.attempt_id).where(chunk)),
                    A.c.state == AttemptState.STARTED,
                )
                .values(
                    state=AttemptState.SUPERSEDED,
                    finished_ms=db_now(),
                    detail="its ledger was trimmed",
                )
            )
            offloading = L.c.offload_state == OffloadState.OFFLOADING
            conn.execute(
                L.update()
                .where(chunk, L.c.attempt_id.is_not(None))
                .values(
                    attempt_id=None,
                    attempt_lease_ms=None,
                    offload_state=sa.case((offloading, OffloadState.NONE), else_=L.c.offload_state),
                )
            )
            return ids, queued

    def hot_copies_of_deleting(self, limit: int, topic: str | None = None) -> list[Ledger]:
        """Deleting ledgers whose hot copy is marked but not yet gone."""
        query = sa.select(L).where(
            L.c.deletion_state == DeletionState.DELETING, L.c.hot_state == HotState.DELETING
        )
        if topic is not None:
            query = query.where(L.c.topic == topic)
        with self.db.engine.connect() as conn:
            rows = conn.execute(query.order_by(L.c.topic, L.c.ledger_id).limit(limit)).mappings()
            return [Ledger.model_validate(dict(r)) for r in rows]

    def mark_hot_copies_deleted(self, topic: str, ledger_ids: Iterable[int]) -> None:
        """Second step of mark-first for trimmed ledgers whose hot files are gone."""
        ids = sorted(ledger_ids)
        if not ids:
            return
        with self.db.transaction() as conn:
            conn.execute(
                L.update()
                .where(
                    L.c.topic == topic,
                    L.c.ledger_id.in_(ids),
                    L.c.hot_state == HotState.DELETING,
                    L.c.deletion_state == DeletionState.DELETING,
                )
                .values(
                    version=L.c.version + 1, hot_state=HotState.DELETED, hot_deleted_ms=db_now()
                )
            )

    def topics_with_unmarked_ledgers(self) -> list[Topic]:
        """Topics whose start moved past ledgers not yet marked (a trim cut short)."""
        below = (
            sa.select(L.c.ledger_id)
            .where(
                L.c.topic == T.c.name,
                L.c.ledger_id < T.c.start_ledger_id,
                L.c.deletion_state == DeletionState.NONE,
            )
            .exists()
        )
        with self.db.engine.connect() as conn:
            rows = conn.execute(sa.select(T).where(below).order_by(T.c.name)).mappings()
            return [topic_from_row(r) for r in rows]

    def finish_deleted_ledgers(self, grace_ms: int = 0) -> int:
        """Deleting ledgers whose hot copy is gone and whose queued keys are all done become
        ``deleted``; how many did. Segments no ledger needs any more are released in the
        same transaction (``grace_ms``: see ``pieces.release_deleted``)."""
        pending = (
            sa.select(D.c.id)
            .where(D.c.topic == L.c.topic, D.c.ledger_id == L.c.ledger_id, D.c.state == "pending")
            .exists()
        )
        with self.db.transaction() as conn:
            result = conn.execute(
                L.update()
                .where(
                    L.c.deletion_state == DeletionState.DELETING,
                    L.c.hot_state == HotState.DELETED,
                    ~pending,
                )
                .values(
                    version=L.c.version + 1,
                    deletion_state=DeletionState.DELETED,
                    deleted_ms=db_now(),
                )
                .returning(L.c.topic, L.c.ledger_id)
            )
            deleted = [(topic, ledger_id) for topic, ledger_id in result.all()]
            # streamed ledgers own no objects: a segment goes once no ledger in it needs it,
            # every one deleted (PIP-76) or moved to objects of its own
            if deleted:
                topics = {topic for topic, _ in deleted}
                release_deleted(conn, topics, grace_ms, changed=deleted)
            return len(deleted)


def _cut(conn: Connection, topic: str, cut_id: int) -> StreamCut:
    # cut ids are a 32-bit column: a larger one cannot exist (and PostgreSQL would
    # refuse to compare it)
    row = (
        conn.execute(sa.select(C).where(C.c.topic == topic, C.c.cut_id == cut_id))
        .mappings()
        .first()
        if 0 <= cut_id < 2**31
        else None
    )
    if row is None:
        raise NotFoundError(f"cut {cut_id} of topic {topic!r} does not exist")
    return StreamCut.model_validate(dict(row))


def _unmarked_below(topic: str, below: int) -> sa.ColumnElement[bool]:
    """Live ledgers of ``topic`` with an id below ``below``: a range of the primary key."""
    return sa.and_(
        L.c.topic == topic, L.c.ledger_id < below, L.c.deletion_state == DeletionState.NONE
    )


def _end_and_offset(conn: Connection, topic: Topic) -> tuple[Position, int]:
    """The end of the topic's sealed data and its committed bytes from the first entry
    (each ledger's recorded size once; nothing of an upload in flight).

    Incremental from the topic's newest cut: every ledger below a cut was sealed when it
    was taken, and sealed sizes never change, so only the ledgers since then are summed
    and the cost does not grow with the topic's history."""
    newest = _newest_cut(conn, topic.name)
    since, base = (0, 0) if newest is None else (newest.ledger_id, newest.offset_bytes)
    end = _end_of_sealed(conn, topic)
    offset = conn.execute(
        sa.select(sa.func.coalesce(sa.func.sum(L.c.size_bytes), 0)).where(
            L.c.topic == topic.name, L.c.ledger_id >= since, L.c.ledger_id < end.ledger_id
        )
    ).scalar_one()
    return end, base + int(offset)


def _newest_cut(
    conn: Connection, topic: str, *conditions: sa.ColumnElement[bool]
) -> StreamCut | None:
    """The topic's newest cut meeting ``conditions``, walking its cut index back."""
    query = sa.select(C).where(C.c.topic == topic, *conditions)
    row = conn.execute(query.order_by(C.c.cut_id.desc()).limit(1)).mappings().first()
    return None if row is None else StreamCut.model_validate(dict(row))


def _end_of_sealed(conn: Connection, topic: Topic) -> Position:
    """Where the topic's sealed data ends: the first open ledger at entry 0, or the next
    ledger id to be allocated. Every ledger below it is sealed, its length recorded."""
    first_open = conn.execute(
        sa.select(sa.func.min(L.c.ledger_id)).where(
            L.c.topic == topic.name, L.c.state == LedgerState.OPEN
        )
    ).scalar()
    end = topic.next_ledger_id if first_open is None else first_open
    return Position(ledger_id=end, entry_id=0)
