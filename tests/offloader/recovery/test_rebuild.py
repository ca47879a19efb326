"""Rebuilding the metadata from the objects alone, on both pairings: every offloaded ledger
reads back identical, every rebuilt row is exact, the newest of several copies is used, an
index that cannot be trusted is reported word for word; a rebuild (or an import) into a
non-empty database is refused and changes nothing."""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa

from fixtures.backends import Fresh, tiered_digests
from fixtures.cli import spawn_cli
from fixtures.inspect import table_rows
from fixtures.metadata_backup import populate_ledgers
from offloader.exceptions import ObjectNotFoundError
from offloader.format import decode_index, encode_index
from offloader.keys import ledger_object_keys
from offloader.metadata import schema
from offloader.metadata.records import Ledger
from offloader.metadata.snapshot import SnapshotError, import_snapshot
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.policy import OffloadPolicy
from offloader.recovery import rebuild_from_objects
from offloader.runtime import Runtime, export_metadata


@pytest.fixture
def populated(runtime: Runtime) -> Runtime:
    """Two topics: offloaded ledgers (some hot copies deleted), a hot one, a queued key."""
    return populate_ledgers(runtime)


def test_rebuild_from_the_objects_alone(populated: Runtime, fresh: Fresh) -> None:
    rt = populated
    digests = tiered_digests(rt)
    assert len(digests) == 4
    # a second complete copy of one ledger (an attempt that lost its commit) is not used
    # twice, and an index that does not match its key is reported, not trusted
    ledger = rt.metadata.get_ledger("orders", 1)
    copy_data, copy_index = ledger_object_keys(str(uuid.uuid4()), 1)
    rt.objects.put(copy_data, rt.objects.get(ledger.data_key))
    rt.objects.put(copy_index, rt.objects.get(ledger.index_key))
    liar = ledger_object_keys(str(uuid.uuid4()), 9)[1]
    rt.objects.put(liar, rt.objects.get(ledger.index_key))
    export_metadata(rt)  # snapshots in the store are not ledgers

    rebuilt = fresh()
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    assert result.topics == ["orders", "päyments/eu"]
    assert result.ledgers == 4
    assert len(result.skipped) == 2 and any(liar in s for s in result.skipped)
    assert tiered_digests(rebuilt) == digests
    assert {x.ledger_id for x in rebuilt.metadata.list_ledgers("orders")} == {1, 2}
    with pytest.raises(SnapshotError, match="not empty"):
        rebuild_from_objects(
            rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
        )


def test_import_or_rebuild_into_a_non_empty_database_is_refused(populated: Runtime) -> None:
    rt = populated
    export_metadata(rt)
    rows = table_rows(rt.metadata)
    listed = ", ".join(f"{name} ({len(r)} rows)" for name, r in rows.items() if r)
    assert listed.startswith("object_stores (1 rows), topics (2 rows), ")
    refusal = (
        "cannot {}: the metadata database is not empty (" + listed + "); use a fresh "
        "database (`offloader db upgrade` on an empty one)"
    )
    with pytest.raises(SnapshotError) as refused:
        import_snapshot(rt.metadata.engine, rt.objects, "latest")
    assert str(refused.value) == refusal.format("import a snapshot")
    with pytest.raises(SnapshotError) as refused:
        rebuild_from_objects(rt.metadata.engine, rt.objects, rt.stores.default_location)
    assert str(refused.value) == refusal.format("rebuild the metadata")
    assert table_rows(rt.metadata) == rows


def test_the_cli_refuses_a_non_empty_database_in_one_line(populated: Runtime) -> None:
    rt = populated
    export_metadata(rt)
    rows = table_rows(rt.metadata)
    for command in ("import", "rebuild"):
        proc = spawn_cli(rt.settings, "metadata", command)
        _, err = proc.communicate(timeout=120)
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, err.decode()
        assert f"cannot {command}" in lines[0] and "not empty" in lines[0]
    assert table_rows(rt.metadata) == rows


def _rows(rt: Runtime, table: sa.Table) -> list[dict]:
    with rt.metadata.engine.connect() as conn:
        return [dict(r) for r in conn.execute(table.select()).mappings()]


def _ms(rt: Runtime, key: str) -> int:
    modified = rt.objects.stat(key).last_modified
    assert modified is not None
    return int(modified.timestamp() * 1000)


