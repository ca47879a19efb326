"""Rebuilding from the objects alone with streaming offload, on both pairings: a rebuild
recovers offloaded segments and the ledgers they hold whole, skipping (with a reason)
damaged, overlapping and partial ones, and the segments a migration back to v1 released
while they wait out their grace."""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa

from fixtures.backends import Fresh, produce_ledgers
from fixtures.metadata_backup import LEDGERS, STREAMED, ledger_digests, populate_streamed
from fixtures.rewrites import check_clean_store
from fixtures.streamed import ledgers_by_segment, shared_segment, streamed_topic
from offloader.keys import segment_object_keys
from offloader.metadata import schema
from offloader.metadata.records import HotState, OffloadMode, Segment, SegmentState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.read.topic_reader import Source, TopicReader
from offloader.recovery import rebuild_from_objects
from offloader.rewrite.to_v1 import ToV1Outcome, migrate_to_v1
from offloader.runtime import Runtime
from offloader.scrub import run_scrub
from offloader.stream.offloader import StreamingOffloader


def test_rebuild_recovers_segments_and_streamed_ledgers(runtime: Runtime, fresh: Fresh) -> None:
    rt = runtime
    populate_streamed(rt)
    segments = rt.metadata.segments.of_topic(STREAMED)
    assert len(segments) >= 3 and all(s.state is SegmentState.OFFLOADED for s in segments)
    ledgers = {x.ledger_id: x for x in rt.metadata.list_ledgers(STREAMED) if x.is_offloaded}
    assert {x.offload_mode for x in ledgers.values()} == {OffloadMode.STREAM}
    digests = {t: ledger_digests(rt, t) for t in (STREAMED, LEDGERS)}
    checksum = TopicReader(rt).checksum(STREAMED)

    rebuilt = fresh()
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    assert result.skipped == []
    assert result.topics == [STREAMED, LEDGERS]
    assert (result.segments, result.streamed_ledgers) == (len(segments), len(ledgers))
    assert result.ledgers == len(ledgers) + 2
    assert {t: ledger_digests(rebuilt, t) for t in digests} == digests
    assert TopicReader(rebuilt).checksum(STREAMED) == checksum

    again = rebuilt.metadata.segments.of_topic(STREAMED)
    # begin: the segment's first entry (the pass may have begun it at the topic's start, 0:0)
    same = ("segment_id", "seq", "state", "end", "data_key", "index_key", "data_len")
    assert [[getattr(s, f) for f in same] for s in again] == [
        [getattr(s, f) for f in same] for s in segments
    ]
    for ledger_id, before in ledgers.items():
        after = rebuilt.metadata.get_ledger(STREAMED, ledger_id)
        assert after.offload_mode is OffloadMode.STREAM and after.is_offloaded
        assert (after.entry_count, after.size_bytes) == (before.entry_count, before.size_bytes)
        assert (after.created_ms, after.sealed_ms) == (before.created_ms, before.sealed_ms)
        assert (after.data_key, after.offload_attempt_id, after.store_id) == (None, None, None)
        assert after.hot_state is HotState.DELETED
    assert all(s.begin >= o.begin for s, o in zip(again, segments, strict=True))
    for ledger_id in ledgers:
        pieces = rebuilt.metadata.segments.pieces(STREAMED, ledger_id)
        original = rt.metadata.segments.pieces(STREAMED, ledger_id)
        assert [(p.segment.segment_id, p.first_entry_id, p.last_entry_id) for p in pieces] == [
            (p.segment.segment_id, p.first_entry_id, p.last_entry_id) for p in original
        ]
    topic = rebuilt.metadata.get_topic(STREAMED)
    assert topic.next_ledger_id == max(ledgers) + 1


