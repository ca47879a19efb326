"""The retention steps of the metadata store on both databases: set-based marking in
batches, the deletion states, the start's CAS, the topic's deletion."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event

from fixtures.counting import counting_transactions
from fixtures.metadata import begin, pending_deletions, sealed_ledger
from offloader.exceptions import CommitFailedError, NotFoundError, TopicDeletedError
from offloader.metadata import (
    AttemptState,
    DeletionState,
    HotState,
    MetadataStore,
    OffloadState,
    Position,
)


@contextmanager
def counting_statements(store: MetadataStore) -> Iterator[list[str]]:
    seen: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", count)


def topic_of(store: MetadataStore, topic: str, count: int, offloaded: set[int]) -> list[int]:
    ids = []
    for _ in range(count):
        ledger = sealed_ledger(store, topic)
        if ledger.ledger_id in offloaded:
            _, attempt = begin(store, ledger, f"{topic}-{ledger.ledger_id}")
            store.attempts.commit(attempt, 10)
        ids.append(ledger.ledger_id)
    return ids


def test_marking_is_batched_set_based_and_records_the_intent(store: MetadataStore) -> None:
    ids = topic_of(store, "t", 20, offloaded={2, 3, 9, 15})
    _, in_flight = begin(store, store.get_ledger("t", 5), "flying")
    store.retention.move_start(store.get_topic("t"), Position(ledger_id=13, entry_id=0))

    with counting_transactions(store.engine) as transactions:
        first = store.retention.mark_ledgers_deleting("t", 13, 8)
    assert transactions.count == 1
    assert first == (ids[:8], 2 * 3)  # ledgers 2, 3 committed, 5 in flight
    assert store.retention.mark_ledgers_deleting("t", 13, 8) == (ids[8:12], 2)  # ledger 9
    assert store.retention.mark_ledgers_deleting("t", 13, 8) == ([], 0)
    for ledger in store.list_ledgers("t"):
        below = ledger.ledger_id < 13
        assert ledger.deletion_state is (DeletionState.DELETING if below else DeletionState.NONE)
        assert ledger.hot_state is (HotState.DELETING if below else HotState.PRESENT)
    assert store.list_ledgers("t", live=True) == store.list_ledgers("t")[12:]

    # the attempt in flight lost its ledger: superseded, its keys queued, the ledger freed
    assert store.attempts.get("flying").state is AttemptState.SUPERSEDED
    ledger5 = store.get_ledger("t", 5)
    assert (ledger5.attempt_id, ledger5.attempt_lease_ms) == (None, None)
    assert ledger5.offload_state is OffloadState.NONE
    with pytest.raises(CommitFailedError):
        store.attempts.commit(in_flight, 10)
    queued = {(d.object_key, d.ledger_id, d.attempt_id) for d in pending_deletions(store)}
    assert ("flying-d", 5, "flying") in queued and ("flying-i", 5, "flying") in queued
    assert {d.ledger_id for d in pending_deletions(store)} == {2, 3, 5, 9}
    assert all(d.store_id is not None for d in pending_deletions(store))


def test_a_ledger_below_a_moved_start_is_not_live_before_it_is_marked(
    store: MetadataStore,
) -> None:
    """Between a trim's two steps (the start moved, nothing marked yet: the
    after-trim-start-moved failpoint) the ledgers below the start are already history."""
    ids = topic_of(store, "t", 3, offloaded=set())
    store.retention.move_start(store.get_topic("t"), Position(ledger_id=ids[1], entry_id=0))
    assert store.get_ledger("t", ids[0]).deletion_state is DeletionState.NONE
    assert [x.ledger_id for x in store.list_ledgers("t", live=True)] == ids[1:]
    assert [x.ledger_id for x in store.list_ledgers("t")] == ids


def test_marking_costs_the_same_statements_for_10_or_100_ledgers(store: MetadataStore) -> None:
    """Selection in SQL: the statements of one batch do not grow with the ledgers it marks."""
    costs = []
    for topic, count in (("small", 10), ("large", 100)):
        topic_of(store, topic, count, offloaded={1, 2})
        store.retention.move_start(
            store.get_topic(topic), Position(ledger_id=count + 1, entry_id=0)
        )
        with counting_statements(store) as statements:
            marked, _ = store.retention.mark_ledgers_deleting(topic, count + 1, 1000)
        assert len(marked) == count
        costs.append(len(statements))
    assert costs[0] == costs[1]


def test_ledgers_become_deleted_only_when_hot_copy_and_keys_are_gone(
    store: MetadataStore,
) -> None:
    topic_of(store, "t", 3, offloaded={1})
    store.retention.move_start(store.get_topic("t"), Position(ledger_id=3, entry_id=0))
    assert [t.name for t in store.retention.topics_with_unmarked_ledgers()] == ["t"]
    store.retention.mark_ledgers_deleting("t", 3, 10)
    assert store.retention.topics_with_unmarked_ledgers() == []
    assert store.retention.finish_deleted_ledgers() == 0  # hot copies only marked
    assert [x.ledger_id for x in store.retention.hot_copies_of_deleting(10)] == [1, 2]
    store.retention.mark_hot_copies_deleted("t", [1, 2])
    assert store.retention.hot_copies_of_deleting(10) == []
    assert store.retention.finish_deleted_ledgers() == 1  # ledger 2: nothing was queued
    assert store.get_ledger("t", 1).deletion_state is DeletionState.DELETING
    store.deletions.complete([d.id for d in pending_deletions(store)])
    assert store.retention.finish_deleted_ledgers() == 1
    deleted = store.get_ledger("t", 1)
    assert deleted.deletion_state is DeletionState.DELETED and deleted.deleted_ms is not None
    assert store.retention.finish_deleted_ledgers() == 0
    assert store.get_ledger("t", 3).is_live


def test_the_start_moves_forward_by_cas_and_a_deleted_topic_is_frozen(
    store: MetadataStore,
) -> None:
    topic_of(store, "t", 3, offloaded=set())
    seen = store.get_topic("t")
    moved = store.retention.move_start(seen, Position(ledger_id=2, entry_id=1))
    assert moved.start == Position(ledger_id=2, entry_id=1) and moved.version == seen.version + 1
    with pytest.raises(CommitFailedError, match="changed since version"):
        store.retention.move_start(seen, Position(ledger_id=3, entry_id=0))
    with pytest.raises(ValueError, match="only moves forward"):
        store.retention.move_start(moved, Position(ledger_id=2, entry_id=0))
    with pytest.raises(ValueError, match="only moves forward"):
        store.retention.move_start(moved, moved.start)  # not even to where it is
    assert store.get_topic("t") == moved
    assert moved.deleted_ms is None
    before = store.db_now_ms()
    deleted = store.retention.delete_topic(moved)
    assert deleted.is_deleted and deleted.writer_epoch == moved.writer_epoch + 1
    assert deleted.start == Position(ledger_id=4, entry_id=0)
    assert deleted.deleted_ms is not None
    assert before <= deleted.deleted_ms <= store.db_now_ms()  # the database's clock
    for cut in (
        store.retention.create_cut,
        store.retention.end_cut,
    ):  # the real one and a dry run's
        with pytest.raises(TopicDeletedError, match=r"^topic 't' was deleted; it cannot be cut$"):
            cut("t")
    assert store.retention.list_cuts("t") == []
    with pytest.raises(CommitFailedError):
        store.retention.delete_topic(moved)  # stale
    with pytest.raises(CommitFailedError):
        store.retention.move_start(deleted, Position(ledger_id=5, entry_id=0))


def test_a_trim_counts_the_ledgers_and_keys_its_marking_then_takes(store: MetadataStore) -> None:
    """What a dry run reports (ledgers_to_trim, count_keys_to_trim) is what the marking
    does: the topic's live ledgers below the bound, two keys per committed ledger and per
    attempt in flight; another topic's ledgers never count."""
    topic_of(store, "t", 6, offloaded={1, 2, 5})
    begin(store, store.get_ledger("t", 3), "flying")
    topic_of(store, "u", 3, offloaded={1, 2})
    assert store.retention.ledgers_to_trim("t", 5) == [1, 2, 3, 4]
    assert store.retention.count_keys_to_trim("t", 5) == 2 * 3  # 1, 2 committed, 3 in flight
    assert store.retention.count_keys_to_trim("t", 3) == 2 * 2
    assert (
        store.retention.ledgers_to_trim("t", 1),
        store.retention.count_keys_to_trim("t", 1),
    ) == ([], 0)
    assert store.retention.count_keys_to_trim("u", 5) == 2 * 2

    store.retention.move_start(store.get_topic("t"), Position(ledger_id=5, entry_id=0))
    assert store.retention.mark_ledgers_deleting("t", 5, 10) == ([1, 2, 3, 4], 2 * 3)
    assert [d.tries for d in pending_deletions(store)] == [0] * 6  # none tried yet
    assert (
        store.retention.ledgers_to_trim("t", 5),
        store.retention.count_keys_to_trim("t", 5),
    ) == ([], 0)
    assert store.retention.ledgers_to_trim("t", 7) == [5, 6]
    assert store.retention.count_keys_to_trim("t", 7) == 2


