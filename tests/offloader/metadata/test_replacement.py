"""The replacement transition in the metadata store: a second offload of an offloaded
ledger (scrub's repair; from the tier, a stream-mode ledger's move back to v1), on both
databases. The intent keeps the ledger offloaded on its objects (or its segments), the
commit swaps them by CAS and queues the old ones in the same transaction, due after the
grace; every other path (failure, a stale attempt, hot deletion, retention) leaves exactly
one committed attempt and every key accounted for, and the refusals name the attempt.

The library's replace_ledger: tests/offloader/offload/test_replace_ledger.py; the SIGKILL
crash test of the same transition: tests/offloader/scrub/test_scrub_crash.py; the segments
a swap releases: test_segment_release.py.
"""

from __future__ import annotations

from operator import attrgetter

import pytest

from fixtures.backends import produce_ledgers
from fixtures.inspect import queued
from fixtures.metadata import begin, list_attempts, pending_deletions, sealed_ledger
from fixtures.scrub import offloaded_topic
from fixtures.segment_rows import offloaded as offloaded_segment
from fixtures.segment_rows import sealed_ledgers
from offloader.exceptions import CommitFailedError
from offloader.metadata import (
    AttemptState,
    DeletionState,
    HotState,
    Ledger,
    MetadataStore,
    OffloadMode,
    OffloadState,
    SegmentState,
)
from offloader.metadata.pieces import release_deleted
from offloader.runtime import Runtime

SMALL = [(10, 500), (10, 500)]
T = "t"  # sealed_ledger's topic


def offloaded(store: MetadataStore, attempt_id: str = "a1") -> Ledger:
    _, attempt = begin(store, sealed_ledger(store), attempt_id)
    return store.attempts.commit(attempt, 1000)


def committed(store: MetadataStore) -> list[str]:
    return [a.attempt_id for a in list_attempts(store, "t", AttemptState.COMMITTED)]


def test_a_replacement_swaps_the_objects_and_queues_the_old_ones(store: MetadataStore) -> None:
    ledger = offloaded(store)
    during, attempt = begin(store, ledger, "a2", replace=True)
    # still offloaded on a1's objects while a2 uploads: readers keep reading them
    assert during.is_offloaded and during.offload_attempt_id == "a1" and during.data_key == "a1-d"
    assert during.attempt_id == "a2" and during.offload_epoch == ledger.offload_epoch + 1
    assert pending_deletions(store) == []
    with pytest.raises(CommitFailedError):
        store.attempts.commit(attempt, 5)  # a first offload's commit cannot take it
    after = store.attempts.commit_replacement(attempt, 1234, "CRC mismatch")
    assert after.is_offloaded and after.offload_attempt_id == "a2" and after.attempt_id is None
    assert (after.data_key, after.index_key, after.data_len) == ("a2-d", "a2-i", 1234)
    assert after.version == during.version + 1
    assert queued(store, attrgetter("reason", "attempt_id")) == {
        "a1-d": ("replaced: CRC mismatch", "a1"),
        "a1-i": ("replaced: CRC mismatch", "a1"),
    }
    old = store.attempts.get("a1")
    assert old.state is AttemptState.SUPERSEDED
    assert old.detail == "replaced by a2: CRC mismatch"
    assert committed(store) == ["a2"]  # exactly one
    with pytest.raises(CommitFailedError, match="no longer owns"):
        store.attempts.commit_replacement(attempt, 1234, "again")
    assert len(pending_deletions(store)) == 2


def test_the_batch_commit_does_not_take_a_replacement_either(store: MetadataStore) -> None:
    """commit_batch (a batch's first offloads) loses a replacement attempt, as commit
    does: only commit_replacement swaps objects and queues the old ones."""
    ledger = offloaded(store)
    _, attempt = begin(store, ledger, "a2", replace=True)
    assert store.attempts.commit_batch([(attempt, 5)]) == set()
    after = store.get_ledger("t", ledger.ledger_id)
    assert (after.offload_attempt_id, after.data_key, after.data_len) == ("a1", "a1-d", 1000)
    assert committed(store) == ["a1"]
    assert store.attempts.get("a2").state is AttemptState.FAILED
    assert set(queued(store)) == {"a2-d", "a2-i"}