def test_rebuild_skips_damaged_overlapping_and_partial_segments(
    runtime: Runtime, fresh: Fresh
) -> None:
    rt = runtime
    populate_streamed(rt)
    first, second, *_ = rt.metadata.segments.of_topic(STREAMED)
    # a ledger split between the first and second segments, and ledgers whole in the first
    (split,) = {p.ledger_id for p in _ranges(rt, first)} & {
        p.ledger_id for p in _ranges(rt, second)
    }
    whole_in_first = {p.ledger_id for p in _ranges(rt, first)} - {split}
    assert whole_in_first
    # the first segment's index is lost; a newer copy of the second (a zombie's) overlaps
    # it and wins (the newest copy does); a damaged index of the segment shape is not
    # trusted
    rt.objects.delete_many([first.index_key])
    copy_data, copy_index = segment_object_keys(str(uuid.uuid4()))
    time.sleep(1.1)  # S3 keeps LastModified to the second: the copy must be the later one
    rt.objects.put(copy_data, rt.objects.get(second.data_key))
    rt.objects.put(copy_index, rt.objects.get(second.index_key))
    junk_data, junk_index = segment_object_keys(str(uuid.uuid4()))
    rt.objects.put(junk_data, b"no blocks here")
    rt.objects.put(junk_index, b"\x3d\x1f\xb0\xbc not an index")

    rebuilt = fresh()
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    assert len(result.skipped) == 3, result.skipped
    (junk,) = [s for s in result.skipped if s.startswith(junk_index)]
    (overlap,) = [s for s in result.skipped if s.startswith(second.index_key)]
    (partial,) = [s for s in result.skipped if s.startswith("ledger")]
    assert "index" in junk
    assert f"overlaps newer segment {copy_data}" in overlap
    assert partial.startswith(f"ledger {split} of {STREAMED!r}") and "not 0..N" in partial
    kept = {s.segment_id for s in rebuilt.metadata.segments.of_topic(STREAMED)}
    assert first.segment_id not in kept and len(kept) == result.segments
    assert copy_data in kept and second.segment_id not in kept
    recorded = {x.ledger_id for x in rebuilt.metadata.list_ledgers(STREAMED)}
    assert split not in recorded and not whole_in_first & recorded
    for ledger_id in recorded:  # what was recorded reads back
        assert list(TopicReader(rebuilt).read(STREAMED, ledger_id, source=Source.TIERED))


def _ranges(rt: Runtime, segment: Segment) -> list[sa.Row]:
    SL = schema.pieces
    query = sa.select(SL.c.ledger_id).where(SL.c.segment_id == segment.segment_id)
    with rt.metadata.engine.connect() as conn:
        return list(conn.execute(query))


def _streamed_for_migration(rt: Runtime, ledgers: int) -> tuple[list[int], str]:
    """``STREAMED`` streamed whole, hot copies gone (the tier is the only copy), replaced
    objects kept an hour (a rebuild then finds released segments still in the store);
    the ledger ids and the topic's checksum."""
    rt.settings = rt.settings.model_copy(update={"replaced_object_grace_seconds": 3600})
    ids = streamed_topic(rt, STREAMED, ledgers)
    delete_hot_copies(rt.metadata, rt.hot, STREAMED)
    checksum = TopicReader(rt).checksum(STREAMED, Source.TIERED).digest
    time.sleep(1.1)  # S3 keeps LastModified to the second: the v1 objects are the newer
    return ids, checksum


def _rebuild(rt: Runtime, fresh: Fresh) -> tuple[Runtime, list[str]]:
    rebuilt = fresh()
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    assert result.segments == len(rebuilt.metadata.segments.of_topic(STREAMED))
    return rebuilt, result.skipped


def _offloaded_segments(rt: Runtime) -> set[str]:
    return {s.segment_id for s in rt.metadata.segments.of_topic(STREAMED, [SegmentState.OFFLOADED])}


def _modes(rt: Runtime) -> dict[int, OffloadMode]:
    return {x.ledger_id: x.offload_mode for x in rt.metadata.list_ledgers(STREAMED)}


