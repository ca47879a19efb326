"""The batched transitions (begin_batch, renew_batch, commit_batch): what each writes
per ledger, on SQLite and PostgreSQL, the same fields the single-ledger ones write."""

from __future__ import annotations

import pytest

from fixtures.metadata import begin, file_store_id, pending_deletions, sealed_ledger
from offloader.metadata import AttemptState, Ledger, MetadataStore, OffloadState
from offloader.metadata.attempts import AttemptIntent


def intent(ledger: Ledger, attempt_id: str) -> AttemptIntent:
    return AttemptIntent(ledger, attempt_id, f"{attempt_id}-d", f"{attempt_id}-i")


def test_begin_attempts_records_each_intent_and_leases_on_the_database_clock(
    store: MetadataStore,
) -> None:
    ledgers = [sealed_ledger(store, "a") for _ in range(3)]
    sealed_ledger(store, "b")  # ledger 1 of another topic, at the same version as a's
    before = store.db_now_ms()
    owner = "w" * 300
    started = store.attempts.begin_batch(
        [intent(x, f"n{x.ledger_id}") for x in ledgers],
        owner,
        60_000,
        store_id=file_store_id(store),
    )
    after = store.db_now_ms()
    assert sorted(started) == [x.ledger_id for x in ledgers]
    for old in ledgers:
        attempt = started[old.ledger_id]
        assert store.attempts.get(attempt.attempt_id) == attempt
        assert (attempt.topic, attempt.epoch, attempt.state) == ("a", 1, AttemptState.STARTED)
        assert (attempt.data_key, attempt.index_key) == (
            f"n{old.ledger_id}-d",
            f"n{old.ledger_id}-i",
        )
        assert attempt.owner == "w" * 255
        assert before <= attempt.created_ms <= after
        assert (attempt.finished_ms, attempt.detail) == (None, None)
        ledger = store.get_ledger("a", old.ledger_id)
        assert ledger.version == old.version + 1
        assert (ledger.offload_state, ledger.offload_epoch) == (OffloadState.OFFLOADING, 1)
        assert ledger.attempt_id == attempt.attempt_id
        assert before + 60_000 <= (ledger.attempt_lease_ms or 0) <= after + 60_000
    other = store.get_ledger("b", 1)
    assert (other.offload_state, other.attempt_id) == (OffloadState.NONE, None)


def test_begin_attempts_takes_only_live_ledgers_whose_lease_is_over(store: MetadataStore) -> None:
    trimmed, free, stale, live, moved = (sealed_ledger(store) for _ in range(5))
    store.retention.mark_ledgers_deleting("t", trimmed.ledger_id + 1, limit=10)
    trimmed = store.get_ledger("t", trimmed.ledger_id)  # its version now: only trimmed
    stale, _ = begin(store, stale, "stale", lease_ms=-1)
    live, _ = begin(store, live, "live")
    intents = [intent(free, "n1"), intent(stale, "n2"), intent(live, "n3"), intent(moved, "n4")]
    intents.append(intent(trimmed, "n0"))
    store.attempts.begin(
        moved, "mover", "m-d", "m-i", "other", 60_000, store_id=file_store_id(store)
    )
    started = store.attempts.begin_batch(intents, "me", 60_000, store_id=file_store_id(store))
    assert sorted(started) == [free.ledger_id, stale.ledger_id]
    assert started[stale.ledger_id].epoch == 2
    superseded = store.attempts.get("stale")
    assert superseded.state is AttemptState.SUPERSEDED
    assert superseded.detail == "lease expired; superseded by n2"
    assert sorted(d.object_key for d in pending_deletions(store)) == ["stale-d", "stale-i"]
    assert store.get_ledger("t", live.ledger_id).attempt_id == "live"
    assert store.get_ledger("t", moved.ledger_id).attempt_id == "mover"
    assert store.get_ledger("t", trimmed.ledger_id) == trimmed