def test_only_an_offloaded_ledger_with_its_hot_copy_is_replaced(store: MetadataStore) -> None:
    with pytest.raises(ValueError, match="cannot be offloaded again: it is none"):
        begin(store, sealed_ledger(store), "x", replace=True)
    ledger = offloaded(store)
    marked = store.mark_hot_deleting(ledger)
    with pytest.raises(ValueError, match="hot copy deleting"):
        begin(store, marked, "y", replace=True)
    # a record read before the hot copy was marked loses the compare-and-set
    with pytest.raises(CommitFailedError, match="someone else moved"):
        begin(store, ledger, "z", replace=True)
    assert [a.attempt_id for a in list_attempts(store, "t")] == ["a1"]


def test_a_failed_replacement_leaves_the_ledger_on_its_objects(store: MetadataStore) -> None:
    ledger = offloaded(store)
    _, attempt = begin(store, ledger, "a2", replace=True)
    store.attempts.fail(attempt, "upload failed")
    after = store.get_ledger("t", ledger.ledger_id)
    assert after.offload_state is OffloadState.OFFLOADED and after.offload_attempt_id == "a1"
    assert after.attempt_id is None and after.data_key == "a1-d"
    assert set(queued(store)) == {"a2-d", "a2-i"}
    assert store.attempts.get("a2").state is AttemptState.FAILED
    assert committed(store) == ["a1"]


def test_a_stale_replacement_is_superseded_by_the_next(store: MetadataStore) -> None:
    ledger = offloaded(store)
    during, stale = begin(store, ledger, "a2", lease_ms=-1, replace=True)
    with pytest.raises(CommitFailedError, match="someone else moved"):
        begin(store, ledger, "early", replace=True)  # the old record: version moved
    _, fresh = begin(store, during, "a3", replace=True)
    assert store.attempts.get("a2").state is AttemptState.SUPERSEDED
    assert set(queued(store)) == {"a2-d", "a2-i"}
    with pytest.raises(CommitFailedError):
        store.attempts.commit_replacement(stale, 1, "zombie")
    assert store.attempts.commit_replacement(fresh, 7, "bad").offload_attempt_id == "a3"
    assert set(queued(store)) == {"a2-d", "a2-i", "a1-d", "a1-i"}
    assert committed(store) == ["a3"]


def test_a_live_replacement_one_in_flight_is_refused(store: MetadataStore) -> None:
    ledger = offloaded(store)
    during, _ = begin(store, ledger, "a2", replace=True)
    with pytest.raises(CommitFailedError, match="has attempt a2 in flight"):
        begin(store, during, "a3", replace=True)


def test_hot_deletion_waits_for_a_live_replacement(store: MetadataStore) -> None:
    during, attempt = begin(store, offloaded(store), "a2", replace=True)
    with pytest.raises(CommitFailedError) as refused:
        store.mark_hot_deleting(during)
    assert str(refused.value).endswith(
        f"t/{during.ledger_id} has replacement attempt a2 in flight until its lease ends, or "
        "was offloaded less than its deletion lag of 0 ms ago (database clock); its hot copy "
        "stays"
    ), str(refused.value)
    assert store.get_ledger("t", during.ledger_id).hot_state is HotState.PRESENT
    assert store.attempts.commit_replacement(attempt, 9, "bad").offload_attempt_id == "a2"


def test_hot_deletion_retires_a_stale_replacement(store: MetadataStore) -> None:
    during, stale = begin(store, offloaded(store), "a2", lease_ms=-1, replace=True)
    marked = store.mark_hot_deleting(during)
    assert marked.hot_state is HotState.DELETING and marked.attempt_id is None
    assert marked.attempt_lease_ms is None
    retired = store.attempts.get("a2")
    assert retired.detail == "lease expired; its ledger's hot copy is being deleted"
    assert marked.offload_attempt_id == "a1"
    assert store.attempts.get("a2").state is AttemptState.SUPERSEDED
    assert set(queued(store)) == {"a2-d", "a2-i"}
    with pytest.raises(CommitFailedError):
        store.attempts.commit_replacement(stale, 1, "too late")
    assert committed(store) == ["a1"]


