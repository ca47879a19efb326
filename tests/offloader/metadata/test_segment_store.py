"""The streaming half of the metadata store (metadata/segments.py), on SQLite and PostgreSQL:
the stream's claim and its epoch fencing, a segment's life, what a commit settles, and
what retention releases."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
import sqlalchemy as sa

from fixtures.backends import Fresh, produce_ledgers
from fixtures.clock import database_time_ms
from fixtures.inspect import table_rows
from fixtures.metadata import pending_deletions
from fixtures.segment_rows import add_part, assign, offloaded, pos
from offloader.exceptions import (
    CommitFailedError,
    NotFoundError,
    StreamBusyError,
    StreamFencedError,
)
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.metadata import (
    DeletionState,
    HotState,
    LedgerState,
    OffloadMode,
    OffloadState,
    SegmentState,
    StreamClaim,
    schema,
)
from offloader.metadata.pieces import covers, release_deleted
from offloader.metadata.records import PieceRange
from offloader.metadata.segments import SegmentStore
from offloader.metadata.snapshot import import_snapshot
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime, export_metadata

T = "s"


@pytest.fixture
def rt(runtime: Runtime) -> Runtime:
    """A topic with three sealed ledgers of 10 entries."""
    runtime.metadata.create_topic(T, OffloadPolicy(streaming=True, min_part_bytes=1))
    produce_ledgers(runtime, T, [(10, 50)] * 3)
    return runtime


@pytest.fixture
def store(rt: Runtime) -> SegmentStore:
    return rt.metadata.segments


def ledger_ids(rt: Runtime) -> list[int]:
    return [x.ledger_id for x in rt.metadata.list_ledgers(T)]


def snapshot(rt: Runtime) -> dict[str, list[Any]]:
    """Every row the streaming metadata touches."""
    return table_rows(
        rt.metadata,
        schema.streams,
        schema.segments,
        schema.segment_parts,
        schema.pieces,
        schema.deletion_queue,
        schema.ledgers,
    )


def wait_for_lease_end(rt: Runtime, claim_ms: int, lease_ms: int) -> None:
    """Until the database's clock is past a lease set at ``claim_ms``."""
    deadline = time.monotonic() + 10
    while database_time_ms(rt.metadata.engine) <= claim_ms + lease_ms + 1000:
        assert time.monotonic() < deadline
        time.sleep(0.05)


# --- the stream's claim ----------------------------------------------------------------
def test_a_live_claim_keeps_others_out_until_released(rt: Runtime, store: SegmentStore) -> None:
    first = store.claim(T, "first", 60_000)
    assert (first.epoch, first.owner) == (1, "first")
    with pytest.raises(StreamBusyError, match=r"first.*epoch 1"):
        store.claim(T, "second", 60_000)
    store.renew(first)
    with pytest.raises(StreamBusyError):
        store.claim(T, "second", 60_000)
    assert store.release(first)
    second = store.claim(T, "second", 60_000)
    assert second.epoch == 2
    with pytest.raises(StreamFencedError, match=r"epoch 1.*second \(epoch 2\)"):
        store.renew(first)
    assert not store.release(first)  # fenced: releases nothing of the new holder's
    with pytest.raises(StreamBusyError):
        store.claim(T, "third", 60_000)


def test_a_release_frees_only_its_own_topic_s_stream(rt: Runtime, store: SegmentStore) -> None:
    """Epochs are per topic: topic o's stream is held at the same epoch 1 and stays held;
    the released stream's row moves to its next version with no lease."""
    rt.metadata.create_topic("o", OffloadPolicy(streaming=True, min_part_bytes=1))
    first = store.claim(T, "first", 60_000)
    assert store.claim("o", "other", 60_000).epoch == first.epoch == 1
    S = schema.streams
    query = sa.select(S.c.version, S.c.lease_until_ms).where(S.c.topic == T)
    with rt.metadata.engine.connect() as conn:
        version, _ = conn.execute(query).one()
    assert store.release(first)
    with rt.metadata.engine.connect() as conn:
        assert tuple(conn.execute(query).one()) == (version + 1, None)
    with pytest.raises(StreamBusyError, match=r"\(other, epoch 1\)"):
        store.claim("o", "third", 60_000)


