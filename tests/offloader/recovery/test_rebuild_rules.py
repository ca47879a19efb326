"""The rules by which a rebuild from the objects alone picks, per streamed ledger, between
its own (v1) objects and the segments holding it, and which segments it keeps: a tie goes
to the own objects, an older own copy gives way to the segments (reported, naming each),
a ledger held only in part keeps its segments and is reported with its ranges, and a
segment whose every ledger has newer objects of its own is left for the sweep. Of two
segment copies of the same entries the newer wins, per topic (ledger ids are per topic);
a ledger whose segment indexes give no created or sealed time takes its offload time.

Files + SQLite only: the tests set the objects' times with ``os.utime`` (the filesystem
store's LastModified is the file's mtime), so ties and orderings need no sleeping."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from fixtures.backends import Fresh, make_topic, produce_ledgers, tiered_digests
from fixtures.streamed import ledgers_by_segment, streamed_topic
from offloader.format import decode_segment_index
from offloader.format.object_metadata import segment_user_metadata
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.keys import segment_object_keys
from offloader.metadata.records import HotState, OffloadMode, Segment
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.recovery import RebuildResult, rebuild_from_objects
from offloader.rewrite.to_v1 import ToV1Outcome, migrate_to_v1
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader

TOPIC = "events"
FS_ONLY = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)


def _set_ms(rt: Runtime, key: str, ms: int) -> None:
    """The object's LastModified, exactly (the file's mtime)."""
    assert isinstance(rt.objects, FilesystemObjectStore)
    os.utime(rt.objects.root / key, ns=(ms * 1_000_000, ms * 1_000_000))


def _whole_second_ms() -> int:
    """A time a float mtime holds exactly, so the rebuild reads back the same ms."""
    return int(time.time()) * 1000


def _digests(rt: Runtime) -> dict[int, str]:
    """Each offloaded ledger's digest of entries read from the store alone, by ledger id."""
    return {ledger_id: d for (topic, ledger_id), d in tiered_digests(rt).items() if topic == TOPIC}


def _rebuild(fresh: Fresh) -> tuple[Runtime, RebuildResult, int, int]:
    """A rebuild into a fresh database, with the wall-clock ms around it."""
    rebuilt = fresh()
    before = int(time.time() * 1000)
    result = rebuild_from_objects(
        rebuilt.metadata.engine, rebuilt.objects, rebuilt.stores.default_location
    )
    return rebuilt, result, before, int(time.time() * 1000) + 1


def _modes(rt: Runtime) -> dict[int, OffloadMode]:
    return {x.ledger_id: x.offload_mode for x in rt.metadata.list_ledgers(TOPIC)}


def _segment_ids(rt: Runtime) -> list[str]:
    return [s.segment_id for s in rt.metadata.segments.of_topic(TOPIC)]


def _migrated_whole(rt: Runtime, ledgers: int) -> tuple[list[int], list[Segment], dict[int, str]]:
    """``TOPIC`` streamed whole, then every ledger migrated back to v1 with the released
    segments kept in the store (an hour's grace): the ledger ids, the segments, the
    digests. Both copies of every ledger are then in the store."""
    rt.settings = rt.settings.model_copy(update={"replaced_object_grace_seconds": 3600})
    ids = streamed_topic(rt, TOPIC, ledgers)
    delete_hot_copies(rt.metadata, rt.hot, TOPIC)
    segments = rt.metadata.segments.of_topic(TOPIC)
    digests = _digests(rt)
    assert {r.outcome for r in migrate_to_v1(rt, [TOPIC])} == {ToV1Outcome.MIGRATED}
    return ids, segments, digests


