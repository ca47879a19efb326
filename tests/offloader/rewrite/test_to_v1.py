"""Migration back to v1 (offloader/rewrite/to_v1.py) in this process, on both pairings:
streamed ledgers become ledgers of their own v1 objects, read from the tier (hot copies
gone), with the same bytes; a segment goes only when no ledger needs it; a rerun changes
nothing; GC and the orphan sweep leave exactly the v1 objects. The SIGKILL cases are
test_to_v1_crash.py."""

from __future__ import annotations

import logging

import pytest

from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from fixtures.inspect import table_rows
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.rewrites import change_after_to_v1_plan
from fixtures.streamed import SWAP_POINTS, ledgers_by_segment, streamed_topic
from offloader import failpoints
from offloader.exceptions import NotFoundError, TrimmedError
from offloader.format import decode_index
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.sweep import sweep
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.keys import topic_start_key
from offloader.metadata import (
    AttemptState,
    OffloadMode,
    Position,
    SegmentState,
)
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import EntrySource, LedgerOffloader, Outcome
from offloader.read.topic_reader import Source, TopicReader, tiered_ledger_reader
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.retention.trim import trim_topic
from offloader.rewrite import to_v1
from offloader.rewrite.to_v1 import ToV1Outcome, ToV1Result, migrate_to_v1, plan_to_v1
from offloader.runtime import Runtime
from offloader.scrub import run_scrub
from offloader.settings import Settings
from offloader.stream.offloader import StreamingOffloader

T = "s"
RELEASED = "segment released: migrated to v1"


def outcomes(results: list[ToV1Result]) -> list[tuple[int, ToV1Outcome]]:
    return [(r.ledger_id, r.outcome) for r in results]


def segment_states(rt: Runtime, topic: str = T) -> dict[str, SegmentState]:
    return {s.segment_id: s.state for s in rt.metadata.segments.of_topic(topic)}


def check_v1(rt: Runtime, results: list[ToV1Result]) -> None:
    """Each migrated ledger is offloaded in mode ``ledger`` on the committed attempt's own
    objects, whose index agrees with the metadata store; exactly one committed attempt."""
    for r in results:
        assert r.outcome is ToV1Outcome.MIGRATED, r
        ledger = rt.metadata.get_ledger(r.topic, r.ledger_id)
        assert ledger.is_offloaded and ledger.offload_mode is OffloadMode.LEDGER
        assert ledger.offload_attempt_id == r.attempt_id and ledger.data_len == r.bytes > 0
        assert ledger.index_key is not None and ledger.data_key is not None
        index = decode_index(rt.objects.get(ledger.index_key))
        assert index.metadata is not None
        assert (index.metadata.entry_count, index.metadata.length) == (
            ledger.entry_count,
            ledger.size_bytes,
        )
        assert rt.objects.stat(ledger.data_key).size == ledger.data_len
        committed = [
            a.attempt_id
            for a in list_attempts(rt.metadata, r.topic, AttemptState.COMMITTED)
            if a.ledger_id == r.ledger_id
        ]
        assert committed == [r.attempt_id]


def v1_keys(rt: Runtime, topic: str = T) -> set[str]:
    return {
        key
        for x in rt.metadata.list_ledgers(topic)
        if x.offload_mode is OffloadMode.LEDGER and x.is_offloaded
        for key in (x.data_key, x.index_key)
        if key
    }


def boundary(held: dict[str, set[int]]) -> int:
    """A ledger id M such that some segment holds only ledgers up to M (it is released
    once they are migrated) and another holds M and a later one (it stays)."""
    for m in sorted(set().union(*held.values())):
        below = any(max(ids) <= m for ids in held.values())
        shared = any(min(ids) <= m < max(ids) for ids in held.values())
        if below and shared:
            return m
    raise AssertionError(f"no ledger splits the segments both ways: {held}")