def test_renew_moves_the_lease_on_and_a_claim_with_no_stream_is_fenced(
    rt: Runtime, store: SegmentStore
) -> None:
    claim = store.claim(T, "p", 60_000)
    S = schema.streams
    query = sa.select(S.c.version, S.c.lease_until_ms).where(S.c.topic == T)
    with rt.metadata.engine.connect() as conn:
        version, lease_until = conn.execute(query).one()
    time.sleep(0.05)
    store.renew(claim)
    with rt.metadata.engine.connect() as conn:
        renewed, renewed_until = conn.execute(query).one()
    assert renewed == version + 1 and renewed_until > lease_until
    rt.metadata.create_topic("o", OffloadPolicy(streaming=True, min_part_bytes=1))
    stray = StreamClaim(topic="o", epoch=1, owner="p", lease_ms=60_000)
    refused = "topic 'o': this pass (epoch 1) lost the stream to nobody; it commits nothing more"
    with pytest.raises(StreamFencedError, match=rf"^{re.escape(refused)}$"):
        store.renew(stray)


def test_a_claim_needs_a_topic_and_a_lease(rt: Runtime, store: SegmentStore) -> None:
    with pytest.raises(NotFoundError):
        store.claim("nope", "x", 1000)
    with pytest.raises(ValueError, match="lease_ms must be positive"):
        store.claim(T, "x", 0)


