"""Rewrites beside the rest of the product, on both pairings: streaming (a rewrite segment
is never the stream's open segment nor moves where the stream continues), retention (a
rewrite segment goes when every ledger in it is deleted), hot deletion, the orphan sweep
(a rewrite's keys and recorded upload are references while it is open), scrub and bulk
export (stream-mode ledgers in a rewrite segment are read through it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.backends import tiered_digests, unaccounted_objects
from fixtures.clock import wait_past
from fixtures.damage import flip, overwrite_object
from fixtures.exports import export_files, export_table, output_url, parquet_digests, run_export
from fixtures.inspect import checksum, stored_keys, uploads
from fixtures.rewrites import (
    T,
    check_clean_store,
    check_one_copy,
    entry_digests,
    gc,
    v1_topic,
    whole_group,
)
from fixtures.streams import converge, crash_at, produce, run_pass, set_policy, stream_topic
from offloader.bulk.params import ExportParams
from offloader.gc.run import recover_stale_rewrites
from offloader.gc.sweep import sweep
from offloader.keys import topic_start_key
from offloader.metadata import OffloadMode, Position, SegmentOrigin, SegmentState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import Source, TopicReader
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.retention.trim import trim_topic
from offloader.rewrite.report import REWRITTEN
from offloader.runtime import Runtime
from offloader.scrub import run_scrub


# --- streaming -------------------------------------------------------------------------------
def test_a_topic_streams_is_compacted_and_streams_on_without_a_gap_or_a_repeat(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ledgers 1-2 streamed; streaming off: 3 stays hot, 4-5 are offloaded ledger by
    ledger and compacted (a rewrite segment newer than the stream's), 6-7 too but that
    rewrite dies midway; streaming on again for 8 and 9. The stream continues after its
    own segments (3 is streamed, not skipped as if the rewrite segment were the stream's
    end), never takes the dead rewrite's open segment for its own, and never streams the
    rewritten or v1-offloaded ledgers again."""
    rt = runtime
    stream_topic(rt, T)
    produce(rt, T, 2)
    converge(rt, T)
    set_policy(rt, T, streaming=False)
    (hot_only,) = produce(rt, T, 1, seed=8)
    compacted = produce(rt, T, 2, seed=9)
    for ledger_id in compacted:
        LedgerOffloader(rt).offload_ledger(T, ledger_id)
    span = {"first_ledger": compacted[0], "last_ledger": compacted[-1]}
    assert [g.outcome for g in whole_group(rt, **span).groups] == [REWRITTEN]
    dying = produce(rt, T, 2, seed=10)
    for ledger_id in dying:
        LedgerOffloader(rt).offload_ledger(T, ledger_id)
    span = {"first_ledger": dying[0], "last_ledger": dying[-1]}
    with crash_at(monkeypatch, "rewrite-after-first-part"):
        whole_group(rt, **span, lease_seconds=2.0)
    (dead,) = rt.metadata.rewrites.open_rewrites(T)
    assert dead.begin == Position(ledger_id=dying[0], entry_id=0)

    set_policy(rt, T, streaming=True)
    (streamed,) = produce(rt, T, 1, seed=11)
    run_pass(rt, T, close_now=True)
    converge(rt, T)
    assert rt.metadata.segments.get(dead.segment_id).state is SegmentState.ASSIGNED  # untouched
    assert rt.metadata.get_ledger(T, hot_only).is_offloaded  # streamed, not skipped
    wait_past(rt.metadata, dead.lease_until_ms or 0)
    report = whole_group(rt, **span)
    assert report.recovered == [dead.segment_id]
    assert [(g.ledgers, g.outcome) for g in report.groups] == [(dying, REWRITTEN)]

    produce(rt, T, 1, seed=12)
    converge(rt, T)
    ledgers = rt.metadata.list_ledgers(T)
    assert all(x.is_offloaded and x.offload_mode is OffloadMode.STREAM for x in ledgers)
    by_origin: dict[SegmentOrigin, set[int]] = {}
    pieces = rt.metadata.segments.offloaded_pieces(T)
    for segment in rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED]):
        held = {p.ledger_id for p in pieces[segment.segment_id]}
        by_origin.setdefault(segment.origin, set()).update(held)
    assert by_origin[SegmentOrigin.REWRITE] == {*compacted, *dying}
    assert {hot_only, streamed} <= by_origin[SegmentOrigin.STREAM]
    assert not by_origin[SegmentOrigin.STREAM] & by_origin[SegmentOrigin.REWRITE]
    check_one_copy(rt)
    assert checksum(rt, T, source="tiered") == checksum(rt, T, source="hot")  # hot copies stay
    gc(rt)
    check_clean_store(rt)


