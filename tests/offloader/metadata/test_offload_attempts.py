"""An offload attempt in the metadata store (``metadata.attempts``: begin, renew, commit,
fail, supersede), on SQLite and PostgreSQL (the ``metadata_url`` fixture): the CAS
protocol, the fields each step writes (versions, times, epochs, keys, reasons) and the exact
errors, which the CLI, the DAGs and `offloader status` show to people.

A batch's attempts: test_offload_batches.py; a second offload of an offloaded ledger:
test_replacement.py; leases with a worker whose clock is wrong: test_metadata_clock.py.
"""

from __future__ import annotations

import pytest

from fixtures.metadata import begin, file_store_id, list_attempts, pending_deletions, sealed_ledger
from offloader.exceptions import CommitFailedError
from offloader.metadata import AttemptState, MetadataStore, OffloadState, now_ms


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


def test_an_attempt_records_its_intent_before_any_upload(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    before = now_ms()
    owner = "worker-" + "w" * 300
    store_id = file_store_id(store)
    ledger, attempt = store.attempts.begin(
        ledger, "a1", "a1-d", "a1-i", owner, 5_000, store_id=store_id
    )
    assert (attempt.attempt_id, attempt.topic, attempt.ledger_id, attempt.epoch) == (
        "a1",
        "t",
        ledger.ledger_id,
        1,
    )
    assert (attempt.data_key, attempt.index_key, attempt.state) == (
        "a1-d",
        "a1-i",
        AttemptState.STARTED,
    )
    assert attempt.owner == owner[:255]
    assert before <= attempt.created_ms <= now_ms()
    assert (attempt.finished_ms, attempt.detail) == (None, None)
    assert (ledger.offload_state, ledger.offload_epoch, ledger.attempt_id) == (
        OffloadState.OFFLOADING,
        1,
        "a1",
    )
    assert ledger.attempt_lease_ms is not None
    assert before + 5_000 <= ledger.attempt_lease_ms <= now_ms() + 5_000
    with pytest.raises(CommitFailedError) as raised:
        begin(store, ledger, "a2")
    assert str(raised.value) == (
        f"ledger t/{ledger.ledger_id} has attempt a1 in flight until its lease ends"
    )


def test_a_commit_records_where_the_offload_went(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    ledger, attempt = begin(store, ledger, "a1")
    before = now_ms()
    committed = store.attempts.commit(attempt, 4321)
    assert committed.version == ledger.version + 1
    assert (committed.offload_state, committed.attempt_id, committed.attempt_lease_ms) == (
        OffloadState.OFFLOADED,
        None,
        None,
    )
    assert (committed.offload_attempt_id, committed.data_key, committed.index_key) == (
        "a1",
        "a1-d",
        "a1-i",
    )
    assert committed.data_len == 4321
    assert committed.offloaded_ms is not None and before <= committed.offloaded_ms <= now_ms()
    recorded = store.attempts.get("a1")
    assert recorded.state is AttemptState.COMMITTED
    assert recorded.finished_ms is not None and before <= recorded.finished_ms <= now_ms()
    with pytest.raises(CommitFailedError) as raised:
        store.attempts.commit(attempt, 4321)
    assert str(raised.value) == (f"attempt a1 (epoch 1) no longer owns ledger t/{ledger.ledger_id}")


def test_retired_attempts_record_why_and_queue_their_keys(store: MetadataStore) -> None:
    ledger = sealed_ledger(store)
    ledger, stale = begin(store, ledger, "old", lease_ms=-1)
    ledger, fresh = begin(store, ledger, "new")
    old = store.attempts.get("old")
    assert old.detail == "lease expired; superseded by new"
    assert old.finished_ms is not None
    before = now_ms()
    store.attempts.fail(fresh, "boom " + "x" * 3000)
    failed = store.attempts.get("new")
    assert failed.state is AttemptState.FAILED
    assert failed.detail == ("boom " + "x" * 3000)[:2000]
    assert failed.finished_ms is not None and before <= failed.finished_ms <= now_ms()
    freed = store.get_ledger("t", ledger.ledger_id)
    assert (freed.offload_state, freed.attempt_id, freed.attempt_lease_ms) == (
        OffloadState.NONE,
        None,
        None,
    )
    assert freed.version == ledger.version + 1
    queued = [(d.object_key, d.reason, d.attempt_id) for d in pending_deletions(store)]
    assert queued == [
        ("old-d", "attempt superseded", "old"),
        ("old-i", "attempt superseded", "old"),
        ("new-d", "attempt failed", "new"),
        ("new-i", "attempt failed", "new"),
    ]
    store.attempts.fail(stale, "zombie")  # a superseded attempt queues its keys again
    again = [(d.object_key, d.reason, d.attempt_id) for d in pending_deletions(store)][4:]
    assert again == [
        ("old-d", "late objects of a superseded attempt", "old"),
        ("old-i", "late objects of a superseded attempt", "old"),
    ]
    assert store.attempts.get("old").state is AttemptState.SUPERSEDED


def test_retiring_an_attempt_leaves_other_attempts_alone(store: MetadataStore) -> None:
    _, mine = begin(store, sealed_ledger(store, "t"), "mine")
    _, other = begin(store, sealed_ledger(store, "u"), "other")
    store.attempts.fail(mine, "boom")
    assert store.attempts.get("mine").state is AttemptState.FAILED
    untouched = store.attempts.get("other")
    assert (untouched.state, untouched.finished_ms, untouched.detail) == (
        AttemptState.STARTED,
        None,
        None,
    )
    assert {d.attempt_id for d in pending_deletions(store)} == {"mine"}
    assert store.get_ledger("u", other.ledger_id).attempt_id == "other"


def test_attempts_are_listed_oldest_first_by_topic_and_state(store: MetadataStore) -> None:
    first = sealed_ledger(store, "t")
    other = sealed_ledger(store, "u")
    _, a1 = begin(store, first, "a1")
    store.attempts.commit(a1, 1)
    begin(store, other, "b1")
    assert [a.attempt_id for a in list_attempts(store)] == ["a1", "b1"]
    assert [a.attempt_id for a in list_attempts(store, topic="u")] == ["b1"]
    committed = list_attempts(store, state=AttemptState.COMMITTED)
    assert [a.attempt_id for a in committed] == ["a1"]
    assert list_attempts(store, topic="u", state=AttemptState.COMMITTED) == []
