"""Scrub with streaming offload, on both pairings: stream-mode ledgers (no objects of their
own) do not break the plan; each offloaded segment is read whole and its blocks and index
checked against the metadata store; damage is reported with the segment id, and fails a
run without repair (the repair of damaged segments: test_scrub_segment_repair.py)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import fixtures.streamed
from fixtures.backends import make_topic, produce_ledgers
from fixtures.damage import flip, overwrite_object
from fixtures.metadata import pending_deletions
from offloader.exceptions import ScrubFailedError
from offloader.format import decode_segment_index
from offloader.metadata import schema
from offloader.metadata.records import OffloadMode, Segment, SegmentState
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime
from offloader.scrub import (
    Action,
    FindingKind,
    finish_scrub,
    plan_scrub,
    run_scrub,
    scrub_targets,
)

STREAMED = "events"


def streamed_topic(rt: Runtime) -> list[Segment]:
    """A streamed topic (several segments of two parts) beside a v1-offloaded one."""
    fixtures.streamed.streamed_topic(rt, STREAMED, 5)
    make_topic(rt, "orders")
    produce_ledgers(rt, "orders", [(40, 2000), (10, 100)])
    LedgerOffloader(rt).offload_topic("orders", up_to=2)
    segments = rt.metadata.segments.of_topic(STREAMED)
    assert len(segments) >= 2 and all(s.state is SegmentState.OFFLOADED for s in segments)
    return segments


def state(rt: Runtime) -> tuple[object, ...]:
    ledgers = [rt.metadata.list_ledgers(t.name) for t in rt.metadata.list_topics()]
    segments = [rt.metadata.segments.of_topic(t.name) for t in rt.metadata.list_topics()]
    objects = {info.key: rt.objects.get(info.key) for info in rt.objects.list()}
    return ledgers, segments, pending_deletions(rt.metadata), objects


def test_segments_are_planned_and_scrubbed_clean(runtime: Runtime) -> None:
    rt = runtime
    segments = streamed_topic(rt)
    streamed = [x for x in rt.metadata.list_ledgers(STREAMED) if x.is_offloaded]
    assert streamed and all(x.offload_mode is OffloadMode.STREAM for x in streamed)

    targets = plan_scrub(rt.metadata)
    ledgers = [t for t in targets if t.segment_id is None]
    planned = [t for t in targets if t.segment_id is not None]
    assert [(t.topic, t.ledger_id) for t in ledgers] == [("orders", 1), ("orders", 2)]
    assert [t.segment_id for t in planned] == [s.segment_id for s in segments]
    for target, segment in zip(planned, segments, strict=True):
        assert (target.data_key, target.index_key) == (segment.data_key, segment.index_key)
        assert target.data_len == segment.data_len and target.offload_uuid == segment.segment_id
        assert target.pieces[0][:2] == (target.ledger_id, target.pieces[0][1])
    # every streamed entry is in exactly one segment's ranges
    assert sum(t.entry_count for t in planned) == sum(x.entry_count for x in streamed)

    before = state(rt)
    report = run_scrub(rt)
    assert report.damaged == [] and not report.failed
    indexes = [decode_segment_index(rt.objects.get(s.index_key)) for s in segments]
    blocks = sum(len(ledger.blocks) for index in indexes for ledger in index.ledgers)
    assert report.counts.ledgers == 2 + len(segments)
    assert report.counts.objects == 2 * (2 + len(segments))
    assert report.counts.entries == 50 + sum(x.entry_count for x in streamed)
    assert report.counts.blocks == blocks + 2
    assert state(rt) == before
    only = run_scrub(rt, [STREAMED])
    assert only.counts.ledgers == len(segments) and only.counts.blocks == blocks


def _second_block(rt: Runtime, segment: Segment) -> tuple[int, int]:
    """(ledger id, offset) of the segment's second block (its first if it has one)."""
    index = decode_segment_index(rt.objects.get(segment.index_key))
    blocks = [
        (i, b) for i, view in zip(index.ledger_ids, index.ledgers, strict=True) for b in view.blocks
    ]
    ledger_id, block = blocks[min(1, len(blocks) - 1)]
    return ledger_id, block.offset