def test_a_trim_takes_the_replacement_in_flight_with_the_ledger(store: MetadataStore) -> None:
    during, attempt = begin(store, offloaded(store), "a2", replace=True)
    ids, count = store.retention.mark_ledgers_deleting("t", during.ledger_id + 1, limit=10)
    assert ids == [during.ledger_id] and count == 4
    assert set(queued(store)) == {"a1-d", "a1-i", "a2-d", "a2-i"}
    assert store.attempts.get("a2").state is AttemptState.SUPERSEDED
    with pytest.raises(CommitFailedError):
        store.attempts.commit_replacement(attempt, 1, "after the trim")
    after = store.get_ledger("t", during.ledger_id)
    assert after.deletion_state is DeletionState.DELETING and after.attempt_id is None


# --- ledgers offloaded for real, on both backends ---------------------------------------
def test_the_swap_supersedes_only_the_replaced_attempt(runtime: Runtime) -> None:
    rt = runtime
    first, second = offloaded_topic(rt, shapes=SMALL)
    _, attempt = begin(rt.metadata, first, "repl", replace=True)
    reason = "crc mismatch " + "x" * 3000  # a long reason is cut to the column's 2,000
    swapped = rt.metadata.attempts.commit_replacement(attempt, 123, reason)

    assert (swapped.offload_attempt_id, swapped.data_key, swapped.index_key, swapped.data_len) == (
        "repl",
        "repl-d",
        "repl-i",
        123,
    )
    assert swapped.attempt_id is None and swapped.version > first.version
    old = rt.metadata.attempts.get(first.offload_attempt_id or "")
    assert old.state is AttemptState.SUPERSEDED
    assert old.detail == f"replaced by repl: {reason}"[:2000]
    new = rt.metadata.attempts.get("repl")
    assert new.state is AttemptState.COMMITTED and new.finished_ms is not None
    # the other ledger's committed attempt is untouched
    assert rt.metadata.attempts.get(second.offload_attempt_id or "").state is AttemptState.COMMITTED
    assert rt.metadata.get_ledger("orders", second.ledger_id) == second
    queued = {(d.object_key, d.attempt_id) for d in pending_deletions(rt.metadata)}
    assert queued == {
        (first.data_key, first.offload_attempt_id),
        (first.index_key, first.offload_attempt_id),
    }
    assert {d.reason for d in pending_deletions(rt.metadata)} == {f"replaced: {reason}"[:255]}


def test_an_attempt_that_lost_its_ledger_is_refused_by_name(runtime: Runtime) -> None:
    rt = runtime
    (first,) = offloaded_topic(rt, shapes=SMALL[:1])
    _, stale = begin(rt.metadata, first, "stale", lease_ms=-1, replace=True)
    ledger = rt.metadata.get_ledger("orders", first.ledger_id)
    begin(rt.metadata, ledger, "winner", replace=True)  # the stale one's lease was over
    before = rt.metadata.get_ledger("orders", first.ledger_id)
    message = rf"^attempt stale \(epoch {stale.epoch}\) no longer owns offloaded ledger orders/"
    with pytest.raises(CommitFailedError, match=message):
        rt.metadata.attempts.commit_replacement(stale, 1, "r")
    assert rt.metadata.get_ledger("orders", first.ledger_id) == before
    # only the takeover's queueing of the stale attempt's keys: the offloaded objects stay
    assert {d.object_key for d in pending_deletions(rt.metadata)} == {"stale-d", "stale-i"}


