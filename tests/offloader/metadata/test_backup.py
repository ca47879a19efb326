"""Metadata snapshots on both pairings: export, wipe the database, import, every ledger reads
back identical; rebuild from the objects alone; refusals (non-empty database, damaged or
foreign snapshot) change nothing; an export killed before its manifest never becomes the
latest."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from fixtures.backends import Fresh, make_topic, produce_ledgers, run_cli, tiered_digests
from fixtures.databases import sqlite_url
from fixtures.metadata import pending_deletions
from offloader.exceptions import ObjectNotFoundError, ObjectStoreError
from offloader.format import decode_index, encode_index
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import backup, schema
from offloader.metadata.backup import (
    MANIFEST_KEY,
    SnapshotError,
    export_from,
    export_snapshot,
    import_snapshot,
    latest_snapshot,
    read_manifest,
    rebuild_from_objects,
)
from offloader.metadata.migrate import head_revision
from offloader.metadata.records import Ledger
from offloader.objectstore import MultipartUpload, PartInfo
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.offload.keys import ledger_object_keys
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.policy import OffloadPolicy
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime
from offloader.settings import Settings


@pytest.fixture
def populated(runtime: Runtime) -> Runtime:
    """Two topics: offloaded ledgers (some hot copies deleted), a hot one, a queued key."""
    rt = runtime
    make_topic(rt, "orders")
    make_topic(rt, "päyments/eu")
    produce_ledgers(rt, "orders", [(30, 4000), (12, 100), (7, 900)])
    produce_ledgers(rt, "päyments/eu", [(9, 2000), (4, 10)], seed=3)
    offloader = LedgerOffloader(rt)
    offloader.offload_topic("orders", up_to=2)
    offloader.offload_topic("päyments/eu", up_to=2)
    from offloader.offload.hot_deletion import delete_hot_copies

    delete_hot_copies(rt.metadata, rt.hot, "orders")
    rt.metadata.deletions.enqueue(["some-leftover"], "test", store_id=rt.stores.default_id())
    return rt


def table_rows(rt: Runtime) -> dict[str, list[tuple]]:
    with rt.metadata.engine.connect() as conn:
        return {
            t.name: sorted(tuple(r) for r in conn.execute(t.select()))
            for t in schema.metadata.sorted_tables
        }


def test_export_wipe_import_reads_back_identical(populated: Runtime, fresh: Fresh) -> None:
    rt = populated
    checksums = {t: TopicReader(rt).checksum(t) for t in ("orders", "päyments/eu")}
    digests = tiered_digests(rt)
    rows = table_rows(rt)
    exported = export_from(rt)
    assert latest_snapshot(rt.objects) == exported.snapshot
    assert exported.snapshot.rows["ledgers"] == 5

    restored = fresh()
    info = import_snapshot(restored.metadata.engine, restored.objects, None)
    assert info == exported.snapshot
    assert table_rows(restored) == rows
    assert tiered_digests(restored) == digests
    for topic, checksum in checksums.items():
        assert TopicReader(restored).checksum(topic) == checksum
    # the restored database goes on working: new ids continue after the restored ones
    restored.metadata.deletions.enqueue(["after-restore"], "t", store_id=1)
    ids = [d.id for d in pending_deletions(restored.metadata)]
    assert len(set(ids)) == len(ids) == 2
    produce_ledgers(restored, "orders", [(3, 10)])
    assert max(x.ledger_id for x in restored.metadata.list_ledgers("orders")) == 4


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
    export_from(rt)  # snapshots in the store are not ledgers

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
    export_from(rt)
    rows = table_rows(rt)
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
    assert table_rows(rt) == rows


def test_the_cli_refuses_a_non_empty_database_in_one_line(populated: Runtime) -> None:
    rt = populated
    export_from(rt)
    rows = table_rows(rt)
    for command in ("import", "rebuild"):
        proc = run_cli(rt, "metadata", command)
        _, err = proc.communicate(timeout=120)
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, err.decode()
        assert f"cannot {command}" in lines[0] and "not empty" in lines[0]
    assert table_rows(rt) == rows


def _rewrite(rt: Runtime, key: str, edit: Callable[[list[bytes]], list[bytes]]) -> str:
    """A copy of snapshot ``key`` with its lines edited (checksum recomputed when the edit
    keeps the end line's sha256 field out of its hands)."""
    lines = gzip.decompress(rt.objects.get(key)).splitlines(keepends=True)
    new_key = f"_metadata/snapshots/edited-{uuid.uuid4()}.jsonl.gz"
    rt.objects.put(new_key, gzip.compress(b"".join(edit(lines))))
    return new_key


def _resealed(lines: list[bytes]) -> list[bytes]:
    body = lines[:-1]
    end = json.loads(lines[-1])
    end["sha256"] = hashlib.sha256(b"".join(body)).hexdigest()
    return [*body, json.dumps(end).encode() + b"\n"]


def test_damaged_or_foreign_snapshots_are_refused(populated: Runtime, fresh: Fresh) -> None:
    rt = populated
    key = export_from(rt).snapshot.key
    raw = rt.objects.get(key)
    flipped = f"_metadata/snapshots/flipped-{uuid.uuid4()}.jsonl.gz"
    rt.objects.put(flipped, raw[:40] + bytes([raw[40] ^ 0xFF]) + raw[41:])

    def tamper(lines: list[bytes]) -> list[bytes]:
        at = next(n for n, line in enumerate(lines) if b'"t":"ledgers"' in line)
        return [*lines[:at], lines[at].replace(b"orders", b"orderz"), *lines[at + 1 :]]

    def other_revision(lines: list[bytes]) -> list[bytes]:
        header = json.loads(lines[0])
        header["revision"] = "0001"
        return _resealed([json.dumps(header).encode() + b"\n", *lines[1:]])

    def fewer_columns(lines: list[bytes]) -> list[bytes]:
        """A hand-made snapshot at this revision whose ledgers lack their last column."""
        header, *rows = (json.loads(line) for line in lines[:-1])
        header["tables"]["ledgers"].pop()
        for row in rows:
            if row["t"] == "ledgers":
                row["r"].pop()
        return _resealed([*(json.dumps(x).encode() + b"\n" for x in (header, *rows)), lines[-1]])

    cases = {
        _rewrite(rt, key, fewer_columns): (
            "the columns of table 'ledgers' differ from this database's; nothing was imported$"
        ),
        flipped: "is damaged",
        _rewrite(rt, key, tamper): "checksum mismatch",
        _rewrite(rt, key, lambda lines: lines[:-1]): "truncated",
        _rewrite(rt, key, other_revision): "schema revision 0001",
        "_metadata/snapshots/nothing-here.jsonl.gz": "is not in",
    }
    target = fresh()
    for bad, message in cases.items():
        with pytest.raises(SnapshotError, match=message):
            import_snapshot(target.metadata.engine, target.objects, bad)
        assert all(not rows for rows in table_rows(target).values())
    assert import_snapshot(target.metadata.engine, target.objects, key).key == key


def test_the_cli_names_a_damaged_snapshot_in_one_line(populated: Runtime, fresh: Fresh) -> None:
    rt = populated
    raw = rt.objects.get(export_from(rt).snapshot.key)
    flipped = f"_metadata/snapshots/flipped-{uuid.uuid4()}.jsonl.gz"
    rt.objects.put(flipped, raw[:40] + bytes([raw[40] ^ 0xFF]) + raw[41:])
    target = fresh()
    proc = run_cli(target, "metadata", "import", "--snapshot", flipped)
    _, err = proc.communicate(timeout=120)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "is damaged" in lines[0]
    assert all(not rows for rows in table_rows(target).values())


def test_an_export_killed_before_its_manifest_never_becomes_the_latest(
    populated: Runtime, fresh: Fresh
) -> None:
    rt = populated
    first = export_from(rt).snapshot
    rt.metadata.deletions.enqueue(["after-first"], "t", store_id=rt.stores.default_id())
    proc = run_cli(rt, "metadata", "export", failpoints="after-snapshot-upload")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert [s.key for s in read_manifest(rt.objects)] == [first.key]
    written = {o.key for o in rt.objects.list("_metadata/snapshots/")}
    assert len(written) == 3  # manifest, first, the killed export's complete object

    target = fresh()
    assert import_snapshot(target.metadata.engine, target.objects, "latest").key == first.key
    queued = {d.object_key for d in pending_deletions(target.metadata)}
    assert "after-first" not in queued  # the state of the first snapshot, not the killed one

    # a rerun converges: a new latest; the killed one is left for the sweep (unreferenced)
    proc = run_cli(rt, "metadata", "export", "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["kept"][0] == first.key
    assert latest_snapshot(rt.objects).key == json.loads(out)["snapshot"]["key"]


def test_only_the_newest_snapshots_are_kept(backend_settings: Settings) -> None:
    settings = backend_settings.model_copy(update={"metadata_snapshots_keep": 2})
    with Runtime.open(settings) as rt:
        results = [export_from(rt) for _ in range(4)]
        keys = [r.snapshot.key for r in results]
        assert [(r.kept, r.retired) for r in results] == [
            (keys[:1], []),
            (keys[:2], []),
            (keys[1:3], keys[:1]),
            (keys[2:4], keys[1:2]),
        ]
        assert [s.key for s in read_manifest(rt.objects)] == keys[2:]
        assert sorted(
            (d.object_key, d.reason, d.store_id) for d in pending_deletions(rt.metadata)
        ) == sorted(
            (key, "metadata snapshot beyond the kept ones", rt.stores.default_id())
            for key in keys[:2]
        )
        process_deletions(rt.metadata, rt.stores, rt.settings)
        assert {o.key for o in rt.objects.list("_metadata/snapshots/2")} == set(keys[2:])


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


def test_each_snapshot_refusal_word_for_word(populated: Runtime, fresh: Fresh) -> None:
    """The message of every refusal, and that each one imports nothing."""
    rt = populated
    target = fresh()
    with pytest.raises(SnapshotError) as no_manifest:
        import_snapshot(target.metadata.engine, target.objects, None)
    assert str(no_manifest.value) == (
        f"no metadata snapshot in {rt.objects.url} (_metadata/snapshots/manifest.json names "
        "none): run `offloader metadata export`, or `offloader metadata rebuild` without one"
    )
    key = export_from(rt).snapshot.key
    lines = gzip.decompress(rt.objects.get(key)).splitlines(keepends=True)
    body_sha = hashlib.sha256(b"".join(lines[:-1])).hexdigest()

    def header(edit: Callable[[dict], object]) -> Callable[[list[bytes]], list[bytes]]:
        def rewrite(lines: list[bytes]) -> list[bytes]:
            item = json.loads(lines[0])
            edit(item)
            return _resealed([json.dumps(item).encode() + b"\n", *lines[1:]])

        return rewrite

    def end(edit: Callable[[dict], object]) -> Callable[[list[bytes]], list[bytes]]:
        def rewrite(lines: list[bytes]) -> list[bytes]:
            item = json.loads(lines[-1])
            edit(item)
            return [*lines[:-1], json.dumps(item).encode() + b"\n"]

        return rewrite

    def tamper(lines: list[bytes]) -> list[bytes]:
        return [lines[0], lines[1].replace(b"[", b"[ ", 1), *lines[2:]]

    tampered = _rewrite(rt, key, tamper)
    tampered_sha = hashlib.sha256(b"".join(tamper(lines)[:-1])).hexdigest()
    damaged = "snapshot {} is damaged: "
    cases = {
        _rewrite(rt, key, lambda ls: [*ls, ls[1]]): damaged + "data after its end line",
        _rewrite(rt, key, header(lambda h: h.update(format="other"))): (
            "snapshot {} is not a version 1 metadata snapshot"
        ),
        _rewrite(rt, key, lambda ls: _resealed([ls[0], b"not json\n", *ls[1:]])): (
            damaged + "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
        ),
        _rewrite(rt, key, lambda ls: ls[:-1]): damaged + "it is truncated (no end line)",
        tampered: damaged + f"checksum mismatch (sha256 {tampered_sha}, recorded {body_sha}); "
        "nothing was imported",
        _rewrite(rt, key, end(lambda e: e.pop("rows"))): (
            damaged + "row counts differ from its end line"
        ),
        _rewrite(rt, key, header(lambda h: h.update(revision="0001"))): (
            f"snapshot {{}} is at schema revision 0001, this database at {head_revision()}: "
            "restore it with the release that wrote it, then `offloader db upgrade`"
        ),
        _rewrite(rt, key, header(lambda h: h["tables"].pop("stream_cuts"))): (
            "snapshot {}: the columns of table 'stream_cuts' differ from this database's; "
            "nothing was imported"
        ),
        "_metadata/snapshots/nothing-here.jsonl.gz": f"snapshot {{}} is not in {rt.objects.url}",
    }
    for bad, message in cases.items():
        with pytest.raises(SnapshotError) as refused:
            import_snapshot(target.metadata.engine, target.objects, bad)
        assert str(refused.value) == message.format(bad)
        assert all(not rows for rows in table_rows(target).values())

    # the manifest's checksum is checked too when the latest is imported
    manifest = json.loads(rt.objects.get(MANIFEST_KEY))
    manifest["snapshots"][-1]["sha256"] = "0" * 64
    rt.objects.put(MANIFEST_KEY, json.dumps(manifest).encode())
    with pytest.raises(SnapshotError) as refused:
        import_snapshot(target.metadata.engine, target.objects, "latest")
    assert str(refused.value) == (
        f"snapshot {key} is damaged: checksum mismatch (sha256 {body_sha}, recorded "
        f"{'0' * 64}); nothing was imported"
    )
    assert all(not rows for rows in table_rows(target).values())


def test_a_row_of_the_wrong_width_is_refused(populated: Runtime, fresh: Fresh) -> None:
    """A sealed snapshot whose row has a value too few (a writer's bug: its checksum is
    right) is refused before anything is loaded, naming the table."""
    rt = populated
    key = export_from(rt).snapshot.key

    def narrow(lines: list[bytes]) -> list[bytes]:
        at = next(n for n, line in enumerate(lines) if b'"t":"ledgers"' in line)
        item = json.loads(lines[at])
        item["r"] = item["r"][:-1]
        return _resealed([*lines[:at], json.dumps(item).encode() + b"\n", *lines[at + 1 :]])

    target = fresh()
    message = r"is damaged: a row of table 'ledgers' has \d+ values, its header names \d+ columns$"
    with pytest.raises(SnapshotError, match=message):
        import_snapshot(target.metadata.engine, target.objects, _rewrite(rt, key, narrow))
    assert all(not rows for rows in table_rows(target).values())


def _compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode() + b"\n"


@pytest.fixture
def away_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone 3.5 hours behind UTC: UTC stamps must not follow it."""
    monkeypatch.setenv("TZ", "America/St_Johns")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_an_export_writes_the_documented_snapshot(
    populated: Runtime, away_from_utc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FORMAT.md's snapshot byte for byte: key (in UTC), gzip header, lines, end line,
    user metadata, manifest; a snapshot below the part size goes up in one PUT."""
    rt = populated
    rows = table_rows(rt)
    parts: list[int] = []
    upload_part = rt.objects.upload_part
    monkeypatch.setattr(
        rt.objects, "upload_part", lambda u, n, data: parts.append(n) or upload_part(u, n, data)
    )
    before = rt.metadata.db_now_ms()
    exported = export_from(rt)
    after = rt.metadata.db_now_ms()
    assert parts == []
    info = exported.snapshot
    assert (exported.kept, exported.retired) == ([info.key], [])
    assert before <= info.created_ms <= after
    stamp = datetime.fromtimestamp(info.created_ms / 1000, UTC)
    prefix = f"_metadata/snapshots/{stamp:%Y%m%dT%H%M%S}{info.created_ms % 1000:03d}Z-"
    assert info.key.startswith(prefix) and info.key.endswith(".jsonl.gz")
    assert str(uuid.UUID(info.key[len(prefix) : -len(".jsonl.gz")])) in info.key
    assert info.revision == head_revision()
    assert info.rows == {name: len(r) for name, r in rows.items()}

    raw = rt.objects.get(info.key)
    assert info.bytes == len(raw)
    assert raw[4:8] == b"\0\0\0\0"  # gzip mtime 0: the same rows give the same bytes
    assert dict(rt.objects.stat(info.key).metadata) == {
        "sha256": info.sha256,
        "revision": info.revision,
    }
    lines = gzip.decompress(raw).splitlines(keepends=True)
    tables = schema.metadata.sorted_tables
    assert lines[0] == _compact(
        {
            "format": "offloader-metadata-snapshot",
            "format_version": 1,
            "revision": info.revision,
            "created_ms": info.created_ms,
            "tables": {t.name: [c.name for c in t.columns] for t in tables},
        }
    )
    body = [json.loads(line) for line in lines[1:-1]]
    assert [_compact(item) for item in body] == lines[1:-1]
    # tables parents first, each in primary-key order
    expected = []
    for t in tables:
        key = [list(t.columns).index(c) for c in t.primary_key.columns]
        expected += sorted(
            ({"t": t.name, "r": list(r)} for r in rows[t.name]),
            key=lambda item: [item["r"][k] for k in key],
        )
    assert body == json.loads(json.dumps(expected))
    assert info.sha256 == hashlib.sha256(b"".join(lines[:-1])).hexdigest()
    assert (
        lines[-1]
        == json.dumps({"end": True, "rows": info.rows, "sha256": info.sha256}).encode() + b"\n"
    )

    manifest = {
        "format": "offloader-metadata-snapshot",
        "format_version": 1,
        "snapshots": [asdict(info)],
    }
    assert rt.objects.get(MANIFEST_KEY) == json.dumps(manifest, indent=1, sort_keys=True).encode()
    assert read_manifest(rt.objects) == [info]


def test_a_foreign_manifest_is_refused(runtime: Runtime) -> None:
    rt = runtime
    for body in (
        {"format": "other", "format_version": 1, "snapshots": []},
        {"format": "offloader-metadata-snapshot", "format_version": 2, "snapshots": []},
    ):
        rt.objects.put(MANIFEST_KEY, json.dumps(body).encode())
        with pytest.raises(SnapshotError) as refused:
            latest_snapshot(rt.objects)
        assert str(refused.value) == (
            "_metadata/snapshots/manifest.json: not a version 1 snapshot manifest"
        )


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_snapshot_above_the_part_size_goes_in_parts(
    populated: Runtime, fresh: Fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fs only: parts of 500 bytes (S3's smallest part is 5 MiB, a snapshot that big
    takes minutes to make). Uploaded in parts, read back in ranges, restored identical; a
    failed part leaves no upload behind and no snapshot."""
    rt = populated
    monkeypatch.setattr(backup, "PART_SIZE", 500)
    uploaded: list[int] = []
    upload_part = rt.objects.upload_part

    def counting(upload: MultipartUpload, number: int, data: bytes) -> PartInfo:
        uploaded.append(len(data))
        return upload_part(upload, number, data)

    monkeypatch.setattr(rt.objects, "upload_part", counting)
    info = export_from(rt).snapshot
    assert (
        info.bytes > 1000
        and uploaded == [500] * (info.bytes // 500) + [info.bytes % 500][: info.bytes % 500]
    )
    assert dict(rt.objects.stat(info.key).metadata) == {
        "sha256": info.sha256,
        "revision": info.revision,
    }
    rows = table_rows(rt)
    target = fresh()
    assert import_snapshot(target.metadata.engine, target.objects, None) == info
    assert table_rows(target) == rows

    def failing(upload: MultipartUpload, number: int, data: bytes) -> PartInfo:
        if number == 2:
            raise ObjectStoreError("part 2 lost")
        return upload_part(upload, number, data)

    monkeypatch.setattr(rt.objects, "upload_part", failing)
    with pytest.raises(ObjectStoreError, match="part 2 lost"):
        export_from(rt)
    assert list(rt.objects.list_multipart_uploads()) == []
    assert read_manifest(rt.objects) == [info]


def test_an_export_of_a_database_without_schema_is_refused(
    runtime: Runtime, tmp_path: Path
) -> None:
    (tmp_path / "bare").mkdir()
    engine = sa.create_engine(sqlite_url(tmp_path / "bare"))
    try:
        with pytest.raises(SnapshotError) as refused:
            export_snapshot(engine, runtime.objects, 1, 1)
    finally:
        engine.dispose()
    assert str(refused.value) == "the metadata database has no schema: run `offloader db upgrade`"
    assert [o.key for o in runtime.objects.list("_metadata/")] == []
