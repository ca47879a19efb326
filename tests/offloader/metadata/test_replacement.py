"""A second offload of an offloaded ledger (scrub's repair), on both databases: the intent
keeps the ledger offloaded on its objects, the commit swaps them by CAS and queues the old
ones in the same transaction, and every other path (failure, a stale attempt, hot deletion,
retention) leaves exactly one committed attempt and every key accounted for."""

from operator import attrgetter

import pytest

from fixtures.inspect import queued
from fixtures.metadata import begin, list_attempts, pending_deletions, sealed_ledger
from offloader.exceptions import CommitFailedError
from offloader.metadata import (
    AttemptState,
    DeletionState,
    HotState,
    Ledger,
    MetadataStore,
    OffloadState,
)


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
