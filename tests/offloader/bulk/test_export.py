"""The export without Spark: plan, executors' slices, atomic publish, on both backends.

Spark only distributes these functions (tests/spark/ runs them through it); here each
step's contract is checked directly, including what a reader sees between two attempts.
"""

from __future__ import annotations

import itertools
from array import array
from pathlib import Path

import pytest

from fixtures.backends import make_topic, produce_ledgers, tiered_digests
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
from offloader.bulk.export import export_slices, published_manifest
from offloader.bulk.output import ATTEMPTS_DIR, ExportTarget, open_output
from offloader.bulk.params import ExportParams
from offloader.bulk.parquet import SCHEMA, slice_table
from offloader.bulk.plan import plan_export
from offloader.exceptions import NotFoundError
from offloader.read.batch import EntryBatch
from offloader.runtime import Runtime


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
        return {p.name for p in (Path(url[7:]) / ATTEMPTS_DIR / export_id).iterdir()}
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
    assert plan.summary()["not_offloaded"] == [f"a/{ids[3]}"]
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
