"""The streaming pass (stream/offloader.py) on both backends: entries round-trip through
the segments' objects, the open ledger's confirmed entries are streamed, a small tail waits
for more data or the age limit, segments roll over by size and at history's planned ends,
streaming can be switched off (ledger offload takes over) and on again, and a pass with
nothing new does nothing."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter

import pytest
import sqlalchemy as sa

from fixtures.backends import produce_ledgers
from fixtures.metadata import pending_deletions
from fixtures.streams import (
    check_sealed_ledgers_streamed,
    check_segments,
    converge,
    crash_at,
    hot_entries,
    is_s3,
    produce,
    profile,
    run_pass,
    segment_entries,
    set_policy,
    stream_topic,
)
from offloader import failpoints
from offloader.format.layout import ENTRY_FRAME, HEADER_LEN
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.metadata import (
    LedgerState,
    OffloadMode,
    OffloadState,
    Position,
    SegmentState,
    schema,
)
from offloader.objectstore import MultipartUpload
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime
from offloader.stream.history import SealedSpan, plan_segment_end

T = "s"


def ledgers_for(rt: Runtime, segments: float) -> int:
    """How many ledgers of the profile hold about ``segments`` segments."""
    p = profile(rt)
    return int(segments * p.segment_max / p.ledger_bytes) + 1


def expected_history_ends(rt: Runtime, begin: Position, max_bytes: int) -> list[Position]:
    """Where segments of sealed history from ``begin`` end, by a linear scan of the hot
    tier's framed entry sizes (the whole-history segments only)."""
    ends, total = [], 0
    for ledger in rt.metadata.list_ledgers(T, live=True):
        if ledger.state is not LedgerState.SEALED or ledger.ledger_id < begin.ledger_id:
            continue
        first = begin.entry_id if ledger.ledger_id == begin.ledger_id else 0
        for _, entry_id, payload in hot_entries(rt, T, ledger.ledger_id, first):
            total += len(payload) + ENTRY_FRAME
            if total >= max_bytes:
                ends.append(Position(ledger_id=ledger.ledger_id, entry_id=entry_id))
                total = 0
    return ends


def part_sizes_ok(rt: Runtime) -> None:
    """Every offloaded segment's parts but the last are at least min_part_bytes (S3's rule)."""
    min_part = rt.metadata.get_topic(T).policy.min_part_bytes
    for segment in rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED]):
        parts = rt.metadata.segments.parts(segment)
        assert all(p.length >= min_part for p in parts[:-1]), segment.segment_id
        assert sum(p.length for p in parts) == segment.data_len


# --- round trips and history -------------------------------------------------------------
def test_sealed_history_is_split_at_planned_ends_and_round_trips(runtime: Runtime) -> None:
    rt = runtime
    p = stream_topic(rt)
    produce(rt, T, ledgers_for(rt, 2.3))
    planned = expected_history_ends(rt, Position(ledger_id=0, entry_id=0), p.segment_max)
    assert len(planned) == 2

    first = run_pass(rt)
    segments = rt.metadata.segments.of_topic(T)
    assert first.committed == [s.segment_id for s in segments[:2]]
    assert [s.end for s in segments[:2]] == planned
    assert [s.planned_end for s in segments[:2]] == planned
    assert segments[1].begin == Position(
        ledger_id=planned[0].ledger_id, entry_id=planned[0].entry_id + 1
    )
    # the rest of history is smaller than a segment: its segment is open, no planned end
    tail = segments[2]
    assert tail.state is SegmentState.ASSIGNED and tail.planned_end is None
    assert first.open_segment == tail.segment_id and first.waiting_bytes > 0
    streamed = check_segments(rt)
    settled = sorted(
        x.ledger_id
        for x in rt.metadata.list_ledgers(T)
        if x.offload_state is OffloadState.OFFLOADED
    )
    assert settled == [lid for lid in {k[0] for k in streamed} if lid < planned[1].ledger_id]
    # the pass reports the ledgers its commits settled
    assert first.settled_ledgers == settled

    closing = run_pass(rt, close_now=True)
    assert closing.committed == [tail.segment_id]
    check_sealed_ledgers_streamed(rt)
    part_sizes_ok(rt)
    assert rt.metadata.segments.current(T) is None