def test_only_the_named_trimmed_ledgers_hot_copies_are_recorded_deleted(
    store: MetadataStore,
) -> None:
    """mark_hot_copies_deleted touches a ledger of the named topic and ids only when trim
    marked both it and its hot copy deleting: not a live ledger whose hot copy hot
    deletion is removing, not another topic's, not one already recorded (once, by CAS
    version, at the database's time)."""
    topic_of(store, "t", 4, offloaded={3})
    topic_of(store, "u", 2, offloaded=set())
    for name in ("t", "u"):
        store.retention.move_start(store.get_topic(name), Position(ledger_id=3, entry_id=0))
        store.retention.mark_ledgers_deleting(name, 3, 10)
    store.mark_hot_deleting(store.get_ledger("t", 3))  # live, offloaded: hot deletion's
    everything = {(x.topic, x.ledger_id): x for n in ("t", "u") for x in store.list_ledgers(n)}

    before = store.db_now_ms()
    store.retention.mark_hot_copies_deleted("t", [3, 1])
    now = {(x.topic, x.ledger_id): x for n in ("t", "u") for x in store.list_ledgers(n)}
    assert {key for key in everything if now[key] != everything[key]} == {("t", 1)}
    one = now[("t", 1)]
    assert one.hot_state is HotState.DELETED and one.deletion_state is DeletionState.DELETING
    assert one.version == everything[("t", 1)].version + 1
    assert one.hot_deleted_ms is not None
    assert before <= one.hot_deleted_ms <= store.db_now_ms()
    assert now[("t", 3)].hot_state is HotState.DELETING  # hot deletion finishes it

    store.retention.mark_hot_copies_deleted("t", [1, 2])  # 1 again: already recorded, unchanged
    assert store.get_ledger("t", 1) == one
    two = store.get_ledger("t", 2)
    assert (two.hot_state, two.version) == (HotState.DELETED, everything[("t", 2)].version + 1)
    assert [x.hot_state for x in store.list_ledgers("u")[:2]] == [HotState.DELETING] * 2
    store.retention.mark_hot_copies_deleted("t", [])  # nothing named: no transaction, no change
    assert store.get_ledger("t", 2) == two


