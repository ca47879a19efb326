"""Recorded store locations (the object_stores table): one row per store location that
offloads went to; ledgers, attempts, segments and queued deletions name it by ``store_id``.

Rows are only ever inserted, so an id, once handed out, names the same location forever.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from offloader.exceptions import NotFoundError
from offloader.metadata import schema
from offloader.metadata.clock import db_now
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


def list_locations(conn: Connection) -> list[tuple[int, StoreLocation]]:
    """Every recorded store, by id: what the orphan sweep walks."""
    rows = conn.execute(sa.select(S).order_by(S.c.id)).mappings()
    return [
        (int(r["id"]), StoreLocation(r["kind"], r["location"], r["prefix"], r["endpoint"]))
        for r in rows
    ]