def test_a_streamed_topic_migrates_to_v1_from_the_tier(runtime: Runtime) -> None:
    rt = runtime
    ids = streamed_topic(rt, T, 8)
    hot = TopicReader(rt).checksum(T, Source.HOT)
    delete_hot_copies(rt.metadata, rt.hot, T)  # the tier is the only copy now
    assert not any(x.has_hot_copy for x in rt.metadata.list_ledgers(T))
    assert TopicReader(rt).checksum(T, Source.TIERED) == hot
    held = ledgers_by_segment(rt, T)
    last = boundary(held)

    assert plan_to_v1(rt.metadata, [T], last_ledger=last) == [
        rt.metadata.get_ledger(T, n) for n in ids if n <= last
    ]
    first = migrate_to_v1(rt, [T], last_ledger=last)
    assert outcomes(first) == [(n, ToV1Outcome.MIGRATED) for n in ids if n <= last]
    check_v1(rt, first)
    states = segment_states(rt)
    for segment_id, held_ids in held.items():
        gone = max(held_ids) <= last  # no ledger of it is left in mode stream
        assert states[segment_id] is (SegmentState.DELETED if gone else SegmentState.OFFLOADED)
    released = {
        k
        for s in rt.metadata.segments.of_topic(T, [SegmentState.DELETED])
        for k in (s.data_key, s.index_key)
    }
    assert released and {
        d.object_key: d.reason for d in pending_deletions(rt.metadata)
    } == dict.fromkeys(released, RELEASED)
    assert TopicReader(rt).checksum(T, Source.TIERED) == hot  # half v1, half segments

    rest = migrate_to_v1(rt, [T])
    assert outcomes(rest) == [(n, ToV1Outcome.MIGRATED) for n in ids if n > last]
    check_v1(rt, rest)
    assert set(segment_states(rt).values()) == {SegmentState.DELETED}
    assert TopicReader(rt).checksum(T, Source.TIERED) == hot
    assert unaccounted_objects(rt) == set()

    rows = table_rows(rt.metadata)
    assert migrate_to_v1(rt, [T]) == [] and table_rows(rt.metadata) == rows  # nothing left to do
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    swept = sweep(rt.metadata, rt.stores, rt.settings.model_copy(update={"sweep_grace_seconds": 0}))
    assert swept.orphans == 0 and not swept.errors
    assert {info.key for info in rt.objects.list()} == v1_keys(rt)
    assert TopicReader(rt).checksum(T, Source.TIERED) == hot
    report = run_scrub(rt, [T])
    assert report.damaged == [] and report.counts.ledgers == len(ids)


def test_only_the_selection_moves_and_a_dry_run_changes_nothing(runtime: Runtime) -> None:
    rt = runtime
    ids = streamed_topic(rt, T, 4)
    make_topic(rt, "orders")  # a v1 topic: nothing to migrate
    produce_ledgers(rt, "orders", [(10, 100)])
    LedgerOffloader(rt).offload_topic("orders")
    rows = table_rows(rt.metadata)
    assert plan_to_v1(rt.metadata, [T], first_ledger=0, last_ledger=0) == []  # 0 is an id
    dry = migrate_to_v1(rt, None, first_ledger=ids[1], last_ledger=ids[2], dry_run=True)
    assert [(r.topic, r.ledger_id, r.outcome) for r in dry] == [
        (T, n, ToV1Outcome.PLANNED) for n in ids[1:3]
    ]
    assert [r.bytes for r in dry] == [rt.metadata.get_ledger(T, n).size_bytes for n in ids[1:3]]
    assert table_rows(rt.metadata) == rows
    done = migrate_to_v1(rt, None, first_ledger=ids[1], last_ledger=ids[2])
    assert outcomes(done) == [(n, ToV1Outcome.MIGRATED) for n in ids[1:3]]
    modes = {x.ledger_id: x.offload_mode for x in rt.metadata.list_ledgers(T)}
    assert [modes[n] for n in ids] == [
        OffloadMode.STREAM,
        OffloadMode.LEDGER,
        OffloadMode.LEDGER,
        OffloadMode.STREAM,
    ]


