"""Recorded store locations (the object_stores table): one row per store location that
offloads went to; ledgers, attempts, segments and queued deletions name it by ``store_id``.

Rows are only ever inserted, so an id, once handed out, names the same location forever.
A store can be retired (``retired_ms``) once no committed data names it: the sweep and the
GC no longer visit it; recording its location again (it answered) makes it live again.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from offloader.exceptions import NotFoundError
from offloader.metadata import schema
from offloader.metadata.clock import db_now
from offloader.metadata.records import Record
from offloader.objectstore.location import StoreLocation

S = schema.object_stores


def _where(location: StoreLocation) -> sa.ColumnElement[bool]:
    return sa.and_(
        S.c.kind == location.kind,
        S.c.location == location.location,
        S.c.prefix == location.prefix,
        S.c.endpoint == location.endpoint,
    )


def record_location(conn: Connection, location: StoreLocation) -> int:
    """The id of ``location``, inserting it if new; racing recorders agree on one row."""
    found = conn.execute(sa.select(S.c.id).where(_where(location))).scalar()
    if found is not None:
        conn.execute(
            S.update().where(S.c.id == found, S.c.retired_ms.is_not(None)).values(retired_ms=None)
        )
        return int(found)
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    conn.execute(
        dialect.insert(S)
        .values(
            kind=location.kind,
            location=location.location,
            prefix=location.prefix,
            endpoint=location.endpoint,
            created_ms=db_now(),
        )
        .on_conflict_do_nothing()
    )
    return int(conn.execute(sa.select(S.c.id).where(_where(location))).scalar_one())


def load_location(conn: Connection, store_id: int) -> StoreLocation:
    row = conn.execute(sa.select(S).where(S.c.id == store_id)).mappings().first()
    if row is None:
        raise NotFoundError(f"object store {store_id} is not recorded in the metadata")
    return StoreLocation(row["kind"], row["location"], row["prefix"], row["endpoint"])


def list_locations(conn: Connection, *, retired: bool = False) -> list[tuple[int, StoreLocation]]:
    """Every recorded store, by id, the retired ones only if ``retired``: what the orphan
    sweep walks."""
    query = sa.select(S).order_by(S.c.id)
    if not retired:
        query = query.where(S.c.retired_ms.is_(None))
    rows = conn.execute(query).mappings()
    return [
        (int(r["id"]), StoreLocation(r["kind"], r["location"], r["prefix"], r["endpoint"]))
        for r in rows
    ]


class StoreUsage(Record):
    """One recorded store and what names it: what `offloader store list` shows and what
    `offloader store retire` checks."""

    store_id: int
    location: str  # safe to show: never a credential
    retired: bool
    committed_ledgers: int  # offloaded, not deleted: their objects live there
    live_segments: int  # assigned, closing or offloaded
    started_attempts: int  # in flight: they may still write there
    queued_deletions: int  # pending keys the GC deletes there

    @property
    def holds_data(self) -> bool:
        return bool(self.committed_ledgers or self.live_segments or self.started_attempts)


def store_usage(conn: Connection) -> list[StoreUsage]:
    """Every recorded store with its counts, by id."""
    L, A, G, D = schema.ledgers, schema.offload_attempts, schema.segments, schema.deletion_queue

    def counts(query: sa.Select[Any]) -> dict[int, int]:
        rows: list[Any] = list(conn.execute(query))
        return {int(store): int(n) for store, n in rows if store is not None}

    committed = counts(
        sa.select(L.c.store_id, sa.func.count())
        .where(L.c.offload_state == "offloaded", L.c.deletion_state != "deleted")
        .group_by(L.c.store_id)
    )
    segments = counts(
        sa.select(G.c.store_id, sa.func.count())
        .where(G.c.state.in_(["assigned", "closing", "offloaded"]))
        .group_by(G.c.store_id)
    )
    started = counts(
        sa.select(A.c.store_id, sa.func.count())
        .where(A.c.state == "started")
        .group_by(A.c.store_id)
    )
    queued = counts(
        sa.select(D.c.store_id, sa.func.count())
        .where(D.c.state == "pending")
        .group_by(D.c.store_id)
    )
    rows = conn.execute(sa.select(S).order_by(S.c.id)).mappings()
    return [
        StoreUsage(
            store_id=int(r["id"]),
            location=str(StoreLocation(r["kind"], r["location"], r["prefix"], r["endpoint"])),
            retired=r["retired_ms"] is not None,
            committed_ledgers=committed.get(int(r["id"]), 0),
            live_segments=segments.get(int(r["id"]), 0),
            started_attempts=started.get(int(r["id"]), 0),
            queued_deletions=queued.get(int(r["id"]), 0),
        )
        for r in rows
    ]


def retire_location(conn: Connection, store_id: int) -> int:
    """Retire ``store_id`` and drop its queued deletions (their keys cannot be deleted
    there any more); the number dropped. Refused (ValueError) while data names it."""
    usage = {u.store_id: u for u in store_usage(conn)}.get(store_id)
    if usage is None:
        raise NotFoundError(f"object store {store_id} is not recorded in the metadata")
    if usage.holds_data:
        raise ValueError(
            f"object store {store_id} ({usage.location}) still holds data: "
            f"{usage.committed_ledgers} committed ledgers, {usage.live_segments} segments, "
            f"{usage.started_attempts} attempts in flight name it; it cannot be retired"
        )
    D = schema.deletion_queue
    dropped = conn.execute(
        D.delete().where(D.c.store_id == store_id, D.c.state == "pending")
    ).rowcount
    conn.execute(S.update().where(S.c.id == store_id).values(retired_ms=db_now()))
    return int(dropped)
