"""The deletion queue (invariant 5): every object key to delete, with the store it lives in,
the reason, and when its next try is due on the database's clock.

:class:`DeletionQueue` (``metadata.deletions``) is what the GC and the sweep use. The
functions below queue keys inside a transaction some other change runs in (an attempt
retired, a segment released, ledgers trimmed), so the keys and the change commit together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.metadata import schema
from offloader.metadata.clock import db_now, db_now_ms
from offloader.metadata.engine import Database
from offloader.metadata.records import Deletion, DeletionBacklog

D = schema.deletion_queue


class DeletionQueue:
    """The deletion queue of the metadata store (``metadata.deletions``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def enqueue(
        self, keys: Iterable[str], reason: str, *, store_id: int, attempt_id: str | None = None
    ) -> None:
        """Queue ``keys`` of the store ``store_id`` (see record_location) for deletion."""
        with self.db.transaction() as conn:
            queue_keys(conn, keys, reason, attempt_id, store_id)

    def due(self, limit: int, at_ms: int | None = None) -> list[Deletion]:
        """Pending deletions whose retry time has come: now on the database's clock, or
        ``at_ms`` when given. Read in the order of the index on (state, next_try_ms), so a
        batch costs ``limit`` rows however long the queue's history."""
        at = db_now() if at_ms is None else sa.literal(at_ms, sa.BigInteger)
        with self.db.engine.connect() as conn:
            rows = conn.execute(due_deletions_query(limit, at)).mappings()
            return [Deletion.model_validate(dict(r)) for r in rows]

    def complete(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        with self.db.transaction() as conn:
            conn.execute(
                D.update()
                .where(D.c.id.in_(ids), D.c.state == "pending")
                .values(state="done", done_ms=db_now())
            )

    def postpone(self, ids: Iterable[int], not_before_ms: int, reason: str) -> None:
        """Leave rows queued untried (their store did not answer): no try counted, the
        reason recorded, next due at ``not_before_ms`` (after the pass that skipped them)."""
        ids = list(ids)
        if not ids:
            return
        floor = sa.literal(not_before_ms, sa.BigInteger)
        with self.db.transaction() as conn:
            conn.execute(
                D.update()
                .where(D.c.id.in_(ids), D.c.state == "pending")
                .values(
                    last_error=reason[:2000],
                    next_try_ms=sa.case((D.c.next_try_ms < floor, floor), else_=D.c.next_try_ms),
                )
            )

    def retry_later(
        self, failures: Sequence[tuple[Deletion, str, int]], not_before_ms: int = 0
    ) -> None:
        """Record failed tries (row, error, delay in ms) in one transaction: each row's
        tries and last error, and its next try ``delay`` after the database's now but never
        before ``not_before_ms`` (a pass uses this so it does not retry a row it just tried).
        """
        if not failures:
            return
        next_try = db_now() + sa.bindparam("delay", type_=sa.BigInteger)
        floor = sa.literal(not_before_ms, sa.BigInteger)
        with self.db.transaction() as conn:
            conn.execute(
                D.update()
                .where(D.c.id == sa.bindparam("row_id"), D.c.state == "pending")
                .values(
                    tries=D.c.tries + 1,
                    last_error=sa.bindparam("error"),
                    next_try_ms=sa.case((next_try < floor, floor), else_=next_try),
                ),
                [
                    {"row_id": row.id, "error": error[:2000], "delay": delay}
                    for row, error, delay in failures
                ],
            )

    def count_pending(self) -> int:
        """How many keys the queue still holds (a COUNT, served by the index)."""
        with self.db.engine.connect() as conn:
            query = sa.select(sa.func.count()).select_from(D).where(D.c.state == "pending")
            return int(conn.execute(query).scalar_one())

    def backlog(self, failing_tries: int, failing_shown: int = 20) -> DeletionBacklog:
        """The queue's backlog, oldest item (age on the database's clock) and the items
        that keep failing (``tries >= failing_tries``, at most ``failing_shown`` listed)."""
        pending = D.c.state == "pending"
        failing = sa.and_(pending, D.c.tries >= failing_tries)
        with self.db.engine.connect() as conn:
            now = db_now_ms(conn)
            counts = conn.execute(
                sa.select(
                    sa.func.count(),
                    sa.func.count().filter(D.c.next_try_ms <= now),
                    sa.func.count().filter(D.c.tries >= failing_tries),
                    sa.func.min(D.c.enqueued_ms),
                ).where(pending)
            ).one()
            rows = conn.execute(
                sa.select(D).where(failing).order_by(D.c.tries.desc(), D.c.id).limit(failing_shown)
            ).mappings()
            shown = [Deletion.model_validate(dict(r)) for r in rows]
        oldest = counts[3]
        return DeletionBacklog(
            pending=counts[0],
            due=counts[1],
            oldest_enqueued_ms=oldest,
            oldest_age_ms=None if oldest is None else max(0, now - oldest),
            failing_tries=failing_tries,
            failing_count=counts[2],
            failing=shown,
        )


def queue_keys(
    conn: Connection,
    keys: Iterable[str],
    reason: str,
    attempt_id: str | None,
    store_id: int | None,
    delay_ms: int = 0,
) -> None:
    """Queue ``keys`` for deletion, due ``delay_ms`` after the database's now."""
    rows = [
        dict(
            object_key=k,
            reason=reason[:255],
            attempt_id=attempt_id,
            state="pending",
            tries=0,
            store_id=store_id,
        )
        for k in keys
    ]
    queue_rows(conn, rows, delay_ms)


def queue_rows(conn: Connection, rows: Sequence[Mapping[str, object]], delay_ms: int) -> None:
    """Insert deletion rows due ``delay_ms`` after the database's now, read once: two
    readings of PostgreSQL's clock_timestamp() in one row can differ by a millisecond."""
    if rows:
        now = db_now_ms(conn)
        conn.execute(D.insert().values(enqueued_ms=now, next_try_ms=now + delay_ms), rows)


def queue_selected(conn: Connection, rows: sa.Select) -> int:
    """Queue the keys a SELECT yields as (key, reason, attempt id, store, topic, ledger)."""
    columns = ["object_key", "reason", "attempt_id", "store_id", "topic", "ledger_id"]
    source = rows.add_columns(sa.literal("pending"), sa.literal(0), db_now(), db_now())
    columns += ["state", "tries", "enqueued_ms", "next_try_ms"]
    return int(conn.execute(D.insert().from_select(columns, source)).rowcount)


def due_deletions_query(limit: int, at: sa.ColumnElement[int]) -> sa.Select[tuple[object, ...]]:
    """Due rows in index order (state, next_try_ms): no sort, no scan of done rows."""
    return (
        sa.select(D)
        .where(D.c.state == "pending", D.c.next_try_ms <= at)
        .order_by(D.c.next_try_ms)
        .limit(limit)
    )
