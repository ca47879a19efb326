"""The CAS protocol on both databases (the `metadata_url` fixture runs SQLite and PostgreSQL)."""

import contextlib

import pytest

from fixtures.backends import run_in_threads
from fixtures.metadata import (
    begin,
    file_store_id,
    pending_deletions,
    retry_deletion_later,
    sealed_ledger,
)
from offloader.exceptions import AlreadyExistsError, CommitFailedError, NotFoundError
from offloader.metadata import AttemptState, HotState, MetadataStore, OffloadState
from offloader.metadata.migrate import current_revision, head_revision
from offloader.policy import OffloadPolicy


def test_upgraded_database_is_at_head_and_opens_twice(metadata_url: str) -> None:
    MetadataStore.open(metadata_url).close()
    store = MetadataStore.open(metadata_url)
    assert current_revision(store.engine) == head_revision()
    store.close()


def test_topics(store: MetadataStore) -> None:
    store.create_topic("a", OffloadPolicy())
    with pytest.raises(AlreadyExistsError):
        store.create_topic("a", OffloadPolicy())
    with pytest.raises(NotFoundError, match="'nope'"):
        store.get_topic("nope")
    topic = store.get_topic("a")
    updated = store.set_policy(topic, OffloadPolicy(deletion_lag_seconds=1))
    assert updated.version == topic.version + 1
    assert updated.policy.deletion_lag_seconds == 1
    with pytest.raises(CommitFailedError):  # stale version
        store.set_policy(topic, OffloadPolicy(deletion_lag_seconds=2))
    assert store.get_topic("a").policy.deletion_lag_seconds == 1


def test_fenced_writer_cannot_allocate_or_seal(store: MetadataStore) -> None:
    store.create_topic("t", OffloadPolicy())
    old = store.claim_writer("t").writer_epoch
    ledger = store.allocate_ledger("t", old)
    new = store.claim_writer("t").writer_epoch
    assert new > old
    with pytest.raises(CommitFailedError, match="fenced"):
        store.allocate_ledger("t", old)
    with pytest.raises(CommitFailedError, match="fenced"):
        store.seal_ledger(ledger, 1, 1, old)
    assert store.seal_ledger(ledger, 1, 1, new).state == "sealed"


def test_ledger_ids_are_unique_under_concurrent_allocation(store: MetadataStore) -> None:
    store.create_topic("t", OffloadPolicy())
    epoch = store.claim_writer("t").writer_epoch
    ids: list[int] = []

    def allocate() -> None:
        for _ in range(10):
            with contextlib.suppress(CommitFailedError):  # a lost CAS is fine; duplicates not
                ids.append(store.allocate_ledger("t", epoch).ledger_id)

    errors = run_in_threads(allocate, 4)
    assert not errors
    assert len(ids) == len(set(ids)) > 0
    assert sorted(x.ledger_id for x in store.list_ledgers("t")) == sorted(ids)


def test_attempt_commit_is_compare_and_set(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    ledger, attempt = begin(store, ledger, "a1")
    assert ledger.offload_state is OffloadState.OFFLOADING
    with pytest.raises(CommitFailedError, match="in flight"):
        begin(store, ledger, "a2")
    committed = store.attempts.commit(attempt, 1234)
    assert committed.is_offloaded and committed.offload_attempt_id == "a1"
    assert committed.data_key == "a1-d" and committed.data_len == 1234
    with pytest.raises(CommitFailedError):
        store.attempts.commit(attempt, 1234)
    assert store.attempts.get("a1").state is AttemptState.COMMITTED
    assert pending_deletions(store) == []


def test_expired_attempt_is_superseded_and_its_objects_queued(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    ledger, stale = begin(store, ledger, "old", lease_ms=-1)
    ledger, fresh = begin(store, ledger, "new")
    assert fresh.epoch == stale.epoch + 1
    assert store.attempts.get("old").state is AttemptState.SUPERSEDED
    assert {d.object_key for d in pending_deletions(store)} == {"old-d", "old-i"}
    # the zombie cannot renew or commit, and its failure queues its keys again
    assert not store.attempts.renew(stale, 60_000)
    with pytest.raises(CommitFailedError):
        store.attempts.commit(stale, 1)
    store.attempts.fail(stale, "lost")
    assert [d.object_key for d in pending_deletions(store)].count("old-d") == 2
    assert store.attempts.commit(fresh, 1).offload_attempt_id == "new"


def test_failed_attempt_frees_the_ledger(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    ledger, attempt = begin(store, ledger, "a1")
    store.attempts.fail(attempt, "boom")
    store.attempts.fail(attempt, "boom again")  # idempotent
    ledger = store.get_ledger("t", ledger.ledger_id)
    assert ledger.offload_state is OffloadState.NONE and ledger.attempt_id is None
    assert sorted(d.object_key for d in pending_deletions(store)) == ["a1-d", "a1-i"]
    begin(store, ledger, "a2")


def test_failing_a_committed_attempt_deletes_nothing(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    ledger, attempt = begin(store, ledger, "a1")
    store.attempts.commit(attempt, 1)
    store.attempts.fail(attempt, "late failure report")
    assert pending_deletions(store) == []
    assert store.get_ledger("t", ledger.ledger_id).is_offloaded


def test_hot_copy_is_marked_before_it_is_deleted(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    with pytest.raises(ValueError, match="not offloaded"):
        store.mark_hot_deleting(ledger)
    ledger, attempt = begin(store, ledger, "a1")
    ledger = store.attempts.commit(attempt, 1)
    marked = store.mark_hot_deleting(ledger)
    assert marked.hot_state is HotState.DELETING
    with pytest.raises(CommitFailedError):
        store.mark_hot_deleting(ledger)
    assert store.mark_hot_deleted(marked).hot_state is HotState.DELETED


def test_deletion_queue_retries_and_completes(store: MetadataStore) -> None:
    store_id = file_store_id(store, "/o")
    store.deletions.enqueue(["k1", "k2"], "test", store_id=store_id)
    due = store.deletions.due(10)
    assert [d.object_key for d in due] == ["k1", "k2"]
    retry_deletion_later(store, due[0], "503 SlowDown", delay_ms=3_600_000)
    store.deletions.complete([due[1].id])
    assert store.deletions.due(10) == []
    (left,) = pending_deletions(store)
    assert left.object_key == "k1" and left.tries == 1 and left.last_error == "503 SlowDown"
    counts = store.counts()
    assert counts["deletions_by_state"] == {"done": 1, "pending": 1}