@pytest.mark.parametrize(
    ("topics", "first", "last", "error", "message"),
    [
        (["nope"], None, None, NotFoundError, "topic 'nope' does not exist"),
        ([T], -1, None, ValueError, "first_ledger must be a ledger id"),
        ([T], None, -2, ValueError, "last_ledger must be a ledger id"),
        ([T], 3, 2, ValueError, "first_ledger 3 is after last_ledger 2"),
    ],
)
def test_bad_input_is_refused_by_name_and_changes_nothing(
    runtime: Runtime,
    topics: list[str],
    first: int | None,
    last: int | None,
    error: type,
    message: str,
) -> None:
    rt = runtime
    streamed_topic(rt, T, 2)
    rows = table_rows(rt.metadata)
    with pytest.raises(error, match=message):
        migrate_to_v1(rt, topics, first, last)
    assert table_rows(rt.metadata) == rows


def test_a_ledger_still_being_streamed_keeps_its_segments(runtime: Runtime) -> None:
    rt = runtime
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, T, streaming=True, min_part_bytes=part, segment_max_bytes=4 * part)
    sealed = produce_ledgers(rt, T, [(12, part // 8)] * 2)
    payload = b"o" * (part // 16)
    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:
        for _ in range(6):
            open_id, _ = writer.append(payload)
        writer.sync()  # confirmed: the pass streams them beside the sealed ledgers
        StreamingOffloader(rt).run_pass(T, close_now=True)
        held = ledgers_by_segment(rt, T)
        (shared,) = [s for s, ids in held.items() if open_id in ids]
        assert held[shared] & set(sealed), held  # a migrated ledger shares it
        assert rt.metadata.get_ledger(T, open_id).offload_state.value == "none"

        results = migrate_to_v1(rt, [T])
        assert outcomes(results) == [(n, ToV1Outcome.MIGRATED) for n in sealed]
        assert segment_states(rt)[shared] is SegmentState.OFFLOADED  # the open ledger needs it
        assert [p.segment.segment_id for p in rt.metadata.segments.pieces(T, open_id)] == [shared]
        for _ in range(3):
            writer.append(payload)
    StreamingOffloader(rt).run_pass(T, close_now=True)  # sealed: the rest, then settled
    assert rt.metadata.get_ledger(T, open_id).offload_mode is OffloadMode.STREAM
    assert outcomes(migrate_to_v1(rt, [T])) == [(open_id, ToV1Outcome.MIGRATED)]
    assert set(segment_states(rt).values()) == {SegmentState.DELETED}
    assert TopicReader(rt).checksum(T, Source.TIERED) == TopicReader(rt).checksum(T, Source.HOT)
    assert unaccounted_objects(rt) == set()


def test_a_partly_trimmed_topic_migrates_and_keeps_its_start(runtime: Runtime) -> None:
    rt = runtime
    ids = streamed_topic(rt, T, 6)
    start = Position(ledger_id=ids[2], entry_id=5)
    trim_topic(rt, T, start)
    before = TopicReader(rt).checksum(T, Source.TIERED)
    held = ledgers_by_segment(rt, T)

    results = migrate_to_v1(rt, [T])
    assert outcomes(results) == [(n, ToV1Outcome.MIGRATED) for n in ids[2:]]
    check_v1(rt, results)  # ids[2]'s objects hold all its entries, the trimmed ones too
    assert rt.metadata.get_topic(T).start == start
    assert TopicReader(rt).checksum(T, Source.TIERED) == before
    with pytest.raises(TrimmedError):
        list(TopicReader(rt).read(T, ids[2], 4, 4, source=Source.TIERED))
    states = segment_states(rt)
    for segment_id, held_ids in held.items():  # the trimmed ledgers are not deleted yet
        wanted = SegmentState.OFFLOADED if min(held_ids) < ids[2] else SegmentState.DELETED
        assert states[segment_id] is wanted, (segment_id, held_ids)

    finish_deleted_ledgers(rt)  # retention ends: the rest goes, some left for v1
    assert set(segment_states(rt).values()) == {SegmentState.DELETED}
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    # the v1 objects and the trim's record of the start (docs/FORMAT.md, "Topic starts")
    assert {info.key for info in rt.objects.list()} == v1_keys(rt) | {topic_start_key(T)}
    assert TopicReader(rt).checksum(T, Source.TIERED) == before


def test_reads_during_a_migration_return_the_same_bytes(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every step of every ledger's swap a reader of the topic gets the same entries;
    so does one that looked a ledger up before its swap and its segments after it."""
    rt = runtime
    ids = streamed_topic(rt, T, 4)
    expected = TopicReader(rt).checksum(T, Source.TIERED)
    stale = rt.metadata.get_ledger(T, ids[0])
    early = tiered_ledger_reader(rt, stale)  # a reader in the segments before the swap
    real, seen = failpoints.reach, []

    def reach(point: str) -> None:
        real(point)
        if point in SWAP_POINTS:
            seen.append(point)
        # inside the swap's transaction a reader waits for it (SQLite: in this thread it
        # would wait for itself) or sees the state before it (PostgreSQL): the points on
        # either side of it stand for it
        if point in SWAP_POINTS and point != "mid-replacement-commit":
            assert TopicReader(rt).checksum(T, Source.TIERED) == expected, point

    monkeypatch.setattr(failpoints, "reach", reach)
    assert {r.outcome for r in migrate_to_v1(rt, [T])} == {ToV1Outcome.MIGRATED}
    assert seen == list(SWAP_POINTS) * len(ids)
    entries = list(rt.hot.read(T, ids[0]))
    assert list(tiered_ledger_reader(rt, stale).read()) == entries  # follows the swap
    assert list(early.read()) == entries  # the released segment is still there (queued)


def test_the_released_segments_wait_out_the_grace(backend_settings: Settings) -> None:
    settings = backend_settings.model_copy(update={"replaced_object_grace_seconds": 3600.0})
    with Runtime.open(settings) as rt:
        ids = streamed_topic(rt, T, 3)
        early = tiered_ledger_reader(rt, rt.metadata.get_ledger(T, ids[0]))
        migrate_to_v1(rt, [T])
        gc = process_deletions(rt.metadata, rt.stores, rt.settings)
        assert gc.deleted == 0 and gc.remaining == 2 * len(segment_states(rt))
        assert list(early.read()) == list(rt.hot.read(T, ids[0]))
        now = rt.metadata.db_now_ms()
        assert all(d.next_try_ms >= now + 3_500_000 for d in pending_deletions(rt.metadata))


def test_retention_releases_a_segment_left_for_v1_after_the_settings_grace(
    runtime: Runtime,
) -> None:
    """finish_deleted_ledgers passes replaced_object_grace_seconds, in milliseconds, to the
    release of a segment some of whose ledgers moved to v1 objects of their own (a reader
    may still be in it); a segment all of whose ledgers were deleted goes at once."""
    import dataclasses

    ids = streamed_topic(runtime, T, 6)
    trim_topic(runtime, T, Position(ledger_id=ids[2], entry_id=5))
    migrate_to_v1(runtime, [T])
    before = {d.id for d in pending_deletions(runtime.metadata)}
    settings = runtime.settings.model_copy(update={"replaced_object_grace_seconds": 7.0})
    rt = dataclasses.replace(runtime, settings=settings)
    finish_deleted_ledgers(rt)
    released = [
        d.next_try_ms - d.enqueued_ms for d in pending_deletions(rt.metadata) if d.id not in before
    ]
    assert 7_000 in released and set(released) <= {0, 7_000}


def test_a_tier_that_disagrees_with_the_metadata_fails_the_ledger_and_changes_nothing(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """The entries read from the segments are held against the ledger's recorded count and
    bytes before an index is written: a mismatch fails that ledger only, its attempt's
    keys queued, and it stays on its segments. The log has a line per ledger: an error
    naming the failed one and why, the others' outcome and bytes."""
    from offloader.metadata import schema

    rt = runtime
    ids = streamed_topic(rt, T, 3)
    L = schema.ledgers
    with rt.metadata.transaction() as conn:
        conn.execute(
            L.update()
            .where(L.c.topic == T, L.c.ledger_id == ids[1])
            .values(size_bytes=L.c.size_bytes + 1)
        )
    with caplog.at_level(logging.INFO, logger="offloader.rewrite.to_v1"):
        results = migrate_to_v1(rt, [T])
    assert outcomes(results) == [
        (ids[0], ToV1Outcome.MIGRATED),
        (ids[1], ToV1Outcome.FAILED),
        (ids[2], ToV1Outcome.MIGRATED),
    ]
    assert results[1].failed and "the metadata store" in results[1].detail
    assert results[1].topic == T and results[1].ledger_id == ids[1]
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if " to v1" in r.getMessage()]
    assert lines == [
        (logging.INFO, f"{T}/{ids[0]} to v1: migrated ({results[0].bytes} bytes)"),
        (logging.ERROR, f"migration of {T}/{ids[1]} to v1 failed: {results[1].detail}"),
        (logging.INFO, f"{T}/{ids[2]} to v1: migrated ({results[2].bytes} bytes)"),
    ]
    assert results[0].bytes > 0
    ledger = rt.metadata.get_ledger(T, ids[1])
    assert ledger.offload_mode is OffloadMode.STREAM and ledger.attempt_id is None
    (failed,) = list_attempts(rt.metadata, T, AttemptState.FAILED)
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert {failed.data_key, failed.index_key} <= queued
    assert not rt.objects.exists(failed.index_key)
    assert rt.metadata.segments.pieces(T, ids[1])  # still read from its segments
    assert unaccounted_objects(rt) == set()


def test_a_ledger_swapped_since_it_was_planned_is_left_alone(runtime: Runtime) -> None:
    """The replacement checks what the ledger is offloaded as when it begins: one migrated
    (or repaired) meanwhile, or one with objects of its own, is already offloaded."""
    rt = runtime
    ids = streamed_topic(rt, T, 2)
    make_topic(rt, "orders")
    (v1,) = produce_ledgers(rt, "orders", [(10, 100)])
    LedgerOffloader(rt).offload_topic("orders")
    off = LedgerOffloader(rt)
    (done,) = migrate_to_v1(rt, [T], last_ledger=ids[0])
    rows = table_rows(rt.metadata)
    for topic, ledger_id, attempt in (("orders", v1, None), (T, ids[0], done.attempt_id)):
        again = off.replace_ledger(topic, ledger_id, None, "r", source=EntrySource.TIER)
        assert (again.outcome, again.attempt_id) == (Outcome.ALREADY_OFFLOADED, attempt)
    stale = off.replace_ledger(T, ids[1], "some-attempt", "r", source=EntrySource.TIER)
    assert stale.outcome is Outcome.ALREADY_OFFLOADED  # it is on segments, not objects
    assert table_rows(rt.metadata) == rows


def test_a_ledger_trimmed_or_migrated_since_the_plan_names_no_attempt_of_its_own(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the plan and its migration one ledger is trimmed away and another is
    migrated by someone else: both are ``changed``, their detail is the replacement's
    outcome (with the attempt that holds the ledger now, where there is one), and neither
    reports an attempt as the one this run committed."""
    rt = runtime
    ids = streamed_topic(rt, T, 3)

    def trim_one_and_move_the_next() -> None:
        trim_topic(rt, T, Position(ledger_id=ids[1], entry_id=0))
        moved = LedgerOffloader(rt).replace_ledger(
            T, ids[1], None, "elsewhere", source=EntrySource.TIER
        )
        assert moved.outcome is Outcome.REPLACED

    change_after_to_v1_plan(monkeypatch, to_v1, trim_one_and_move_the_next)
    results = migrate_to_v1(rt, [T])

    moved_as = rt.metadata.get_ledger(T, ids[1]).offload_attempt_id
    assert moved_as is not None
    assert results[:2] == [
        ToV1Result(T, ids[0], ToV1Outcome.CHANGED, detail="trimmed"),
        ToV1Result(T, ids[1], ToV1Outcome.CHANGED, detail=f"already-offloaded: {moved_as}"),
    ]
    check_v1(rt, results[2:])
    assert [r.ledger_id for r in results[2:]] == ids[2:]