def test_history_boundaries_follow_plan_segment_end_when_streaming_is_turned_on(
    runtime: Runtime,
) -> None:
    """A topic with a sealed backlog turns streaming on: each segment of history ends
    where plan_segment_end says, from wherever the last one ended."""
    rt = runtime
    p = stream_topic(rt, streaming=False)
    produce(rt, T, ledgers_for(rt, 3.2), seed=11)
    set_policy(rt, T, streaming=True)
    run_pass(rt)
    done = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    assert len(done) == 3

    def sizes(ledger_id: int, first: int) -> list[int]:
        return [len(x) for _, _, x in hot_entries(rt, T, ledger_id, first)]

    begin = Position(ledger_id=0, entry_id=0)
    for segment in done:
        spans = []
        for ledger in rt.metadata.list_ledgers(T):
            if ledger.ledger_id < begin.ledger_id:
                continue
            first = begin.entry_id if ledger.ledger_id == begin.ledger_id else 0
            framed = sum(n + ENTRY_FRAME for n in sizes(ledger.ledger_id, first))
            spans.append(SealedSpan(ledger.ledger_id, first, ledger.entry_count, framed))
        assert segment.begin == begin
        assert segment.end == plan_segment_end(spans, p.segment_max, sizes)
        assert segment.end is not None
        begin = Position(ledger_id=segment.end.ledger_id, entry_id=segment.end.entry_id + 1)
    check_segments(rt)


# --- the open ledger ------------------------------------------------------------------------
def test_the_open_ledgers_confirmed_entries_are_streamed(runtime: Runtime) -> None:
    rt = runtime
    stream_topic(rt)
    sealed = produce(rt, T, 1)
    payloads = [bytes([n]) * 3000 for n in range(12)]
    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:
        for payload in payloads[:8]:
            open_id, _ = writer.append(payload)
        # appends are buffered in the writer: a reader sees them once flushed. The writer
        # has no flush of its own, so the test syncs its open ledger (the hot tier's API)
        assert rt.hot.info(T, open_id).entry_count == 0
        writer._writable.sync()  # type: ignore[union-attr]
        assert rt.hot.info(T, open_id).entry_count == 8

        result = run_pass(rt, close_now=True)
        (segment,) = rt.metadata.segments.of_topic(T)
        assert result.committed == [segment.segment_id]
        assert segment.end == Position(ledger_id=open_id, entry_id=7)
        entries = segment_entries(rt, segment)
        assert entries == hot_entries(rt, T, sealed[0]) + [
            (open_id, n, payloads[n]) for n in range(8)
        ]
        assert result.settled_ledgers == sealed
        ledger = rt.metadata.get_ledger(T, open_id)
        assert ledger.state is LedgerState.OPEN and ledger.offload_state is OffloadState.NONE

        for payload in payloads[8:]:
            writer.append(payload)
    # sealed now: the rest goes into the next segment, and the ledger is settled
    result = run_pass(rt, close_now=True)
    assert len(result.committed) == 1
    assert result.settled_ledgers == [open_id]
    (piece_a, piece_b) = rt.metadata.segments.pieces(T, open_id)
    assert (piece_a.first_entry_id, piece_a.last_entry_id) == (0, 7)
    assert (piece_b.first_entry_id, piece_b.last_entry_id) == (8, 11)
    check_sealed_ledgers_streamed(rt)


