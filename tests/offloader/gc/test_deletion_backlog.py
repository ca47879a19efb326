"""The queue's cost and visibility: batches of ``gc_batch_keys`` per request, a pass that
does not retry what it just tried, a failing store that keeps the work with its tries and
errors and drains once it recovers, and a backlog (count, oldest age on the database's
clock, failing items) that status and the pass report."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from fixtures.clock import HOUR, skew_worker_clock, stopped_sqlite_clock
from fixtures.counting import CountingStore
from fixtures.faults import FaultyStore, OnlyStore
from fixtures.metadata import pending_deletions, retry_deletion_later
from offloader.exceptions import ObjectStoreError
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata.clock import db_now
from offloader.metadata.deletions import due_deletions_query
from offloader.runtime import Runtime
from offloader.settings import Settings


def enqueue(rt: Runtime, keys: list[str]) -> None:
    rt.metadata.deletions.enqueue(keys, "test", store_id=rt.stores.default_id())


@pytest.mark.parametrize("value", [0, 1001, -1])
def test_gc_batch_keys_outside_1_to_1000_is_refused(value: int) -> None:
    with pytest.raises(ValidationError, match="gc_batch_keys"):
        Settings(gc_batch_keys=value)


def test_one_delete_request_per_batch_of_gc_batch_keys(runtime: Runtime) -> None:
    rt = runtime
    settings = rt.settings.model_copy(update={"gc_batch_keys": 3})
    keys = [f"k{n}" for n in range(7)]
    for key in keys[:4]:
        rt.objects.put(key, b"x")  # the other three are already gone: they count as deleted
    enqueue(rt, keys)
    counting = CountingStore(rt.objects)
    result = process_deletions(rt.metadata, OnlyStore(counting), settings)
    assert (result.deleted, result.failed, result.remaining) == (7, 0, 0)
    assert result.delete_requests == counting.requests["delete_many"] == 3
    assert list(rt.objects.list()) == []


def test_a_pass_does_not_retry_what_it_just_tried(runtime: Runtime) -> None:
    """No backoff configured: a failed key is due again at once, but not in the same pass."""
    rt = runtime
    assert rt.settings.delete_retry_base_seconds == 0
    enqueue(rt, ["a", "b"])
    failing = FaultyStore(rt.objects, delete_error=ObjectStoreError("503 SlowDown"))
    result = process_deletions(rt.metadata, OnlyStore(failing), rt.settings, limit=100)
    assert (result.deleted, result.failed, result.delete_requests) == (0, 2, 1)
    assert [d.tries for d in pending_deletions(rt.metadata)] == [1, 1]


def test_a_failing_store_keeps_the_work_then_the_queue_drains_when_it_recovers(
    runtime: Runtime,
) -> None:
    rt = runtime
    settings = rt.settings.model_copy(update={"gc_failing_tries": 3})
    keys = ["a", "b", "c"]
    for key in keys:
        rt.objects.put(key, b"x")
    enqueue(rt, keys)
    failing = FaultyStore(rt.objects, delete_error=ObjectStoreError("503 SlowDown"))
    for attempt in range(1, 4):
        result = process_deletions(rt.metadata, OnlyStore(failing), settings)
        assert (result.deleted, result.failed, result.remaining) == (0, 3, 3)
        assert result.backlog.failing_count == (3 if attempt >= 3 else 0)
    pending = pending_deletions(rt.metadata)
    assert [(d.object_key, d.tries) for d in pending] == [(k, 3) for k in keys]
    assert {d.last_error for d in pending} == {"ObjectStoreError: 503 SlowDown"}
    assert sorted(i.key for i in rt.objects.list()) == keys  # nothing deleted, nothing lost
    backlog = rt.metadata.deletions.backlog(3)
    assert (backlog.pending, backlog.due, backlog.failing_count) == (3, 3, 3)
    assert sorted(d.object_key for d in backlog.failing) == keys
    assert all(d.last_error == "ObjectStoreError: 503 SlowDown" for d in backlog.failing)

    recovered = process_deletions(rt.metadata, rt.stores, settings)
    assert (recovered.deleted, recovered.failed, recovered.remaining) == (3, 0, 0)
    assert recovered.backlog.failing == [] and recovered.backlog.oldest_age_ms is None
    assert list(rt.objects.list()) == []


def test_the_failing_list_is_capped_most_tried_first(runtime: Runtime) -> None:
    rt = runtime
    enqueue(rt, ["a", "b", "c", "d"])
    rows = {d.object_key: d for d in pending_deletions(rt.metadata)}
    for key, tries in (("a", 2), ("b", 4), ("c", 3), ("d", 1)):
        for _ in range(tries):
            retry_deletion_later(rt.metadata, rows[key], f"err {key}", 60_000)
    backlog = rt.metadata.deletions.backlog(failing_tries=2, failing_shown=2)
    assert (backlog.pending, backlog.due, backlog.failing_count) == (4, 0, 3)
    assert [(d.object_key, d.tries, d.last_error) for d in backlog.failing] == [
        ("b", 4, "err b"),
        ("c", 3, "err c"),
    ]


def test_the_oldest_item_is_aged_on_the_database_clock(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    assert rt.metadata.deletions.backlog(5).oldest_age_ms is None
    enqueue(rt, ["a"])
    enqueue(rt, ["b"])
    first, second = pending_deletions(rt.metadata)
    skew_worker_clock(monkeypatch, 5 * HOUR)  # a worker clock far ahead changes nothing
    backlog = rt.metadata.deletions.backlog(5)
    assert backlog.oldest_enqueued_ms == first.enqueued_ms <= second.enqueued_ms
    assert backlog.oldest_age_ms is not None and 0 <= backlog.oldest_age_ms < 60_000
    assert backlog.pending == 2


def test_due_deletions_are_read_through_the_index(runtime: Runtime) -> None:
    """The query plan uses ix_deletion_queue_due and needs no sort, so a batch costs its
    own rows, not the queue's history of done rows."""
    rt = runtime
    engine = rt.metadata.engine
    query = due_deletions_query(1000, db_now())
    sql = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
        else:
            conn.exec_driver_sql("SET enable_seqscan = off")  # an empty table is scanned
            plan = " ".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {sql}"))
    assert "ix_deletion_queue_due" in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan


def test_pending_count_is_a_count(runtime: Runtime) -> None:
    rt = runtime
    enqueue(rt, [f"k{n}" for n in range(5)])
    rt.metadata.deletions.complete([d.id for d in rt.metadata.deletions.due(2)])
    statements: list[str] = []
    sa.event.listen(rt.metadata.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    assert rt.metadata.deletions.count_pending() == 3
    (statement,) = [s for s in statements if "deletion_queue" in s]
    assert "count(" in statement.lower()


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_failed_key_is_due_again_one_millisecond_after_the_pass_began(runtime: Runtime) -> None:
    """With the database's clock standing still, the failure's own time equals the pass's
    start, so only the pass's floor (start + 1 ms) keeps the key from being retried, and
    failed again, over and over within the same pass."""
    rt = runtime
    assert rt.settings.delete_retry_base_seconds == 0
    enqueue(rt, ["a"])
    failing = FaultyStore(rt.objects, delete_error=ObjectStoreError("503 SlowDown"))
    now = rt.metadata.db_now_ms() + 1_000
    with stopped_sqlite_clock(rt.metadata.engine, now):
        result = process_deletions(rt.metadata, OnlyStore(failing), rt.settings, limit=50)
    assert (result.deleted, result.failed, result.delete_requests) == (0, 1, 1)
    (row,) = pending_deletions(rt.metadata)
    assert (row.tries, row.next_try_ms) == (1, now + 1)


def test_a_pass_takes_at_most_its_limit_across_batches(runtime: Runtime) -> None:
    rt = runtime
    settings = rt.settings.model_copy(update={"gc_batch_keys": 2})
    enqueue(rt, [f"k{n}" for n in range(6)])
    counting = CountingStore(rt.objects)
    result = process_deletions(rt.metadata, OnlyStore(counting), settings, limit=3)
    assert (result.deleted, result.remaining, result.delete_requests) == (3, 3, 2)


def test_failures_of_every_store_and_batch_are_summed(runtime: Runtime) -> None:
    rt = runtime
    settings = rt.settings.model_copy(update={"gc_batch_keys": 2})
    enqueue(rt, [f"k{n}" for n in range(5)])
    failing = FaultyStore(rt.objects, delete_error=ObjectStoreError("503 SlowDown"))
    result = process_deletions(rt.metadata, OnlyStore(failing), settings)
    assert (result.deleted, result.failed, result.delete_requests) == (0, 5, 3)


@pytest.mark.parametrize("limit", [0, -3])
def test_a_pass_limit_below_one_is_refused(runtime: Runtime, limit: int) -> None:
    rt = runtime
    enqueue(rt, ["a"])
    with pytest.raises(ValueError, match=rf"^limit must be >= 1, got {limit}$"):
        process_deletions(rt.metadata, rt.stores, rt.settings, limit=limit)
    assert len(pending_deletions(rt.metadata)) == 1


def test_keys_of_a_store_that_cannot_be_opened_stay_queued_with_the_reason(
    runtime: Runtime,
) -> None:
    """A row naming no store (written before revision 0002 and not upgraded) is not tried:
    no delete request, counted skipped (not failed, no try), and its error names the row."""
    rt = runtime
    rt.metadata.deletions.enqueue(["old"], "test", store_id=None)  # type: ignore[arg-type]
    enqueue(rt, ["a"])
    result = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (result.deleted, result.failed, result.delete_requests) == (1, 0, 1)
    assert result.skipped == 1 and len(result.skipped_stores) == 1
    (row,) = pending_deletions(rt.metadata)
    assert row.object_key == "old" and row.tries == 0
    assert (row.last_error or "").startswith(f"queued deletion {row.id} names no object store")
