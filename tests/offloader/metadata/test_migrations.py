"""Migrations run once (`offloader db upgrade`), match the schema, and carry old rows over.

Every test runs on SQLite and PostgreSQL (the ``metadata_url`` / ``empty_metadata_url``
fixtures).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from fixtures.databases import postgres_database, sqlite_url
from fixtures.metadata import list_attempts, pending_deletions
from offloader.exceptions import SchemaOutOfDateError
from offloader.metadata import (
    DeletionState,
    MetadataStore,
    Position,
    SegmentOrigin,
    TopicState,
    schema,
)
from offloader.metadata.engine import create_metadata_engine
from offloader.metadata.migrate import current_revision, head_revision, upgrade
from offloader.objectstore.location import StoreLocation

OLD_STORE = StoreLocation("s3", "old-bucket", "ledgers", "http://127.0.0.1:8333")


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """An engine on an empty database: nothing migrated yet."""
    urls = iter([sqlite_url(tmp_path)]) if request.param == "sqlite" else postgres_database()
    for url in urls:
        engine = create_metadata_engine(url)
        yield engine
        engine.dispose()


def test_autogenerate_sees_no_difference_between_schema_and_migrations(
    engine: sa.Engine,
) -> None:
    upgrade(engine, None)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), schema.metadata)
    assert diff == []


def test_opening_never_migrates_and_names_the_upgrade_command(engine: sa.Engine) -> None:
    url = engine.url.render_as_string(hide_password=False)
    no_schema = r"has no offloader schema.*run `offloader db upgrade`"
    with pytest.raises(SchemaOutOfDateError, match=no_schema):
        MetadataStore.open(url)
    assert current_revision(engine) is None
    upgrade(engine, None, target="0001")
    with pytest.raises(SchemaOutOfDateError, match=r"is at revision 0001.*offloader db upgrade"):
        MetadataStore.open(url)
    assert current_revision(engine) == "0001"
    upgrade(engine, None)
    MetadataStore.open(url).close()


def _rows_of_0001(engine: sa.Engine) -> None:
    """A topic, an offloaded ledger, an attempt in flight and a queued deletion, as 0001
    wrote them (no store recorded anywhere)."""
    common = dict(version=1, state="sealed", entry_count=10, size_bytes=100, created_ms=1)
    common |= dict(sealed_ms=2, hot_state="present")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO topics (name, version, policy, created_ms, next_ledger_id, "
                "writer_epoch) VALUES ('t', 1, '{}', 1, 3, 1)"
            )
        )
        columns = ["topic", "ledger_id", "offload_state", "offload_epoch", "offload_uuid"]
        columns += ["data_key", "index_key", "data_len", "attempt_id", *common]
        ledgers = sa.table("ledgers", *(sa.column(c) for c in columns))
        conn.execute(
            ledgers.insert(),
            [
                dict(common, topic="t", ledger_id=1, offload_state="offloaded", offload_epoch=1)
                | dict(offload_uuid="u1", data_key="u1-ledger-1", index_key="u1-ledger-1-index")
                | dict(data_len=500, attempt_id=None),
                dict(common, topic="t", ledger_id=2, offload_state="offloading", offload_epoch=1)
                | dict(offload_uuid=None, data_key=None, index_key=None, data_len=None)
                | dict(attempt_id="u2"),
            ],
        )
        for attempt, ledger_id, state in (("u1", 1, "committed"), ("u2", 2, "started")):
            conn.execute(
                sa.text(
                    "INSERT INTO offload_attempts (attempt_id, topic, ledger_id, epoch, "
                    "data_key, index_key, state, owner, created_ms) VALUES "
                    f"('{attempt}', 't', {ledger_id}, 1, '{attempt}-ledger-{ledger_id}', "
                    f"'{attempt}-ledger-{ledger_id}-index', '{state}', 'old', 1)"
                )
            )
        conn.execute(
            sa.text(
                "INSERT INTO deletion_queue (object_key, reason, state, enqueued_ms, tries, "
                "next_try_ms) VALUES ('u0-ledger-1', 'attempt failed', 'pending', 1, 0, 1)"
            )
        )


def _store_ids(engine: sa.Engine) -> dict[str, list[int | None]]:
    """store_id of every row, in key order."""
    keys = {"ledgers": "ledger_id", "offload_attempts": "attempt_id", "deletion_queue": "id"}
    with engine.connect() as conn:
        return {
            table: [
                row[0]
                for row in conn.execute(sa.text(f"SELECT store_id FROM {table} ORDER BY {key}"))
            ]
            for table, key in keys.items()
        }


def test_rows_of_0001_are_recorded_as_written_to_the_store_configured_at_upgrade(
    engine: sa.Engine,
) -> None:
    upgrade(engine, None, target="0001")
    _rows_of_0001(engine)

    # without the store they were written to, the upgrade refuses and changes nothing
    counted = r"no object store \(2 offload_attempts, 1 ledgers, 1 deletion_queue\)"
    with pytest.raises(ValueError, match=counted):
        upgrade(engine, None)
    assert current_revision(engine) == "0001"
    assert "object_stores" not in sa.inspect(engine).get_table_names()
    assert "store_id" not in {c["name"] for c in sa.inspect(engine).get_columns("ledgers")}

    assert upgrade(engine, OLD_STORE) == ("0001", head_revision())
    url = engine.url.render_as_string(hide_password=False)
    store = MetadataStore.open(url)
    try:
        (store_id,) = {a.store_id for a in list_attempts(store)}
        assert store.get_location(store_id) == OLD_STORE
        offloaded, in_flight = store.list_ledgers("t")
        assert offloaded.store_id == store_id  # committed: records where it went
        assert in_flight.store_id is None  # not offloaded: its attempt holds the store
        assert [d.store_id for d in pending_deletions(store)] == [store_id]
    finally:
        store.close()
    # a second upgrade at head is a no-op that keeps what was recorded
    assert upgrade(engine, StoreLocation("file", "/elsewhere")) == (head_revision(),) * 2
    assert _store_ids(engine) == {
        "ledgers": [store_id, None],
        "offload_attempts": [store_id, store_id],
        "deletion_queue": [store_id],
    }


def downgrade_then_upgrade(
    engine: sa.Engine, revision: str, check: Callable[[sa.Inspector], None]
) -> None:
    """From head down to ``revision`` (``check`` the schema there), then up again: the
    schema must match the tables exactly."""
    from alembic import command
    from alembic.config import Config

    from offloader.metadata.migrate import MIGRATIONS

    upgrade(engine, None)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)
    assert current_revision(engine) == revision
    check(sa.inspect(engine))
    upgrade(engine, None)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), schema.metadata) == []


def test_0002_downgrades_to_0001_and_upgrades_again(engine: sa.Engine) -> None:
    def check(inspector: sa.Inspector) -> None:
        assert "object_stores" not in inspector.get_table_names()

    downgrade_then_upgrade(engine, "0001", check)


def test_0003_upgrades_a_0002_database_with_data(engine: sa.Engine) -> None:
    """Rows of 0002 get the retention defaults: start 0:0, active, live ledgers, queued keys
    of no ledger; cuts and trims then work on them."""
    upgrade(engine, None, target="0001")
    _rows_of_0001(engine)
    upgrade(engine, OLD_STORE, target="0002")
    assert current_revision(engine) == "0002"
    assert upgrade(engine, OLD_STORE) == ("0002", head_revision())
    url = engine.url.render_as_string(hide_password=False)
    store = MetadataStore.open(url)
    try:
        (topic,) = store.list_topics()
        assert (topic.start, topic.state, topic.deleted_ms) == (
            Position(ledger_id=0, entry_id=0),
            TopicState.ACTIVE,
            None,
        )
        ledgers = store.list_ledgers("t")
        assert [x.deletion_state for x in ledgers] == [DeletionState.NONE] * 2
        assert [(d.topic, d.ledger_id) for d in pending_deletions(store)] == [(None, None)]
        assert store.retention.list_cuts("t") == []
        cut = store.retention.create_cut("t")  # both ledgers sealed, 100 bytes each
        assert (cut.position, cut.offset_bytes) == (Position(ledger_id=3, entry_id=0), 200)
        store.retention.move_start(topic, Position(ledger_id=2, entry_id=0))
        ids, queued = store.retention.mark_ledgers_deleting("t", 2, 10)
        assert (ids, queued) == ([1], 2)
        assert {(d.object_key, d.ledger_id) for d in pending_deletions(store)} >= {
            ("u1-ledger-1", 1),
            ("u1-ledger-1-index", 1),
        }
    finally:
        store.close()


def test_0003_downgrades_to_0002_and_upgrades_again(engine: sa.Engine) -> None:
    def check(inspector: sa.Inspector) -> None:
        assert "stream_cuts" not in inspector.get_table_names()
        assert "start_ledger_id" not in {c["name"] for c in inspector.get_columns("topics")}
        assert "deletion_state" not in {c["name"] for c in inspector.get_columns("ledgers")}

    downgrade_then_upgrade(engine, "0002", check)


def test_0004_downgrades_to_0003_and_upgrades_again(engine: sa.Engine) -> None:
    def check(inspector: sa.Inspector) -> None:
        names = {ix["name"] for ix in inspector.get_indexes("ledgers")}
        assert "ix_ledgers_hot" in names and "ix_ledgers_created" not in names

    downgrade_then_upgrade(engine, "0003", check)


def test_0006_gives_existing_segments_the_stream_origin_and_no_lease(engine: sa.Engine) -> None:
    """Segments of 0005 were all written by a stream: origin 'stream', lease NULL (their
    lease is the stream's); the stream's queries then see them as before."""
    upgrade(engine, OLD_STORE, target="0005")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO topics (name, version, policy, created_ms, next_ledger_id, "
                "writer_epoch) VALUES ('t', 1, '{}', 1, 3, 1)"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO object_stores (kind, location, prefix, endpoint, created_ms) "
                "VALUES ('file', '/objects', '', '', 1)"
            )
        )
        store_id = conn.execute(sa.text("SELECT id FROM object_stores")).scalar_one()
        conn.execute(
            sa.text(
                "INSERT INTO segments (segment_id, topic, seq, version, state, epoch, "
                "assigned_ms, begin_ledger_id, begin_entry_id, end_ledger_id, end_entry_id, "
                "data_key, index_key, store_id, data_len) VALUES ('s1', 't', 1, 3, "
                f"'offloaded', 1, 1, 1, 0, 2, 9, 's1', 's1-index', {store_id}, 100)"
            )
        )
    assert upgrade(engine, OLD_STORE) == ("0005", head_revision())
    store = MetadataStore.open(engine.url.render_as_string(hide_password=False))
    try:
        (segment,) = store.segments.of_topic("t")
        assert (segment.origin, segment.lease_until_ms) == (SegmentOrigin.STREAM, None)
        assert store.segments.last_offloaded_end("t") == Position(ledger_id=2, entry_id=9)
    finally:
        store.close()


def test_0006_downgrades_to_0005_and_upgrades_again(engine: sa.Engine) -> None:
    def check(inspector: sa.Inspector) -> None:
        columns = {c["name"] for c in inspector.get_columns("segments")}
        assert "replaces" in columns and not columns & {"origin", "lease_until_ms"}

    downgrade_then_upgrade(engine, "0005", check)


def test_0007_keeps_recorded_stores_live_and_downgrades(engine: sa.Engine) -> None:
    """Stores recorded before 0007 are live (not retired); down to 0006 and up again."""
    upgrade(engine, OLD_STORE, target="0006")
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO object_stores (kind, location, prefix, endpoint, created_ms) "
                "VALUES ('s3', 'b', '', 'http://127.0.0.1:1', 1)"
            )
        )
    upgrade(engine, OLD_STORE)
    with engine.connect() as conn:
        retired = conn.execute(sa.text("SELECT retired_ms FROM object_stores")).scalars().all()
    assert retired and set(retired) == {None}

    def check(inspector: sa.Inspector) -> None:
        columns = {c["name"] for c in inspector.get_columns("object_stores")}
        assert "retired_ms" not in columns and "endpoint" in columns

    downgrade_then_upgrade(engine, "0006", check)