def test_rebuilt_rows_are_exact(populated: Runtime, fresh: Fresh) -> None:
    """Every column the rebuild writes, per topic, ledger and attempt."""
    rt = populated
    LedgerOffloader(rt).offload_ledger("orders", 3)  # orders: 3 ledgers, päyments/eu: 2
    offloaded = [
        x
        for topic in ("orders", "päyments/eu")
        for x in rt.metadata.list_ledgers(topic)
        if x.is_offloaded
    ]
    assert [(x.topic, x.ledger_id) for x in offloaded] == [
        ("orders", 1), ("orders", 2), ("orders", 3), ("päyments/eu", 1), ("päyments/eu", 2)
    ]  # fmt: skip

    rebuilt = fresh()
    before = rebuilt.metadata.db_now_ms()
    rebuild_from_objects(rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location)
    after = rebuilt.metadata.db_now_ms()
    store_id = rebuilt.stores.default_id()

    topics = {r["name"]: r for r in _rows(rebuilt, schema.topics)}
    for name, next_id in (("orders", 4), ("päyments/eu", 3)):
        assert topics[name] == {
            "name": name,
            "version": 1,
            "policy": OffloadPolicy().model_dump_json(),
            "created_ms": min(x.created_ms for x in offloaded if x.topic == name),
            "next_ledger_id": next_id,
            "writer_epoch": 0,
            "start_ledger_id": 0,
            "start_entry_id": 0,
            "state": "active",
            "deleted_ms": None,
        }
    assert len(topics) == 2

    ledgers = {(r["topic"], r["ledger_id"]): r for r in _rows(rebuilt, schema.ledgers)}
    attempts = {r["attempt_id"]: r for r in _rows(rebuilt, schema.offload_attempts)}
    assert len(ledgers) == len(attempts) == len(offloaded)
    for x in offloaded:
        row = ledgers[(x.topic, x.ledger_id)]
        assert before <= row.pop("hot_deleted_ms") <= after
        modified = _ms(rt, x.index_key)
        assert row == {
            "topic": x.topic,
            "ledger_id": x.ledger_id,
            "version": 1,
            "state": "sealed",
            "entry_count": x.entry_count,
            "size_bytes": x.size_bytes,
            "created_ms": x.created_ms,
            "sealed_ms": x.sealed_ms,
            "offload_state": "offloaded",
            "offload_epoch": 1,
            "attempt_id": None,
            "attempt_lease_ms": None,
            "offload_uuid": x.offload_attempt_id,
            "data_key": x.data_key,
            "index_key": x.index_key,
            "data_len": x.data_len,
            "offloaded_ms": modified,
            "hot_state": "deleted",
            "store_id": store_id,
            "deletion_state": "none",
            "deleting_ms": None,
            "deleted_ms": None,
            "offload_mode": "ledger",
        }
        assert attempts[x.offload_attempt_id] == {
            "attempt_id": x.offload_attempt_id,
            "topic": x.topic,
            "ledger_id": x.ledger_id,
            "epoch": 1,
            "data_key": x.data_key,
            "index_key": x.index_key,
            "state": "committed",
            "owner": "metadata rebuild",
            "created_ms": modified,
            "finished_ms": modified,
            "detail": "rebuilt from the objects",
            "store_id": store_id,
        }


