"""The database's clock (invariant 6): leases and ages are measured on it, never a worker's.

Workers' clocks drift apart; the metadata database is the one clock every worker shares.
``db_now()`` is a SQL expression for the database's current time in epoch milliseconds,
so a lease end (``db_now() + lease``) and a lease check (``attempt_lease_ms <= db_now()``)
are computed by the database, inside the very statement that acts on them.

PostgreSQL: ``clock_timestamp()``, the time the expression is evaluated. ``now()`` is the
start of the transaction: a transaction that waited for a row lock would write a lease
that is already partly spent and judge expiry on a stale time. SQLite: ``julianday('now')``,
the host's clock read by SQLite itself (embedded SQLite is only ever shared by processes
of one host, so that clock is common to all of them).
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement


class db_now(FunctionElement[int]):
    """The database's current time, integer milliseconds since the epoch (UTC)."""

    type = sa.BigInteger()
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "postgresql")
def _postgresql_now(element: db_now, compiler: SQLCompiler, **kw: object) -> str:
    return "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: SQLCompiler, **kw: object) -> str:
    return "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"


@compiles(db_now)
def _unsupported(element: db_now, compiler: SQLCompiler, **kw: object) -> str:
    raise CompileError(
        f"the metadata store has no clock expression for the {compiler.dialect.name!r} "
        "database; supported: sqlite, postgresql"
    )


def db_now_ms(conn: Connection) -> int:
    """Read the database's clock (milliseconds since the epoch)."""
    return int(conn.execute(sa.select(db_now())).scalar_one())


def now_ms() -> int:
    """This worker's clock: for durations and logs only, never for a lease or an age."""
    return int(time.time() * 1000)