def test_damaged_segment_is_reported_with_its_id_without_repair(runtime: Runtime) -> None:
    rt = runtime
    segments = streamed_topic(rt)
    victim = segments[-1]
    ledger_id, offset = _second_block(rt, victim)
    overwrite_object(rt.objects, victim.data_key, flip(offset + 200))
    before = state(rt)

    report = run_scrub(rt, repair=False)
    (verdict,) = report.damaged
    assert (verdict.topic, verdict.offload_uuid, verdict.action) == (
        STREAMED,
        victim.segment_id,
        Action.NOT_REPAIRED,
    )
    (finding,) = verdict.findings
    assert finding.kind is FindingKind.DAMAGED_BLOCK and finding.key == victim.data_key
    assert finding.ledger_id == ledger_id and offset <= (finding.offset or 0) <= offset + 200
    assert f"segment {victim.segment_id}" in finding.reason and "crc" in finding.reason.lower()
    assert report.failed and state(rt) == before

    with pytest.raises(ScrubFailedError, match="1 damaged"):
        report.raise_for_failure()
    assert f"segment {victim.segment_id}" in str(report)


@pytest.mark.parametrize("damage", ["magic", "missing-index", "truncated", "ranges"])
def test_index_and_metadata_damage(runtime: Runtime, damage: str) -> None:
    rt = runtime
    victim, *_ = streamed_topic(rt)
    if damage == "magic":
        overwrite_object(rt.objects, victim.index_key, flip(0))
        kind, key, words = FindingKind.DAMAGED_INDEX, victim.index_key, "magic"
    elif damage == "missing-index":
        rt.objects.delete_many([victim.index_key])
        kind, key, words = FindingKind.MISSING_INDEX, victim.index_key, "missing index"
    elif damage == "truncated":
        overwrite_object(rt.objects, victim.data_key, lambda data: data[:-100])
        kind, key, words = FindingKind.TRUNCATED, victim.data_key, "truncated"
    else:  # the metadata store's ranges disagree with the index
        SL = schema.pieces
        with rt.metadata.engine.begin() as conn:
            conn.execute(
                SL.update()
                .where(SL.c.segment_id == victim.segment_id, SL.c.first_entry_id == 0)
                .values(first_entry_id=1)
            )
        kind, key, words = FindingKind.METADATA_MISMATCH, victim.index_key, "recorded"
    report = run_scrub(rt, repair=False)
    (verdict,) = report.damaged
    assert verdict.offload_uuid == victim.segment_id
    finding = verdict.findings[0]
    assert (finding.kind, finding.key) == (kind, key)
    assert words in finding.reason and f"segment {victim.segment_id}" in finding.reason


def test_a_segment_trimmed_meanwhile_is_changed(runtime: Runtime) -> None:
    rt = runtime
    victim, *_ = streamed_topic(rt)
    overwrite_object(rt.objects, victim.data_key, flip(300))
    started = rt.metadata.db_now_ms()
    results = scrub_targets(rt.stores, plan_scrub(rt.metadata, [STREAMED]))
    G = schema.segments
    with rt.metadata.engine.begin() as conn:
        conn.execute(
            G.update()
            .where(G.c.segment_id == victim.segment_id)
            .values(state=sa.literal(SegmentState.DELETED.value))
        )
    report = finish_scrub(rt, results, topics=[STREAMED], repair=True, started_ms=started)
    (verdict,) = report.damaged
    assert verdict.action is Action.CHANGED and not report.failed


def test_a_segment_target_carries_its_store_and_is_scrubbed_where_it_is_sent(
    runtime: Runtime,
) -> None:
    """The plan's target for a segment names its store's location (the executors open
    the store from it, with no database), its recorded pieces and their entries, and no
    payload bytes (the index of a segment has no single length to compare)."""
    from offloader.scrub.spread import scrub_partition

    rt = runtime
    segments = streamed_topic(rt)
    targets = [t for t in plan_scrub(rt.metadata, [STREAMED]) if t.segment_id is not None]
    assert [t.segment_id for t in targets] == [s.segment_id for s in segments]
    for target, segment in zip(targets, segments, strict=True):
        assert target.location == rt.stores.default_location
        assert target.size_bytes == 0
        assert target.entry_count == sum(last - first + 1 for _, first, last in target.pieces)
        assert target.data_len == segment.data_len
    results = scrub_partition(targets, rt.settings.for_object_stores())
    assert [r.findings for r in results] == [()] * len(targets)