def test_an_expired_lease_is_taken_over_and_the_old_pass_is_fenced(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    lease_ms = 300
    zombie = store.claim(T, "zombie", lease_ms)
    done = offloaded(rt, zombie, "done", [(ids[0], 0, 9)])
    open_ = assign(rt, zombie, "open", pos(ids[1], 0))
    open_ = store.record_upload(zombie, open_, "upload-open")
    open_ = add_part(store, zombie, open_, pos(ids[1], 4))
    renewed_ms = database_time_ms(rt.metadata.engine)  # the zombie's last renewal
    with pytest.raises(StreamBusyError):
        store.claim(T, "successor", 60_000)  # the lease is live
    wait_for_lease_end(rt, renewed_ms, lease_ms)

    successor = store.claim(T, "successor", 60_000)
    assert successor.epoch == zombie.epoch + 1
    closing = add_part(store, successor, open_, pos(ids[1], 9))  # for the zombie's commit
    closing = store.begin_close(successor, closing)
    before = snapshot(rt)
    attempts = {
        "renew": lambda: store.renew(zombie),
        "assign": lambda: assign(rt, zombie, "late", pos(ids[2], 0)),
        "record_upload": lambda: store.record_upload(zombie, open_, "other-upload"),
        "record_part": lambda: add_part(store, zombie, open_, pos(ids[1], 7)),
        "begin_close": lambda: store.begin_close(zombie, open_),
        "commit": lambda: store.commit(zombie, closing, [PieceRange(ids[1], 0, 9)]),
        "fail": lambda: store.fail(zombie, closing, "zombie"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(StreamFencedError, match="epoch 1"):
            attempt()
        assert snapshot(rt) == before, f"the fenced {name} changed something"
    assert not store.release(zombie)
    assert snapshot(rt) == before
    # the successor goes on
    committed = store.commit(successor, closing, [PieceRange(ids[1], 0, 9)])
    assert committed.state is SegmentState.OFFLOADED
    assert store.get(done.segment_id).state is SegmentState.OFFLOADED


# --- a segment's life ---------------------------------------------------------------------
def test_assign_records_the_keys_and_refuses_while_a_segment_is_open(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    claim = store.claim(T, "p", 60_000)
    first = assign(rt, claim, "a", pos(ids[0], 0), planned_end=pos(ids[1], 3))
    assert (first.state, first.seq, first.epoch) == (SegmentState.ASSIGNED, 1, claim.epoch)
    assert (first.data_key, first.index_key, first.upload_id) == ("a-d", "a-i", None)
    assert (first.end, first.planned_end, first.data_len) == (None, pos(ids[1], 3), 0)
    assert store.current(T) == first
    with pytest.raises(CommitFailedError, match="open segment a"):
        assign(rt, claim, "b", pos(ids[2], 0))
    first = store.record_upload(claim, first, "up")
    first = add_part(store, claim, first, pos(ids[1], 3))
    first = store.begin_close(claim, first)
    assert first.state is SegmentState.CLOSING
    with pytest.raises(CommitFailedError, match="open segment a"):
        assign(rt, claim, "b", pos(ids[2], 0))
    with pytest.raises(ValueError, match="before the segment's begin"):
        assign(rt, claim, "c", pos(ids[2], 5), planned_end=pos(ids[2], 4))
    assert [s.segment_id for s in store.of_topic(T)] == ["a"]


def test_each_step_moves_only_its_segment_one_version_on(rt: Runtime, store: SegmentStore) -> None:
    """A segment of topic o, in the same state at the same version, is never touched."""
    ids = ledger_ids(rt)
    rt.metadata.create_topic("o", OffloadPolicy(streaming=True, min_part_bytes=1))
    other = assign(rt, store.claim("o", "p", 60_000), "o1", pos(ids[0], 0))
    claim = store.claim(T, "p", 60_000)
    segment = assign(rt, claim, "a", pos(ids[0], 0))
    versions = [segment.version]
    segment = store.record_upload(claim, segment, "up")
    versions.append(segment.version)
    segment = add_part(store, claim, segment, pos(ids[0], 9))
    versions.append(segment.version)
    segment = store.begin_close(claim, segment)
    versions.append(segment.version)
    segment = store.commit(claim, segment, [PieceRange(ids[0], 0, 9)])
    assert [*versions, segment.version] == [1, 2, 3, 4, 5]
    assert store.get("o1") == other and other.version == 1
    refused = "segment a is no longer assigned at version 5: someone else moved"
    with pytest.raises(CommitFailedError, match=rf"^{re.escape(refused)}$"):
        store.record_upload(claim, segment, "again")


def test_an_open_rewrite_segment_is_not_the_stream_s(rt: Runtime, store: SegmentStore) -> None:
    """A compaction's segment (origin rewrite) opened after the stream's: the stream has
    no open segment and assigns its next one."""
    ids = ledger_ids(rt)
    claim = store.claim(T, "p", 60_000)
    committed = offloaded(rt, claim, "a", [(ids[0], 0, 9)])
    rewrite = rt.metadata.rewrites.begin(
        T,
        segment_id="r",
        data_key="r-d",
        index_key="r-i",
        store_id=rt.stores.default_id(),
        owner="compaction",
        lease_ms=60_000,
        segments=[committed],
    )
    assert rewrite.is_open and rewrite.seq > committed.seq
    assert store.current(T) is None
    assert assign(rt, claim, "b", pos(ids[1], 0)).state is SegmentState.ASSIGNED
    assert [x.segment_id for x in store.of_topic(T)] == ["a", "r", "b"]
    assert [x.segment_id for x in store.of_topic(T, [SegmentState.OFFLOADED])] == ["a"]


def test_assign_refuses_a_begin_at_or_below_the_committed_end(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    claim = store.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(ids[0], 0, 9), (ids[1], 0, 4)])
    assert store.last_offloaded_end(T) == pos(ids[1], 4)
    assert store.current(T) is None
    for begin in (pos(ids[1], 4), pos(ids[1], 2), pos(ids[0], 9)):
        with pytest.raises(CommitFailedError, match="offloaded segments reach"):
            assign(rt, claim, "b", begin)
    after = assign(rt, claim, "b", pos(ids[1], 5))
    assert after.seq == 2


def test_record_part_keeps_parts_contiguous_and_moving_forward(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    claim = store.claim(T, "p", 60_000)
    segment = store.record_upload(claim, assign(rt, claim, "a", pos(ids[0], 0)), "up")
    with pytest.raises(ValueError, match="nothing to close"):
        store.begin_close(claim, segment)
    segment = add_part(store, claim, segment, pos(ids[0], 4), length=100)
    assert (segment.data_len, segment.end) == (100, pos(ids[0], 4))
    before = snapshot(rt)
    for offset in (0, 99, 101):
        with pytest.raises(ValueError, match="starts at"):
            store.record_part(
                claim,
                segment,
                part_number=2,
                etag="e",
                offset=offset,
                length=10,
                last=pos(ids[0], 6),
                blocks="[]",
            )
    with pytest.raises(ValueError, match="not after the recorded end"):
        add_part(store, claim, segment, pos(ids[0], 4))
    stale = store.get(segment.segment_id).model_copy(update={"version": segment.version - 1})
    with pytest.raises(CommitFailedError, match="someone else moved"):
        add_part(store, claim, stale.model_copy(update={"data_len": 100}), pos(ids[0], 9))
    assert snapshot(rt)["segment_parts"] == before["segment_parts"]
    assert snapshot(rt)["segments"] == before["segments"]
    segment = add_part(store, claim, segment, pos(ids[1], 2), length=50)
    assert [(p.part_number, p.offset, p.length) for p in store.parts(segment)] == [
        (1, 0, 100),
        (2, 100, 50),
    ]
    assert (segment.data_len, segment.end) == (150, pos(ids[1], 2))


def test_a_failed_segment_queues_its_keys_and_is_replaced(rt: Runtime, store: SegmentStore) -> None:
    ids = ledger_ids(rt)
    claim = store.claim(T, "p", 60_000)
    segment = store.record_upload(claim, assign(rt, claim, "a", pos(ids[0], 3)), "up")
    segment = add_part(store, claim, segment, pos(ids[0], 9))
    detail = "upload gone " + "x" * 3000  # a long detail is cut to the column's 2,000
    failed = store.fail(claim, segment, detail)
    assert failed.state is SegmentState.FAILED and failed.detail == detail[:2000]
    assert failed.finished_ms is not None
    queued = {(d.object_key, d.store_id, d.reason) for d in pending_deletions(rt.metadata)}
    home = rt.stores.default_id()
    assert queued == {("a-d", home, "failed segment"), ("a-i", home, "failed segment")}
    assert store.current(T) == failed  # waiting to be replaced
    with pytest.raises(CommitFailedError, match="changed since"):
        store.fail(claim, segment, "again")  # an old version: no second queueing
    assert len(pending_deletions(rt.metadata)) == 2

    replacement = assign(rt, claim, "b", failed.begin)
    assert replacement.replaces == "a" and replacement.seq == 2
    old = store.get("a")
    assert old.state is SegmentState.REPLACED and "replaced by b" in (old.detail or "")
    assert store.current(T) == replacement
    assert store.pieces(T, ids[0]) == []  # nothing of a failed segment is readable
    with pytest.raises(CommitFailedError, match="changed since"):
        store.fail(claim, old, "replaced")


def test_commit_records_the_pieces_and_settles_exactly_the_covered_sealed_ledgers(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    claim = store.claim(T, "p", 60_000)
    segment = store.record_upload(claim, assign(rt, claim, "a", pos(ids[0], 0)), "up")
    segment = add_part(store, claim, segment, pos(ids[2], 4))
    with pytest.raises(CommitFailedError, match="no longer closing"):
        store.commit(claim, segment, [PieceRange(ids[0], 0, 9)])  # not closing yet
    segment = store.begin_close(claim, segment)
    with pytest.raises(ValueError, match="holds entries"):
        store.commit(claim, segment, [])
    pieces = [PieceRange(ids[0], 0, 9), PieceRange(ids[1], 0, 9), PieceRange(ids[2], 0, 4)]
    committed = store.commit(claim, segment, pieces)
    assert committed.state is SegmentState.OFFLOADED and committed.offloaded_ms is not None
    ledgers = {x.ledger_id: x for x in rt.metadata.list_ledgers(T)}
    for lid in ids[:2]:
        assert ledgers[lid].offload_state is OffloadState.OFFLOADED
        assert ledgers[lid].offload_mode is OffloadMode.STREAM
        assert ledgers[lid].offload_attempt_id is None and ledgers[lid].data_key is None
    assert ledgers[ids[2]].offload_state is OffloadState.NONE
    (piece,) = store.pieces(T, ids[2])
    assert (piece.segment.segment_id, piece.first_entry_id, piece.last_entry_id) == ("a", 0, 4)
    with pytest.raises(CommitFailedError):
        store.commit(claim, segment, pieces)  # once only
    assert store.settle_ledgers(T) == []

    rest = offloaded(rt, claim, "b", [(ids[2], 5, 9)])
    assert rest.state is SegmentState.OFFLOADED
    assert rt.metadata.get_ledger(T, ids[2]).offload_mode is OffloadMode.STREAM
    assert [(p.segment.segment_id, p.first_entry_id) for p in store.pieces(T, ids[2])] == [
        ("a", 0),
        ("b", 5),
    ]


@pytest.mark.parametrize(
    ("ranges", "entry_count", "covered"),
    [
        ([], 0, True),  # an empty ledger needs no piece
        ([], 1, False),
        ([(0, 9)], 10, True),
        ([(0, 8)], 10, False),  # the last entry missing
        ([(1, 9)], 10, False),  # entry 0 missing
        ([(0, 4), (5, 9)], 10, True),  # adjacent
        ([(0, 4), (6, 9)], 10, False),  # entry 5 missing
        ([(0, 6), (2, 3), (7, 9)], 10, True),  # a piece inside another moves nothing back
        ([(0, 9), (11, 12)], 10, True),  # entries past the sealed count count for nothing
    ],
)
def test_covers_asks_for_every_entry_of_the_ledger_with_no_gap(
    ranges: list[tuple[int, int]], entry_count: int, covered: bool
) -> None:
    assert covers(ranges, entry_count) is covered


def test_a_ledger_sealed_after_its_last_segment_is_settled_later(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:
        for n in range(5):
            open_id, _ = writer.append(b"x%d" % n)
        assert rt.metadata.get_ledger(T, open_id).state is LedgerState.OPEN
        claim = store.claim(T, "p", 60_000)
        offloaded(rt, claim, "a", [(ids[2], 0, 9), (open_id, 0, 4)])
        assert rt.metadata.get_ledger(T, open_id).offload_state is OffloadState.NONE
        assert store.settle_ledgers(T) == []  # still open
        assert writer.roll_over() is not None
    assert rt.metadata.get_ledger(T, open_id).entry_count == 5
    assert store.settle_ledgers(T) == [open_id]
    ledger = rt.metadata.get_ledger(T, open_id)
    assert ledger.offload_state is OffloadState.OFFLOADED
    assert ledger.offload_mode is OffloadMode.STREAM
    assert store.settle_ledgers(T) == []


def test_a_ledger_not_covered_does_not_keep_the_next_one_from_being_settled(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    before = rt.metadata.get_ledger(T, ids[1])
    claim = store.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(ids[0], 0, 4), (ids[1], 0, 9)])
    assert rt.metadata.get_ledger(T, ids[0]).offload_state is OffloadState.NONE
    settled = rt.metadata.get_ledger(T, ids[1])
    assert (settled.offload_state, settled.offload_mode) == (
        OffloadState.OFFLOADED,
        OffloadMode.STREAM,
    )
    assert settled.version == before.version + 1


def test_settling_takes_only_sealed_live_ledgers_not_offloaded_with_their_hot_copy(
    rt: Runtime, store: SegmentStore
) -> None:
    """A segment holding a ledger already offloaded as its own objects, one a trim
    marked deleting, or one whose hot copy is going (lost, were it settled), settles
    none of them; sealed empty ledgers are settled with no segment, also one whose hot
    copy was already let go (it held nothing)."""
    ids = ledger_ids(rt)
    epoch = rt.metadata.claim_writer(T).writer_epoch
    empty = [
        rt.metadata.seal_ledger(rt.metadata.allocate_ledger(T, epoch), 0, 0, epoch)
        for _ in range(2)
    ]
    assert rt.metadata.mark_hot_deleting(empty[1]).hot_state is HotState.DELETING
    L = schema.ledgers
    changes = {
        ids[0]: dict(offload_state=OffloadState.OFFLOADED, offload_mode=OffloadMode.LEDGER),
        ids[1]: dict(deletion_state=DeletionState.DELETING),
        ids[2]: dict(hot_state=HotState.DELETING),
    }
    with rt.metadata.transaction() as conn:
        for ledger_id, values in changes.items():
            conn.execute(
                L.update().where(L.c.topic == T, L.c.ledger_id == ledger_id).values(**values)
            )
    before = rt.metadata.list_ledgers(T)
    claim = store.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(ids[0], 0, 9), (ids[1], 0, 9), (ids[2], 0, 9)])
    assert rt.metadata.list_ledgers(T) == before
    settled = [x.ledger_id for x in empty]
    assert store.settle_ledgers(T) == settled
    after = {x.ledger_id: x for x in rt.metadata.list_ledgers(T)}
    assert [after[i].offload_mode for i in settled] == [OffloadMode.STREAM] * 2
    assert after[settled[1]].hot_state is HotState.DELETING
    assert [after[x.ledger_id] for x in before if x.ledger_id not in settled] == [
        x for x in before if x.ledger_id not in settled
    ]


def test_a_ledger_alone_in_the_topic_s_segments_is_settled_once_sealed(
    rt: Runtime, store: SegmentStore
) -> None:
    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:
        for n in range(5):
            open_id, _ = writer.append(b"x%d" % n)
        claim = store.claim(T, "p", 60_000)
        offloaded(rt, claim, "a", [(open_id, 0, 4)])
        assert store.settle_ledgers(T) == []  # still open
    assert store.settle_ledgers(T) == [open_id]


def test_settling_looks_at_the_topic_s_own_ledgers_and_segments(
    rt: Runtime, store: SegmentStore
) -> None:
    """Ledger ids are per topic: topic o has ledgers of the same ids and versions (the
    first of 5 entries only) and a segment holding entries 5..9 of the second. s's
    segment holds entries 0..4 of its first two ledgers and all of its third: only that
    third one is settled, and nothing of o."""
    ids = ledger_ids(rt)
    rt.metadata.create_topic("o", OffloadPolicy(streaming=True, min_part_bytes=1))
    assert produce_ledgers(rt, "o", [(5, 50), (10, 50), (10, 50)]) == ids
    offloaded(rt, store.claim("o", "p", 60_000), "o1", [(ids[1], 5, 9)])
    others = rt.metadata.list_ledgers("o")
    assert [x.version for x in others] == [x.version for x in rt.metadata.list_ledgers(T)]
    claim = store.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(ids[0], 0, 4), (ids[1], 0, 4), (ids[2], 0, 9)])
    assert [x.offload_state for x in rt.metadata.list_ledgers(T)] == [
        OffloadState.NONE,
        OffloadState.NONE,
        OffloadState.OFFLOADED,
    ]
    assert rt.metadata.list_ledgers("o") == others
    assert [p.segment.segment_id for p in store.pieces(T, ids[1])] == ["a"]


def test_pieces_and_settling_go_by_entry_not_by_row_order(
    rt: Runtime, store: SegmentStore, fresh: Fresh
) -> None:
    """A restore loads segment_ledgers by primary key, segment id first: segment b holds
    entries 0..4 of the open ledger and a (committed after it) entries 5..7, so their rows
    come back a first. pieces() still lists them by entry, and the ledger sealed after
    the restore is settled."""
    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:
        for n in range(8):
            open_id, _ = writer.append(b"x%d" % n)
        claim = store.claim(T, "p", 60_000)
        offloaded(rt, claim, "b", [(open_id, 0, 4)])
        offloaded(rt, claim, "a", [(open_id, 5, 7)])
        export_metadata(rt)
    restored = fresh()
    import_snapshot(restored.metadata.engine, restored.objects, None)
    segments = restored.metadata.segments
    pieces = [(p.segment.segment_id, p.first_entry_id) for p in segments.pieces(T, open_id)]
    assert pieces == [("b", 0), ("a", 5)]
    ledger = restored.metadata.get_ledger(T, open_id)
    restored.metadata.seal_ledger(ledger, 8, ledger.size_bytes, None)
    assert segments.settle_ledgers(T) == [open_id]


def test_a_ledger_sealed_longer_than_its_streamed_entries_is_not_settled(
    rt: Runtime, store: SegmentStore
) -> None:
    with ManagedLedgerWriter(rt.metadata, rt.hot, T) as writer:
        for n in range(8):
            open_id, _ = writer.append(b"x%d" % n)
        claim = store.claim(T, "p", 60_000)
        offloaded(rt, claim, "a", [(open_id, 0, 4)])
    assert rt.metadata.get_ledger(T, open_id).entry_count == 8
    assert store.settle_ledgers(T) == []
    offloaded(rt, claim, "b", [(open_id, 5, 7)])
    assert rt.metadata.get_ledger(T, open_id).offload_mode is OffloadMode.STREAM


def delete_ledgers_below(rt: Runtime, below: int) -> list[int]:
    """Retention's steps for the ledgers below ``below``: mark deleting, the hot copies
    gone, then deleted (finish_deleted_ledgers releases segments on the way)."""
    marked, queued = rt.metadata.retention.mark_ledgers_deleting(T, below, 100)
    assert queued == 0  # streamed ledgers own no objects
    for ledger_id in marked:
        rt.hot.delete(T, ledger_id)
    rt.metadata.retention.mark_hot_copies_deleted(T, marked)
    assert rt.metadata.retention.finish_deleted_ledgers() == len(marked)
    return marked


def test_a_segment_is_released_once_every_ledger_it_holds_is_deleted(
    rt: Runtime, store: SegmentStore
) -> None:
    ids = ledger_ids(rt)
    claim = store.claim(T, "p", 60_000)
    a = offloaded(rt, claim, "a", [(ids[0], 0, 9), (ids[1], 0, 4)])
    b = offloaded(rt, claim, "b", [(ids[1], 5, 9), (ids[2], 0, 9)])

    # deleting is not enough: the segment goes once its ledgers are deleted
    rt.metadata.retention.mark_ledgers_deleting(T, ids[2], 100)
    assert store.get("a").state is SegmentState.OFFLOADED
    assert pending_deletions(rt.metadata) == []
    rt.metadata.retention.mark_hot_copies_deleted(T, ids[:2])
    for ledger_id in ids[:2]:
        rt.hot.delete(T, ledger_id)

    # ids[0] deleted, ids[1] still deleting: a stays
    with rt.metadata.transaction() as conn:
        conn.execute(
            schema.ledgers.update()
            .where(schema.ledgers.c.topic == T, schema.ledgers.c.ledger_id == ids[0])
            .values(deletion_state=DeletionState.DELETED)
        )
        assert release_deleted(conn, [T]) == 0
    assert store.get("a").state is SegmentState.OFFLOADED

    assert rt.metadata.retention.finish_deleted_ledgers() == 1  # ids[1]
    released = store.get("a")
    assert released.state is SegmentState.DELETED and released.version == a.version + 1
    assert store.get("b").state is SegmentState.OFFLOADED
    deletions = pending_deletions(rt.metadata)
    assert {(d.object_key, d.store_id) for d in deletions} == {
        ("a-d", a.store_id),
        ("a-i", a.store_id),
    }
    assert store.last_offloaded_end(T) == b.end  # deleted segments still end the stream
    assert [p.segment.segment_id for p in store.pieces(T, ids[1])] == ["b"]

    assert delete_ledgers_below(rt, ids[2] + 1) == [ids[2]]
    assert store.get("b").state is SegmentState.DELETED
    assert all(x.deletion_state is DeletionState.DELETED for x in rt.metadata.list_ledgers(T))
    assert {d.object_key for d in pending_deletions(rt.metadata)} == {"a-d", "a-i", "b-d", "b-i"}
    with rt.metadata.transaction() as conn:
        assert release_deleted(conn, [T]) == 0  # once only
