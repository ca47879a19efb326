"""The tiered-storage view's numbers: per-topic tiers, deletions and the derived history, on
both backends, through a ledger's whole life (hot, offloaded, hot copy gone, trimmed, GC'd)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from fixtures.backends import make_topic, produce_ledgers
from fixtures.metadata import begin, file_store_id, sealed_ledger
from offloader.gc.deletion_queue import drain_queue
from offloader.metadata import MetadataStore, schema
from offloader.metadata.records import Position
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime
from offloader.status import (
    LagSample,
    TierSample,
    _thin,
    lag_history,
    tier_history,
    tiers_report,
)


def tiers(rt: Runtime) -> dict[str, tuple[int, int, int, int, int]]:
    return {
        t.topic: (
            t.hot_ledgers,
            t.hot_bytes,
            t.offloaded_ledgers,
            t.offloaded_bytes,
            t.pending_deletions,
        )
        for t in rt.metadata.topic_tiers()
    }


def test_a_ledgers_life_moves_its_bytes_between_tiers(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, "orders")
    make_topic(rt, "empty")
    ids = produce_ledgers(rt, "orders", [(40, 3000), (30, 3000), (20, 3000)])
    size = {x.ledger_id: x.size_bytes for x in rt.metadata.list_ledgers("orders")}
    assert all(size[i] > 0 for i in ids)
    total = sum(size.values())
    assert tiers(rt) == {"empty": (0, 0, 0, 0, 0), "orders": (len(size), total, 0, 0, 0)}

    LedgerOffloader(rt).offload_topic("orders", up_to=ids[1])
    data = {i: rt.metadata.get_ledger("orders", i).data_len for i in ids[:2]}
    assert all(data.values())
    offloaded = sum(data.values())
    assert tiers(rt)["orders"] == (len(size), total, 2, offloaded, 0)

    delete_hot_copies(rt.metadata, rt.hot, "orders")
    hot = total - size[ids[0]] - size[ids[1]]
    assert tiers(rt)["orders"] == (len(size) - 2, hot, 2, offloaded, 0)

    trim_topic(rt, "orders", Position(ledger_id=ids[1], entry_id=0))
    # ledger 1 is deleting: its objects are queued under the topic, still counted offloaded
    state = rt.metadata.topic_tiers()[1]
    assert (state.offloaded_ledgers, state.pending_deletions) == (2, 2)
    assert state.oldest_pending_deletion_ms is not None
    report = tiers_report(rt.metadata, rt.settings.gc_failing_tries)
    assert report.deletion_backlog.pending == 2
    assert report.history[-1].hot_bytes == hot
    assert report.history[-1].offloaded_bytes == offloaded

    lags = report.lag_history
    assert lags[-1] == LagSample(
        at_ms=lags[-1].at_ms, offload_lag_bytes=size[ids[2]], deletion_backlog=2
    )
    assert max(s.offload_lag_bytes for s in lags) == total  # all sealed, none offloaded yet
    drain_queue(rt.metadata, rt.stores, rt.settings)
    assert rt.metadata.retention.finish_deleted_ledgers() == 1
    assert tiers(rt)["orders"] == (len(size) - 2, hot, 1, data[ids[1]], 0)

    history = tier_history(rt.metadata)
    assert [s.at_ms for s in history] == sorted({s.at_ms for s in history})
    assert max(s.hot_bytes for s in history) == total  # all hot before the first offload
    assert max(s.offloaded_bytes for s in history) == offloaded
    assert (history[-1].hot_bytes, history[-1].offloaded_bytes) == (hot, data[ids[1]])


def test_history_of_an_empty_store_is_empty(runtime: Runtime) -> None:
    assert tier_history(runtime.metadata) == []
    assert lag_history(runtime.metadata) == []
    assert tiers_report(runtime.metadata, 5).topics == []


def test_thinning_keeps_the_first_and_last_samples() -> None:
    samples = [TierSample(at_ms=i, hot_bytes=i, offloaded_bytes=0) for i in range(1000)]
    thin = _thin(samples, 10)
    assert len(thin) == 10
    assert (thin[0].at_ms, thin[-1].at_ms) == (0, 999)
    assert _thin(samples[:5], 10) == samples[:5]
    with pytest.raises(ValueError, match="points must be >= 2, got 1"):
        _thin(samples, 1)


def test_an_attempts_leftovers_count_for_its_topic_and_sweep_orphans_for_none(
    runtime: Runtime,
) -> None:
    rt = runtime
    make_topic(rt, "orders")
    [ledger_id] = produce_ledgers(rt, "orders", [(10, 1000)])
    LedgerOffloader(rt).offload_topic("orders", up_to=ledger_id)
    ledger = rt.metadata.get_ledger("orders", ledger_id)
    assert ledger.offload_attempt_id and ledger.store_id is not None
    rt.metadata.deletions.enqueue(
        ["a/data", "a/index"],
        "lost attempt",
        store_id=ledger.store_id,
        attempt_id=ledger.offload_attempt_id,
    )
    rt.metadata.deletions.enqueue(["orphan"], "sweep", store_id=ledger.store_id)
    [orders] = rt.metadata.topic_tiers()
    assert orders.pending_deletions == 2
    assert tiers_report(rt.metadata, 5).deletion_backlog.pending == 3


def stamp(store: MetadataStore, table: sa.Table, where: sa.ColumnElement, **values: int) -> None:
    """Known times on rows whose writers stamped the database's clock."""
    with store.transaction() as conn:
        assert conn.execute(table.update().where(where).values(**values)).rowcount == 1


def test_the_lag_history_of_a_constructed_past(runtime: Runtime) -> None:
    """Two ledgers sealed at 1000 and 2000 (100 and 200 bytes), the first offloaded at
    3000; two keys queued at 2000 and 4000, the first done at 5000. One sample per
    distinct time, cumulative; ``points`` thins it keeping the first and the last."""
    store = runtime.metadata
    first, second = sealed_ledger(store, "t", 100), sealed_ledger(store, "t", 200)
    L, D = schema.ledgers, schema.deletion_queue
    _, attempt = begin(store, first, "a1")
    store.attempts.commit(attempt, 10)
    stamp(store, L, L.c.ledger_id == first.ledger_id, sealed_ms=1000, offloaded_ms=3000)
    stamp(store, L, L.c.ledger_id == second.ledger_id, sealed_ms=2000)
    store.deletions.enqueue(["a", "b"], "sweep", store_id=file_store_id(store))
    stamp(store, D, D.c.object_key == "a", enqueued_ms=2000)
    stamp(store, D, D.c.object_key == "b", enqueued_ms=4000)
    [a] = [d for d in store.deletions.due(10, at_ms=10**15) if d.object_key == "a"]
    store.deletions.complete([a.id])
    stamp(store, D, D.c.object_key == "a", done_ms=5000)

    assert [(s.at_ms, s.offload_lag_bytes, s.deletion_backlog) for s in lag_history(store)] == [
        (1000, 100, 0),
        (2000, 300, 1),
        (3000, 200, 1),
        (4000, 200, 2),
        (5000, 200, 1),
    ]
    thin = lag_history(store, points=3)
    assert [s.at_ms for s in thin] == [1000, 3000, 5000]