def test_renew_leases_extends_the_owned_and_names_the_lost(store: MetadataStore) -> None:
    ledgers = [sealed_ledger(store) for _ in range(2)]
    started = store.attempts.begin_batch(
        [intent(x, f"n{x.ledger_id}") for x in ledgers], "me", -1, store_id=file_store_id(store)
    )
    kept, lost = (started[x.ledger_id] for x in ledgers)
    store.attempts.begin(
        store.get_ledger("t", lost.ledger_id),
        "w",
        "w-d",
        "w-i",
        "o",
        1000,
        store_id=file_store_id(store),
    )
    before = store.db_now_ms()
    assert store.attempts.renew_batch([kept, lost], 90_000) == {lost.attempt_id}
    after = store.db_now_ms()
    lease = store.get_ledger("t", kept.ledger_id).attempt_lease_ms or 0
    assert before + 90_000 <= lease <= after + 90_000
    assert store.attempts.renew_batch([], 90_000) == set()


def test_commit_offloads_records_each_ledgers_own_offload(store: MetadataStore) -> None:
    ledgers = [sealed_ledger(store) for _ in range(2)]
    stores = [file_store_id(store, "/one"), file_store_id(store, "/two")]
    # two attempts of one topic begun in different stores (the default changed between)
    attempts = [
        store.attempts.begin(
            x, f"n{x.ledger_id}", f"d{x.ledger_id}", f"i{x.ledger_id}", "me", 60_000, store_id=sid
        )[1]
        for x, sid in zip(ledgers, stores, strict=True)
    ]
    before = store.db_now_ms()
    committed = store.attempts.commit_batch([(attempts[0], 111), (attempts[1], 222)])
    after = store.db_now_ms()
    assert committed == {a.attempt_id for a in attempts}
    for old, attempt, length, sid in zip(ledgers, attempts, (111, 222), stores, strict=True):
        ledger = store.get_ledger("t", old.ledger_id)
        assert ledger.version == old.version + 2  # begin, commit
        assert ledger.offload_state is OffloadState.OFFLOADED
        assert (ledger.attempt_id, ledger.attempt_lease_ms) == (None, None)
        assert (ledger.offload_attempt_id, ledger.data_key, ledger.index_key) == (
            attempt.attempt_id,
            attempt.data_key,
            attempt.index_key,
        )
        assert (ledger.data_len, ledger.store_id) == (length, sid)
        assert before <= (ledger.offloaded_ms or 0) <= after
        done = store.attempts.get(attempt.attempt_id)
        assert done.state is AttemptState.COMMITTED
        assert before <= (done.finished_ms or 0) <= after
    assert store.attempts.commit_batch([]) == set()


def test_a_batch_spans_exactly_one_topic(store: MetadataStore) -> None:
    """Attempts of two topics are refused, even when their ledger ids are the same."""
    _, a = begin(store, sealed_ledger(store, "a"), "in-a")
    _, b = begin(store, sealed_ledger(store, "b"), "in-b")
    fresh = [intent(sealed_ledger(store, topic), f"{topic}2") for topic in ("a", "b")]
    message = "a batch belongs to exactly one topic, got ['a', 'b']"
    with pytest.raises(ValueError) as renewing:
        store.attempts.renew_batch([a, b], 1000)
    with pytest.raises(ValueError) as committing:
        store.attempts.commit_batch([(a, 1), (b, 1)])
    with pytest.raises(ValueError) as beginning:
        store.attempts.begin_batch(fresh, "me", 1000, store_id=file_store_id(store))
    assert str(renewing.value) == str(committing.value) == str(beginning.value) == message
    for topic in ("a", "b"):
        assert store.attempts.get(f"in-{topic}").state is AttemptState.STARTED
        assert [x.offload_state for x in store.list_ledgers(topic)] == [
            OffloadState.OFFLOADING,
            OffloadState.NONE,
        ]