def test_a_ledger_that_is_not_offloaded_cannot_be_replaced(runtime: Runtime) -> None:
    """An ordinary first attempt owns its ledger too: the replacement commit still refuses
    it, because there is nothing offloaded to replace."""
    rt = runtime
    offloaded_topic(rt, shapes=SMALL[:1])
    (fresh_id,) = produce_ledgers(rt, "orders", [(5, 100)])
    fresh = rt.metadata.get_ledger("orders", fresh_id)
    owned, attempt = begin(rt.metadata, fresh, "first-try")
    with pytest.raises(CommitFailedError, match="no longer owns offloaded ledger"):
        rt.metadata.attempts.commit_replacement(attempt, 1, "r")
    assert rt.metadata.get_ledger("orders", fresh_id) == owned
    assert rt.metadata.attempts.get("first-try").state is AttemptState.STARTED


def test_the_replaced_objects_are_due_after_the_grace(runtime: Runtime) -> None:
    """A reader that looked the old keys up before the swap still finds them: they are
    queued due ``grace_ms`` after the database's now, not at once."""
    rt = runtime
    first, _ = offloaded_topic(rt, shapes=SMALL)
    _, attempt = begin(rt.metadata, first, "repl", replace=True)
    before = rt.metadata.db_now_ms()
    rt.metadata.attempts.commit_replacement(attempt, 123, "crc mismatch", grace_ms=3_600_000)
    after = rt.metadata.db_now_ms()

    queued = pending_deletions(rt.metadata)
    assert {d.object_key for d in queued} == {first.data_key, first.index_key}
    assert all(before + 3_600_000 <= d.next_try_ms <= after + 3_600_000 for d in queued)
    assert rt.metadata.deletions.due(10) == []
    assert len(rt.metadata.deletions.due(10, at_ms=after + 3_600_000)) == 2


# --- a stream-mode ledger's replacement from the tier ----------------------------------------
def test_a_replacement_in_flight_keeps_the_segments(runtime: Runtime) -> None:
    """While the attempt uploads, the ledger is offloaded on its segments (reads go on
    there) and a second one is refused; a failed one leaves the segments as they were."""
    rt = runtime
    (lid,) = (x.ledger_id for x in sealed_ledgers(rt, 1))
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded_segment(rt, claim, "a", [(lid, 0, 9)])
    ledger = rt.metadata.get_ledger(T, lid)
    during, attempt = begin(rt.metadata, ledger, "v1", replace=True, from_tier=True)
    assert during.offload_mode is OffloadMode.STREAM and during.attempt_id == "v1"
    with rt.metadata.transaction() as conn:
        assert release_deleted(conn, [T]) == 0
    with pytest.raises(CommitFailedError, match="has attempt v1 in flight"):
        begin(rt.metadata, during, "other", replace=True, from_tier=True)
    rt.metadata.attempts.fail(attempt, "upload failed")
    after = rt.metadata.get_ledger(T, lid)
    assert after.offload_mode is OffloadMode.STREAM and after.attempt_id is None
    assert rt.metadata.segments.get("a").state is SegmentState.OFFLOADED
    assert set(queued(rt.metadata)) == {"v1-d", "v1-i"}


def test_only_a_tier_sourced_replacement_may_lack_a_hot_copy(runtime: Runtime) -> None:
    rt = runtime
    (lid,) = (x.ledger_id for x in sealed_ledgers(rt, 1))
    claim = rt.metadata.segments.claim(T, "p", 60_000)
    offloaded_segment(rt, claim, "a", [(lid, 0, 9)])
    ledger = rt.metadata.mark_hot_deleting(rt.metadata.get_ledger(T, lid))
    with pytest.raises(ValueError, match="needs an offloaded ledger whose hot copy is present"):
        begin(rt.metadata, ledger, "hot", replace=True)
    _, attempt = begin(rt.metadata, ledger, "tier", replace=True, from_tier=True)
    assert (
        rt.metadata.attempts.commit_replacement(attempt, 1, "r").offload_mode is OffloadMode.LEDGER
    )
    not_offloaded = sealed_ledger(rt.metadata, T)
    with pytest.raises(ValueError, match=r"it is none .*needs an offloaded ledger\)$"):
        begin(rt.metadata, not_offloaded, "x", replace=True, from_tier=True)
