"""The deletion queue in the metadata store (``metadata.deletions``: enqueue, due, retry,
complete, backlog), on SQLite and PostgreSQL (the ``metadata_url`` fixture): what each step
records and in which order items come due.

Due on the database's clock: test_metadata_clock.py; the GC that drains the queue:
tests/offloader/gc/.
"""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from fixtures.clock import stopped_sqlite_clock
from fixtures.metadata import file_store_id, pending_deletions, retry_deletion_later
from offloader.metadata import MetadataStore, now_ms, schema
from offloader.metadata.deletions import queue_keys


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


def test_queued_deletions_record_reason_and_attempt(store: MetadataStore) -> None:
    before = now_ms()
    store.deletions.enqueue(["k1"], "r" * 300, attempt_id="a1", store_id=file_store_id(store))
    store.deletions.enqueue([], "nothing", store_id=file_store_id(store))
    (row,) = pending_deletions(store)
    assert (row.object_key, row.reason, row.attempt_id) == ("k1", "r" * 255, "a1")
    assert (row.state, row.tries, row.last_error, row.done_ms) == ("pending", 0, None, None)
    assert before <= row.enqueued_ms == row.next_try_ms <= now_ms()


def test_a_delayed_deletion_is_due_exactly_its_delay_after_it_was_queued(
    store: MetadataStore,
) -> None:
    """One reading of the database's clock per queueing: with PostgreSQL's
    clock_timestamp() read twice per row, about one row in a few hundred came out a
    millisecond late (seen in the suite, on a replaced ledger's grace)."""
    keys, store_id = [f"k{i}" for i in range(3000)], file_store_id(store)
    with store.transaction() as conn:
        queue_keys(conn, keys, "grace", None, store_id, delay_ms=60_000)
    delays = {d.next_try_ms - d.enqueued_ms for d in pending_deletions(store)}
    assert delays == {60_000}


def unordered_selects_reversed(store: MetadataStore) -> None:
    """On SQLite, rows of a query without ORDER BY come back in the reverse of the plan's
    order (``reverse_unordered_selects``): an order that only the index gave is lost, so
    the test sees whether the store asks for it. PostgreSQL is left as it is."""
    if store.engine.dialect.name != "sqlite":
        return
    sa.event.listen(
        store.engine,
        "connect",
        lambda dbapi_conn, _record: dbapi_conn.execute("PRAGMA reverse_unordered_selects = ON"),
    )
    store.engine.dispose()


def test_due_deletions_come_soonest_first_up_to_the_limit(store: MetadataStore) -> None:
    unordered_selects_reversed(store)
    store.deletions.enqueue(["a", "b", "c", "d"], "test", store_id=file_store_id(store))
    a, b, _, _ = pending_deletions(store)
    retry_deletion_later(store, a, "later", delay_ms=2 * 3_600_000)
    retry_deletion_later(store, b, "sooner", delay_ms=3_600_000)
    # pending is in queue order, whatever order the database finds the rows in
    assert [x.object_key for x in pending_deletions(store)] == ["a", "b", "c", "d"]
    assert [x.object_key for x in store.deletions.due(10)] == ["c", "d"]
    assert [x.object_key for x in store.deletions.due(1)] == ["c"]
    at = {x.object_key: x.next_try_ms for x in pending_deletions(store)}["a"]
    assert [x.object_key for x in store.deletions.due(10, at_ms=at)] == ["c", "d", "b", "a"]
    assert [x.object_key for x in store.deletions.due(10, at_ms=at - 1)] == ["c", "d", "b"]


def test_the_backlog_lists_the_most_tried_items_first_then_the_oldest(
    store: MetadataStore,
) -> None:
    keys = [f"k{n:02}" for n in range(22)]
    store.deletions.enqueue(keys, "test", store_id=file_store_id(store))
    rows = pending_deletions(store)
    # retried in id order with shrinking delays, so the next tries run against the ids:
    # the index on next_try_ms hands the failing rows over in the reverse of their id order
    store.deletions.retry_later([(d, "once", (30 - n) * 60_000) for n, d in enumerate(rows)][1:])
    store.deletions.retry_later([(rows[n], "twice", (30 - n) * 60_000) for n in (3, 5)])

    twice = store.deletions.backlog(failing_tries=2)
    assert (twice.pending, twice.due, twice.failing_tries, twice.failing_count) == (22, 1, 2, 2)
    assert [(d.object_key, d.tries, d.last_error) for d in twice.failing] == [
        ("k03", 2, "twice"),
        ("k05", 2, "twice"),
    ]
    # 21 items failed at least once (not k00): 20 are listed unless told otherwise
    once = store.deletions.backlog(failing_tries=1)
    assert once.failing_count == 21
    once_only = [k for k in keys[1:] if k not in ("k03", "k05")]
    assert [d.object_key for d in once.failing] == ["k03", "k05", *once_only[:18]]


@pytest.mark.parametrize("metadata_url", ["sqlite"], indirect=True)  # SQLite's clock stops
@pytest.mark.parametrize(("offset_ms", "age_ms"), [(7, 7), (0, 0), (-1_000, 0)])
def test_the_oldest_items_age_is_never_negative(
    store: MetadataStore, offset_ms: int, age_ms: int
) -> None:
    """An item queued this very millisecond is 0 ms old, and so is one whose time is ahead
    of the database's clock (the clock stepped back since)."""
    store.deletions.enqueue(["a"], "test", store_id=file_store_id(store))
    (row,) = pending_deletions(store)
    with stopped_sqlite_clock(store.engine, row.enqueued_ms + offset_ms):
        backlog = store.deletions.backlog(failing_tries=1)
    assert (backlog.oldest_enqueued_ms, backlog.oldest_age_ms) == (row.enqueued_ms, age_ms)


def queue_rows(store: MetadataStore) -> dict[str, dict]:
    """Every row of the deletion queue, done ones included (the API shows pending ones)."""
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(schema.deletion_queue)).mappings()
        return {r["object_key"]: dict(r) for r in rows}


def test_completed_deletions_keep_their_first_completion(store: MetadataStore) -> None:
    store.deletions.enqueue(["a", "b"], "test", store_id=file_store_id(store))
    a, b = pending_deletions(store)
    store.deletions.complete([])
    before = now_ms()
    store.deletions.complete([a.id])
    first = queue_rows(store)["a"]
    assert first["state"] == "done"
    assert first["done_ms"] is not None and before <= first["done_ms"] <= now_ms()
    time.sleep(0.01)
    store.deletions.complete([a.id])  # done already: nothing changes
    retry_deletion_later(store, a, "x" * 3000, delay_ms=0)  # done: no longer retried
    retry_deletion_later(store, b, "x" * 3000, delay_ms=0)
    assert queue_rows(store)["a"] == first
    (left,) = pending_deletions(store)
    assert (left.object_key, left.tries, left.last_error) == ("b", 1, "x" * 2000)
    counts = store.counts()
    assert counts["deletions_by_state"] == {"done": 1, "pending": 1}
    assert counts["oldest_pending_deletion_ms"] == b.enqueued_ms
