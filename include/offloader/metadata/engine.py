"""The metadata database: an engine with the settings the CAS protocol relies on, and
:class:`Database`, what the store and every one of its sub-stores share (the engine, its
transactions, the database's clock).

SQLite (the embedded default) takes the database lock at BEGIN (``BEGIN IMMEDIATE``), so
concurrent writers queue instead of failing; PostgreSQL needs nothing special.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from offloader.metadata.clock import db_now_ms


def create_metadata_engine(url: str) -> Engine:
    """An engine with the settings the CAS protocol relies on."""
    if url.startswith("sqlite"):
        database = sa.engine.make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=60000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return sa.create_engine(url, pool_pre_ping=True)


class Database:
    """The engine and its transactions: every store of the metadata works through one."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def close(self) -> None:
        self.engine.dispose()

    def db_now_ms(self) -> int:
        """The database's clock, the one leases and ages are measured on (invariant 6)."""
        with self.engine.connect() as conn:
            return db_now_ms(conn)

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn
