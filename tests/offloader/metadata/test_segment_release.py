"""The release rule of streaming segments (metadata/segments.py), on SQLite and PostgreSQL:
an offloaded segment is released (state ``deleted``, its two keys queued) once none of the
ledgers it holds needs it, and a ledger stops needing it when it is deleted or offloaded in
mode ``ledger`` (its own objects). A ledger still streamed, offloading, offloaded in mode
``stream`` or being deleted keeps it. Segments left by ledgers moving to v1 queue their
keys after the replaced objects' grace; retention's (every ledger deleted) at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from fixtures.inspect import queued
from fixtures.metadata import begin, list_attempts, sealed_ledger
from fixtures.segment_rows import offloaded, sealed_ledgers
from offloader.metadata import (
    AttemptState,
    Deletion,
    DeletionState,
    Ledger,
    OffloadMode,
    OffloadState,
    SegmentState,
    schema,
)
from offloader.metadata import attempts as attempts_module
from offloader.metadata.pieces import (
    RELEASED_DETAIL,
    RELEASED_REASON,
    release_deleted,
    release_moved,
)
from offloader.runtime import Runtime

T = "t"
GRACE = 3_600_000

# how each ledger of the segment is left: (offload_state, offload_mode, deletion_state)
STATES = {
    "deleted": (OffloadState.OFFLOADED, OffloadMode.STREAM, DeletionState.DELETED),
    "deleting": (OffloadState.OFFLOADED, OffloadMode.STREAM, DeletionState.DELETING),
    "ledger-mode": (OffloadState.OFFLOADED, OffloadMode.LEDGER, DeletionState.NONE),
    "stream-mode": (OffloadState.OFFLOADED, OffloadMode.STREAM, DeletionState.NONE),
    "unsettled": (OffloadState.NONE, OffloadMode.LEDGER, DeletionState.NONE),
    "offloading": (OffloadState.OFFLOADING, OffloadMode.LEDGER, DeletionState.NONE),
    "deleted-ledger-mode": (OffloadState.OFFLOADED, OffloadMode.LEDGER, DeletionState.DELETED),
}

# the ledgers' states -> released, and how: "at once" (retention's), "after the grace"
CASES = {
    "all deleted": (["deleted", "deleted"], "at once"),
    "deleted and deleting": (["deleted", "deleting"], None),
    "all ledger-mode": (["ledger-mode", "ledger-mode"], "after the grace"),
    "ledger-mode and unsettled": (["ledger-mode", "unsettled"], None),
    "ledger-mode and stream-mode": (["ledger-mode", "stream-mode"], None),
    "ledger-mode and offloading": (["ledger-mode", "offloading"], None),
    "mixed": (["deleted", "ledger-mode", "deleted-ledger-mode"], "after the grace"),
    "mixed, one unsettled": (["deleted", "ledger-mode", "unsettled"], None),
    "mixed, one deleting": (["deleting", "ledger-mode"], None),
}


def set_state(rt: Runtime, ledger_id: int, state: str) -> None:
    offload_state, mode, deletion = STATES[state]
    L = schema.ledgers
    with rt.metadata.transaction() as conn:
        conn.execute(
            L.update()
            .where(L.c.topic == T, L.c.ledger_id == ledger_id)
            .values(offload_state=offload_state, offload_mode=mode, deletion_state=deletion)
        )


def reason_and_delay(deletion: Deletion) -> tuple[str, int]:
    """A queued key's reason, and how long after it was queued it is due."""
    return (deletion.reason, deletion.next_try_ms - deletion.enqueued_ms)


