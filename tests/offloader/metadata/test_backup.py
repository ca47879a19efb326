"""Metadata snapshots on both pairings: export, wipe the database, import, every ledger reads
back identical; rebuild from the objects alone; refusals (non-empty database, damaged or
foreign snapshot) change nothing; an export killed before its manifest never becomes the
latest."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from fixtures.backends import make_topic, produce_ledgers, run_cli, tiered_digests
from fixtures.databases import sqlite_url, temporary_database, upgraded
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import schema
from offloader.metadata.backup import (
    SnapshotError,
    export_from,
    import_snapshot,
    latest_snapshot,
    read_manifest,
    rebuild_from_objects,
)
from offloader.offload.keys import ledger_object_keys
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import TopicReader
from offloader.runtime import Runtime
from offloader.settings import Settings

Fresh = Callable[[], Runtime]


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
    rt.metadata.enqueue_deletions(["some-leftover"], "test", store_id=rt.stores.default_id())
    return rt


@pytest.fixture
def fresh(backend_settings: Settings, tmp_path: Path) -> Iterator[Fresh]:
    """Runtimes on a new, empty, upgraded database; same store and hot tier."""
    stack = contextlib.ExitStack()

    def make() -> Runtime:
        if backend_settings.resolved_metadata_url.startswith("postgresql"):
            url = stack.enter_context(temporary_database())
        else:
            url = sqlite_url(tmp_path / f"fresh-{uuid.uuid4().hex[:8]}")
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True)
        settings = upgraded(backend_settings.model_copy(update={"metadata_url": SecretStr(url)}))
        return stack.enter_context(Runtime.open(settings))

    with stack:
        yield make


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
    assert info.sha256 == exported.snapshot.sha256
    assert table_rows(restored) == rows
    assert tiered_digests(restored) == digests
    for topic, checksum in checksums.items():
        assert TopicReader(restored).checksum(topic) == checksum
    # the restored database goes on working: new ids continue after the restored ones
    restored.metadata.enqueue_deletions(["after-restore"], "t", store_id=1)
    ids = [d.id for d in restored.metadata.pending_deletions()]
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
    with pytest.raises(SnapshotError, match=r"not empty \(object_stores"):
        import_snapshot(rt.metadata.engine, rt.objects, "latest")
    with pytest.raises(SnapshotError, match=r"not empty \(object_stores"):
        rebuild_from_objects(rt.metadata.engine, rt.objects, rt.stores.default_location)
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

    cases = {
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
    rt.metadata.enqueue_deletions(["after-first"], "t", store_id=rt.stores.default_id())
    proc = run_cli(rt, "metadata", "export", failpoints="after-snapshot-upload")
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert [s.key for s in read_manifest(rt.objects)] == [first.key]
    written = {o.key for o in rt.objects.list("_metadata/snapshots/")}
    assert len(written) == 3  # manifest, first, the killed export's complete object

    target = fresh()
    assert import_snapshot(target.metadata.engine, target.objects, "latest").key == first.key
    queued = {d.object_key for d in target.metadata.pending_deletions()}
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
        keys = [export_from(rt).snapshot.key for _ in range(4)]
        assert [s.key for s in read_manifest(rt.objects)] == keys[2:]
        assert {d.object_key for d in rt.metadata.pending_deletions()} == set(keys[:2])
        process_deletions(rt.metadata, rt.stores, rt.settings)
        assert {o.key for o in rt.objects.list("_metadata/snapshots/2")} == set(keys[2:])
