"""Offload, hot deletion, planning and gc on a worker whose clock is an hour off.

The decisions (is the lease over, has the lag passed, is the ledger old enough, is the
deletion due) follow the database's clock (invariant 6). Both backend pairings.
"""

import time

import pytest

from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from fixtures.clock import HOUR, skew_worker_clock
from fixtures.metadata import list_attempts, pending_deletions
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.offload.runs import plan_batches
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime


def _peer_attempt(rt: Runtime, ledger_id: int, lease_ms: int):  # type: ignore[no-untyped-def]
    """Another worker's attempt on the ledger, recorded with a correct clock."""
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    _, attempt = rt.metadata.attempts.begin(
        ledger,
        "0" * 8 + "-peer",
        "peer-data",
        "peer-index",
        "peer",
        lease_ms,
        store_id=rt.stores.default_id(),
    )
    return attempt


def test_worker_ahead_reports_a_live_attempt_in_progress(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    make_topic(rt)
    (ledger_id,) = produce_ledgers(rt, "orders", [(10, 1000)])
    peer = _peer_attempt(rt, ledger_id, lease_ms=60_000)
    skew_worker_clock(monkeypatch, HOUR)
    offloader = LedgerOffloader(rt)
    result = offloader.offload_ledger("orders", ledger_id)
    assert (result.outcome, result.attempt_id) == (Outcome.IN_PROGRESS, peer.attempt_id)
    assert [r.outcome for r in offloader.offload_topic("orders", up_to=ledger_id)] == [
        Outcome.IN_PROGRESS
    ]
    assert rt.metadata.get_ledger("orders", ledger_id).attempt_id == peer.attempt_id
    assert [a.attempt_id for a in list_attempts(rt.metadata, "orders")] == [peer.attempt_id]
    assert rt.metadata.attempts.get(peer.attempt_id).state is AttemptState.STARTED
    assert pending_deletions(rt.metadata) == []


def test_worker_behind_takes_over_an_expired_attempt(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    make_topic(rt)
    (ledger_id,) = produce_ledgers(rt, "orders", [(10, 1000)])
    before = TopicReader(rt).checksum("orders", Source.HOT)
    peer = _peer_attempt(rt, ledger_id, lease_ms=50)
    time.sleep(0.2)  # the peer's lease is over by the database's clock
    skew_worker_clock(monkeypatch, -HOUR)
    result = LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    assert result.outcome is Outcome.OFFLOADED
    assert rt.metadata.attempts.get(peer.attempt_id).state is AttemptState.SUPERSEDED
    assert rt.metadata.get_ledger("orders", ledger_id).offload_attempt_id == result.attempt_id
    assert TopicReader(rt).checksum("orders", Source.TIERED) == before
    assert unaccounted_objects(rt) == set()


def test_worker_ahead_keeps_hot_copies_until_the_lag_has_passed(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    make_topic(rt, deletion_lag_seconds=600)
    ids = produce_ledgers(rt, "orders", [(10, 1000), (10, 1000)])
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[-1])
    skew_worker_clock(monkeypatch, HOUR)  # by this clock the 10 minutes passed long ago
    assert delete_hot_copies(rt.metadata, rt.hot, "orders", dry_run=True) == []
    assert delete_hot_copies(rt.metadata, rt.hot, "orders") == []
    assert all(rt.hot.exists("orders", i) for i in ids)


def test_worker_behind_plans_by_database_time(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    make_topic(rt, offload_age_seconds=0)
    ids = produce_ledgers(rt, "orders", [(10, 1000), (10, 1000)])
    skew_worker_clock(monkeypatch, -HOUR)  # by this clock the ledgers are sealed in an hour
    offloader = LedgerOffloader(rt)
    assert [x.ledger_id for x in offloader.plan("orders")] == ids  # sealed 0 s ago is due
    assert [b.ledger_ids for b in plan_batches(rt.metadata, "orders", None, 10)] == [ids]
    assert [r.outcome for r in offloader.offload_topic("orders")] == [Outcome.OFFLOADED] * 2


def test_worker_behind_deletes_hot_copies_whose_lag_has_passed(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    make_topic(rt, deletion_lag_seconds=0)
    ids = produce_ledgers(rt, "orders", [(10, 1000), (10, 1000)])
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[-1])
    skew_worker_clock(monkeypatch, -HOUR)  # by this clock the commits lie in the future
    deleted = delete_hot_copies(rt.metadata, rt.hot, "orders")
    assert sorted(d.ledger_id for d in deleted) == ids
    assert not any(rt.hot.exists("orders", i) for i in ids)


def test_worker_behind_drains_due_deletions(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    rt.objects.put("leftover", b"x")
    rt.metadata.deletions.enqueue(["leftover"], "test", store_id=rt.stores.default_id())
    skew_worker_clock(monkeypatch, -HOUR)  # by this clock the deletion is due in an hour
    assert process_deletions(rt.metadata, rt.stores, rt.settings).deleted == 1
    assert [i.key for i in rt.objects.list()] == []
