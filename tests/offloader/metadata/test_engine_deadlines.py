"""Invariant 8 for the metadata database: the engine carries the settings' deadlines."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from fixtures.databases import postgres_database, sqlite_url
from offloader.metadata.engine import DatabaseDeadlines, create_metadata_engine
from offloader.runtime import database_deadlines
from offloader.settings import Settings

DEADLINES = DatabaseDeadlines(connect_seconds=7, statement_seconds=123.0, lock_seconds=4.5)


def test_the_settings_become_the_engines_deadlines() -> None:
    settings = Settings.from_values(
        db_connect_timeout_seconds=7, db_statement_timeout_seconds=123, db_lock_timeout_seconds=4.5
    )
    assert database_deadlines(settings) == DEADLINES


def test_sqlite_waits_for_its_lock_at_most_the_lock_deadline(tmp_path: Path) -> None:
    engine = create_metadata_engine(sqlite_url(tmp_path), DEADLINES)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 4500
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_postgres_sessions_carry_statement_and_lock_timeouts() -> None:
    for url in postgres_database():
        engine = create_metadata_engine(url, DEADLINES)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "123s"
                assert conn.execute(sa.text("SHOW lock_timeout")).scalar() == "4500ms"
                dsn = conn.connection.dbapi_connection.dsn  # type: ignore[union-attr]
                assert "connect_timeout=7" in dsn
        finally:
            engine.dispose()