def test_a_rebuild_during_the_grace_leaves_segments_released_by_a_migration_to_the_sweep(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Ledgers up to M went back to v1; the segments holding only them were released and
    wait out the grace when the metadata is rebuilt. Those segments are not recorded (each
    reported), so the sweep deletes them; a segment still holding a streamed ledger stays.
    Every entry reads back the same throughout."""
    rt = runtime
    ids, checksum = _streamed_for_migration(rt, 8)
    held = ledgers_by_segment(rt, STREAMED)
    last = next(  # some segment holds only ledgers up to M, another M and a later one
        m
        for m in sorted(ids)
        if any(max(h) <= m for h in held.values())
        and any(min(h) <= m < max(h) for h in held.values())
    )
    digests = ledger_digests(rt, STREAMED)
    done = migrate_to_v1(rt, [STREAMED], last_ledger=last)
    assert {r.outcome for r in done} == {ToV1Outcome.MIGRATED}
    released = {
        s.segment_id: s for s in rt.metadata.segments.of_topic(STREAMED, [SegmentState.DELETED])
    }
    assert released and set(released) == {s for s, h in held.items() if max(h) <= last}
    released_keys = {k for s in released.values() for k in (s.data_key, s.index_key)}
    assert released_keys <= {o.key for o in rt.objects.list()}  # waiting out the grace

    rebuilt, skipped = _rebuild(rt, fresh)
    assert _offloaded_segments(rebuilt) == _offloaded_segments(rt)
    assert sorted(s.split(":")[0] for s in skipped) == sorted(
        s.index_key for s in released.values()
    ), skipped
    assert all("needed by no ledger" in s and "for the sweep" in s for s in skipped), skipped
    assert _modes(rebuilt) == {
        n: OffloadMode.LEDGER if n <= last else OffloadMode.STREAM for n in ids
    }
    assert ledger_digests(rebuilt, STREAMED) == digests
    assert TopicReader(rebuilt).checksum(STREAMED, Source.TIERED).digest == checksum

    check_clean_store(rebuilt)  # the queue, then the sweep with no grace
    assert not released_keys & {o.key for o in rebuilt.objects.list()}
    assert ledger_digests(rebuilt, STREAMED) == digests
    assert TopicReader(rebuilt).checksum(STREAMED, Source.TIERED).digest == checksum
    report = run_scrub(rebuilt, [STREAMED])
    # each v1 ledger and each recorded segment is scrubbed once; no released one is
    targets = len([n for n in ids if n <= last]) + len(_offloaded_segments(rebuilt))
    assert report.damaged == [] and report.counts.ledgers == targets


def test_a_rebuild_keeps_a_segment_holding_a_migrated_and_a_streamed_ledger(
    runtime: Runtime, fresh: Fresh
) -> None:
    """One ledger of a segment shared with still-streamed ledgers went back to v1: the
    segment stays recorded through the rebuild and the sweep, and every ledger reads the
    same entries (the migrated one from its own objects)."""
    rt = runtime
    ids, checksum = _streamed_for_migration(rt, 6)
    shared = shared_segment(rt, STREAMED)
    migrated, *streamed = sorted(ledgers_by_segment(rt, STREAMED)[shared.segment_id])
    digests = ledger_digests(rt, STREAMED)
    (done,) = migrate_to_v1(rt, [STREAMED], first_ledger=migrated, last_ledger=migrated)
    assert done.outcome is ToV1Outcome.MIGRATED
    assert shared.segment_id in _offloaded_segments(rt)

    # a segment holding the migrated ledger alone (if any) is released, the shared one not
    released = rt.metadata.segments.of_topic(STREAMED, [SegmentState.DELETED])

    rebuilt, skipped = _rebuild(rt, fresh)
    assert _offloaded_segments(rebuilt) == _offloaded_segments(rt)
    assert shared.segment_id in _offloaded_segments(rebuilt)
    assert sorted(s.split(":")[0] for s in skipped) == sorted(s.index_key for s in released)
    expected = {n: OffloadMode.STREAM for n in ids} | {migrated: OffloadMode.LEDGER}
    assert streamed and _modes(rebuilt) == expected
    assert ledger_digests(rebuilt, STREAMED) == digests

    check_clean_store(rebuilt)
    present = {o.key for o in rebuilt.objects.list()}
    assert {shared.data_key, shared.index_key} <= present
    assert ledger_digests(rebuilt, STREAMED) == digests
    assert TopicReader(rebuilt).checksum(STREAMED, Source.TIERED).digest == checksum


def test_a_rebuild_after_a_whole_migration_records_no_segment_and_the_stream_goes_on(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Every ledger went back to v1, the last segment's too: the rebuild records no
    segment, the sweep deletes them all, and the next pass (starting from the topic's
    start now that no segment is recorded) streams the new ledger alone."""
    rt = runtime
    ids, checksum = _streamed_for_migration(rt, 4)
    segments = rt.metadata.segments.of_topic(STREAMED)
    digests = ledger_digests(rt, STREAMED)
    assert {r.outcome for r in migrate_to_v1(rt, [STREAMED])} == {ToV1Outcome.MIGRATED}
    assert _offloaded_segments(rt) == set()

    rebuilt, skipped = _rebuild(rt, fresh)
    assert rebuilt.metadata.segments.of_topic(STREAMED) == []
    assert sorted(s.split(":")[0] for s in skipped) == sorted(s.index_key for s in segments)
    assert _modes(rebuilt) == dict.fromkeys(ids, OffloadMode.LEDGER)
    check_clean_store(rebuilt)
    keys = {k for s in segments for k in (s.data_key, s.index_key)}
    assert not keys & {o.key for o in rebuilt.objects.list()}
    assert ledger_digests(rebuilt, STREAMED) == digests
    assert TopicReader(rebuilt).checksum(STREAMED, Source.TIERED).digest == checksum

    topic = rebuilt.metadata.get_topic(STREAMED)
    rebuilt.metadata.set_policy(topic, rt.metadata.get_topic(STREAMED).policy)
    (new,) = produce_ledgers(rebuilt, STREAMED, [(5, 100)], seed=11)
    assert new == max(ids) + 1
    StreamingOffloader(rebuilt).run_pass(STREAMED, close_now=True)
    assert list(ledgers_by_segment(rebuilt, STREAMED).values()) == [{new}]
    pieces = rebuilt.metadata.segments.pieces(STREAMED, new)
    assert [(p.first_entry_id, p.last_entry_id) for p in pieces] == [(0, 4)]
    assert _modes(rebuilt)[new] is OffloadMode.STREAM
    assert {n: d for n, d in ledger_digests(rebuilt, STREAMED).items() if n != new} == digests
