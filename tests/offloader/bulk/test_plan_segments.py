"""Bulk export's plan beside streaming offload, on both pairings: ledgers offloaded by
streaming (no objects of their own) do not break the plan; they are left out by name with
the reason, and the ledgers offloaded ledger by ledger export as before."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.exports import export_files, export_table
from offloader.bulk.export import export_slices, publish_export
from offloader.bulk.output import ExportTarget
from offloader.bulk.params import ExportParams
from offloader.bulk.plan import STREAMED_NOTE, plan_export
from offloader.metadata.records import OffloadMode
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader

STREAMED = "events"


def topics(rt: Runtime) -> list[int]:
    """A streamed topic (all its sealed ledgers in segments) and a v1-offloaded one; the
    streamed ledgers' ids."""
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, STREAMED, streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    produce_ledgers(rt, STREAMED, [(12, part // 8)] * 3)
    StreamingOffloader(rt).run_pass(STREAMED, close_now=True)
    make_topic(rt, "orders")
    produce_ledgers(rt, "orders", [(30, 1000), (10, 100)])
    LedgerOffloader(rt).offload_topic("orders", up_to=2)
    streamed = [x for x in rt.metadata.list_ledgers(STREAMED) if x.is_offloaded]
    assert len(streamed) == 3
    assert all(x.offload_mode is OffloadMode.STREAM and x.data_key is None for x in streamed)
    return [x.ledger_id for x in streamed]


def test_streamed_ledgers_are_left_out_by_name(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    streamed = topics(runtime)
    with caplog.at_level(logging.WARNING, logger="offloader.bulk.plan"):
        plan = plan_export(runtime.metadata, ExportParams.parse({"slice_bytes": 5000}))
    assert {(s.topic, s.ledger_id) for s in plan.slices} == {("orders", 1), ("orders", 2)}
    assert plan.ledgers == 2
    assert plan.streamed == [(STREAMED, i) for i in streamed]
    summary = plan.summary()
    assert summary["streamed_not_exported"] == [f"{STREAMED}/{i}" for i in streamed]
    assert summary["streamed_note"] == STREAMED_NOTE
    assert summary["not_offloaded"] == []
    assert "leaves out 3 ledger(s)" in caplog.text and f"{STREAMED}/{streamed[0]}" in caplog.text

    only = plan_export(runtime.metadata, ExportParams.parse({"topics": [STREAMED]}))
    assert (only.slices, only.ledgers, only.bytes) == ([], 0, 0)
    assert len(only.streamed) == 3
    ranged = ExportParams.parse({"topics": [STREAMED], "last_ledger": streamed[0]})
    assert plan_export(runtime.metadata, ranged).streamed == [(STREAMED, streamed[0])]


def test_a_plan_without_streamed_ledgers_says_nothing_of_them(runtime: Runtime) -> None:
    make_topic(runtime, "orders")
    produce_ledgers(runtime, "orders", [(10, 100)])
    LedgerOffloader(runtime).offload_topic("orders", up_to=1)
    summary = plan_export(runtime.metadata, ExportParams()).summary()
    assert summary["streamed_not_exported"] == [] and "streamed_note" not in summary


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_the_rest_exports_as_before(runtime: Runtime, tmp_path: Path) -> None:
    topics(runtime)
    url = (tmp_path / "exports").as_uri()
    params = ExportParams.parse({"slice_bytes": 5000, "output": url, "export_id": "e1"})
    plan = plan_export(runtime.metadata, params)
    target = ExportTarget.new_attempt(url, "e1")
    files = export_slices(plan.slices, target, runtime.settings.for_object_stores())
    manifest = publish_export(target, runtime.settings, params, files)
    read, published = export_files(url, "e1", runtime.settings)
    assert read == manifest
    table = export_table(published)
    assert set(table["topic"].to_pylist()) == {"orders"}
    assert table.num_rows == 40