# --- retention -------------------------------------------------------------------------------
def test_a_trim_deletes_the_rewrite_segment_only_with_its_last_ledger(runtime: Runtime) -> None:
    rt = runtime
    ids = v1_topic(rt, 5)
    assert [g.outcome for g in whole_group(rt).groups] == [REWRITTEN]
    (segment,) = rt.metadata.segments.of_topic(T)
    gc(rt)
    expected = {k: v for k, v in entry_digests(rt).items() if k[0] >= ids[2]}

    trim_topic(rt, T, Position(ledger_id=ids[2], entry_id=0))  # a partial trim: 2 of 5
    gc(rt)
    finish_deleted_ledgers(rt)
    assert [x.ledger_id for x in rt.metadata.list_ledgers(T, live=True)] == ids[2:]
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    assert {segment.data_key, segment.index_key} <= stored_keys(rt.objects)
    assert entry_digests(rt) == expected  # the trimmed ledgers hidden, the rest readable
    check_one_copy(rt)

    trim_topic(rt, T, Position(ledger_id=ids[-1] + 1, entry_id=0))  # the rest
    finish_deleted_ledgers(rt)
    released = rt.metadata.segments.get(segment.segment_id)
    assert released.state is SegmentState.DELETED
    gc(rt)
    # only the topic's recorded start is left (docs/FORMAT.md, "Topic starts")
    assert stored_keys(rt.objects) == {topic_start_key(T)} and unaccounted_objects(rt) == set()


# --- hot deletion, the sweep, scrub, export -------------------------------------------------
def test_hot_copies_of_rewritten_ledgers_are_deleted_and_reads_go_to_the_segment(
    runtime: Runtime,
) -> None:
    rt = runtime
    ids = v1_topic(rt, 3, hot=True)
    before = checksum(rt, T)
    whole_group(rt)
    deleted = delete_hot_copies(rt.metadata, rt.hot, T)
    assert sorted(x.ledger_id for x in deleted) == ids
    assert checksum(rt, T) == before == checksum(rt, T, source="tiered")


def test_an_open_rewrite_s_objects_and_upload_are_references_for_the_sweep(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    v1_topic(rt, 3)
    eager = rt.settings.model_copy(
        update={"sweep_grace_seconds": 0, "multipart_max_age_seconds": 0}
    )
    with crash_at(monkeypatch, "rewrite-after-first-part"):
        whole_group(rt, lease_seconds=2.0)
    (open_one,) = rt.metadata.rewrites.open_rewrites(T)
    result = sweep(rt.metadata, rt.stores, eager)
    assert (result.orphans, sum(s.aborted_uploads for s in result.stores)) == (0, 0)
    assert uploads(rt.objects) == {(open_one.data_key, open_one.upload_id)}
    wait_past(rt.metadata, open_one.lease_until_ms or 0)
    recover_stale_rewrites(rt)
    with crash_at(monkeypatch, "rewrite-after-index"):
        whole_group(rt, lease_seconds=2.0)
    (written,) = rt.metadata.rewrites.open_rewrites(T)
    assert {written.data_key, written.index_key} <= stored_keys(rt.objects)
    result = sweep(rt.metadata, rt.stores, eager)
    assert result.orphans == 0
    gc(rt)
    assert {written.data_key, written.index_key} <= stored_keys(rt.objects)
    wait_past(rt.metadata, written.lease_until_ms or 0)
    recover_stale_rewrites(rt)
    check_clean_store(rt)  # the failed rewrite's objects went through the queue
    assert not {written.data_key, written.index_key} & stored_keys(rt.objects)


def test_scrub_reads_rewrite_segments_and_finds_their_damage(runtime: Runtime) -> None:
    rt = runtime
    v1_topic(rt, 3)
    whole_group(rt)
    gc(rt)
    clean = run_scrub(rt, [T], repair=False)
    assert not clean.failed and clean.counts.objects == 2
    (segment,) = rt.metadata.segments.of_topic(T)
    overwrite_object(rt.objects, segment.data_key, flip(200))
    damaged = run_scrub(rt, [T], repair=False)
    assert damaged.failed
    assert segment.data_key in str(damaged)


def test_bulk_export_of_a_compacted_topic_equals_its_entries(
    runtime: Runtime, tmp_path: Path
) -> None:
    rt = runtime
    v1_topic(rt, 4)
    expected = tiered_digests(rt)
    whole_group(rt)
    gc(rt)
    params = ExportParams(topics=[T], output=output_url(rt, tmp_path), export_id="compacted")
    plan, _ = run_export(rt, params)
    assert plan.slices
    _, files = export_files(params.output or "", "compacted", rt.settings)
    assert parquet_digests(export_table(files)) == expected
    assert all(x.offload_mode is OffloadMode.STREAM for x in rt.metadata.list_ledgers(T)), (
        "the export read the segment"
    )
    assert TopicReader(rt).checksum(T, Source.TIERED).entries == sum(
        x.entry_count for x in rt.metadata.list_ledgers(T)
    )