@pytest.mark.parametrize("case", list(CASES))
def test_a_segment_is_released_only_when_no_ledger_needs_it(runtime: Runtime, case: str) -> None:
    rt = runtime
    states, released = CASES[case]
    ids = [x.ledger_id for x in sealed_ledgers(rt, len(states) + 1)]
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    before = offloaded(rt, claim, "a", [(n, 0, 9) for n in ids[:-1]])
    other = offloaded(rt, claim, "b", [(ids[-1], 0, 9)])  # of another ledger: never released
    for ledger_id, state in zip(ids, states, strict=False):
        set_state(rt, ledger_id, state)

    with rt.metadata.transaction() as conn:
        count = release_deleted(conn, [T], GRACE)
    segment = rt.metadata.segments.get("a")
    assert rt.metadata.segments.get("b") == other
    if released is None:
        assert count == 0 and segment == before
        assert queued(rt.metadata, reason_and_delay) == {}
        return
    assert count == 1 and segment.state is SegmentState.DELETED
    assert segment.version == before.version + 1
    assert segment.finished_ms is not None and segment.finished_ms >= segment.offloaded_ms
    if released == "at once":
        reason, detail, delay = "segment deleted", "every ledger it holds was deleted", 0
    else:
        reason, detail, delay = RELEASED_REASON, "no ledger it holds needs it", GRACE
    assert detail in (segment.detail or "")
    assert queued(rt.metadata, reason_and_delay) == {"a-d": (reason, delay), "a-i": (reason, delay)}
    with rt.metadata.transaction() as conn:
        assert release_deleted(conn, [T], GRACE) == 0  # once only


def test_one_release_counts_the_segments_of_both_rules(runtime: Runtime) -> None:
    """a's ledger was deleted, b's moved to its own objects: one call releases both (a at
    once, b after the grace) and counts both. Topic u has ledgers of the same ids, still
    needing segments of their own: ledger ids are per topic, so they hold nothing of t."""
    rt = runtime
    first, second = (x.ledger_id for x in sealed_ledgers(rt, 2))
    assert [sealed_ledger(rt.metadata, "u").ledger_id for _ in range(2)] == [first, second]
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(first, 0, 9)])
    offloaded(rt, claim, "b", [(second, 0, 9)])
    set_state(rt, first, "deleted")
    set_state(rt, second, "ledger-mode")
    with rt.metadata.transaction() as conn:
        assert release_deleted(conn, [T], GRACE) == 2
    assert {s.segment_id: s.state for s in rt.metadata.segments.of_topic(T)} == {
        "a": SegmentState.DELETED,
        "b": SegmentState.DELETED,
    }
    assert queued(rt.metadata, reason_and_delay) == {
        "a-d": ("segment deleted", 0),
        "a-i": ("segment deleted", 0),
        "b-d": (RELEASED_REASON, GRACE),
        "b-i": (RELEASED_REASON, GRACE),
    }


def test_a_piece_of_an_unrecorded_ledger_keeps_its_segment(runtime: Runtime) -> None:
    """A rebuild from the objects keeps a segment holding a ledger only in part without
    recording the ledger (recovery/rows.py): no rule may take such a segment for one
    whose ledgers were all deleted, or it would delete the only copy of those entries
    (ledger ids are per topic: topic u's ledger of that id is not this one). Segment d,
    whose pieces are gone from the metadata altogether, is kept too. Segment c, of a
    deleted ledger alone, shows the release did run."""
    rt = runtime
    gone, deleted, other = (x.ledger_id for x in sealed_ledgers(rt, 3))
    unrecorded = other + 1
    assert [sealed_ledger(rt.metadata, "u").ledger_id for _ in range(4)][-1] == unrecorded
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "c", [(gone, 0, 9)])
    kept = [
        offloaded(rt, claim, "a", [(deleted, 0, 9), (unrecorded, 0, 4)]),
        offloaded(rt, claim, "b", [(unrecorded + 1, 5, 9)]),
        offloaded(rt, claim, "d", [(unrecorded + 2, 0, 9)]),
    ]
    SL = schema.pieces
    with rt.metadata.transaction() as conn:
        conn.execute(SL.delete().where(SL.c.segment_id == "d"))
    set_state(rt, deleted, "deleted")
    set_state(rt, gone, "deleted")
    with rt.metadata.transaction() as conn:
        assert release_deleted(conn, [T], GRACE) == 1
        assert release_moved(conn, T, unrecorded, "moved", 0) == 0
    assert rt.metadata.segments.settle_ledgers(T) == []
    assert [rt.metadata.segments.get(s.segment_id) for s in kept] == kept
    assert rt.metadata.segments.get("c").state is SegmentState.DELETED
    assert set(queued(rt.metadata)) == {"c-d", "c-i"}


