"""The SQLite engine the CAS protocol relies on (SQLite only: PostgreSQL needs none of it).

Writers take the database lock at BEGIN, so two writers queue instead of both reading a
version and one failing at COMMIT; WAL keeps readers off the writers' backs; foreign keys
are enforced; a busy writer waits up to a minute.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from offloader.metadata.engine import create_metadata_engine


def test_the_database_directory_is_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "metadata.db"
    engine = create_metadata_engine(f"sqlite:///{path}")
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    engine.dispose()
    assert path.is_file()


def test_every_connection_gets_wal_foreign_keys_and_a_minute_of_patience(
    tmp_path: Path,
) -> None:
    engine = create_metadata_engine(f"sqlite:///{tmp_path / 'metadata.db'}")
    with engine.connect() as conn:
        pragma = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "foreign_keys", "busy_timeout")
        }
    engine.dispose()
    assert pragma == {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 60_000}


def test_a_transaction_holds_the_write_lock_from_its_begin(tmp_path: Path) -> None:
    path = tmp_path / "metadata.db"
    engine = create_metadata_engine(f"sqlite:///{path}")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        # no statement in the transaction yet: BEGIN itself took the lock
        with engine.begin(), pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")  # released at commit
        other.execute("COMMIT")
    finally:
        other.close()
        engine.dispose()


def test_an_in_memory_database_needs_no_directory() -> None:
    engine = create_metadata_engine("sqlite:///:memory:")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    engine.dispose()
