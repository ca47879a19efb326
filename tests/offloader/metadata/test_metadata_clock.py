"""Leases and ages on the database's clock (invariant 6), with a worker whose clock is wrong.

Every test skews this process's clock by an hour, ahead or behind; the database's clock
(PostgreSQL's server, SQLite's read of the OS clock) is right. Both databases.
"""

import time

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import CompileError

from fixtures.clock import HOUR, database_time_ms, skew_worker_clock, stopped_sqlite_clock
from fixtures.metadata import (
    begin,
    file_store_id,
    pending_deletions,
    retry_deletion_later,
    sealed_ledger,
)
from offloader.exceptions import CommitFailedError
from offloader.metadata import AttemptState, HotState, MetadataStore
from offloader.metadata.clock import db_now

LEASE_MS = 60_000
TOLERANCE_MS = 5_000  # a loaded test machine; an hour of skew is far outside it


def test_lease_ends_at_database_time_plus_lease(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    skew_worker_clock(monkeypatch, HOUR)
    before = database_time_ms(store.engine)
    ledger, attempt = begin(store, sealed_ledger(store), "a1", lease_ms=LEASE_MS)
    assert 0 <= ledger.attempt_lease_ms - (before + LEASE_MS) <= TOLERANCE_MS
    # what the store records is the database's time too, not this worker's
    assert 0 <= ledger.sealed_ms - before <= TOLERANCE_MS
    assert 0 <= store.attempts.get("a1").created_ms - before <= TOLERANCE_MS

    assert store.attempts.renew(attempt, 2 * LEASE_MS)
    renewed = store.get_ledger("t", ledger.ledger_id).attempt_lease_ms
    assert 0 <= renewed - (before + 2 * LEASE_MS) <= TOLERANCE_MS
    assert abs(store.db_now_ms() - database_time_ms(store.engine)) <= TOLERANCE_MS


def test_worker_ahead_cannot_supersede_a_live_attempt(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, live = begin(store, sealed_ledger(store), "live", lease_ms=LEASE_MS)
    skew_worker_clock(monkeypatch, HOUR)  # by this worker's clock the lease ended long ago
    with pytest.raises(CommitFailedError, match="in flight until its lease ends"):
        begin(store, ledger, "usurper")
    current = store.get_ledger("t", ledger.ledger_id)
    assert (current.attempt_id, current.version) == ("live", ledger.version)
    assert store.attempts.get("live").state is AttemptState.STARTED
    assert pending_deletions(store) == []
    assert store.attempts.commit(live, 1).offload_attempt_id == "live"


def test_worker_behind_supersedes_an_expired_attempt(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, stale = begin(store, sealed_ledger(store), "stale", lease_ms=50)
    time.sleep(0.2)  # the lease is over by the database's clock
    skew_worker_clock(monkeypatch, -HOUR)  # by this worker's clock it has an hour to go
    ledger, fresh = begin(store, ledger, "fresh")
    assert fresh.epoch == stale.epoch + 1 and ledger.attempt_id == "fresh"
    assert store.attempts.get("stale").state is AttemptState.SUPERSEDED
    assert {d.object_key for d in pending_deletions(store)} == {"stale-d", "stale-i"}


def test_hot_copy_is_not_marked_before_the_lag_on_database_time(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger, attempt = begin(store, sealed_ledger(store), "a1")
    ledger = store.attempts.commit(attempt, 1)
    skew_worker_clock(monkeypatch, HOUR)
    with pytest.raises(CommitFailedError) as refused:
        store.mark_hot_deleting(ledger, deletion_lag_ms=600_000)
    assert str(refused.value).endswith(
        f"t/{ledger.ledger_id} was offloaded less than its deletion lag of 600000 ms ago "
        "(database clock); its hot copy stays"
    ), str(refused.value)
    assert store.get_ledger("t", ledger.ledger_id).hot_state is HotState.PRESENT
    assert store.mark_hot_deleting(ledger, deletion_lag_ms=0).hot_state is HotState.DELETING


def test_deletion_queue_is_due_by_database_time(
    store: MetadataStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_id = file_store_id(store)
    store.deletions.enqueue(["k1", "k2"], "test", store_id=store_id)
    skew_worker_clock(monkeypatch, -HOUR)  # by this worker's clock they are not due for an hour
    due = store.deletions.due(10)
    assert [d.object_key for d in due] == ["k1", "k2"]
    skew_worker_clock(monkeypatch, HOUR)  # now an hour ahead: a 60 s backoff must still hold
    retry_deletion_later(store, due[0], "503 SlowDown", delay_ms=LEASE_MS)
    assert [d.object_key for d in store.deletions.due(10)] == ["k2"]
    (retried,) = [d for d in pending_deletions(store) if d.object_key == "k1"]
    assert abs(retried.next_try_ms - (database_time_ms(store.engine) + LEASE_MS)) <= TOLERANCE_MS


def test_a_renewal_between_look_and_takeover_keeps_the_attempt(store: MetadataStore) -> None:
    """The lease check and the takeover are one conditional update: a ledger read while the
    lease looked over does not win once the owner has renewed."""
    ledger, live = begin(store, sealed_ledger(store), "live", lease_ms=50)
    time.sleep(0.2)
    seen = store.get_ledger("t", ledger.ledger_id)  # the lease looks over
    assert seen.attempt_lease_ms <= time.time() * 1000  # no skew here: one clock
    assert store.attempts.renew(live, LEASE_MS)  # the owner renews meanwhile
    with pytest.raises(CommitFailedError, match="in flight until its lease ends"):
        begin(store, seen, "usurper")
    assert store.get_ledger("t", ledger.ledger_id).attempt_id == "live"
    assert store.attempts.get("live").state is AttemptState.STARTED
    assert pending_deletions(store) == []


def test_a_database_without_a_clock_expression_is_named() -> None:
    with pytest.raises(CompileError, match="no clock expression for the 'mysql' database"):
        sa.select(db_now()).compile(dialect=mysql.dialect())


@pytest.mark.parametrize("metadata_url", ["sqlite"], indirect=True)  # SQLite's clock stops
def test_the_deletion_lag_ends_exactly_at_commit_plus_lag(store: MetadataStore) -> None:
    ledger, attempt = begin(store, sealed_ledger(store), "a1")
    ledger = store.attempts.commit(attempt, 1)
    assert ledger.offloaded_ms is not None
    lag = 60_000
    with (
        stopped_sqlite_clock(store.engine, ledger.offloaded_ms + lag - 1),
        pytest.raises(CommitFailedError, match="deletion lag of 60000 ms"),
    ):
        store.mark_hot_deleting(ledger, deletion_lag_ms=lag)
    with stopped_sqlite_clock(store.engine, ledger.offloaded_ms + lag):
        assert store.mark_hot_deleting(ledger, deletion_lag_ms=lag).hot_state is HotState.DELETING


@pytest.mark.parametrize("metadata_url", ["sqlite"], indirect=True)  # SQLite's clock stops
def test_a_lease_ends_exactly_at_its_recorded_end(store: MetadataStore) -> None:
    """A lease is over once the database's now reaches its end, not one millisecond later."""
    ledger, _ = begin(store, sealed_ledger(store), "old")
    assert ledger.attempt_lease_ms is not None
    with (
        stopped_sqlite_clock(store.engine, ledger.attempt_lease_ms - 1),
        pytest.raises(CommitFailedError, match="in flight until its lease ends"),
    ):
        begin(store, ledger, "early")
    with stopped_sqlite_clock(store.engine, ledger.attempt_lease_ms):
        assert begin(store, ledger, "new")[0].attempt_id == "new"
    assert store.attempts.get("old").state is AttemptState.SUPERSEDED
