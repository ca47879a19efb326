"""Planning and hot deletion read only the ledgers they can act on (selected in SQL), and
plan exactly what the planner plans over the whole topic."""

from __future__ import annotations

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.metadata import created_at
from offloader.metadata import HotState, Ledger
from offloader.offload.hot_deletion import delete_hot_copies, hot_copies_due
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.offload.planner import CreationWindow, due_ledgers
from offloader.offload.runs import plan_batches
from offloader.runtime import Runtime

DAY = 86_400_000


def test_plan_and_hot_deletion_see_only_ledgers_with_a_hot_copy(runtime: Runtime) -> None:
    rt = runtime
    make_topic(rt, offload_threshold_bytes=0, deletion_lag_seconds=3600)
    ids = produce_ledgers(rt, "orders", [(5, 100)] * 6)
    offloader = LedgerOffloader(rt)
    offloader.offload_topic("orders", up_to=ids[3])  # 1..4 offloaded, hot copies kept
    for ledger in rt.metadata.list_ledgers("orders")[:2]:  # 1..2: hot copies deleted
        rt.metadata.mark_hot_deleted(rt.metadata.mark_hot_deleting(ledger))

    everything = rt.metadata.list_ledgers("orders")
    assert [x.hot_state for x in everything[:2]] == [HotState.DELETED] * 2
    not_offloaded = rt.metadata.ledgers_with_hot_copy("orders", offloaded=False)
    offloaded = rt.metadata.ledgers_with_hot_copy("orders", offloaded=True)
    assert [x.ledger_id for x in not_offloaded] == ids[4:]
    assert [x.ledger_id for x in offloaded] == ids[2:4]
    assert [x.ledger_id for x in rt.metadata.ledgers_with_hot_copy("orders")] == [
        x.ledger_id for x in everything[2:]
    ]

    now = rt.metadata.db_now_ms()
    policy = rt.metadata.get_topic("orders").policy
    assert offloader.plan("orders") == due_ledgers(everything, policy, now)
    assert [x.ledger_id for x in offloader.plan("orders")] == ids[4:]
    later = now + 2 * 3600 * 1000
    assert hot_copies_due(offloaded, 3600, later) == hot_copies_due(everything, 3600, later)
    assert delete_hot_copies(rt.metadata, rt.hot, "orders", dry_run=True) == []  # lag not over


def record_loaded(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ids of the ledgers ``ledgers_with_hot_copy`` hands out (the real store's answer),
    in the order asked, from now on."""
    loaded: list[int] = []
    real = rt.metadata.ledgers_with_hot_copy

    def recording(topic: str, **kwargs: object) -> list[Ledger]:
        ledgers = real(topic, **kwargs)  # type: ignore[arg-type]
        loaded.extend(x.ledger_id for x in ledgers)
        return ledgers

    monkeypatch.setattr(rt.metadata, "ledgers_with_hot_copy", recording)
    return loaded


def test_batch_planning_loads_only_ledgers_not_yet_offloaded(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan_batches (the DAG's planning task) and LedgerOffloader.plan ask the store for
    the ledgers with a hot copy that are not offloaded: the offloaded ones whose hot copies
    wait for their lag would plan nothing and only cost reading. A creation window (a
    backfill) reads only the ledgers created inside it."""
    rt = runtime
    make_topic(rt, offload_threshold_bytes=0, deletion_lag_seconds=3600)
    ids = produce_ledgers(rt, "orders", [(5, 100)] * 4)
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[1])  # hot copies kept (the lag)
    loaded = record_loaded(rt, monkeypatch)
    batches = plan_batches(rt.metadata, "orders", None, 10)
    assert [(b.topic, b.ledger_ids) for b in batches] == [("orders", ids[2:])]
    assert loaded == ids[2:]
    loaded.clear()
    assert [x.ledger_id for x in LedgerOffloader(rt).plan("orders")] == ids[2:]
    assert loaded == ids[2:]

    created_at(rt.metadata, "orders", {ids[2]: DAY, ids[3]: 2 * DAY})
    loaded.clear()
    window = CreationWindow(DAY, 2 * DAY)
    batches = plan_batches(rt.metadata, "orders", None, 10, window=window)
    assert [(b.topic, b.ledger_ids) for b in batches] == [("orders", [ids[2]])]
    assert loaded == [ids[2]]  # not ids[3], which the window would drop after reading it


def test_hot_deletion_loads_only_offloaded_ledgers(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hot copy is deleted only after its offload: the ledgers not offloaded yet are not
    read at all (whatever their number), not read and then dropped."""
    rt = runtime
    make_topic(rt, offload_threshold_bytes=0, deletion_lag_seconds=0)
    ids = produce_ledgers(rt, "orders", [(5, 100)] * 4)
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[1])
    loaded = record_loaded(rt, monkeypatch)
    deleted = delete_hot_copies(rt.metadata, rt.hot, "orders", dry_run=True)
    assert [x.ledger_id for x in deleted] == ids[:2]
    assert loaded == ids[:2]
