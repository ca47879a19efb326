"""The rewrite half of the metadata store (metadata/rewrites.py), in process on both
pairings: the intent and its refusals, the lease on the database's clock, the swap of v1
ledgers and of segments in one transaction, and what a failed or stale rewrite queues.

The objects are not written here (keys are made up): the store only records them. The
whole rewrite, objects and all, is tests/offloader/rewrite/.
"""

from __future__ import annotations

import re
import time

import pytest
import sqlalchemy as sa

from fixtures.backends import produce_ledgers
from fixtures.clock import stopped_sqlite_clock, wait_past
from fixtures.inspect import queued
from fixtures.metadata import begin as begin_attempt
from fixtures.metadata import pending_deletions
from fixtures.races import rival_inside_commit
from fixtures.rewrites import assign_stream_segment, rewrite_rows, stream_segment, stream_segment_of
from fixtures.scrub import offloaded_topic
from fixtures.streams import crash_at
from offloader import failpoints
from offloader.exceptions import CommitFailedError, TopicDeletedError
from offloader.metadata import (
    AttemptState,
    Ledger,
    MetadataStore,
    OffloadMode,
    Position,
    Segment,
    SegmentOrigin,
    SegmentState,
    schema,
)
from offloader.metadata.records import PieceRange
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime

T = "orders"
SHAPES = [(10, 500), (12, 500), (8, 500)]


@pytest.fixture
def ledgers(runtime: Runtime) -> list[Ledger]:
    """Three ledgers of ``orders`` offloaded as v1 objects, hot copies kept."""
    return offloaded_topic(runtime, T, SHAPES)


def pos(ledger_id: int, entry_id: int) -> Position:
    return Position(ledger_id=ledger_id, entry_id=entry_id)


def begin(
    rt: Runtime,
    name: str,
    ledgers: list[Ledger] | None = None,
    segments: list[Segment] | None = None,
    lease_ms: int = 60_000,
) -> Segment:
    return rt.metadata.rewrites.begin(
        T,
        segment_id=name,
        data_key=f"{name}-d",
        index_key=f"{name}-i",
        store_id=rt.stores.default_id(),
        owner="test-owner",
        lease_ms=lease_ms,
        ledgers=ledgers or [],
        segments=segments or [],
    )


def whole(ledgers: list[Ledger]) -> list[PieceRange]:
    return [PieceRange(x.ledger_id, 0, x.entry_count - 1) for x in ledgers]


def wait_past_lease(rt: Runtime, segment: Segment) -> None:
    assert segment.lease_until_ms is not None
    wait_past(rt.metadata, segment.lease_until_ms, timeout=10)