def test_a_trim_cut_short_and_a_finished_deletion_are_judged_per_topic(
    store: MetadataStore,
) -> None:
    """Ledger ids repeat across topics: a topic's unmarked ledgers are measured against its
    own start, and a deleting ledger waits only for its own topic's queued keys. Topics
    come back by name, whatever order they were created in."""
    topic_of(store, "u", 2, offloaded={1})
    topic_of(store, "t", 2, offloaded=set())
    topic_of(store, "v", 2, offloaded=set())  # untouched: live ledgers 1 and 2
    for name in ("u", "t"):
        store.retention.move_start(store.get_topic(name), Position(ledger_id=3, entry_id=0))
    assert [t.name for t in store.retention.topics_with_unmarked_ledgers()] == ["t", "u"]
    for name in ("u", "t"):
        store.retention.mark_ledgers_deleting(name, 3, 10)
    assert store.retention.topics_with_unmarked_ledgers() == []  # v is below no start of its own
    for name in ("u", "t"):
        store.retention.mark_hot_copies_deleted(name, [1, 2])
    marked = {(n, x.ledger_id): x for n in ("t", "u") for x in store.list_ledgers(n)}

    before = store.db_now_ms()
    assert store.retention.finish_deleted_ledgers() == 3  # u/1's keys are still queued
    for key in (("t", 1), ("t", 2), ("u", 2)):
        done = store.get_ledger(*key)
        assert done.deletion_state is DeletionState.DELETED
        assert done.version == marked[key].version + 1
        assert done.deleted_ms is not None and before <= done.deleted_ms <= store.db_now_ms()
    assert store.get_ledger("u", 1) == marked[("u", 1)]
    store.deletions.complete([d.id for d in pending_deletions(store)])
    assert store.retention.finish_deleted_ledgers() == 1
    assert store.get_ledger("u", 1).deletion_state is DeletionState.DELETED
    assert [x.is_live for x in store.list_ledgers("v")] == [True, True]


def test_hot_copies_of_deleting_ledgers_come_by_topic_then_id_up_to_the_limit(
    store: MetadataStore,
) -> None:
    """Only trimmed ledgers (deletion and hot copy both deleting), never a live ledger
    whose hot copy hot deletion is removing; ordered by topic, then id, across topics."""
    topic_of(store, "u", 3, offloaded=set())
    topic_of(store, "t", 3, offloaded={3})
    for name in ("u", "t"):
        store.retention.move_start(store.get_topic(name), Position(ledger_id=3, entry_id=0))
        store.retention.mark_ledgers_deleting(name, 3, 10)
    store.mark_hot_deleting(store.get_ledger("t", 3))  # live: hot deletion's, not trim's

    def listed(limit: int, topic: str | None = None) -> list[tuple[str, int]]:
        return [
            (x.topic, x.ledger_id) for x in store.retention.hot_copies_of_deleting(limit, topic)
        ]

    assert listed(10) == [("t", 1), ("t", 2), ("u", 1), ("u", 2)]
    assert listed(3) == [("t", 1), ("t", 2), ("u", 1)]
    assert listed(10, "u") == [("u", 1), ("u", 2)]
    assert listed(1, "u") == [("u", 1)]


