"""Schema migrations (Alembic), run once by ``offloader db upgrade``, checked on every open.

Opening a store never migrates: a mapped Airflow task must not race a schema change. It
checks the revision instead and tells the operator to run the upgrade.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from offloader.exceptions import SchemaOutOfDateError
from offloader.metadata import schema
from offloader.metadata.locations import record_location
from offloader.objectstore.location import StoreLocation

MIGRATIONS = Path(__file__).with_name("migrations")
UPGRADE_HINT = "run `offloader db upgrade`"


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_revision(engine: Engine) -> str:
    """The head revision, or SchemaOutOfDateError saying which revision the database is at."""
    head, current = head_revision(), current_revision(engine)
    if current != head:
        found = "has no offloader schema" if current is None else f"is at revision {current}"
        raise SchemaOutOfDateError(
            f"the metadata database {found}, this offloader needs revision {head}: {UPGRADE_HINT}"
        )
    return head


def upgrade(
    engine: Engine, legacy_store: StoreLocation | None, target: str = "head"
) -> tuple[str | None, str | None]:
    """Migrate to ``target`` and record ``legacy_store`` for rows that name no store.

    Rows without a store were written before revision 0002, to the store configured then;
    the operator upgrades with that store still configured (docs/OPERATIONS.md). Both steps
    run in one transaction, so a database at head never holds such rows. A concurrent
    upgrader winning is fine. Returns the revisions before and after.
    """
    before = current_revision(engine)
    config = _config()
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, target)
            if MigrationContext.configure(conn).get_current_revision() == head_revision():
                _record_legacy_store(conn, legacy_store)
    except Exception:
        if target != "head" or current_revision(engine) != head_revision():
            raise
    return before, current_revision(engine)


def _record_legacy_store(conn: Connection, legacy_store: StoreLocation | None) -> None:
    L, A, D = schema.ledgers, schema.offload_attempts, schema.deletion_queue
    unrecorded = {
        A: A.c.store_id.is_(None),
        L: sa.and_(L.c.store_id.is_(None), L.c.offload_uuid.is_not(None)),
        D: D.c.store_id.is_(None),
    }
    counts = {
        table.name: conn.execute(
            sa.select(sa.func.count()).select_from(table).where(where)
        ).scalar_one()
        for table, where in unrecorded.items()
    }
    if not any(counts.values()):
        return
    if legacy_store is None:
        rows = ", ".join(f"{n} {t}" for t, n in counts.items() if n)
        raise ValueError(
            f"rows written before revision 0002 name no object store ({rows}): upgrade "
            "with the object store they were written to configured (OFFLOADER_OBJECT_STORE_URL)"
        )
    store_id = record_location(conn, legacy_store)
    for table, where in unrecorded.items():
        conn.execute(table.update().where(where).values(store_id=store_id))
