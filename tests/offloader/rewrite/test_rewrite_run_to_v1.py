"""Mode to-v1 of a rewrite run (rewrite/run.py, what the ``bulk_rewrite`` DAG runs with
``RewriteParams(mode="to-v1")``) in this process, on files + SQLite: the params' topics and
ledger range limit the plan, and the report says per ledger what was (or, dry, would be)
migrated, in the dict form the task returns (docs/OPERATIONS.md, bulk_rewrite); a ledger
that moved between plan and run is "no longer streamed"; the data reads back the same."""

from __future__ import annotations

from typing import Any

import pytest

from fixtures.inspect import table_rows
from fixtures.rewrites import change_after_to_v1_plan, v1_topic
from fixtures.streamed import streamed_topic
from offloader.metadata import OffloadMode
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.read.topic_reader import Source, TopicReader
from offloader.rewrite import run as run_module
from offloader.rewrite import to_v1
from offloader.rewrite.params import RewriteParams
from offloader.rewrite.report import FAILED
from offloader.rewrite.run import run_rewrite
from offloader.runtime import Runtime

FAST = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
T, OTHER = "s", "other"


def to_v1_run(rt: Runtime, **values: Any) -> dict[str, Any]:
    """One to-v1 run as the DAG's driver starts it; the report's dict form."""
    params = RewriteParams(mode="to-v1", **values)
    return run_rewrite(rt, params, owner="test").to_json()


def segment_group(rt: Runtime, ledger_id: int, outcome: str, **after: Any) -> dict[str, Any]:
    """A to-v1 group as reported: one ledger, whose payload bytes lay in shared segments
    (no object of its own before)."""
    return {
        "topic": T,
        "kind": "segment",
        "ledgers": [ledger_id],
        "sources": 1,
        "objects_before": 0,
        "bytes_before": size(rt, ledger_id),
        "outcome": outcome,
        "objects_after": 0,
        "bytes_after": 0,
        "segment_id": None,
        "detail": None,
        **after,
    }


def size(rt: Runtime, ledger_id: int) -> int:
    return rt.metadata.get_ledger(T, ledger_id).size_bytes


@pytest.fixture
def two_topics(runtime: Runtime) -> list[int]:
    """``T`` (4 ledgers) and ``OTHER`` (2) streamed whole, hot copies deleted so that the
    tier is the only copy; ``T``'s ledger ids."""
    ids = streamed_topic(runtime, T, 4)
    streamed_topic(runtime, OTHER, 2, seed=11)
    for topic in (T, OTHER):
        delete_hot_copies(runtime.metadata, runtime.hot, topic)
    return ids


@FAST
def test_a_dry_run_reports_the_selected_ledgers_as_planned(
    runtime: Runtime, two_topics: list[int]
) -> None:
    """Topics, range and max_groups choose what is planned; nothing is written."""
    rt, ids = runtime, two_topics
    rows = table_rows(rt.metadata)
    report = to_v1_run(
        rt, topics=[T], first_ledger=ids[1], last_ledger=ids[3], dry_run=True, max_groups=2
    )
    assert table_rows(rt.metadata) == rows
    planned = [segment_group(rt, n, "planned") for n in ids[1:3]]
    assert report == {
        "mode": "to-v1",
        "dry_run": True,
        "groups": planned,
        "left": 1,
        "recovered": [],
        "stores_read": [],  # a dry run moves nothing
        "stores_written": [],
        "totals": {
            "groups": 2,
            "objects_before": 0,
            "objects_after": 4,
            "bytes_before": size(rt, ids[1]) + size(rt, ids[2]),
            "bytes_after": 0,
        },
    }


@FAST
def test_a_run_migrates_only_the_selected_ledgers_and_the_data_reads_back(
    runtime: Runtime, two_topics: list[int]
) -> None:
    """The ledgers inside topics and range become v1 ledgers, one group each with its data
    object's bytes and the attempt; the ones outside stay streamed; entries read the same."""
    rt, ids = runtime, two_topics
    before = {t: TopicReader(rt).checksum(t, Source.TIERED) for t in (T, OTHER)}
    report = to_v1_run(rt, topics=[T], first_ledger=ids[1], last_ledger=ids[2])
    migrated = [rt.metadata.get_ledger(T, n) for n in ids[1:3]]
    assert report["mode"] == "to-v1" and report["dry_run"] is False and report["left"] == 0
    assert report["groups"] == [
        segment_group(
            rt,
            x.ledger_id,
            "rewritten",
            objects_after=2,
            bytes_after=x.data_len,
            detail=f"replaced: {x.offload_attempt_id}",
        )
        for x in migrated
    ]
    assert all(x.offload_mode is OffloadMode.LEDGER and x.data_len for x in migrated)
    # what the task's lineage names: the segments' store into the default store (one here)
    store = rt.settings.resolved_object_store_url.rstrip("/")
    assert report["stores_read"] == report["stores_written"] == [store]
    modes = {
        (x.topic, x.ledger_id): x.offload_mode
        for t in (T, OTHER)
        for x in rt.metadata.list_ledgers(t)
    }
    assert [k for k, m in modes.items() if m is OffloadMode.LEDGER] == [(T, n) for n in ids[1:3]]
    assert {t: TopicReader(rt).checksum(t, Source.TIERED) for t in (T, OTHER)} == before


@FAST
def test_a_ledger_migrated_between_plan_and_run_is_no_longer_streamed(
    runtime: Runtime, two_topics: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another migration takes the ledger after the plan: this run finds nothing to do for
    it and reports it ``changed``, the others go on."""
    rt, ids = runtime, two_topics
    before = TopicReader(rt).checksum(T, Source.TIERED)

    def migrate_the_first() -> None:
        (moved,) = to_v1.migrate_to_v1(rt, [T], ids[0], ids[0])
        assert moved.outcome is to_v1.ToV1Outcome.MIGRATED

    change_after_to_v1_plan(monkeypatch, run_module, migrate_the_first)
    report = to_v1_run(rt, topics=[T], last_ledger=ids[1])
    second = rt.metadata.get_ledger(T, ids[1])
    assert report["groups"] == [
        segment_group(rt, ids[0], "changed", detail="no longer streamed"),
        segment_group(
            rt,
            ids[1],
            "rewritten",
            objects_after=2,
            bytes_after=second.data_len,
            detail=f"replaced: {second.offload_attempt_id}",
        ),
    ]
    assert report["totals"]["groups"] == 1
    assert TopicReader(rt).checksum(T, Source.TIERED) == before


@FAST
def test_a_failed_group_reports_the_error_type_and_message(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in one group is reported as ``TypeName: message`` (the run goes on)."""
    rt = runtime
    v1_topic(rt, 4)

    def refuse(*_: object, **__: object) -> None:
        raise OSError("no space left")

    monkeypatch.setattr(rt.objects, "create_multipart", refuse)
    report = run_rewrite(rt, RewriteParams(mode="to-v2", target_bytes=1 << 30), owner="test")
    assert report.groups and {g.outcome for g in report.groups} == {FAILED}
    assert {g.detail for g in report.groups} == {"OSError: no space left"}