def test_settling_releases_a_segment_no_ledger_needs_at_once(runtime: Runtime) -> None:
    """settle_ledgers releases the segments no ledger needs (one committed after its
    ledgers went) with no grace: here its only ledger has its own objects."""
    rt = runtime
    (lid,) = (x.ledger_id for x in sealed_ledgers(rt, 1))
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(lid, 0, 9)])
    set_state(rt, lid, "ledger-mode")
    assert rt.metadata.segments.settle_ledgers(T) == []
    assert rt.metadata.segments.get("a").state is SegmentState.DELETED
    assert queued(rt.metadata, reason_and_delay) == {
        "a-d": (RELEASED_REASON, 0),
        "a-i": (RELEASED_REASON, 0),
    }


def test_retention_releases_a_segment_its_other_ledgers_left_for_v1(runtime: Runtime) -> None:
    """finish_deleted_ledgers applies the whole rule: the last ledger of a segment to go is
    deleted while the other moved to its own objects, so the keys wait out the grace."""
    rt = runtime
    first, second = (x.ledger_id for x in sealed_ledgers(rt, 2))
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(first, 0, 9), (second, 0, 9)])
    set_state(rt, second, "ledger-mode")
    marked, _ = rt.metadata.retention.mark_ledgers_deleting(T, second, 10)
    assert marked == [first]
    rt.metadata.retention.mark_hot_copies_deleted(T, marked)
    assert rt.metadata.segments.get("a").state is SegmentState.OFFLOADED
    rt.metadata.retention.finish_deleted_ledgers(GRACE)
    assert rt.metadata.segments.get("a").state is SegmentState.DELETED
    assert queued(rt.metadata, reason_and_delay)["a-d"] == (RELEASED_REASON, GRACE)


def swap(rt: Runtime, ledger_id: int, attempt_id: str, grace_ms: int = GRACE) -> Ledger:
    """A stream-mode ledger rewritten as v1 objects from the tier: intent, then the swap."""
    ledger = rt.metadata.get_ledger(T, ledger_id)
    _, attempt = begin(rt.metadata, ledger, attempt_id, replace=True, from_tier=True)
    return rt.metadata.attempts.commit_replacement(
        attempt, 100, "migrated to v1", grace_ms=grace_ms
    )


def test_the_swap_of_the_last_ledger_that_needs_a_segment_releases_it(runtime: Runtime) -> None:
    rt = runtime
    ids = [x.ledger_id for x in sealed_ledgers(rt, 3)]
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(ids[0], 0, 9), (ids[1], 0, 4)])
    offloaded(rt, claim, "b", [(ids[1], 5, 9), (ids[2], 0, 9)])
    assert all(
        rt.metadata.get_ledger(T, n).offload_mode is OffloadMode.STREAM for n in ids
    )  # settled by the commits

    first = swap(rt, ids[0], "v1-0")
    assert (first.offload_mode, first.offload_attempt_id, first.data_key) == (
        OffloadMode.LEDGER,
        "v1-0",
        "v1-0-d",
    )
    assert rt.metadata.segments.get("a").state is SegmentState.OFFLOADED  # ids[1] needs it
    assert queued(rt.metadata, reason_and_delay) == {}
    swap(rt, ids[1], "v1-1")
    assert rt.metadata.segments.get("a").state is SegmentState.DELETED
    assert rt.metadata.segments.get("b").state is SegmentState.OFFLOADED  # ids[2] needs it
    reason = "segment released: migrated to v1"
    assert queued(rt.metadata, reason_and_delay) == {"a-d": (reason, GRACE), "a-i": (reason, GRACE)}
    assert rt.metadata.segments.pieces(T, ids[2])  # still read from b
    swap(rt, ids[2], "v1-2", grace_ms=0)
    assert rt.metadata.segments.get("b").state is SegmentState.DELETED
    assert queued(rt.metadata, reason_and_delay)["b-d"] == (reason, 0)
    committed = list_attempts(rt.metadata, T, AttemptState.COMMITTED)
    assert sorted(a.attempt_id for a in committed) == ["v1-0", "v1-1", "v1-2"]  # one each