def _copy_ledger(rt: Runtime, ledger: Ledger, attempt: str, **edit: object) -> tuple[str, str]:
    """Copy ``ledger``'s objects under ``attempt``'s keys; ``edit`` replaces (None: drops)
    entries of the index's user metadata, ``data``/``index`` its bodies."""
    data_key, index_key = ledger_object_keys(attempt, ledger.ledger_id)
    user = {**rt.objects.stat(ledger.index_key).metadata}
    for name, value in edit.items():
        if name in ("data", "index"):
            continue
        if value is None:
            user.pop(name)
        else:
            user[name] = str(value)
    data = edit.get("data", rt.objects.get(ledger.data_key))
    index = edit.get("index", rt.objects.get(ledger.index_key))
    assert isinstance(data, bytes) and isinstance(index, bytes)
    rt.objects.put(data_key, data)
    rt.objects.put(index_key, index, metadata=user)
    return data_key, index_key


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_rebuild_keeps_the_newest_copy_and_the_first_listed_of_a_tie(
    populated: Runtime, fresh: Fresh
) -> None:
    """fs only: the test sets the objects' times (S3 cannot, and its times are whole
    seconds). The newest copy is listed first, an older one last."""
    rt = populated
    assert isinstance(rt.objects, FilesystemObjectStore)
    ledger = rt.metadata.get_ledger("orders", 1)
    base = _ms(rt, ledger.index_key) // 1000 * 1000
    copies = {
        "00000000-0000-4000-8000-000000000001": base + 3000,  # newest, listed first
        "00000000-0000-4000-8000-000000000002": base + 3000,  # as new, listed second
        "ffffffff-ffff-4fff-8fff-ffffffffffff": base + 2000,  # older, listed last
    }
    for attempt, ms in copies.items():
        _, index_key = _copy_ledger(rt, ledger, attempt)
        os.utime(rt.objects.root / index_key, ns=(ms * 1_000_000, ms * 1_000_000))

    rebuilt = fresh()
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    assert (result.ledgers, result.skipped) == (4, [])
    got = rebuilt.metadata.get_ledger("orders", 1)
    assert (got.offload_attempt_id, got.offloaded_ms) == (
        "00000000-0000-4000-8000-000000000001",
        base + 3000,
    )
    assert got.index_key == ledger_object_keys(got.offload_attempt_id, 1)[1]


def test_rebuild_reports_each_index_it_cannot_trust(populated: Runtime, fresh: Fresh) -> None:
    """Each refusal of an index object, word for word; the good copies are still used."""
    rt = populated
    ledger = rt.metadata.get_ledger("orders", 1)
    index = rt.objects.get(ledger.index_key)
    decoded = decode_index(index)
    assert decoded.metadata is not None
    foreign = bytearray(encode_index(decoded.metadata, decoded.blocks, None))
    foreign[32:34] = b"\xff\xff"  # a metadata version of ours it is not: Pulsar's, say
    data = rt.objects.get(ledger.data_key)
    attempt = {name: str(uuid.UUID(int=n + 1)) for n, name in enumerate(
        ("foreign", "version", "unversioned", "topic", "no-id", "short", "no-data")
    )}  # fmt: skip
    keys = {
        "foreign": _copy_ledger(rt, ledger, attempt["foreign"], index=bytes(foreign)),
        "version": _copy_ledger(rt, ledger, attempt["version"], **{"format-version": 9}),
        "unversioned": _copy_ledger(rt, ledger, attempt["unversioned"], **{"format-version": None}),
        "topic": _copy_ledger(rt, ledger, attempt["topic"], **{"managed-ledger": "other%2Ft"}),
        "no-id": _copy_ledger(rt, ledger, attempt["no-id"], **{"ledger-id": None}),
        "short": _copy_ledger(rt, ledger, attempt["short"], data=data[:-1]),
        "no-data": _copy_ledger(rt, ledger, attempt["no-data"]),
    }
    rt.objects.delete_many([keys["no-data"][0]])
    with pytest.raises(ObjectNotFoundError) as gone:  # the store's own words
        rt.objects.stat(keys["no-data"][0])
    liar = ledger_object_keys(str(uuid.UUID(int=99)), 9)[1]
    rt.objects.put(liar, index, metadata=rt.objects.stat(ledger.index_key).metadata)

    rebuilt = fresh()
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    n = len(data)
    assert sorted(result.skipped) == sorted([
        f"{keys['foreign'][1]}: the index holds no ledger metadata (a foreign index)",
        f"{keys['version'][1]}: unknown object format-version '9'",
        f"{keys['topic'][1]}: the index says orders/1, the key and user metadata say other/t/1",
        f"{keys['no-id'][1]}: the index says orders/1, the key and user metadata say orders/1",
        f"{keys['short'][1]}: data object {keys['short'][0]} is {n - 1} bytes, the index says {n}",
        f"{keys['no-data'][1]}: {gone.value}",
        f"{liar}: the index says orders/1, the key and user metadata say orders/1",
    ])  # fmt: skip
    assert result.ledgers == 4  # the unversioned copy is trusted: objects of before the field
    assert rebuilt.metadata.get_ledger("orders", 1).offload_attempt_id in (
        ledger.offload_attempt_id,
        attempt["unversioned"],
    )
