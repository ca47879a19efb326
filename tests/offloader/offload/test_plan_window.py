"""Planning a creation-time window against the database (SQLite and PostgreSQL): the
ledgers created in it are read in SQL and planned whatever the policy; what the planner
always refuses (offloaded, trimmed, open) stays refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from fixtures.metadata import begin, created_at, sealed_ledger
from offloader.metadata import MetadataStore, Position, schema
from offloader.offload.planner import CreationWindow
from offloader.offload.runs import Batch, plan_batches
from offloader.policy import OffloadPolicy

DAY_MS = 86_400_000
DAY1 = 20_000 * DAY_MS  # 2024-10-04T00:00Z: any midnight will do


@pytest.fixture
def store(metadata_url: str) -> Iterator[MetadataStore]:
    store = MetadataStore.open(metadata_url)
    yield store
    store.close()


def test_a_window_plans_exactly_the_ledgers_created_in_it(store: MetadataStore) -> None:
    orders = [sealed_ledger(store, "orders", 100).ledger_id for _ in range(6)]
    clicks = [sealed_ledger(store, "clicks", 100).ledger_id for _ in range(2)]
    # orders: one per half day over three days; clicks: day 1 and day 3
    created_at(store, "orders", {i: DAY1 + n * DAY_MS // 2 for n, i in enumerate(orders)})
    created_at(store, "clicks", {clicks[0]: DAY1 + 5, clicks[1]: DAY1 + 2 * DAY_MS})
    open_one = store.allocate_ledger("orders", store.get_topic("orders").writer_epoch)
    created_at(store, "orders", {open_one.ledger_id: DAY1 + DAY_MS})  # open: never planned

    day2 = CreationWindow(DAY1 + DAY_MS, DAY1 + 2 * DAY_MS)
    assert plan_batches(store, None, None, 500, None, day2) == [Batch("orders", orders[2:4], 200)]
    days_1_2 = CreationWindow(DAY1, DAY1 + 2 * DAY_MS)
    assert plan_batches(store, None, None, 3, None, days_1_2) == [
        Batch("clicks", clicks[:1], 100),
        Batch("orders", orders[:3], 300),
        Batch("orders", orders[3:4], 100),
    ]
    assert plan_batches(store, "clicks", None, 500, None, days_1_2) == [
        Batch("clicks", clicks[:1], 100)
    ]
    # the rules say nothing is due (no thresholds): without a window nothing is planned
    assert plan_batches(store, None, None, 500) == []
    # the database returns only the window's ledgers
    read = store.ledgers_with_hot_copy(
        "orders", offloaded=False, created=(day2.start_ms, day2.end_ms)
    )
    assert [x.ledger_id for x in read] == [*orders[2:4], open_one.ledger_id]


def test_a_window_skips_offloaded_and_trimmed_ledgers(store: MetadataStore) -> None:
    ids = [sealed_ledger(store, "orders", 100).ledger_id for _ in range(4)]
    created_at(store, "orders", dict.fromkeys(ids, DAY1 + 1))
    _, attempt = begin(store, store.get_ledger("orders", ids[2]), "a-1")
    store.attempts.commit(attempt, 10)
    topic = store.get_topic("orders")
    store.retention.move_start(topic, Position(ledger_id=ids[1], entry_id=0))  # ids[0] is trimmed

    window = CreationWindow(DAY1, DAY1 + DAY_MS)
    assert plan_batches(store, "orders", None, 500, None, window) == [
        Batch("orders", [ids[1], ids[3]], 200)
    ]


def test_a_window_of_a_day_without_ledgers_plans_nothing(store: MetadataStore) -> None:
    ids = [sealed_ledger(store, "orders", 100).ledger_id for _ in range(2)]
    created_at(store, "orders", dict.fromkeys(ids, DAY1))
    empty_day = CreationWindow(DAY1 + DAY_MS, DAY1 + 2 * DAY_MS)
    assert plan_batches(store, None, None, 500, None, empty_day) == []


def test_a_window_that_is_not_a_creation_window_is_refused(store: MetadataStore) -> None:
    with pytest.raises(TypeError, match="window must be a CreationWindow"):
        plan_batches(store, None, None, 500, None, (0, 1))  # type: ignore[arg-type]


@pytest.mark.parametrize("metadata_url", ["postgres"], indirect=True)
def test_a_window_is_served_by_an_index_on_postgresql(store: MetadataStore) -> None:
    """With enough rows to make a scan costly, PostgreSQL picks ix_ledgers_created."""
    L = schema.ledgers
    store.create_topic("orders", OffloadPolicy())
    with store.transaction() as conn:
        conn.execute(
            L.insert(),
            [
                dict(
                    topic="orders",
                    ledger_id=i,
                    version=1,
                    state="sealed",
                    entry_count=1,
                    size_bytes=1,
                    created_ms=DAY1 + i * 1000,
                    sealed_ms=DAY1,
                    offload_state="none",
                    offload_epoch=0,
                    hot_state="present",
                )
                for i in range(20_000)
            ],
        )
        conn.exec_driver_sql("ANALYZE ledgers")
    query = sa.select(L).where(
        L.c.topic == "orders",
        L.c.hot_state.in_(["present", "deleting"]),
        L.c.offload_state.in_(["none", "offloading"]),
        L.c.created_ms >= DAY1,
        L.c.created_ms < DAY1 + 60_000,
    )
    with store.engine.connect() as conn:
        compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
        plan = "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {compiled}"))
    assert "ix_ledgers_created" in plan, plan