def test_a_swap_releases_only_the_segments_holding_its_ledger(runtime: Runtime) -> None:
    """Segment b of the same topic needs no ledger either (its ledger was moved to its
    own objects by hand, without a release), but it does not hold the swapped ledger:
    the swap releases a alone, with the release's detail."""
    rt = runtime
    first, second = (x.ledger_id for x in sealed_ledgers(rt, 2))
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(first, 0, 9)])
    other = offloaded(rt, claim, "b", [(second, 0, 9)])
    set_state(rt, second, "ledger-mode")
    swap(rt, first, "v1-0")
    released = rt.metadata.segments.get("a")
    assert (released.state, released.detail) == (SegmentState.DELETED, RELEASED_DETAIL)
    assert rt.metadata.segments.get("b") == other
    reason = "segment released: migrated to v1"
    assert queued(rt.metadata, reason_and_delay) == {"a-d": (reason, GRACE), "a-i": (reason, GRACE)}


@pytest.mark.parametrize("other", ["swap", "retention"])
def test_two_ledgers_of_a_segment_let_go_at_once_release_it(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """The two ledgers of a segment let go of it by two transactions at once (a swap to
    v1, and another swap or retention deleting the other ledger): the second waits for the
    first's lock on the segment, then sees its change and releases the segment (each
    alone would find the other ledger still needing it, and on PostgreSQL neither would
    release it)."""
    rt = runtime
    first, second = (x.ledger_id for x in sealed_ledgers(rt, 2))
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded(rt, claim, "a", [(first, 0, 9), (second, 0, 9)])
    _, attempt = begin(rt.metadata, rt.metadata.get_ledger(T, second), "v1", replace=True)
    if other == "swap":
        ledger = rt.metadata.get_ledger(T, first)
        _, early = begin(rt.metadata, ledger, "early", replace=True)

        def let_go() -> object:
            return rt.metadata.attempts.commit_replacement(early, 1, "r")
    else:
        marked, _ = rt.metadata.retention.mark_ledgers_deleting(T, second, 10)
        rt.metadata.retention.mark_hot_copies_deleted(T, marked)

        def let_go() -> object:
            return rt.metadata.retention.finish_deleted_ledgers(GRACE)

    inside, go = threading.Event(), threading.Event()
    real = attempts_module.release_moved

    def held_open(conn: Any, topic: str, ledger_id: int, *rest: Any) -> int:
        count = real(conn, topic, ledger_id, *rest)
        if ledger_id == second:  # the swap's transaction stays open past its release
            inside.set()
            assert go.wait(30)
        return count

    monkeypatch.setattr(attempts_module, "release_moved", held_open)
    swap = threading.Thread(target=rt.metadata.attempts.commit_replacement, args=(attempt, 1, "r"))
    swap.start()
    assert inside.wait(30)
    rival = threading.Thread(target=let_go)
    rival.start()
    time.sleep(0.5)  # the rival runs up to the segment's lock (unlocked: it commits)
    go.set()
    for thread in (swap, rival):
        thread.join(30)
    assert rt.metadata.get_ledger(T, second).offload_mode is OffloadMode.LEDGER
    assert rt.metadata.segments.get("a").state is SegmentState.DELETED
    assert set(queued(rt.metadata)) == {"a-d", "a-i"}