@FS_ONLY
def test_a_tie_between_own_objects_and_segments_goes_to_the_own_objects(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Every ledger's own objects are exactly as new as the segments holding it: the own
    objects win (``>=``), every ledger is rebuilt in mode ledger, and each segment (holding
    two or more ledgers) is reported word for word as needed by no ledger."""
    rt = runtime
    ids, segments, digests = _migrated_whole(rt, 4)
    held = ledgers_by_segment(rt, TOPIC)
    assert any(len(h) >= 2 for h in held.values()), held
    tie = _whole_second_ms()
    for s in segments:
        _set_ms(rt, s.index_key, tie)
    own = {n: rt.metadata.get_ledger(TOPIC, n) for n in ids}
    for ledger in own.values():
        assert ledger.index_key is not None
        _set_ms(rt, ledger.index_key, tie)

    rebuilt, result, _, _ = _rebuild(fresh)
    assert (result.segments, result.streamed_ledgers, result.ledgers) == (0, 0, len(ids))
    assert _segment_ids(rebuilt) == []
    assert _modes(rebuilt) == dict.fromkeys(ids, OffloadMode.LEDGER)
    for n, ledger in own.items():
        got = rebuilt.metadata.get_ledger(TOPIC, n)
        assert (got.index_key, got.offload_attempt_id, got.offloaded_ms) == (
            ledger.index_key,
            ledger.offload_attempt_id,
            tie,
        )
    assert sorted(result.skipped) == sorted(
        f"{s.index_key}: segment {s.segment_id} of {TOPIC!r} is needed by no ledger: each "
        f"it holds ({', '.join(str(n) for n in sorted(held[s.segment_id]))}) has newer "
        "objects of its own; not recorded, left for the sweep"
        for s in segments
    )
    assert _digests(rebuilt) == digests


@FS_ONLY
def test_older_own_objects_give_way_to_the_segments_naming_each(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Every ledger's own objects are older than the segments: the segments are its
    offload (mode stream, the hot copy marked deleted at the rebuild's time) and each
    older copy is reported with all the segments holding it, sorted, comma-separated."""
    rt = runtime
    ids, segments, digests = _migrated_whole(rt, 4)
    held = ledgers_by_segment(rt, TOPIC)
    holders = {n: sorted(s for s, h in held.items() if n in h) for n in ids}
    assert any(len(h) >= 2 for h in holders.values()), holders
    newer = _whole_second_ms()
    for s in segments:
        _set_ms(rt, s.index_key, newer)
    own = {n: rt.metadata.get_ledger(TOPIC, n).index_key for n in ids}
    for key in own.values():
        assert key is not None
        _set_ms(rt, key, newer - 5000)

    rebuilt, result, before, after = _rebuild(fresh)
    assert sorted(result.skipped) == sorted(
        f"{own[n]}: ledger {n} of {TOPIC!r} is in newer segment(s) {', '.join(holders[n])}"
        for n in ids
    )
    assert (result.segments, result.streamed_ledgers) == (len(segments), len(ids))
    assert _segment_ids(rebuilt) == [s.segment_id for s in segments]
    assert _modes(rebuilt) == dict.fromkeys(ids, OffloadMode.STREAM)
    for n in ids:
        got = rebuilt.metadata.get_ledger(TOPIC, n)
        assert (got.data_key, got.offload_attempt_id, got.offloaded_ms) == (None, None, newer)
        assert got.hot_deleted_ms is not None and before <= got.hot_deleted_ms <= after
    assert _digests(rebuilt) == digests


@FS_ONLY
def test_a_partly_held_ledger_with_own_objects_lets_the_later_ledgers_be_rebuilt(
    runtime: Runtime, fresh: Fresh
) -> None:
    """The first segment's index is lost; the ledger it shared with the second went back to
    v1 before. That ledger, held only in part by the segments, is its own objects' offload
    (nothing reported); every later ledger is still rebuilt from its segments."""
    rt = runtime
    rt.settings = rt.settings.model_copy(update={"replaced_object_grace_seconds": 3600})
    ids = streamed_topic(rt, TOPIC, 6)
    delete_hot_copies(rt.metadata, rt.hot, TOPIC)
    held = ledgers_by_segment(rt, TOPIC)
    first, second, *rest = rt.metadata.segments.of_topic(TOPIC)
    (split,) = held[first.segment_id] & held[second.segment_id]
    later = [n for n in ids if n > split]
    assert later and all(n not in held[first.segment_id] for n in later)
    digests = _digests(rt)
    (done,) = migrate_to_v1(rt, [TOPIC], first_ledger=split, last_ledger=split)
    assert done.outcome is ToV1Outcome.MIGRATED
    assert [s.segment_id for s in rt.metadata.segments.of_topic(TOPIC)] == [
        s.segment_id for s in (first, second, *rest)
    ]
    rt.objects.delete_many([first.index_key])

    rebuilt, result, before, after = _rebuild(fresh)
    assert result.skipped == []
    assert _segment_ids(rebuilt) == [s.segment_id for s in (second, *rest)]
    assert _modes(rebuilt) == {split: OffloadMode.LEDGER} | dict.fromkeys(later, OffloadMode.STREAM)
    assert result.streamed_ledgers == len(later)
    for n in later:
        got = rebuilt.metadata.get_ledger(TOPIC, n)
        assert got.hot_deleted_ms is not None and before <= got.hot_deleted_ms <= after
    pieces = rebuilt.metadata.segments.pieces(TOPIC, split)  # its ranges are kept
    assert pieces and pieces[0].segment.segment_id == second.segment_id
    assert _digests(rebuilt) == {n: digests[n] for n in (split, *later)}


@FS_ONLY
def test_a_ledger_held_only_in_part_keeps_every_segment_holding_it(
    runtime: Runtime, fresh: Fresh
) -> None:
    """A ledger larger than a segment, its first segment's index lost, with no other copy:
    it is reported with each range its segments still hold, and every one of them is kept,
    the ones holding nothing else too (never lose data); the next ledger, whole, reads
    back."""
    rt = runtime
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, TOPIC, streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    big, small = produce_ledgers(rt, TOPIC, [(120, part // 8), (12, part // 8)])
    StreamingOffloader(rt).run_pass(TOPIC, close_now=True)
    digests = _digests(rt)
    pieces = rt.metadata.segments.pieces(TOPIC, big)
    lost = pieces[0].segment
    kept = [p for p in pieces if p.segment.segment_id != lost.segment_id]
    assert len(kept) >= 2 and kept[0].first_entry_id > 0, pieces
    held = ledgers_by_segment(rt, TOPIC)
    alone = [p.segment.segment_id for p in kept if held[p.segment.segment_id] == {big}]
    assert alone, held  # a segment holding nothing but a part of the big ledger
    rt.objects.delete_many([lost.index_key])

    rebuilt, result, _, _ = _rebuild(fresh)
    ranges = ", ".join(f"{p.first_entry_id}..{p.last_entry_id}" for p in kept)
    assert result.skipped == [
        f"ledger {big} of {TOPIC!r}: its segments hold entries {ranges}, not 0..N without a "
        "gap: not recorded as offloaded"
    ]
    expected = [s.segment_id for s in rt.metadata.segments.of_topic(TOPIC)][1:]
    assert _segment_ids(rebuilt) == expected and set(alone) <= set(expected)
    assert _modes(rebuilt) == {small: OffloadMode.STREAM}
    again = rebuilt.metadata.segments.pieces(TOPIC, big)
    assert [(p.segment.segment_id, p.first_entry_id, p.last_entry_id) for p in again] == [
        (p.segment.segment_id, p.first_entry_id, p.last_entry_id) for p in kept
    ]
    assert _digests(rebuilt) == {small: digests[small]}


@FS_ONLY
def test_a_rebuilt_segment_is_the_committed_segment_as_its_objects_say(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Every field of a rebuilt segment row: offloaded (and assigned) when its index was
    written, finished never, no planned end, no upload, replacing nothing, the rest as the
    stream committed it (but for the first segment's begin: the stream began it at the
    topic's start, 0:0, which the objects do not record, so it begins at its first
    piece); its detail says where it came from."""
    rt = runtime
    streamed_topic(rt, TOPIC, 4)
    originals = rt.metadata.segments.of_topic(TOPIC)
    assert len(originals) >= 2
    stamp = _whole_second_ms() - 60_000
    for n, segment in enumerate(originals):
        _set_ms(rt, segment.index_key, stamp + n * 1000)
    rebuilt, result, _, _ = _rebuild(fresh)
    assert result.skipped == []
    held = ledgers_by_segment(rt, TOPIC)
    expected = [
        s.model_copy(
            update=dict(
                begin_ledger_id=min(held[s.segment_id]) if n == 0 else s.begin_ledger_id,
                version=1,
                epoch=0,
                assigned_ms=stamp + n * 1000,
                offloaded_ms=stamp + n * 1000,
                finished_ms=None,
                detail="rebuilt from the objects",
                planned_end_ledger_id=None,
                planned_end_entry_id=None,
                upload_id=None,
                replaces=None,
                store_id=rebuilt.stores.default_id(),
            )
        )
        for n, s in enumerate(originals)
    ]
    assert rebuilt.metadata.segments.of_topic(TOPIC) == expected


@FS_ONLY
def test_a_rebuilt_streamed_ledger_is_the_sealed_ledger_its_segments_describe(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Every field of a streamed ledger's rebuilt row: as the stream settled it (count,
    bytes, created and sealed times from the segment index), offloaded when the newest
    segment holding it was written, no objects or attempt of its own, and its hot copy
    taken as gone when the rebuild ran (reads go to the store)."""
    rt = runtime
    streamed_topic(rt, TOPIC, 4)
    stamp = _whole_second_ms() - 60_000
    written = {}
    for n, segment in enumerate(rt.metadata.segments.of_topic(TOPIC)):
        _set_ms(rt, segment.index_key, stamp + n * 1000)
        written[segment.segment_id] = stamp + n * 1000
    held = ledgers_by_segment(rt, TOPIC)
    originals = rt.metadata.list_ledgers(TOPIC)
    rebuilt, result, before, after = _rebuild(fresh)
    assert result.skipped == []
    rows = rebuilt.metadata.list_ledgers(TOPIC)
    assert [x.ledger_id for x in rows] == [x.ledger_id for x in originals]
    for row, original in zip(rows, originals, strict=True):
        assert before <= (row.hot_deleted_ms or 0) <= after
        newest = max(ms for s, ms in written.items() if original.ledger_id in held[s])
        assert row == original.model_copy(
            update=dict(
                version=1,
                offloaded_ms=newest,
                hot_state=HotState.DELETED,
                hot_deleted_ms=row.hot_deleted_ms,
                offload_epoch=0,
            )
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format-version": "9"}, "unknown segment object format-version '9'"),
        (
            {"managed-ledger": "other%2Ftopic"},
            "the index is of topic 'events', segment {id} by its key; its user metadata says "
            "topic 'other/topic', segment {id}",
        ),
        (
            {"segment-id": "not-this-one"},
            "the index is of topic 'events', segment {id} by its key; its user metadata says "
            "topic 'events', segment not-this-one",
        ),
    ],
    ids=["format-version", "managed-ledger", "segment-id"],
)
@FS_ONLY
def test_a_segment_index_whose_user_metadata_disagrees_is_not_trusted(
    runtime: Runtime, fresh: Fresh, change: dict[str, str], message: str
) -> None:
    """The index object's user metadata (written with it: format version, managed ledger,
    segment id) must agree with the index and its key; one that does not is reported by
    its key and skipped, never recorded."""
    rt = runtime
    streamed_topic(rt, TOPIC, 4)
    victim, following = rt.metadata.segments.of_topic(TOPIC)[:2]
    held = ledgers_by_segment(rt, TOPIC)
    shared = sorted(held[victim.segment_id] & held[following.segment_id])
    user = rt.objects.stat(victim.index_key).metadata
    assert set(change) <= set(user)
    rt.objects.put(victim.index_key, rt.objects.get(victim.index_key), metadata=user | change)
    rebuilt, result, _, _ = _rebuild(fresh)
    first, *partial = result.skipped  # and the ledger it shared with the next segment
    assert first == f"{victim.index_key}: {message.format(id=victim.segment_id)}"
    assert [p.split(":")[0] for p in partial] == [f"ledger {i} of {TOPIC!r}" for i in shared]
    assert victim.segment_id not in _segment_ids(rebuilt)


@FS_ONLY
def test_a_segment_whose_data_object_has_another_length_than_its_index_is_not_trusted(
    runtime: Runtime, fresh: Fresh
) -> None:
    """A segment's data object cut short (a partial copy, a damaged disk) no longer holds
    what its index describes: the index is reported by its key with both lengths and
    skipped, never recorded."""
    rt = runtime
    streamed_topic(rt, TOPIC, 4)
    victim, following = rt.metadata.segments.of_topic(TOPIC)[:2]
    held = ledgers_by_segment(rt, TOPIC)
    shared = sorted(held[victim.segment_id] & held[following.segment_id])
    data = rt.objects.get(victim.data_key)
    assert len(data) == victim.data_len
    rt.objects.put(victim.data_key, data[:-100])
    rebuilt, result, _, _ = _rebuild(fresh)
    first, *partial = result.skipped  # and the ledger it shared with the next segment
    assert first == (
        f"{victim.index_key}: data object {victim.data_key} is {victim.data_len - 100} "
        f"bytes, the index says {victim.data_len}"
    )
    assert [p.split(":")[0] for p in partial] == [f"ledger {i} of {TOPIC!r}" for i in shared]
    assert victim.segment_id not in _segment_ids(rebuilt)


@FS_ONLY
def test_an_older_copy_is_skipped_for_the_newer_segment_after_it_among_the_kept(
    runtime: Runtime, fresh: Fresh
) -> None:
    """A newer copy of the second segment (a zombie's): the copy is kept first, then the
    first segment before it (it ends just before the copy begins). The second begins where
    the copy does, so its place among the kept ones is between the first and the copy:
    the kept segment after that place is checked too, and the second is skipped naming
    the copy; every later segment is kept after it."""
    rt = runtime
    streamed_topic(rt, TOPIC, 6)
    originals = rt.metadata.segments.of_topic(TOPIC)
    assert len(originals) >= 3
    first, second, *rest = originals
    digests = _digests(rt)
    stamp = _whole_second_ms() - 60_000
    for segment in originals:
        _set_ms(rt, segment.index_key, stamp)
    copy_id = str(uuid.uuid4())
    copy_data, copy_index = segment_object_keys(copy_id)
    rt.objects.put(copy_data, rt.objects.get(second.data_key))
    user = segment_user_metadata(TOPIC, copy_id, "index")
    rt.objects.put(copy_index, rt.objects.get(second.index_key), metadata=user)
    _set_ms(rt, copy_index, stamp + 1000)

    rebuilt, result, _, _ = _rebuild(fresh)
    begin = f"{second.begin_ledger_id}:{second.begin_entry_id}"
    assert result.skipped == [
        f"{second.index_key}: segment of {TOPIC!r} from {begin} overlaps newer segment "
        f"{copy_id} ({begin} to {second.end_ledger_id}:{second.end_entry_id})"
    ]
    assert _segment_ids(rebuilt) == [first.segment_id, copy_id, *(s.segment_id for s in rest)]
    assert _digests(rebuilt) == digests


@FS_ONLY
def test_streamed_topics_with_the_same_ledger_ids_keep_every_segment_of_both(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Ledger ids are per topic: two topics streamed alike hold the same ledger ids in
    segments over the same ranges, yet no segment of one overlaps the other's. Every
    segment of both is kept and every ledger of both reads back."""
    rt = runtime
    other = "orders"
    assert streamed_topic(rt, TOPIC, 4) == streamed_topic(rt, other, 4)
    segments = {t: rt.metadata.segments.of_topic(t) for t in (TOPIC, other)}
    assert [(s.begin, s.end) for s in segments[TOPIC]] == [
        (s.begin, s.end) for s in segments[other]
    ]
    digests = tiered_digests(rt)

    rebuilt, result, _, _ = _rebuild(fresh)
    assert result.skipped == []
    assert result.topics == [TOPIC, other]
    assert result.segments == sum(len(s) for s in segments.values())
    for topic, originals in segments.items():
        again = rebuilt.metadata.segments.of_topic(topic)
        assert [s.segment_id for s in again] == [s.segment_id for s in originals]
    assert tiered_digests(rebuilt) == digests


@FS_ONLY
def test_a_ledger_streamed_only_while_open_is_created_and_sealed_when_offloaded(
    runtime: Runtime, fresh: Fresh
) -> None:
    """Every entry of a ledger went into segments that closed while it was open (it sealed
    later, with no entry more): no segment index records its created or sealed time (-1),
    so its rebuilt row takes both from its offload, when the newest segment holding it was
    written."""
    rt = runtime
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, TOPIC, streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    with ManagedLedgerWriter(rt.metadata, rt.hot, TOPIC) as writer:
        for batch in range(2):
            for n in range(6):
                ledger_id, _ = writer.append(bytes([batch * 6 + n]) * (part // 8))
            writer.sync()
            done = StreamingOffloader(rt).run_pass(TOPIC, close_now=True)
            assert len(done.committed) == 1
    done = StreamingOffloader(rt).run_pass(TOPIC, close_now=True)
    assert (done.committed, done.settled_ledgers) == ([], [ledger_id])
    segments = rt.metadata.segments.of_topic(TOPIC)
    assert ledgers_by_segment(rt, TOPIC) == {s.segment_id: {ledger_id} for s in segments}
    assert len(segments) == 2
    for segment in segments:
        (meta,) = (
            x.metadata for x in decode_segment_index(rt.objects.get(segment.index_key)).ledgers
        )
        assert meta is not None and (meta.created_ms, meta.sealed_ms) == (-1, -1)
    original = rt.metadata.get_ledger(TOPIC, ledger_id)
    assert original.created_ms >= 0 and original.sealed_ms is not None
    stamp = _whole_second_ms() - 60_000
    for n, segment in enumerate(segments):
        _set_ms(rt, segment.index_key, stamp + n * 1000)
    newest = stamp + 1000
    digests = _digests(rt)

    rebuilt, result, _, _ = _rebuild(fresh)
    assert result.skipped == [] and result.streamed_ledgers == 1
    row = rebuilt.metadata.get_ledger(TOPIC, ledger_id)
    assert row == original.model_copy(
        update=dict(
            version=1,
            created_ms=newest,
            sealed_ms=newest,
            offloaded_ms=newest,
            hot_state=HotState.DELETED,
            hot_deleted_ms=row.hot_deleted_ms,
            offload_epoch=0,
        )
    )
    assert _digests(rebuilt) == digests
