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

from fixtures.backends import produce_ledgers
from fixtures.metadata import begin as begin_attempt
from fixtures.rewrites import assign_stream_segment, stream_segment, table_rows
from fixtures.scrub import offloaded_topic
from fixtures.streams import crash_at
from offloader.exceptions import CommitFailedError, TopicDeletedError
from offloader.metadata import (
    AttemptState,
    Ledger,
    OffloadMode,
    Position,
    Segment,
    SegmentOrigin,
    SegmentState,
)
from offloader.metadata.segments import PieceRange
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


def queued(rt: Runtime) -> dict[str, str]:
    return {d.object_key: d.reason for d in rt.metadata.pending_deletions()}


def wait_past_lease(rt: Runtime, segment: Segment) -> None:
    assert segment.lease_until_ms is not None
    deadline = time.monotonic() + 10
    while rt.metadata.db_now_ms() <= segment.lease_until_ms:
        assert time.monotonic() < deadline
        time.sleep(0.05)


# --- the intent ----------------------------------------------------------------------------
def test_begin_records_a_rewrite_segment_the_stream_never_sees(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    before = rt.metadata.db_now_ms()
    segment = begin(rt, "r1", ledgers)
    assert segment.state is SegmentState.ASSIGNED and segment.origin is SegmentOrigin.REWRITE
    assert (segment.data_key, segment.index_key, segment.store_id) == (
        "r1-d",
        "r1-i",
        rt.stores.default_id(),
    )
    assert segment.begin == pos(ledgers[0].ledger_id, 0)
    assert segment.planned_end == pos(ledgers[-1].ledger_id, ledgers[-1].entry_count - 1)
    assert segment.end is None and segment.upload_id is None and segment.data_len == 0
    assert segment.detail is not None and "test-owner" in segment.detail
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
    first, second, third = ledgers
    before = table_rows(rt)
    with pytest.raises(ValueError, match="at least one source"):
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
    with pytest.raises(CommitFailedError, match=rf"{T}/{third.ledger_id} changed since version"):
        stale = third.model_copy(update={"version": third.version - 1})
        begin(rt, "r", [stale])
    with pytest.raises(ValueError, match="sources of that topic only"):
        begin(rt, "r", [first.model_copy(update={"topic": "other"})])
    assert table_rows(rt)["segments"] == before["segments"] == []
    assert table_rows(rt)["deletion_queue"] == before["deletion_queue"]


def test_begin_refuses_a_deleted_topic(runtime: Runtime, ledgers: list[Ledger]) -> None:
    rt = runtime
    rt.metadata.delete_topic(rt.metadata.get_topic(T))
    with pytest.raises(TopicDeletedError, match="nothing to rewrite"):
        begin(rt, "r", ledgers)
    assert rt.metadata.segments.list(T) == []


# --- the lease -----------------------------------------------------------------------------
def test_a_rewrite_whose_lease_ran_out_has_lost_its_segment(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    live = begin(rt, "live", ledgers[:1])
    segment = rt.metadata.rewrites.record_upload(begin(rt, "r", ledgers[1:], lease_ms=300), "up-1")
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

    (stale,) = rt.metadata.rewrites.recover_stale()
    assert (stale.segment_id, stale.state, stale.upload_id) == ("r", SegmentState.FAILED, "up-1")
    assert stale.detail is not None and stale.detail.endswith("recovered")
    assert "test-owner" in stale.detail
    assert queued(rt) == {
        "r-d": "failed rewrite (lease ran out)",
        "r-i": "failed rewrite (lease ran out)",
    }
    assert rt.metadata.rewrites.recover_stale() == []  # once
    assert rt.metadata.segments.get("live").state is SegmentState.ASSIGNED
    assert rt.metadata.rewrites.open_rewrites() == [live]


# --- the swap ------------------------------------------------------------------------------
def test_commit_swaps_v1_ledgers_onto_the_segment_in_one_step(
    runtime: Runtime, ledgers: list[Ledger]
) -> None:
    rt = runtime
    segment = rt.metadata.rewrites.record_upload(begin(rt, "r", ledgers), "up")
    committed = rt.metadata.rewrites.commit(
        segment, whole(ledgers), ledgers, data_len=4242, grace_ms=3_600_000
    )
    assert committed.state is SegmentState.OFFLOADED and committed.offloaded_ms is not None
    last = ledgers[-1]
    assert committed.end == pos(last.ledger_id, last.entry_count - 1)
    assert (committed.data_len, committed.lease_until_ms) == (4242, None)
    for old in ledgers:
        now = rt.metadata.get_ledger(T, old.ledger_id)
        assert now.is_offloaded and now.offload_mode is OffloadMode.STREAM
        assert (now.offload_uuid, now.data_key, now.index_key, now.data_len, now.store_id) == (
            None,
            None,
            None,
            None,
            None,
        )
        assert (now.offloaded_ms, now.hot_state) == (old.offloaded_ms, old.hot_state)
        attempt = rt.metadata.get_attempt(old.offload_uuid or "")
        assert attempt.state is AttemptState.SUPERSEDED
        assert attempt.detail == "rewritten into segment r"
        (piece,) = rt.metadata.segments.pieces(T, old.ledger_id)
        assert piece.segment.segment_id == "r"
        assert (piece.first_entry_id, piece.last_entry_id) == (0, old.entry_count - 1)
    # the old objects wait out the grace; the stream still has not moved
    now_ms = rt.metadata.db_now_ms()
    deletions = rt.metadata.pending_deletions()
    assert {d.object_key for d in deletions} == {
        k for x in ledgers for k in (x.data_key, x.index_key)
    }
    assert all(d.reason == "rewritten into segment r" for d in deletions)
    assert all(d.next_try_ms >= now_ms + 3_500_000 for d in deletions)
    assert {d.attempt_id for d in deletions} == {x.offload_uuid for x in ledgers}
    assert rt.metadata.due_deletions(100) == []
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
    with pytest.raises(ValueError, match=r"does not hold ledger \d+ whole"):
        rt.metadata.rewrites.commit(segment, short, ledgers[:2], data_len=10)
    with pytest.raises(ValueError, match="holds entries"):
        rt.metadata.rewrites.commit(segment, [], ledgers[:2], data_len=10)
    with pytest.raises(ValueError, match="rising ledger ids"):
        rt.metadata.rewrites.commit(segment, whole(ledgers[:2])[::-1], ledgers[:2], data_len=10)
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
        rt.metadata.move_start(topic, pos(third.ledger_id + 1, 0))
        rt.metadata.mark_ledgers_deleting(T, third.ledger_id + 1, 100)
        # the first two were trimmed too: the refusal names the first source it finds
        expected = rf"ledger {T}/{first.ledger_id} was trimmed"
    elif change == "replaced":
        begin_attempt(rt.metadata, third, "repair", replace=True)
        expected = rf"ledger {T}/{third.ledger_id} has offload attempt repair in flight"
    elif change == "repaired":  # scrub's repair swapped it onto new v1 objects meanwhile
        _, attempt = begin_attempt(rt.metadata, third, "repair", replace=True)
        rt.metadata.commit_replacement(attempt, 5, "crc mismatch")
        expected = re.escape(
            f"ledger {T}/{third.ledger_id} was offloaded again (attempt repair, "
            f"was {third.offload_uuid}): the rewrite of it is called off"
        )
    else:  # a concurrent rewrite of the last ledger won
        other = begin(rt, "other", [third])
        rt.metadata.rewrites.commit(other, whole([third]), [third], data_len=5)
        expected = rf"ledger {T}/{third.ledger_id} is offloaded in mode stream"
    before = table_rows(rt)
    with pytest.raises(CommitFailedError, match=expected):
        rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)
    assert table_rows(rt) == before
    failed = rt.metadata.rewrites.fail(segment, "changed")
    assert failed.state is SegmentState.FAILED
    after = table_rows(rt)
    assert after["ledgers"] == before["ledgers"]
    assert set(queued(rt)) - {d[1] for d in before["deletion_queue"]} == {"r-d", "r-i"}


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


def test_the_commit_crashing_inside_its_transaction_leaves_nothing(
    runtime: Runtime, ledgers: list[Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    segment = begin(rt, "r", ledgers)
    before = table_rows(rt)
    with crash_at(monkeypatch, "mid-rewrite-commit"):
        rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)
    assert table_rows(rt) == before
    committed = rt.metadata.rewrites.commit(segment, whole(ledgers), ledgers, data_len=10)
    assert committed.state is SegmentState.OFFLOADED


def test_two_rewrites_of_the_same_sources_one_wins(runtime: Runtime, ledgers: list[Ledger]) -> None:
    rt = runtime
    a, b = begin(rt, "a", ledgers), begin(rt, "b", ledgers)
    rt.metadata.rewrites.commit(b, whole(ledgers), ledgers, data_len=10)
    with pytest.raises(CommitFailedError, match=rf"ledger {T}/{ledgers[0].ledger_id} is offloaded"):
        rt.metadata.rewrites.commit(a, whole(ledgers), ledgers, data_len=10)
    rt.metadata.rewrites.fail(a, "changed")
    assert {s.segment_id: s.state for s in rt.metadata.segments.list(T)} == {
        "a": SegmentState.FAILED,
        "b": SegmentState.OFFLOADED,
    }
    assert {
        p.segment.segment_id for x in ledgers for p in rt.metadata.segments.pieces(T, x.ledger_id)
    } == {"b"}
    assert {"a-d", "a-i"} <= set(queued(rt))


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
    assert all(d.next_try_ms == d.enqueued_ms for d in rt.metadata.pending_deletions())
    assert queued(rt) == {"r-d": "failed rewrite", "r-i": "failed rewrite"}
    again = rt.metadata.rewrites.fail(segment, "late")
    assert again == failed
    reasons = sorted(d.reason for d in rt.metadata.pending_deletions())
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
    committed = rt.metadata.rewrites.commit(
        segment, whole(streamed[:2]), segments=sources, data_len=200, grace_ms=0
    )
    assert committed.state is SegmentState.OFFLOADED
    for source in sources:
        now = rt.metadata.segments.get(source.segment_id)
        assert (now.state, now.detail) == (SegmentState.DELETED, "rewritten into segment r")
    assert set(queued(rt)) == {k for s in sources for k in (s.data_key, s.index_key)}
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
    rt.metadata.move_start(topic, pos(streamed[1].ledger_id, 0))
    rt.metadata.mark_ledgers_deleting(T, streamed[1].ledger_id, 100)
    before = table_rows(rt)
    with pytest.raises(CommitFailedError, match=rf"holds trimmed ledger {streamed[0].ledger_id}"):
        rt.metadata.rewrites.commit(
            segment, whole(streamed[:2]), segments=[first, second], data_len=1
        )
    assert table_rows(rt) == before


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


def test_only_a_rewrite_segment_is_failed_here(runtime: Runtime, streamed: list[Ledger]) -> None:
    """A stream segment in flight belongs to the stream's pass: the rewrite's fail refuses
    it and changes nothing."""
    rt = runtime
    claim = rt.metadata.segments.claim(T, "stream", 60_000)
    open_segment = assign_stream_segment(rt.metadata, claim, "s", pos(streamed[0].ledger_id, 0))
    before = table_rows(rt)
    with pytest.raises(CommitFailedError, match="rewrite segment s is assigned: nothing to fail"):
        rt.metadata.rewrites.fail(open_segment, "x")
    assert table_rows(rt) == before


def test_merged_pieces_must_be_exactly_what_the_source_segments_held(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    rt = runtime
    sources = stream_segments(rt, streamed[:2])
    segment = begin(rt, "r", segments=sources)
    before = table_rows(rt)
    short = [PieceRange(streamed[0].ledger_id, 0, 3), *whole(streamed[1:2])]
    extra = [*whole(streamed[:2]), *whole(streamed[2:3])]
    for wrong in (short, extra, whole(streamed[:1])):
        with pytest.raises(ValueError, match="the swap would lose or invent entries"):
            rt.metadata.rewrites.commit(segment, wrong, segments=sources, data_len=200)
        assert table_rows(rt) == before
    rt.metadata.rewrites.commit(segment, whole(streamed[:2]), segments=sources, data_len=200)


def test_a_ledger_split_over_two_source_segments_is_one_piece(
    runtime: Runtime, streamed: list[Ledger]
) -> None:
    rt = runtime
    ledger = streamed[0]
    half = ledger.entry_count // 2
    head = stream_segment(rt.metadata, T, "head", ledger.ledger_id, half - 1)
    tail = stream_segment(
        rt.metadata, T, "tail", ledger.ledger_id, ledger.entry_count - 1, first=half
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