def test_a_cut_measures_its_own_topic_up_to_its_first_open_ledger(store: MetadataStore) -> None:
    """A cut ends at the topic's first open ledger (here a fenced writer's, with a sealed
    one after it) and counts the bytes of its own topic's ledgers below that, building on
    the topic's own newest cut, never another topic's."""
    sealed_ledger(store, "u", size_bytes=7000)
    store.retention.create_cut("u")
    sealed_ledger(store, "t", size_bytes=100)
    first = store.retention.create_cut("t")
    assert (first.ledger_id, first.entry_id, first.offset_bytes) == (2, 0, 100)
    sealed_ledger(store, "t", size_bytes=20)
    fenced = store.claim_writer("t").writer_epoch
    assert store.allocate_ledger("t", fenced).ledger_id == 3  # never sealed: fenced next
    assert sealed_ledger(store, "t", size_bytes=3).ledger_id == 4  # by the next writer
    sealed_ledger(store, "u", size_bytes=7000)
    store.retention.create_cut("u")  # the newest cut of all is u's
    sealed_ledger(store, "v")
    store.allocate_ledger("v", store.claim_writer("v").writer_epoch)  # v/2: open, not t's

    dry = store.retention.end_cut("t")
    assert (dry.cut_id, dry.ledger_id, dry.entry_id, dry.offset_bytes) == (0, 3, 0, 120)
    made = store.retention.create_cut("t")
    assert (made.ledger_id, made.entry_id, made.offset_bytes) == (3, 0, 120)
    assert store.retention.list_cuts("t") == [first, made]
    assert [c.offset_bytes for c in store.retention.list_cuts("u")] == [7000, 14000]


def test_a_cut_is_found_by_its_topic_and_id_within_the_32_bit_column(
    store: MetadataStore,
) -> None:
    sealed_ledger(store, "t")
    cuts = [store.retention.create_cut("t") for _ in range(64)]
    assert [c.cut_id for c in cuts] == list(range(1, 65))
    assert store.retention.get_cut("t", 63) == cuts[62]
    sealed_ledger(store, "u")
    for topic, cut_id in (("u", 1), ("t", 0), ("t", -1), ("t", 2**31), ("t", 3_000_000_000)):
        with pytest.raises(NotFoundError) as raised:
            store.retention.get_cut(topic, cut_id)  # another topic's cut, or none can exist
        assert str(raised.value) == f"cut {cut_id} of topic {topic!r} does not exist"


def test_marking_records_when_and_why_and_leaves_other_attempts_alone(
    store: MetadataStore,
) -> None:
    ids = topic_of(store, "t", 3, offloaded={1})
    assert ids[0] == 1  # offloaded by attempt "t-1"
    (other,) = topic_of(store, "u", 1, offloaded=set())
    _, elsewhere = begin(store, store.get_ledger("u", other), "elsewhere")
    _, flying = begin(store, store.get_ledger("t", ids[1]), "flying")
    before = {x.ledger_id: x for x in store.list_ledgers("t")}
    store.retention.move_start(store.get_topic("t"), Position(ledger_id=ids[2], entry_id=0))
    assert store.retention.mark_ledgers_deleting("t", ids[2], 10) == (ids[:2], 4)

    for ledger_id in ids[:2]:
        marked = store.get_ledger("t", ledger_id)
        assert marked.version == before[ledger_id].version + 1
        assert marked.deleting_ms is not None
    assert store.get_ledger("t", ids[2]) == before[ids[2]]
    superseded = store.attempts.get("flying")
    assert (superseded.state, superseded.detail) == (
        AttemptState.SUPERSEDED,
        "its ledger was trimmed",
    )
    assert superseded.finished_ms is not None
    # an attempt of another topic's ledger is not this trim's business
    assert store.attempts.get("elsewhere").state is AttemptState.STARTED
    assert store.get_ledger("u", other).attempt_id == elsewhere.attempt_id
    committed = "t-1"
    assert {(d.object_key, d.reason, d.attempt_id) for d in pending_deletions(store)} == {
        (f"{committed}-d", "ledger trimmed", committed),
        (f"{committed}-i", "ledger trimmed", committed),
        ("flying-d", "attempt of a trimmed ledger", flying.attempt_id),
        ("flying-i", "attempt of a trimmed ledger", flying.attempt_id),
    }
    # a marked ledger takes no new attempt, and the refusal says why
    with pytest.raises(CommitFailedError) as raised:
        begin(store, store.get_ledger("t", ids[1]), "late")
    assert str(raised.value) == f"ledger t/{ids[1]} is deleting: trimmed"
    assert store.get_ledger("t", ids[1]).attempt_id is None