# --- the intent ----------------------------------------------------------------------------
def test_begin_records_a_rewrite_segment_the_stream_never_sees(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    before = rt.metadata.db_now_ms()
    segment = begin(rt, "r1", ledgers)
    assert segment.state is SegmentState.ASSIGNED and segment.origin is SegmentOrigin.REWRITE
    assert (segment.version, segment.epoch) == (1, 0)  # no stream epoch: fenced by its lease
    assert (segment.data_key, segment.index_key, segment.store_id) == (
        "r1-d",
        "r1-i",
        rt.stores.default_id(),
    )
    assert segment.begin == pos(ledgers[0].ledger_id, 0)
    assert segment.planned_end == pos(ledgers[-1].ledger_id, ledgers[-1].entry_count - 1)
    assert segment.end is None and segment.upload_id is None and segment.data_len == 0
    ids = [x.ledger_id for x in ledgers]
    assert segment.detail == f"rewrite by test-owner of 3 ledger object(s) {ids[0]}..{ids[-1]}"
    assert segment.lease_until_ms is not None
    assert before + 59_000 <= segment.lease_until_ms <= rt.metadata.db_now_ms() + 60_000
    # not the stream's open segment, and not where the stream continues
    assert rt.metadata.segments.current(T) is None
    assert rt.metadata.segments.topics_with_open_segments() == []
    assert rt.metadata.segments.last_offloaded_end(T) is None
    assert rt.metadata.rewrites.open_rewrites(T) == [segment]
    # the sources are untouched until the swap
    assert [rt.metadata.get_ledger(T, x.ledger_id) for x in ledgers] == ledgers
    second = begin(rt, "r2", ledgers[:1])
    assert second.seq == segment.seq + 1


def test_begin_refuses_sources_not_as_planned_and_writes_nothing(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    first, second, _ = ledgers
    before = rewrite_rows(rt)
    with pytest.raises(ValueError, match=r"^a rewrite needs at least one source$"):
        begin(rt, "r")
    with pytest.raises(ValueError, match=r"sources overlap"):
        begin(rt, "r", [first, first])
    (hot_id,) = produce_ledgers(rt, T, [(3, 10)])
    hot = rt.metadata.get_ledger(T, hot_id)
    with pytest.raises(ValueError, match=rf"ledger {T}/{hot_id} is not offloaded"):
        begin(rt, "r", [first, hot])
    # a scrub repair in flight on the second ledger
    begin_attempt(rt.metadata, second, "repair", replace=True)
    with pytest.raises(CommitFailedError, match=rf"{T}/{second.ledger_id} has offload attempt"):
        begin(rt, "r", [first, second])
    with pytest.raises(ValueError, match="sources of that topic only"):
        begin(rt, "r", [first.model_copy(update={"topic": "other"})])
    assert rewrite_rows(rt)["segments"] == before["segments"] == []
    assert rewrite_rows(rt)["deletion_queue"] == before["deletion_queue"]
    # read as they are now (no stale version): in flight, trimmed
    with pytest.raises(CommitFailedError, match=rf"{T}/{second.ledger_id} has offload attempt"):
        begin(rt, "r", [rt.metadata.get_ledger(T, second.ledger_id)])
    rt.metadata.retention.move_start(rt.metadata.get_topic(T), pos(second.ledger_id, 0))
    rt.metadata.retention.mark_ledgers_deleting(T, second.ledger_id, 100)
    trimmed = rt.metadata.get_ledger(T, first.ledger_id)
    assert trimmed.is_offloaded
    with pytest.raises(CommitFailedError, match=rf"{T}/{first.ledger_id} was trimmed \(deleting\)"):
        begin(rt, "r", [trimmed])
    assert rt.metadata.segments.of_topic(T) == []


def test_begin_takes_mixed_sources_a_one_entry_ledger_and_a_lease_of_one_millisecond(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    """The rewrite begins where its first source begins, even when that is a segment over
    two ledgers; its detail names v1 and segment sources and is cut at 2000 characters."""
    rt = runtime
    fourth, fifth = produce_ledgers(rt, T, [(5, 100), (6, 100)])
    pair = stream_segment_of(rt.metadata, T, "pair", [(fourth, 0, 4), (fifth, 0, 5)])
    started = begin(rt, "p", segments=[pair])
    assert started.begin == pair.begin == pos(fourth, 0)
    with pytest.raises(ValueError, match=r"^segment p holds no entries: not a source$"):
        begin(rt, "x", segments=[started])
    third = ledgers[2].ledger_id
    mixed = begin(rt, "m", ledgers[2:], segments=[pair])
    assert (
        mixed.detail
        == f"rewrite by test-owner of 1 ledger object(s) {third}..{third} and 1 segment(s) pair"
    )
    (one,) = offloaded_topic(rt, "one", [(1, 10)])

    def begin_one(owner: str, lease_ms: int, sources: list[Ledger] | None = None) -> Segment:
        store_id = rt.stores.default_id()
        return rt.metadata.rewrites.begin(
            "one",
            segment_id="o",
            data_key="d",
            index_key="i",
            store_id=store_id,
            owner=owner,
            lease_ms=lease_ms,
            ledgers=sources or [one],
        )

    with pytest.raises(ValueError, match=r"^lease_ms must be positive, got 0$"):
        begin_one("o", 0)
    with pytest.raises(ValueError, match=rf"^ledger one/{one.ledger_id} is empty: not a source$"):
        begin_one("o", 1, [one.model_copy(update={"entry_count": 0})])
    with pytest.raises(ValueError, match=r"^sources overlap: "):  # one ends where the next begins
        begin_one("o", 1, [one, one])
    long = begin_one("o" * 3000, 1)
    assert long.detail == ("rewrite by " + "o" * 3000)[:2000]
    assert long.planned_end == pos(one.ledger_id, 0)


def test_begin_refuses_a_deleted_topic(runtime: Runtime, ledgers: list[Ledger]) -> None:
    rt = runtime
    rt.metadata.retention.delete_topic(rt.metadata.get_topic(T))
    with pytest.raises(TopicDeletedError, match="nothing to rewrite"):
        begin(rt, "r", ledgers)
    assert rt.metadata.segments.of_topic(T) == []


def test_open_rewrites_are_the_assigned_rewrite_segments_oldest_first(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    """Not the stream's open segment; by assignment time, then (same millisecond) by id."""
    rt = runtime
    first, second = stream_segments(rt, streamed[:2])
    claim = rt.metadata.segments.claim(T, "stream", 60_000)
    assign_stream_segment(rt.metadata, claim, "s", pos(streamed[2].ledger_id, 0))
    later = begin(rt, "b", segments=[first])
    while rt.metadata.db_now_ms() <= later.assigned_ms:
        time.sleep(0.005)
    assert begin(rt, "a", segments=[second]).assigned_ms > later.assigned_ms
    assert [s.segment_id for s in rt.metadata.rewrites.open_rewrites()] == ["b", "a"]
    with rt.metadata.engine.begin() as conn:
        conn.execute(sa.update(schema.segments).values(assigned_ms=later.assigned_ms))
    assert [s.segment_id for s in rt.metadata.rewrites.open_rewrites(T)] == ["a", "b"]


# --- the lease -----------------------------------------------------------------------------
def test_a_rewrite_whose_lease_ran_out_has_lost_its_segment(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    live = begin(rt, "live", ledgers[:1])
    segment = rt.metadata.rewrites.record_upload(begin(rt, "r", ledgers[1:], lease_ms=300), "up-1")
    other = begin(rt, "q", ledgers[2:], lease_ms=300)  # begun later, sorts first
    assert segment.upload_id == "up-1"
    assert rt.metadata.rewrites.renew(segment, 300)
    renewed = rt.metadata.segments.get(segment.segment_id)
    assert renewed.version == segment.version  # a renewal is not a change to CAS on
    wait_past_lease(rt, renewed)
    assert not rt.metadata.rewrites.renew(segment, 60_000)
    with pytest.raises(CommitFailedError, match=r"rewrite segment r lost its lease"):
        rt.metadata.rewrites.record_upload(segment, "up-2")
    with pytest.raises(CommitFailedError, match=r"lost its lease"):
        rt.metadata.rewrites.commit(segment, whole(ledgers[1:]), ledgers[1:], data_len=10)
    assert [rt.metadata.get_ledger(T, x.ledger_id) for x in ledgers] == ledgers

    wait_past_lease(rt, other)
    before_ms = rt.metadata.db_now_ms()
    stale_other, stale = rt.metadata.rewrites.recover_stale()
    after_ms = rt.metadata.db_now_ms()
    assert (stale.segment_id, stale.state, stale.upload_id) == ("r", SegmentState.FAILED, "up-1")
    assert (stale_other.segment_id, stale_other.version) == ("q", other.version + 1)
    assert stale.version == renewed.version + 1
    assert stale.finished_ms is not None and before_ms <= stale.finished_ms <= after_ms
    assert stale.detail is not None and stale.detail.endswith("recovered")
    assert "test-owner" in stale.detail
    assert queued(rt.metadata) == {
        f"{name}-{key}": "failed rewrite (lease ran out)" for name in "qr" for key in "di"
    }
    assert all(d.next_try_ms == d.enqueued_ms for d in pending_deletions(rt.metadata))
    assert rt.metadata.rewrites.recover_stale() == []  # once
    assert rt.metadata.segments.get("live").state is SegmentState.ASSIGNED
    assert rt.metadata.rewrites.open_rewrites() == [live]


def test_a_run_holding_a_stale_or_failed_copy_of_its_segment_commits_nothing(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    """Each step of the open segment is a compare-and-set on its version: a run acting on
    the segment as it was before a step is refused, as is one acting on a failed rewrite."""
    rt = runtime
    source = ledgers[:1]
    segment = begin(rt, "r", source)
    recorded = rt.metadata.rewrites.record_upload(segment, "up")
    assert recorded.version == segment.version + 1
    expected = (
        f"rewrite segment r changed since version {segment.version}: this run commits nothing"
    )
    with pytest.raises(CommitFailedError, match=f"^{re.escape(expected)}$"):
        rt.metadata.rewrites.commit(segment, whole(source), source, data_len=10)
    assert rt.metadata.segments.get("r") == recorded
    rt.metadata.rewrites.fail(recorded, "gave up")
    expected = "rewrite segment r is rewrite segment failed: this run commits nothing"
    with pytest.raises(CommitFailedError, match=f"^{re.escape(expected)}$"):
        rt.metadata.rewrites.record_upload(recorded, "up-2")


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)  # SQLite's clock stops
def test_a_rewrite_lease_ends_exactly_at_its_recorded_end(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    """Once the database's now reaches the lease's end the run has lost its segment (no
    renewal) and the recovery fails it; one millisecond before, neither."""
    rt = runtime
    segment = begin(rt, "r", ledgers[:1])
    end = segment.lease_until_ms
    assert end is not None
    with stopped_sqlite_clock(rt.metadata.engine, end - 1):
        assert rt.metadata.rewrites.renew(segment, 1)  # the same end again
        assert rt.metadata.rewrites.recover_stale() == []
    with stopped_sqlite_clock(rt.metadata.engine, end):
        assert not rt.metadata.rewrites.renew(segment, 60_000)
        (failed,) = rt.metadata.rewrites.recover_stale()
    assert (failed.segment_id, failed.state) == ("r", SegmentState.FAILED)


# --- the swap ------------------------------------------------------------------------------
def test_a_hot_deletion_during_the_rewrite_does_not_call_the_swap_off(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    """The swap needs its sources to be the same v1 objects, live and with nothing in
    flight; their hot copies going meanwhile (the offload DAG's routine hot deletion)
    changes none of that, so it must not waste the rewrite. The swap keeps the hot state."""
    from offloader.metadata import HotState
    from offloader.offload.hot_deletion import delete_hot_copies

    rt = runtime
    segment = begin(rt, "r", ledgers)
    gone = delete_hot_copies(rt.metadata, rt.hot, T)
    assert {d.ledger_id for d in gone} == {x.ledger_id for x in ledgers}
    committed = rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)
    assert committed.state is SegmentState.OFFLOADED
    for old in ledgers:
        now = rt.metadata.get_ledger(T, old.ledger_id)
        assert (now.offload_mode, now.hot_state) == (OffloadMode.STREAM, HotState.DELETED)
        assert now.version == old.version + 3  # marked, recorded gone, swapped


def test_commit_swaps_v1_ledgers_onto_the_segment_in_one_step(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    """The third ledger is no source: it keeps its v1 objects and its committed attempt."""
    rt = runtime
    *sources, untouched = ledgers
    segment = rt.metadata.rewrites.record_upload(begin(rt, "r", sources), "up")
    committed = rt.metadata.rewrites.commit(
        segment, whole(sources), sources, data_len=4242, grace_ms=3_600_000
    )
    assert committed.state is SegmentState.OFFLOADED and committed.offloaded_ms is not None
    last = sources[-1]
    assert committed.end == pos(last.ledger_id, last.entry_count - 1)
    assert (committed.data_len, committed.lease_until_ms) == (4242, None)
    for old in sources:
        now = rt.metadata.get_ledger(T, old.ledger_id)
        assert now.is_offloaded and now.offload_mode is OffloadMode.STREAM
        assert now.version == old.version + 1
        assert (
            now.offload_attempt_id,
            now.data_key,
            now.index_key,
            now.data_len,
            now.store_id,
        ) == (
            None,
            None,
            None,
            None,
            None,
        )
        assert (now.offloaded_ms, now.hot_state) == (old.offloaded_ms, old.hot_state)
        attempt = rt.metadata.attempts.get(old.offload_attempt_id or "")
        assert attempt.state is AttemptState.SUPERSEDED
        assert attempt.detail == "rewritten into segment r"
        (piece,) = rt.metadata.segments.pieces(T, old.ledger_id)
        assert piece.segment.segment_id == "r"
        assert (piece.first_entry_id, piece.last_entry_id) == (0, old.entry_count - 1)
    assert rt.metadata.get_ledger(T, untouched.ledger_id) == untouched
    attempt = rt.metadata.attempts.get(untouched.offload_attempt_id or "")
    assert attempt.state is AttemptState.COMMITTED
    # the old objects wait out the grace; the stream still has not moved
    now_ms = rt.metadata.db_now_ms()
    deletions = pending_deletions(rt.metadata)
    assert {d.object_key for d in deletions} == {
        k for x in sources for k in (x.data_key, x.index_key)
    }
    assert all(d.reason == "rewritten into segment r" for d in deletions)
    assert all(d.next_try_ms >= now_ms + 3_500_000 for d in deletions)
    assert all(d.tries == 0 for d in deletions)
    assert {d.attempt_id for d in deletions} == {x.offload_attempt_id for x in sources}
    assert rt.metadata.deletions.due(100) == []
    assert rt.metadata.segments.last_offloaded_end(T) is None
    # a second swap of the same sources finds them rewritten
    with pytest.raises(CommitFailedError, match=r"already rewritten"):
        begin(rt, "again", ledgers[:1])


def test_commit_refuses_pieces_that_would_lose_entries(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    segment = begin(rt, "r", ledgers[:2])
    short = [PieceRange(ledgers[0].ledger_id, 0, 3), *whole(ledgers[1:2])]
    expected = (
        f"segment r does not hold ledger {ledgers[0].ledger_id} whole (entries "
        f"0..{ledgers[0].entry_count - 1}): the swap would lose entries"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        rt.metadata.rewrites.commit(segment, short, ledgers[:2], data_len=10)
    with pytest.raises(ValueError, match=r"^segment r: a committed segment holds bytes$"):
        rt.metadata.rewrites.commit(segment, whole(ledgers[:2]), ledgers[:2], data_len=0)
    with pytest.raises(ValueError, match="holds entries"):
        rt.metadata.rewrites.commit(segment, [], ledgers[:2], data_len=10)
    with pytest.raises(ValueError, match="rising ledger ids"):
        rt.metadata.rewrites.commit(segment, whole(ledgers[:2])[::-1], ledgers[:2], data_len=10)
    twice = [ledgers[0], *ledgers[:2]]
    expected = f"segment r: ledger(s) [{ledgers[0].ledger_id}] named twice as sources"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        rt.metadata.rewrites.commit(segment, whole(ledgers[:2]), twice, data_len=10)
    assert rt.metadata.segments.get("r") == segment


@pytest.mark.parametrize("change", ["trimmed", "replaced", "repaired", "rewritten"])
def test_a_source_that_moved_rolls_the_whole_swap_back(
    runtime: Runtime, ledgers: list[Ledger], change: str
) -> None:
    """The last source moves after the intent: the first one's update is rolled back with
    it, the refusal names the ledger, and failing the rewrite queues only its own keys."""
    rt = runtime
    first, _, third = ledgers
    segment = begin(rt, "r", ledgers)
    if change == "trimmed":
        topic = rt.metadata.get_topic(T)
        rt.metadata.retention.move_start(topic, pos(third.ledger_id + 1, 0))
        rt.metadata.retention.mark_ledgers_deleting(T, third.ledger_id + 1, 100)
        # the first two were trimmed too: the refusal names the first source it finds
        expected = rf"ledger {T}/{first.ledger_id} was trimmed"
    elif change == "replaced":
        begin_attempt(rt.metadata, third, "repair", replace=True)
        expected = rf"ledger {T}/{third.ledger_id} has offload attempt repair in flight"
    elif change == "repaired":  # scrub's repair swapped it onto new v1 objects meanwhile
        _, attempt = begin_attempt(rt.metadata, third, "repair", replace=True)
        rt.metadata.attempts.commit_replacement(attempt, 5, "crc mismatch")
        expected = re.escape(
            f"ledger {T}/{third.ledger_id} was offloaded again (attempt repair, "
            f"was {third.offload_attempt_id}): the rewrite of it is called off"
        )
    else:  # a concurrent rewrite of the last ledger won
        other = begin(rt, "other", [third])
        rt.metadata.rewrites.commit(other, whole([third]), [third], data_len=5)
        expected = rf"ledger {T}/{third.ledger_id} is offloaded in mode stream"
    before = rewrite_rows(rt)
    with pytest.raises(CommitFailedError, match=expected):
        rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)
    assert rewrite_rows(rt) == before
    failed = rt.metadata.rewrites.fail(segment, "changed")
    assert failed.state is SegmentState.FAILED
    after = rewrite_rows(rt)
    assert after["ledgers"] == before["ledgers"]
    assert set(queued(rt.metadata)) - {d[1] for d in before["deletion_queue"]} == {"r-d", "r-i"}


def test_a_moved_source_is_looked_up_in_its_own_topic(runtime: Runtime) -> None:
    """The refusal describes the source ledger itself, not the ledger with the same id of
    another topic (ids are per topic; that one was recorded first)."""
    rt = runtime
    offloaded_topic(rt, "aaa", SHAPES)
    ledgers = offloaded_topic(rt, T, SHAPES)
    segment = begin(rt, "r", ledgers)
    begin_attempt(rt.metadata, ledgers[2], "repair", replace=True)
    with pytest.raises(CommitFailedError, match=rf"ledger {T}/{ledgers[2].ledger_id} has offload"):
        rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)


def test_a_rival_swapping_a_ledger_inside_the_commit_calls_it_off(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    """Another rewrite of the same ledger commits between this commit's check of its
    sources and its update of them (PostgreSQL): the update's compare-and-set finds the
    ledger moved and rolls the swap back. On SQLite the rival waits and loses instead."""
    rt = runtime
    source = ledgers[:1]
    mine, theirs = begin(rt, "a", source), begin(rt, "b", source)

    def commit_theirs(other: MetadataStore) -> Segment:
        return other.rewrites.commit(theirs, whole(source), source, data_len=5)

    lost: CommitFailedError | None = None
    with rival_inside_commit(rt, "ledgers", "offload_mode", commit_theirs) as rival:
        try:
            rt.metadata.rewrites.commit(mine, whole(source), source, data_len=10)
        except CommitFailedError as err:
            lost = err
    winner = rt.metadata.segments.get("a" if lost is None else "b")
    assert winner.state is SegmentState.OFFLOADED
    (piece,) = rt.metadata.segments.pieces(T, source[0].ledger_id)
    assert piece.segment.segment_id == winner.segment_id
    if rt.metadata.engine.dialect.name == "postgresql":
        assert rival["waited"] is False and rival["result"] == winner
        assert str(lost) == "source ledgers of orders changed: rewritten into segment a is off"
        assert rt.metadata.segments.get("a") == mine
    else:
        assert rival["waited"] is True and lost is None
        assert re.match(
            rf"ledger {T}/{source[0].ledger_id} is offloaded in mode stream", str(rival["error"])
        )


def test_the_commit_crashing_inside_its_transaction_leaves_nothing(
    runtime: Runtime, ledgers: list[Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    segment = begin(rt, "r", ledgers)
    before = rewrite_rows(rt)
    with crash_at(monkeypatch, "mid-rewrite-commit"):
        rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)
    assert rewrite_rows(rt) == before
    committed = rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)
    assert committed.state is SegmentState.OFFLOADED


def test_two_rewrites_of_the_same_sources_one_wins(runtime: Runtime, ledgers: list[Ledger]) -> None:
    rt = runtime
    a, b = begin(rt, "a", ledgers), begin(rt, "b", ledgers)
    rt.metadata.rewrites.commit(b, whole(ledgers), ledgers, data_len=10)
    with pytest.raises(CommitFailedError, match=rf"ledger {T}/{ledgers[0].ledger_id} is offloaded"):
        rt.metadata.rewrites.commit(a, whole(ledgers), ledgers, data_len=10)
    rt.metadata.rewrites.fail(a, "changed")
    assert {s.segment_id: s.state for s in rt.metadata.segments.of_topic(T)} == {
        "a": SegmentState.FAILED,
        "b": SegmentState.OFFLOADED,
    }
    assert {
        p.segment.segment_id for x in ledgers for p in rt.metadata.segments.pieces(T, x.ledger_id)
    } == {"b"}
    assert {"a-d", "a-i"} <= set(queued(rt.metadata))
    # b's commit was given no grace: the v1 objects are due at once
    assert all(d.next_try_ms == d.enqueued_ms for d in pending_deletions(rt.metadata))


# --- fail ----------------------------------------------------------------------------------
def test_fail_queues_at_once_requeues_late_objects_and_refuses_a_committed_one(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    segment = rt.metadata.rewrites.record_upload(begin(rt, "r", ledgers[:1]), "up")
    before_ms = rt.metadata.db_now_ms()
    failed = rt.metadata.rewrites.fail(segment, "boom " + "x" * 3000)
    assert (failed.state, failed.upload_id) == (SegmentState.FAILED, "up")
    assert failed.detail == ("boom " + "x" * 3000)[:2000]
    assert failed.version == segment.version + 1
    now_ms = rt.metadata.db_now_ms()
    assert failed.finished_ms is not None and before_ms <= failed.finished_ms <= now_ms
    assert all(d.next_try_ms == d.enqueued_ms for d in pending_deletions(rt.metadata))
    assert queued(rt.metadata) == {"r-d": "failed rewrite", "r-i": "failed rewrite"}
    again = rt.metadata.rewrites.fail(segment, "late")
    assert again == failed
    reasons = sorted(d.reason for d in pending_deletions(rt.metadata))
    assert reasons == ["failed rewrite"] * 2 + ["late objects of a failed rewrite"] * 2
    done = begin(rt, "done", ledgers[1:2])
    rt.metadata.rewrites.commit(done, whole(ledgers[1:2]), ledgers[1:2], data_len=10)
    with pytest.raises(CommitFailedError, match="is offloaded: nothing to fail"):
        rt.metadata.rewrites.fail(done, "x")


# --- segment sources -----------------------------------------------------------------------
def stream_segments(rt: Runtime, ledgers: list[Ledger]) -> list[Segment]:
    """Offloaded stream segments holding ``ledgers`` (one each), made through the stream's
    own metadata steps; the ledgers are settled in stream mode."""
    return [
        stream_segment(rt.metadata, T, f"s{x.ledger_id}", x.ledger_id, x.entry_count - 1)
        for x in ledgers
    ]


@pytest.fixture
def streamed(runtime: Runtime) -> list[Ledger]:
    """Three sealed ledgers of a streaming topic ``orders``, not offloaded yet."""
    runtime.metadata.create_topic(T, OffloadPolicy(streaming=True, min_part_bytes=1))
    ids = produce_ledgers(runtime, T, SHAPES)
    return [runtime.metadata.get_ledger(T, i) for i in ids]


def test_segment_sources_are_retired_and_the_stream_still_continues_after_them(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    rt = runtime
    sources = stream_segments(rt, streamed[:2])
    assert all(rt.metadata.get_ledger(T, x.ledger_id).is_offloaded for x in streamed[:2])
    end = rt.metadata.segments.last_offloaded_end(T)
    segment = begin(rt, "r", segments=sources)
    assert segment.begin == sources[0].begin and segment.planned_end == sources[-1].end
    ids = ", ".join(s.segment_id for s in sources)
    assert segment.detail == f"rewrite by test-owner of 2 segment(s) {ids}"
    before_ms = rt.metadata.db_now_ms()
    committed = rt.metadata.rewrites.commit(
        segment, whole(streamed[:2]), segments=sources, data_len=200, grace_ms=60_000
    )
    after_ms = rt.metadata.db_now_ms()
    assert committed.state is SegmentState.OFFLOADED
    for source in sources:
        now = rt.metadata.segments.get(source.segment_id)
        assert (now.state, now.detail) == (SegmentState.DELETED, "rewritten into segment r")
        assert now.version == source.version + 1
        assert source.finished_ms is None
        assert now.finished_ms is not None and before_ms <= now.finished_ms <= after_ms
    assert set(queued(rt.metadata)) == {k for s in sources for k in (s.data_key, s.index_key)}
    assert all(d.next_try_ms == d.enqueued_ms + 60_000 for d in pending_deletions(rt.metadata))
    for ledger in streamed[:2]:
        assert [p.segment.segment_id for p in rt.metadata.segments.pieces(T, ledger.ledger_id)] == [
            "r"
        ]
    # the stream continues after its own (merged away) segments, not from the start
    assert rt.metadata.segments.last_offloaded_end(T) == end
    claim = rt.metadata.segments.claim(T, "stream", 60_000)
    with pytest.raises(CommitFailedError, match="offloaded segments reach"):
        assign_stream_segment(rt.metadata, claim, "again", pos(streamed[1].ledger_id, 0))
    nxt = assign_stream_segment(rt.metadata, claim, "next", pos(streamed[2].ledger_id, 0))
    assert rt.metadata.segments.current(T) == nxt and nxt.seq == committed.seq + 1


def test_a_segment_source_that_moved_or_holds_a_trimmed_ledger_is_refused(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    rt = runtime
    first, second = stream_segments(rt, streamed[:2])
    stale = first.model_copy(update={"version": first.version + 1})
    with pytest.raises(CommitFailedError, match=rf"segment {first.segment_id} changed"):
        begin(rt, "r", segments=[stale, second])
    segment = begin(rt, "r", segments=[first, second])
    topic = rt.metadata.get_topic(T)
    rt.metadata.retention.move_start(topic, pos(streamed[1].ledger_id, 0))
    rt.metadata.retention.mark_ledgers_deleting(T, streamed[1].ledger_id, 100)
    before = rewrite_rows(rt)
    expected = (
        f"segment {first.segment_id} holds trimmed ledger {streamed[0].ledger_id}: the rewrite "
        "of it is called off"
    )
    with pytest.raises(CommitFailedError, match=f"^{re.escape(expected)}$"):
        rt.metadata.rewrites.commit(
            segment, whole(streamed[:2]), segments=[first, second], data_len=1
        )
    assert rewrite_rows(rt) == before


def test_a_trimmed_ledger_refuses_only_the_segment_that_holds_it(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    """The first ledger is trimmed, and so are the ledgers of another topic with the same
    ids: the segments holding the other two ledgers of ``orders`` are still sources."""
    rt = runtime
    rt.metadata.create_topic("aaa", OffloadPolicy(streaming=True, min_part_bytes=1))
    assert produce_ledgers(rt, "aaa", SHAPES) == [x.ledger_id for x in streamed]
    rt.metadata.retention.move_start(
        rt.metadata.get_topic("aaa"), pos(streamed[-1].ledger_id + 1, 0)
    )
    rt.metadata.retention.mark_ledgers_deleting("aaa", streamed[-1].ledger_id + 1, 100)
    trimmed, *sources = stream_segments(rt, streamed)
    rt.metadata.retention.move_start(rt.metadata.get_topic(T), pos(streamed[1].ledger_id, 0))
    rt.metadata.retention.mark_ledgers_deleting(T, streamed[1].ledger_id, 100)
    with pytest.raises(CommitFailedError, match=rf"segment {trimmed.segment_id} holds trimmed"):
        begin(rt, "other", segments=[trimmed])
    segment = begin(rt, "r", segments=sources)
    committed = rt.metadata.rewrites.commit(
        segment, whole(streamed[1:]), segments=sources, data_len=200
    )
    assert committed.state is SegmentState.OFFLOADED


def test_a_segment_source_read_stale_or_never_recorded_is_refused_by_what_it_is_now(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    rt = runtime
    (first,) = stream_segments(rt, streamed[:1])
    stale = first.model_copy(update={"version": first.version + 1})
    expected = (
        f"segment {first.segment_id} changed since it was read (offloaded at version "
        f"{stale.version}, now offloaded at version {first.version}): the rewrite of it is "
        "called off"
    )
    with pytest.raises(CommitFailedError, match=f"^{re.escape(expected)}$"):
        begin(rt, "r", segments=[stale])
    unknown = first.model_copy(update={"segment_id": "nowhere"})
    expected = (
        f"segment nowhere changed since it was read (offloaded at version {first.version}, "
        "now gone): the rewrite of it is called off"
    )
    with pytest.raises(CommitFailedError, match=f"^{re.escape(expected)}$"):
        begin(rt, "r", segments=[unknown])


def test_a_rival_retiring_a_source_segment_inside_the_commit_calls_it_off(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    """As for a v1 source: another rewrite of the same source segment retires it between
    this commit's check and its update (PostgreSQL); the refusal says what it is now."""
    rt = runtime
    (source,) = sources = stream_segments(rt, streamed[:1])
    mine, theirs = begin(rt, "a", segments=sources), begin(rt, "b", segments=sources)

    def commit_theirs(other: MetadataStore) -> Segment:
        return other.rewrites.commit(theirs, whole(streamed[:1]), segments=sources, data_len=5)

    lost: CommitFailedError | None = None
    with rival_inside_commit(rt, "segments", "finished_ms", commit_theirs) as rival:
        try:
            rt.metadata.rewrites.commit(mine, whole(streamed[:1]), segments=sources, data_len=9)
        except CommitFailedError as err:
            lost = err
    retired = rt.metadata.segments.get(source.segment_id)
    assert (retired.state, retired.version) == (SegmentState.DELETED, source.version + 1)
    expected = (
        f"segment {source.segment_id} changed since it was read (offloaded at version "
        f"{source.version}, now deleted at version {source.version + 1}): the rewrite of it "
        "is called off"
    )
    if rt.metadata.engine.dialect.name == "postgresql":
        assert rival["waited"] is False
        assert str(lost) == expected
        assert rt.metadata.segments.get("a") == mine
        assert retired.detail == "rewritten into segment b"
    else:
        assert rival["waited"] is True and lost is None
        assert str(rival["error"]) == expected
        assert retired.detail == "rewritten into segment a"


def test_only_a_rewrite_segment_is_failed_here(runtime: Runtime, streamed: list[Ledger]) -> None:
    """A stream segment in flight belongs to the stream's pass: the rewrite's fail refuses
    it and changes nothing."""
    rt = runtime
    claim = rt.metadata.segments.claim(T, "stream", 60_000)
    open_segment = assign_stream_segment(rt.metadata, claim, "s", pos(streamed[0].ledger_id, 0))
    before = rewrite_rows(rt)
    with pytest.raises(CommitFailedError, match="rewrite segment s is assigned: nothing to fail"):
        rt.metadata.rewrites.fail(open_segment, "x")
    assert rewrite_rows(rt) == before


def test_merged_pieces_must_be_exactly_what_the_source_segments_held(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    rt = runtime
    sources = stream_segments(rt, streamed[:2])
    segment = begin(rt, "r", segments=sources)
    before = rewrite_rows(rt)
    short = [PieceRange(streamed[0].ledger_id, 0, 3), *whole(streamed[1:2])]
    extra = [*whole(streamed[:2]), *whole(streamed[2:3])]
    for wrong in (short, extra, whole(streamed[:1])):
        with pytest.raises(ValueError, match="the swap would lose or invent entries"):
            rt.metadata.rewrites.commit(segment, wrong, segments=sources, data_len=200)
        assert rewrite_rows(rt) == before
    rt.metadata.rewrites.commit(segment, whole(streamed[:2]), segments=sources, data_len=200)


def test_a_ledger_split_over_two_source_segments_is_one_piece(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    """The two halves are merged in entry order, whatever their ids (the tail's sorts first)."""
    rt = runtime
    ledger = streamed[0]
    half = ledger.entry_count // 2
    head = stream_segment(rt.metadata, T, "s2", ledger.ledger_id, half - 1)
    tail = stream_segment(
        rt.metadata, T, "s1", ledger.ledger_id, ledger.entry_count - 1, first=half
    )
    assert rt.metadata.get_ledger(T, ledger.ledger_id).is_offloaded  # settled by the two
    segment = begin(rt, "r", segments=[head, tail])
    with pytest.raises(ValueError, match="lose or invent entries"):
        rt.metadata.rewrites.commit(
            segment, [PieceRange(ledger.ledger_id, 0, half - 1)], segments=[head, tail], data_len=1
        )
    rt.metadata.rewrites.commit(segment, whole([ledger]), segments=[head, tail], data_len=1)
    (piece,) = rt.metadata.segments.pieces(T, ledger.ledger_id)
    assert (piece.segment.segment_id, piece.first_entry_id, piece.last_entry_id) == (
        "r",
        0,
        ledger.entry_count - 1,
    )


def test_source_segments_that_skip_entries_are_refused_at_the_first_gap(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    """Sources that do not overlap but skip segments in between: the swap would lose the
    skipped entries. The refusal names the first ledger with a gap, in position order."""
    rt = runtime
    first, second, _ = (x.ledger_id for x in streamed)
    end1, end2 = (x.entry_count - 1 for x in streamed[:2])
    runs = [
        [(first, 0, 2)],
        [(first, 3, 5)],
        [(first, 6, end1), (second, 0, 1)],
        [(second, 2, 4)],
        [(second, 5, end2)],
    ]
    a, _, c, _, e = (stream_segment_of(rt.metadata, T, f"s{i}", p) for i, p in enumerate(runs))
    segment = begin(rt, "r", segments=[a, c, e])
    before = rewrite_rows(rt)
    expected = (
        f"segment r: the source segments hold ledger {first} with a gap or an overlap at "
        "entry 6: not one run of sources"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        rt.metadata.rewrites.commit(segment, whole(streamed[:2]), segments=[a, c, e], data_len=1)
    assert rewrite_rows(rt) == before


def test_the_crash_point_of_a_segment_swap_is_reached_once_after_the_first_source(
    runtime: Runtime, streamed: list[Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With segment sources only, the swap's crash point follows the first source's
    retirement: a crash there leaves nothing. A commit reaches it once, however many
    sources (crash tests count commits by it)."""
    rt = runtime
    sources = stream_segments(rt, streamed[:2])
    single = begin(rt, "one", segments=sources[:1])
    before = rewrite_rows(rt)
    with crash_at(monkeypatch, "mid-rewrite-commit"):
        rt.metadata.rewrites.commit(single, whole(streamed[:1]), segments=sources[:1], data_len=1)
    assert rewrite_rows(rt) == before
    segment = begin(rt, "r", segments=sources)
    reached: list[str] = []
    monkeypatch.setattr(failpoints, "reach", reached.append)
    rt.metadata.rewrites.commit(segment, whole(streamed[:2]), segments=sources, data_len=1)
    assert reached == ["mid-rewrite-commit"]


def test_offloaded_pieces_are_those_of_the_topics_offloaded_segments_by_id(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    """Each offloaded segment's ranges in ledger order, segments in id order (here not
    their position order); another topic's segments and retired ones are left out."""
    rt = runtime
    (l1, n1), (l2, n2), (l3, n3) = ((x.ledger_id, x.entry_count) for x in streamed)
    stream_segment_of(rt.metadata, T, "b", [(l1, 0, n1 - 1), (l2, 0, 5)])
    retired = stream_segment_of(rt.metadata, T, "c", [(l2, 6, n2 - 1)])
    stream_segment_of(rt.metadata, T, "a", [(l3, 0, n3 - 1)])
    rewrite = begin(rt, "d", segments=[retired])
    rt.metadata.rewrites.commit(
        rewrite, [PieceRange(l2, 6, n2 - 1)], segments=[retired], data_len=1
    )
    rt.metadata.create_topic("aaa", OffloadPolicy(streaming=True, min_part_bytes=1))
    (other,) = produce_ledgers(rt, "aaa", SHAPES[:1])
    stream_segment(rt.metadata, "aaa", "aa", other, SHAPES[0][0] - 1)
    assert list(rt.metadata.segments.offloaded_pieces(T).items()) == [
        ("a", [PieceRange(l3, 0, n3 - 1)]),
        ("b", [PieceRange(l1, 0, n1 - 1), PieceRange(l2, 0, 5)]),
        ("d", [PieceRange(l2, 6, n2 - 1)]),
    ]