def test_an_index_written_before_the_open_ledger_sealed_is_accepted(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass dies after writing a segment's index, while a ledger in it was open; the
    ledger is sealed (its seal time changes the index the next pass computes); the next
    pass must still commit the segment, not fail on the index forever."""
    rt = runtime
    stream_topic(rt)
    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:
        for n in range(6):
            open_id, _ = writer.append(bytes([n]) * 2000)
        writer._writable.sync()  # type: ignore[union-attr]
        with crash_at(monkeypatch, "stream-after-index"):
            run_pass(rt, close_now=True)
    assert rt.metadata.get_ledger(T, open_id).state is LedgerState.SEALED
    (segment,) = rt.metadata.segments.of_topic(T)
    assert segment.state is SegmentState.CLOSING
    assert rt.objects.exists(segment.index_key)
    result = run_pass(rt)
    assert result.committed == [segment.segment_id]
    assert result.settled_ledgers == [open_id]
    check_sealed_ledgers_streamed(rt)


# --- the tail, the age limit, the size limit -----------------------------------------------
def test_a_tail_smaller_than_a_part_waits_until_it_grows_or_ages(runtime: Runtime) -> None:
    rt = runtime
    p = stream_topic(rt, segment_max_age_seconds=3600)
    small = max(1, p.min_part // (p.entry_max // 2) // 3)  # entries of about a third part
    produce_ledgers(rt, T, [(small, p.entry_max)])
    first = run_pass(rt)
    (segment,) = rt.metadata.segments.of_topic(T)
    assert (first.parts_uploaded, first.committed) == (0, [])
    assert first.waiting_bytes > 0 and segment.state is SegmentState.ASSIGNED
    assert segment.data_len == 0 and segment.end is None
    assert rt.metadata.segments.parts(segment) == []
    again = run_pass(rt)
    assert again.parts_uploaded == 0 and again.waiting_bytes == first.waiting_bytes

    # more data: a part goes, a smaller rest waits
    produce_ledgers(rt, T, [(small * 4, p.entry_max)], seed=3)
    grown = run_pass(rt)
    assert grown.parts_uploaded >= 1 and grown.committed == []
    segment = rt.metadata.segments.get(segment.segment_id)
    assert segment.state is SegmentState.ASSIGNED and segment.data_len >= p.min_part
    assert all(x.length >= p.min_part for x in rt.metadata.segments.parts(segment))

    # the age limit forces the rest out, in a short last part
    set_policy(rt, T, segment_max_age_seconds=0.5)
    time.sleep(0.6)
    aged = run_pass(rt)
    assert aged.committed == [segment.segment_id]
    check_sealed_ledgers_streamed(rt)
    part_sizes_ok(rt)


@pytest.mark.parametrize(
    ("age_s", "interval_s", "closes"),
    [
        (7.0, 2.5, True),  # 7 + 2.5 + 0.625 >= 10: the next pass would be late
        (6.0, 2.5, False),  # 6 + 2.5 + 0.625 < 10: the next pass is still in time
        (9.0, None, False),  # the first pass of a stream knows no interval: the age alone
        (10.0, None, True),
    ],
)
def test_a_segment_closes_at_the_last_pass_before_its_age(
    runtime: Runtime, age_s: float, interval_s: float | None, closes: bool
) -> None:
    """Rollover by age (10 s here) is decided on the database's clock: the segment's age plus
    the interval since the stream's previous pass (and a quarter of it) against the limit."""
    rt = runtime
    p = stream_topic(rt, segment_max_age_seconds=10)
    small = max(1, p.min_part // (p.entry_max // 2) // 3)  # a tail under one part
    produce_ledgers(rt, T, [(small, p.entry_max)])
    run_pass(rt)
    segment = rt.metadata.segments.current(T)
    assert segment is not None and segment.state is SegmentState.ASSIGNED
    now = rt.metadata.db_now_ms()
    previous_claim = None if interval_s is None else now - int(interval_s * 1000)
    with rt.metadata.transaction() as conn:
        conn.execute(
            schema.segments.update()
            .where(schema.segments.c.segment_id == segment.segment_id)
            .values(assigned_ms=now - int(age_s * 1000))
        )
        conn.execute(
            schema.streams.update()
            .where(schema.streams.c.topic == T)
            .values(claimed_ms=previous_claim)
        )
    result = run_pass(rt)
    assert result.committed == ([segment.segment_id] if closes else [])
    assert result.parts_uploaded == (1 if closes else 0)


def test_segments_roll_over_at_about_the_maximum_size(runtime: Runtime) -> None:
    rt = runtime
    p = stream_topic(rt)
    produce_ledgers(rt, T, [(3, p.entry_max)])
    run_pass(rt)  # the segment is assigned while history is small: no planned end
    (segment,) = rt.metadata.segments.of_topic(T)
    assert segment.planned_end is None
    produce(rt, T, ledgers_for(rt, 3.5), seed=5)
    result = run_pass(rt)
    done = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    assert result.committed == [s.segment_id for s in done]
    assert len(done) >= 3
    slack = 2 * (p.entry_max + ENTRY_FRAME + HEADER_LEN)  # one entry past, a block padded
    for s in done:
        assert p.segment_max <= s.data_len <= p.segment_max + slack, (s.seq, s.data_len)
    check_segments(rt)
    part_sizes_ok(rt)
    converge(rt)
    check_sealed_ledgers_streamed(rt)


def test_close_now_completes_the_current_segment(runtime: Runtime) -> None:
    rt = runtime
    stream_topic(rt)
    produce(rt, T, 2)
    run_pass(rt)
    (segment,) = rt.metadata.segments.of_topic(T)
    assert segment.state is SegmentState.ASSIGNED
    result = run_pass(rt, close_now=True)
    assert result.committed == [segment.segment_id]
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    assert rt.metadata.segments.current(T) is None
    check_sealed_ledgers_streamed(rt)


def test_a_short_last_part_closes_its_segment_even_when_the_pass_died_before(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close-now pass records the segment's short last part and dies; more data comes;
    the next pass must not add parts after the short one (S3 refuses to complete such an
    upload: every part but the last is at least 5 MiB)."""
    rt = runtime
    p = stream_topic(rt)
    produce_ledgers(rt, T, [(3, p.entry_max)])
    with crash_at(monkeypatch, "stream-after-part-record"):
        run_pass(rt, close_now=True)
    (segment,) = rt.metadata.segments.of_topic(T)
    (part,) = rt.metadata.segments.parts(segment)
    assert part.length < p.min_part and segment.state is SegmentState.ASSIGNED
    produce(rt, T, ledgers_for(rt, 0.8), seed=9)
    run_pass(rt)
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    converge(rt)
    assert not rt.metadata.segments.of_topic(T, [SegmentState.FAILED, SegmentState.REPLACED])
    part_sizes_ok(rt)
    check_sealed_ledgers_streamed(rt)


# --- switching streaming off and on -----------------------------------------------------------
def test_streaming_off_leaves_the_rest_to_ledger_offload_and_on_resumes_without_gap(
    runtime: Runtime,
) -> None:
    rt = runtime
    stream_topic(rt)
    produce(rt, T, ledgers_for(rt, 1.5))
    run_pass(rt)
    current = rt.metadata.segments.current(T)
    assert current is not None and current.state is SegmentState.ASSIGNED

    set_policy(rt, T, streaming=False)
    off = run_pass(rt)
    assert off.committed == [current.segment_id]  # the current segment is completed
    assert rt.metadata.segments.current(T) is None
    streamed_end = rt.metadata.segments.last_offloaded_end(T)
    produce(rt, T, 2, seed=21)
    assert run_pass(rt).parts_uploaded == 0  # off: nothing more is streamed
    assert rt.metadata.segments.last_offloaded_end(T) == streamed_end

    unsettled = [
        x.ledger_id for x in rt.metadata.list_ledgers(T) if x.offload_state is OffloadState.NONE
    ]
    results = LedgerOffloader(rt).offload_topic(T, up_to=max(unsettled))
    assert sorted(r.ledger_id for r in results) == unsettled
    by_ledger = {x.ledger_id: x for x in rt.metadata.list_ledgers(T)}
    assert all(by_ledger[lid].offload_mode is OffloadMode.LEDGER for lid in unsettled)

    set_policy(rt, T, streaming=True)
    later = produce(rt, T, 2, seed=33)
    run_pass(rt, close_now=True)
    segments = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    resumed = [s for s in segments if s.begin > streamed_end]
    assert resumed and resumed[0].begin == Position(
        ledger_id=streamed_end.ledger_id, entry_id=streamed_end.entry_id + 1
    )
    streamed = check_segments(rt)
    # the resumed segments hold exactly the ledgers produced since, whole
    assert {lid for lid, _ in streamed if (lid, 0) >= (later[0], 0)} == set(later)
    for ledger in rt.metadata.list_ledgers(T):
        if ledger.offload_mode is OffloadMode.LEDGER:
            assert all(
                piece.segment.seq <= current.seq
                for piece in rt.metadata.segments.pieces(T, ledger.ledger_id)
            )
        else:
            assert ledger.offload_state is OffloadState.OFFLOADED
            covered = [
                e
                for piece in rt.metadata.segments.pieces(T, ledger.ledger_id)
                for e in range(piece.first_entry_id, piece.last_entry_id + 1)
            ]
            assert covered == list(range(ledger.entry_count))


# --- a writer that does not wait for the passes ------------------------------------------
def test_entries_written_between_and_during_passes_appear_once_in_order(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries are appended (and confirmed) between passes and in the middle of them, at
    every step a pass takes, across many ledger rollovers: each entry is in exactly one
    segment, in write order, and the topic reads back from the tier as from the hot copy."""
    rt = runtime
    p = stream_topic(rt, ledger_max_entries=p_ledger_entries(rt))
    rng = random.Random(11)
    written: list[bytes] = []
    during: Counter[str] = Counter()
    total = 6 * p.segment_max // (p.entry_max // 2)  # about six segments

    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:

        def write(count: int) -> None:
            for _ in range(count):
                payload = rng.randbytes(rng.randint(1, p.entry_max))
                writer.append(payload)
                written.append(payload)
            writer.sync()

        real = failpoints.reach

        def reach(name: str) -> None:
            real(name)
            if name.startswith("stream-") and len(written) < total:
                during[name] += 1
                write(1)

        monkeypatch.setattr(failpoints, "reach", reach)
        while len(written) < total:
            write(rng.randint(1, 2 * p.ledger_entries))
            run_pass(rt)
        monkeypatch.setattr(failpoints, "reach", real)
    converge(rt)

    # a pass saw appends at each of its steps that ran
    assert {"stream-after-assign", "stream-after-part-record", "stream-after-commit"} <= set(
        during
    ), during
    check_sealed_ledgers_streamed(rt)
    streamed = check_segments(rt)
    assert [streamed[k] for k in sorted(streamed)] == written
    ledgers = rt.metadata.list_ledgers(T, live=True)
    segments = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    assert len(ledgers) > len(segments) > 3  # rolled over many times, both of them
    assert any(len(rt.metadata.segments.pieces(T, x.ledger_id)) > 1 for x in ledgers)
    reader = TopicReader(rt)
    tiered = reader.checksum(T, Source.TIERED)
    assert tiered == reader.checksum(T, Source.HOT)
    assert tiered.entries == len(written)


def p_ledger_entries(rt: Runtime) -> int:
    """Ledgers of a third of the profile's: many rollovers, segments over several ledgers."""
    return max(2, profile(rt).ledger_entries // 3)


# --- requests --------------------------------------------------------------------------------
def test_a_pass_with_nothing_new_uploads_nothing(runtime: Runtime) -> None:
    rt = runtime
    stream_topic(rt)
    empty = run_pass(rt)
    assert (empty.parts_uploaded, empty.committed, empty.open_segment) == (0, [], None)
    assert rt.metadata.segments.of_topic(T) == []
    produce(rt, T, 2)
    converge(rt)
    keys = {o.key for o in rt.objects.list()}
    uploads = list(rt.objects.list_multipart_uploads())
    segments = rt.metadata.segments.of_topic(T)
    for close_now in (False, True):
        result = run_pass(rt, close_now=close_now)
        assert (result.parts_uploaded, result.bytes_uploaded, result.committed) == (0, 0, [])
        assert result.failed == [] and result.open_segment is None
    assert rt.metadata.segments.of_topic(T) == segments
    assert {o.key for o in rt.objects.list()} == keys
    assert list(rt.objects.list_multipart_uploads()) == uploads


def test_a_part_size_below_the_stores_minimum_is_refused_before_anything_changes(
    runtime: Runtime,
) -> None:
    rt = runtime
    if not is_s3(rt):
        stream_topic(rt, min_part_bytes=1, segment_max_bytes=100)
        produce(rt, T, 1)
        assert run_pass(rt, close_now=True).committed  # the filesystem takes any size
        return
    stream_topic(rt, min_part_bytes=4 * 1024 * 1024)
    produce_ledgers(rt, T, [(3, 1000)])
    with pytest.raises(
        ValueError,
        match=r"min_part_bytes \(4194304\) is below the object store's minimum part size \(5242880",
    ):
        run_pass(rt)
    with rt.metadata.engine.connect() as conn:
        assert conn.execute(sa.select(schema.streams)).all() == []
        assert conn.execute(sa.select(schema.segments)).all() == []
    assert list(rt.objects.list()) == [] and list(rt.objects.list_multipart_uploads()) == []


# --- a segment whose upload is gone ----------------------------------------------------------
@pytest.mark.parametrize("more_data", [False, True], ids=["closing", "more-parts"])
def test_a_segment_whose_upload_vanished_is_failed_and_replaced(
    runtime: Runtime, more_data: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The open segment's multipart upload is aborted behind the stream's back (a bucket
    lifecycle rule, an operator): the segment fails with the reason in its detail and a
    warning, its keys are queued, and a new one streams the same entries from its begin,
    whether the next pass closes the segment or first has more parts to add to it."""
    rt = runtime
    p = stream_topic(rt, segment_max_bytes=profile(rt).segment_max * 4)
    produce(rt, T, ledgers_for(rt, 0.8))
    run_pass(rt)
    (segment,) = rt.metadata.segments.of_topic(T)
    assert rt.metadata.segments.parts(segment), "a part was recorded"
    assert segment.upload_id is not None
    rt.objects.abort_multipart(MultipartUpload(key=segment.data_key, upload_id=segment.upload_id))
    if more_data:
        produce(rt, T, max(1, p.min_part // p.ledger_bytes + 1), seed=4)
    with caplog.at_level(logging.WARNING, logger="offloader.stream.offloader"):
        result = run_pass(rt, close_now=True)
    assert result.failed == [segment.segment_id]
    failed = rt.metadata.segments.get(segment.segment_id)
    assert failed.state is SegmentState.REPLACED
    why = "its upload "  # is gone (a part or the close found it so), or cannot be completed
    assert (failed.detail or "").startswith(why), failed.detail
    (warning,) = [r for r in caplog.records if r.msg.startswith("segment %s failed")]
    assert warning.getMessage().startswith(
        f"segment {segment.segment_id} failed, to be replaced: {why}"
    )
    (replacement,) = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    assert replacement.replaces == segment.segment_id and replacement.begin == segment.begin
    assert {d.object_key for d in pending_deletions(rt.metadata)} == {
        segment.data_key,
        segment.index_key,
    }
    check_sealed_ledgers_streamed(rt)
