"""Topics and ledgers in the metadata store (the facade: create, policy, the writer's claim
and its fencing, allocate, seal, look-ups, counts), on SQLite and PostgreSQL (the
``metadata_url`` fixture): the CAS protocol, the fields each step writes (versions, times,
epochs) and the exact errors, which the CLI, the DAGs and `offloader status` show to people.

Racing creates: test_metadata_races.py.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from fixtures.backends import run_in_threads
from fixtures.metadata import begin, pending_deletions, sealed_ledger
from offloader.exceptions import AlreadyExistsError, CommitFailedError, NotFoundError
from offloader.metadata import HotState, LedgerState, MetadataStore, OffloadState, Topic, now_ms
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


def test_topic_names_are_1_to_512_characters(store: MetadataStore) -> None:
    for bad in ("", "x" * 513):
        with pytest.raises(ValueError) as raised:
            store.create_topic(bad, OffloadPolicy())
        assert str(raised.value) == "topic name must be 1 to 512 characters"
    assert store.list_topics() == []
    store.create_topic("x" * 512, OffloadPolicy())
    assert [t.name for t in store.list_topics()] == ["x" * 512]


def test_a_new_topic_starts_at_version_1_ledger_1_epoch_0(store: MetadataStore) -> None:
    before = now_ms()
    policy = OffloadPolicy(deletion_lag_seconds=7)
    topic = store.create_topic("a", policy)
    assert (topic.name, topic.version, topic.next_ledger_id, topic.writer_epoch) == (
        "a",
        1,
        1,
        0,
    )
    assert topic.policy == policy
    assert before <= topic.created_ms <= now_ms()
    assert store.get_topic("a") == topic
    with pytest.raises(AlreadyExistsError) as raised:
        store.create_topic("a", OffloadPolicy())
    assert str(raised.value) == "topic 'a' exists already"


def test_topics_are_listed_by_name(store: MetadataStore) -> None:
    for name in ("b", "c", "a"):
        store.create_topic(name, OffloadPolicy())
    assert [t.name for t in store.list_topics()] == ["a", "b", "c"]


def test_a_stale_topic_version_is_named(store: MetadataStore) -> None:
    topic = store.create_topic("a", OffloadPolicy())
    store.set_policy(topic, OffloadPolicy(deletion_lag_seconds=1))
    with pytest.raises(CommitFailedError) as raised:
        store.set_policy(topic, OffloadPolicy(deletion_lag_seconds=2))
    assert str(raised.value) == "topic 'a' changed since version 1: someone else moved"


def test_missing_records_are_named(store: MetadataStore) -> None:
    store.create_topic("t", OffloadPolicy())
    cases = [
        (lambda: store.get_topic("nope"), "topic 'nope' does not exist"),
        (lambda: store.list_ledgers("nope"), "topic 'nope' does not exist"),
        (lambda: store.get_ledger("t", 99), "ledger 99 of topic 't' does not exist"),
        (lambda: store.attempts.get("a9"), "offload attempt a9 does not exist"),
    ]
    for call, message in cases:
        with pytest.raises(NotFoundError) as raised:
            call()
        assert str(raised.value) == message


def test_a_ledger_is_allocated_open_and_empty_then_sealed(store: MetadataStore) -> None:
    store.create_topic("t", OffloadPolicy())
    epoch = store.claim_writer("t").writer_epoch
    assert epoch == 1
    before = now_ms()
    ledger = store.allocate_ledger("t", epoch)
    assert (ledger.topic, ledger.ledger_id, ledger.version, ledger.state) == (
        "t",
        1,
        1,
        LedgerState.OPEN,
    )
    assert (ledger.entry_count, ledger.size_bytes, ledger.sealed_ms) == (0, 0, None)
    assert (ledger.offload_state, ledger.offload_epoch, ledger.hot_state) == (
        OffloadState.NONE,
        0,
        HotState.PRESENT,
    )
    assert before <= ledger.created_ms <= now_ms()
    assert store.get_topic("t").next_ledger_id == 2
    sealed = store.seal_ledger(ledger, 10, 1234, epoch)
    assert (sealed.state, sealed.entry_count, sealed.size_bytes, sealed.version) == (
        LedgerState.SEALED,
        10,
        1234,
        2,
    )
    assert sealed.sealed_ms is not None and before <= sealed.sealed_ms <= now_ms()
    assert store.allocate_ledger("t", epoch).ledger_id == 2


def test_ledgers_are_listed_by_id_whatever_was_updated_last(store: MetadataStore) -> None:
    store.create_topic("t", OffloadPolicy())
    epoch = store.claim_writer("t").writer_epoch
    first = store.allocate_ledger("t", epoch)
    second = store.allocate_ledger("t", epoch)
    store.seal_ledger(second, 1, 1, epoch)
    store.seal_ledger(first, 1, 1, epoch)  # ledger 1's row is now the newest on disk
    assert [x.ledger_id for x in store.list_ledgers("t")] == [1, 2]


def test_a_fenced_writer_is_told_which_epoch_fenced_it(store: MetadataStore) -> None:
    store.create_topic("t", OffloadPolicy())
    old = store.claim_writer("t").writer_epoch
    ledger = store.allocate_ledger("t", old)
    new = store.claim_writer("t").writer_epoch
    fenced = f"writer epoch {old} of topic 't' was fenced by epoch {new}"
    with pytest.raises(CommitFailedError) as raised:
        store.allocate_ledger("t", old)
    assert str(raised.value) == fenced
    with pytest.raises(CommitFailedError) as raised:
        store.seal_ledger(ledger, 1, 1, old)
    assert str(raised.value) == fenced
    # recovery by the new owner seals without naming an epoch
    assert store.seal_ledger(ledger, 1, 1, None).state is LedgerState.SEALED


def test_times_are_milliseconds_since_the_epoch() -> None:
    assert abs(now_ms() - time.time() * 1000) < 1000


def test_concurrent_claims_all_succeed_with_distinct_epochs(store: MetadataStore) -> None:
    store.create_topic("t", OffloadPolicy())
    epochs: list[int] = []
    errors = run_in_threads(lambda: epochs.append(store.claim_writer("t").writer_epoch), 8)
    assert errors == []
    assert sorted(epochs) == list(range(1, 9))


def claims_racing_in(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch, races: int
) -> list[int]:
    """The next ``races`` reads of a topic by claim_writer are each followed, before the
    claimer's transaction, by another claimer's win (what threads may do, made certain);
    the list records the epoch each read saw."""
    real = store.get_topic
    seen: list[int] = []
    racing = False

    def read_then_lose(name: str) -> Topic:
        nonlocal racing
        current = real(name)
        if racing or len(seen) >= races:
            return current
        seen.append(current.writer_epoch)
        racing = True
        try:
            store.claim_writer(name)  # the other claimer, between our read and our CAS
        finally:
            racing = False
        return current

    monkeypatch.setattr(store, "get_topic", read_then_lose)
    return seen


def test_a_claimer_that_loses_the_cas_reads_again_and_wins(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_topic("t", OffloadPolicy())
    seen = claims_racing_in(store, monkeypatch, races=2)
    claimed = store.claim_writer("t")
    # read 0 (lost to 1), read 1 (lost to 2), read 2 and won: epoch 3 after 2 rivals
    assert seen == [0, 1]
    assert claimed.writer_epoch == 3 and claimed.version == 4


def test_a_claimer_that_loses_100_times_gives_up_with_the_topic_named(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.create_topic("t", OffloadPolicy())
    seen = claims_racing_in(store, monkeypatch, races=1000)
    with pytest.raises(CommitFailedError) as raised:
        store.claim_writer("t")
    assert str(raised.value) == "could not claim the writer of topic 't'"
    assert seen == list(range(100))  # 100 tries, each lost to a rival
    monkeypatch.undo()
    assert store.get_topic("t").writer_epoch == 100


def test_several_ledgers_come_in_one_query_exactly_those_asked(store: MetadataStore) -> None:
    ids = [sealed_ledger(store).ledger_id for _ in range(3)]
    assert list(store.get_ledgers("t", [ids[2], ids[0]])) in ([ids[0], ids[2]], [ids[2], ids[0]])
    assert store.get_ledgers("t", []) == {}
    with pytest.raises(NotFoundError, match=r"^ledgers \[99\] of topic 't' do not exist$"):
        store.get_ledgers("t", [ids[1], 99])


def test_counts_summarise_every_table(store: MetadataStore) -> None:
    assert store.counts() == {
        "topics": 0,
        "ledgers_by_state": {},
        "attempts_by_state": {},
        "deletions_by_state": {},
        "oldest_pending_deletion_ms": None,
        "segments_by_state": {},
        "segments_by_origin": {},
    }
    ledger = sealed_ledger(store, "t")
    sealed_ledger(store, "u")
    _, attempt = begin(store, ledger, "a1")
    store.attempts.fail(attempt, "boom")
    counts = store.counts()
    pending = pending_deletions(store)
    assert counts == {
        "topics": 2,
        "ledgers_by_state": {"sealed/none/present": 2},
        "attempts_by_state": {"failed": 1},
        "deletions_by_state": {"pending": 2},
        "oldest_pending_deletion_ms": min(d.enqueued_ms for d in pending),
        "segments_by_state": {},
        "segments_by_origin": {},
    }
