"""The export without Spark: plan, executors' slices, atomic publish, on both backends.

Spark only distributes these functions (tests/spark/ runs them through it); here each
step's contract is checked directly, including what a reader sees between two attempts.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from array import array
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from fixtures.backends import make_topic, produce_ledgers, tiered_digests
from fixtures.damage import flip, overwrite_object
from fixtures.databases import sqlite_url, upgraded
from fixtures.exports import (
    TOPICS,
    export_files,
    export_table,
    offloaded_topics,
    output_url,
    parquet_digests,
    run_export,
)
from fixtures.seaweedfs import SeaweedS3
from offloader.bulk import export as export_module
from offloader.bulk import output as output_module
from offloader.bulk.export import export_slices, published_manifest
from offloader.bulk.manifest import BulkExportResult
from offloader.bulk.output import ExportTarget, open_output
from offloader.bulk.params import ExportParams
from offloader.bulk.parquet import SCHEMA, slice_table
from offloader.bulk.plan import plan_export
from offloader.exceptions import DamagedObjectError, NotFoundError
from offloader.keys import EXPORT_ATTEMPTS_DIR
from offloader.metadata import schema
from offloader.objectstore import ObjectStore
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.objectstore.location import StoreLocation
from offloader.objectstore.registry import open_object_store
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.batch import EntryBatch
from offloader.runtime import Runtime
from offloader.settings import Settings


def test_export_equals_the_source_and_a_rerun_replaces_it_whole(
    runtime: Runtime, tmp_path: Path
) -> None:
    offloaded_topics(runtime)
    url = output_url(runtime, tmp_path)
    params = ExportParams.parse({"slice_bytes": 20_000, "output": url, "export_id": "e1"})
    plan, manifest = run_export(runtime, params)
    assert plan.ledgers == 4 and len(plan.slices) > plan.ledgers  # ledgers are cut in slices
    read, files = export_files(url, "e1", runtime.settings)
    assert read == manifest and len(files) == len(plan.slices)
    table = export_table(files)
    assert table.schema == SCHEMA
    assert (
        table["publish_time"].null_count
        == table.num_rows
        == sum(c for s in TOPICS.values() for c, _ in s)
    )
    assert parquet_digests(table) == tiered_digests(runtime)

    # a rerun of the same export: a new attempt, published in one step, the old one removed
    _, again = run_export(runtime, params, executors=3)
    assert again.attempt != manifest.attempt
    assert again.files == manifest.files  # same paths, same bytes
    assert published_manifest(url, "e1", runtime.settings) == again
    assert staged_attempts(runtime, url, "e1") == {again.attempt}


def staged_attempts(rt: Runtime, url: str, export_id: str) -> set[str]:
    """The attempts whose files exist (listing is fine in a test)."""
    if url.startswith("file:"):
        return {p.name for p in (Path(url[7:]) / EXPORT_ATTEMPTS_DIR / export_id).iterdir()}
    keys = [i.key for i in rt.objects.list(f"exports/{export_id}/")]  # output_url's exports/
    return {k.split("/")[2] for k in keys if k.endswith(".parquet")}


def test_a_reader_never_sees_an_unpublished_attempt(runtime: Runtime, tmp_path: Path) -> None:
    first_id, second_id = offloaded_topics(runtime, {"orders": [(20, 1000), (20, 1000)]})["orders"]
    url = output_url(runtime, tmp_path)
    params = ExportParams.parse({"output": url, "export_id": "e2", "last_ledger": first_id})
    _, first = run_export(runtime, params)
    # a second attempt that stages everything and dies before publishing
    wider = params.model_copy(update={"last_ledger": None})
    dead = ExportTarget.new_attempt(url, "e2")
    export_slices(plan_export(runtime.metadata, wider).slices, dead, runtime.settings)
    read, files = export_files(url, "e2", runtime.settings)
    assert read == first and set(export_table(files)["ledger_id"].to_pylist()) == {first_id}
    # the next attempt publishes and takes the dead one's files with it
    _, second = run_export(runtime, wider)
    assert staged_attempts(runtime, url, "e2") == {second.attempt}
    read, files = export_files(url, "e2", runtime.settings)
    assert set(export_table(files)["ledger_id"].to_pylist()) == {first_id, second_id}


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_plan_selects_by_topic_ledger_range_and_creation_time(runtime: Runtime) -> None:
    make_topic(runtime, "a")
    make_topic(runtime, "b")
    ids = produce_ledgers(runtime, "a", [(10, 100)] * 4)
    produce_ledgers(runtime, "b", [(5, 100)])
    from offloader.offload.ledger_offloader import LedgerOffloader

    LedgerOffloader(runtime).offload_topic("a", up_to=ids[2])  # the last stays hot only
    chosen = {"topics": ["a"], "first_ledger": ids[1], "slice_bytes": 300}
    plan = plan_export(runtime.metadata, ExportParams.parse(chosen))
    assert {(s.topic, s.ledger_id) for s in plan.slices} == {("a", ids[1]), ("a", ids[2])}
    assert plan.to_json()["not_offloaded"] == [f"a/{ids[3]}"]
    assert len(plan.slices) > 2
    for ledger in ids[1:3]:  # slices of a ledger cover its entries once, in order
        ranges = [(s.first_entry_id, s.last_entry_id) for s in plan.slices if s.ledger_id == ledger]
        assert ranges[0][0] == 0 and ranges[-1][1] == 9
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges))
    created = runtime.metadata.get_ledger("a", ids[2]).created_ms
    from datetime import UTC, datetime

    window = ExportParams.parse(
        {"created_from": datetime.fromtimestamp(created / 1000, UTC).isoformat()}
    )
    assert {s.ledger_id for s in plan_export(runtime.metadata, window).slices} == {ids[2]}
    with pytest.raises(NotFoundError, match="'nope'"):
        plan_export(runtime.metadata, ExportParams.parse({"topics": ["nope"]}))


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_export_starts_at_the_topics_start(runtime: Runtime) -> None:
    ids = offloaded_topics(runtime, {"orders": [(10, 100), (10, 100)]})["orders"]
    from offloader.metadata import Position
    from offloader.retention.trim import trim_topic

    trim_topic(runtime, "orders", Position(ledger_id=ids[1], entry_id=4))
    plan = plan_export(runtime.metadata, ExportParams())
    assert [(s.ledger_id, s.first_entry_id, s.last_entry_id) for s in plan.slices] == [
        (ids[1], 4, 9)
    ]


def test_a_short_read_is_never_written() -> None:
    from offloader.bulk.plan import ExportSlice
    from offloader.objectstore.location import StoreLocation

    part = ExportSlice("t", 1, 0, 2, "d", "i", 2, StoreLocation("file", "/x"), 0)
    two = EntryBatch(b"ab", 0, array("q", [0, 1]), array("q", [1, 1]))
    with pytest.raises(ValueError, match=r"read entries 0\.\.1, expected 0\.\.2"):
        slice_table(part, [two])
    skipped = EntryBatch(b"c", 2, array("q", [0]), array("q", [1]))
    with pytest.raises(ValueError, match=r"read entries 0\.\.-1, expected 0\.\.2"):
        slice_table(part, [skipped])
    table = slice_table(part, [two, EntryBatch(b"c", 2, array("q", [0]), array("q", [1]))])
    assert table.column("payload").to_pylist() == [b"a", b"b", b"c"]
    assert table.column("entry_id").to_pylist() == [0, 1, 2]


def test_publish_refuses_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "e3").mkdir()
    from offloader.bulk.manifest import ExportManifest
    from offloader.settings import Settings

    target = ExportTarget.new_attempt(tmp_path.as_uri(), "e3")
    manifest = ExportManifest(
        export_id="e3", attempt=target.attempt, root="", created_ms=0, params={}
    )
    with open_output(target, Settings.from_values()) as output, pytest.raises(FileExistsError):
        output.publish(manifest)
    assert list((tmp_path / "e3").iterdir()) == []


def test_replacing_an_export_removes_only_its_own_attempts(
    s3_server: SeaweedS3, tmp_path: Path
) -> None:
    """An export whose folder holds other objects (here the offloader's own ledgers: the
    store is ``s3://bucket/ledgers`` and the export ``ledgers`` at ``s3://bucket``) removes
    only the folders of its earlier attempts, never objects it did not write."""
    settings = upgraded(
        s3_server.make_settings(
            "t-overlap", prefix="ledgers", metadata_url=sqlite_url(tmp_path), data_dir=tmp_path
        )
    )
    with Runtime.open(settings) as rt:
        offloaded_topics(rt, {"orders": [(10, 100), (5, 100)]})
        before = tiered_digests(rt)
        bucket = settings.resolved_object_store_url.rsplit("/", 1)[0]
        params = ExportParams.parse({"output": bucket, "export_id": "ledgers"})
        _, first = run_export(rt, params)
        _, second = run_export(rt, params)  # replaces the first: its attempt is removed
        assert tiered_digests(rt) == before  # every ledger object is still there
        assert staged_attempts_under(rt, "") == {second.attempt}
        assert first.attempt != second.attempt


def staged_attempts_under(rt: Runtime, folder: str) -> set[str]:
    """The attempts whose Parquet files exist under ``folder`` of ``rt``'s store."""
    keys = [i.key for i in rt.objects.list(folder)]
    return {k.split("/")[0] for k in keys if k.endswith(".parquet")}


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_the_manifest_is_what_publish_returns_and_sums_up_the_export(
    runtime: Runtime, tmp_path: Path
) -> None:
    """The manifest a reader reads is the one the driver got back (and logged): its params
    in their JSON form, its time the publish's, its summary (the task's XCom) the files'."""
    offloaded_topics(runtime)
    url = output_url(runtime, tmp_path)
    values = {
        "output": url,
        "export_id": "e1",
        "slice_bytes": 20_000,
        "created_from": "2000-01-01T00:00:00Z",
    }
    params = ExportParams.parse(values)
    before = time.time_ns() // 1_000_000
    plan, manifest = run_export(runtime, params)
    after = time.time_ns() // 1_000_000
    assert before <= manifest.created_ms <= after
    read, files = export_files(url, "e1", runtime.settings)
    assert read == manifest
    assert manifest.params["created_from"] == "2000-01-01T00:00:00Z"
    assert ExportParams.parse(manifest.params) == params
    table = export_table(files)
    published = BulkExportResult(manifest).to_json()
    assert published == {
        "export_id": "e1",
        "attempt": staged_attempts(runtime, url, "e1").pop(),
        "files": len(files),
        "rows": table.num_rows,
        "bytes": sum(len(data) for data in files.values()),
        "ledgers": len(parquet_digests(table)),  # (topic, ledger) pairs in the rows
    }
    assert len(files) > plan.ledgers == published["ledgers"]  # ledgers != files
    for data in files.values():  # one Parquet file per slice, zstd (docs/OPERATIONS.md)
        meta = pq.ParquetFile(io.BytesIO(data)).metadata
        codecs = {
            meta.row_group(g).column(c).compression
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
        }
        assert codecs == {"ZSTD"}


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_an_executor_opens_each_store_once_and_closes_it(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offloaded_topics(runtime, {"orders": [(20, 1000), (20, 1000)]})
    plan = plan_export(runtime.metadata, ExportParams(slice_bytes=5000))
    assert len(plan.slices) > 2 and len({s.store for s in plan.slices}) == 1
    opened: list[StoreLocation] = []
    closed: list[StoreLocation] = []

    def open_location(location: StoreLocation, settings: Settings) -> ObjectStore:
        store = real_open(location, settings)
        opened.append(location)
        close = store.close

        def closing() -> None:
            closed.append(location)
            close()

        store.close = closing  # type: ignore[method-assign]
        return store

    real_open = export_module.open_location
    monkeypatch.setattr(export_module, "open_location", open_location)
    target = ExportTarget.new_attempt((tmp_path / "out").as_uri(), "e1")
    files = export_slices(plan.slices, target, runtime.settings.for_object_stores())
    assert len(files) == len(plan.slices)
    assert opened == closed == [plan.slices[0].store]


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_an_executor_keeps_read_prefetch_gets_in_flight(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_prefetch`` 0 (settings) reads a slice's ranges one after the other in the
    executor's own thread, never in read-ahead threads."""
    make_topic(runtime, "big", max_block_size=9 * 1024 * 1024)
    (ledger_id,) = produce_ledgers(runtime, "big", [(150, 64 * 1024)], fixed=True)
    LedgerOffloader(runtime).offload_ledger("big", ledger_id)
    plan = plan_export(runtime.metadata, ExportParams())
    (part,) = plan.slices  # one slice over two blocks: two ranged GETs
    threads: list[threading.Thread] = []
    read_range = FilesystemObjectStore.read_range

    def recording(store: FilesystemObjectStore, key: str, offset: int, length: int) -> bytes:
        threads.append(threading.current_thread())
        return read_range(store, key, offset, length)

    monkeypatch.setattr(FilesystemObjectStore, "read_range", recording)
    settings = runtime.settings.model_copy(update={"read_prefetch": 0}).for_object_stores()
    target = ExportTarget.new_attempt((tmp_path / "out").as_uri(), "e1")
    (file,) = export_slices([part], target, settings)
    assert file["rows"] == 150
    assert len(threads) >= 2 and set(threads) == {threading.current_thread()}


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_damage_fails_the_slice_naming_the_ledger(runtime: Runtime, tmp_path: Path) -> None:
    """A damaged index is reported with the topic and ledger the slice names; an index that
    holds more entries than the metadata store says fails the slice instead of exporting
    fewer entries."""
    damaged, short = offloaded_topics(runtime, {"orders": [(10, 100), (10, 100)]})["orders"]
    index_key = runtime.metadata.get_ledger("orders", damaged).index_key
    assert index_key is not None
    overwrite_object(runtime.objects, index_key, flip(3))
    with runtime.metadata.transaction() as conn:  # the metadata store lost the last entry
        conn.execute(
            sa.update(schema.ledgers)
            .where(schema.ledgers.c.topic == "orders", schema.ledgers.c.ledger_id == short)
            .values(entry_count=9)
        )
    plan = plan_export(runtime.metadata, ExportParams())
    closure = runtime.settings.for_object_stores()
    target = ExportTarget.new_attempt((tmp_path / "out").as_uri(), "e1")
    slices = {s.ledger_id: s for s in plan.slices}
    with pytest.raises(DamagedObjectError) as raised:
        export_slices([slices[damaged]], target, closure)
    assert (raised.value.topic, raised.value.ledger_id) == ("orders", damaged)
    assert raised.value.key == index_key
    with pytest.raises(DamagedObjectError, match="index says last entry 9, the metadata store 8"):
        export_slices([slices[short]], target, closure)


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_an_s3_output_is_opened_with_each_step_s_settings(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``s3://`` output: the executors open it with their closure's settings, the driver
    with its own (endpoint and keys come from them). The S3 binding is stood in by the
    filesystem one, so the object-store output runs for real: files under
    ``<export id>/<attempt>/``, the manifest beside them, read back as the reader does."""
    offloaded_topics(runtime)
    opened: list[tuple[str, Settings]] = []

    def open_store(url: str, settings: Settings) -> ObjectStore:
        opened.append((url, settings))
        return open_object_store((tmp_path / "bucket").as_uri())

    monkeypatch.setattr(output_module, "open_object_store", open_store)
    url = "s3://bucket/exports"
    params = ExportParams.parse({"output": url, "export_id": "e1", "slice_bytes": 20_000})
    _, manifest = run_export(runtime, params, executors=2)
    assert published_manifest(url, "e1", runtime.settings) == manifest
    closure = runtime.settings.for_object_stores()
    assert closure != runtime.settings
    assert opened == [(url, closure)] * 2 + [(url, runtime.settings)] * 2
    assert manifest.root == f"{manifest.attempt}/"
    store = open_object_store((tmp_path / "bucket").as_uri())
    files = {p: store.get(f"e1/{p}") for p in manifest.file_paths()}
    assert parquet_digests(export_table(files)) == tiered_digests(runtime)
