"""The metadata database: an engine with the settings the CAS protocol relies on, and
:class:`Database`, what the store and every one of its sub-stores share (the engine, its
transactions, the database's clock).

SQLite (the embedded default) takes the database lock at BEGIN (``BEGIN IMMEDIATE``), so
concurrent writers queue instead of failing; PostgreSQL needs nothing special.

Every call has a deadline (invariant 8, :class:`DatabaseDeadlines`): connecting, one
statement, and waiting for a lock (PostgreSQL's ``lock_timeout``, SQLite's busy timeout).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from offloader.metadata.clock import db_now_ms


@dataclass(frozen=True)
class DatabaseDeadlines:
    """How long the metadata database may keep a task waiting (the settings' ``db_*``)."""

    connect_seconds: int = 10
    statement_seconds: float = 600.0
    lock_seconds: float = 60.0


def create_metadata_engine(url: str, deadlines: DatabaseDeadlines | None = None) -> Engine:
    """An engine with the settings the CAS protocol relies on, and deadlines."""
    deadlines = deadlines or DatabaseDeadlines()
    if url.startswith("sqlite"):
        database = sa.engine.make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        busy_ms = int(deadlines.lock_seconds * 1000)
        engine = sa.create_engine(url, connect_args={"timeout": deadlines.lock_seconds})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql"):
        options = (
            f"-c statement_timeout={int(deadlines.statement_seconds * 1000)} "
            f"-c lock_timeout={int(deadlines.lock_seconds * 1000)}"
        )
        connect_args = {"connect_timeout": deadlines.connect_seconds, "options": options}
        return sa.create_engine(url, pool_pre_ping=True, connect_args=connect_args)
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
