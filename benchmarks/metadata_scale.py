"""Cost that does not grow with history: the offload plan and one GC batch over a topic of
10,000 / 100,000 / 1,000,000 ledger rows on PostgreSQL (quick: 1,000 / 10,000 / 100,000).

Each size gets a fresh database, filled with SQL (``generate_series``), shaped like a long
lived topic: every ledger but the newest ``HOT`` is offloaded with its hot copy deleted;
the newest ``HOT`` are sealed and still hot (so the plan has work: the topic's size rule
makes them due); the deletion queue holds one done row per offloaded ledger (its history)
plus ``PENDING`` pending rows. Measured, best of ``REPEATS``:

- plan: ``plan_batches`` (what the DAG's plan task runs) for the topic;
- one GC batch: ``deletions.due(1000)`` + ``deletions.complete`` of them (each repeat takes
  the next 1,000 pending rows).

Time is wall-clock seconds; peak memory is Python's allocations during the call
(tracemalloc, in a separate call so tracing does not slow the timed one). Flat = the same
at every size.

Run alone: ``python -m benchmarks.metadata_scale [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from benchmarks import use_test_fixtures
from benchmarks.scale import growth, measure
from offloader.metadata.store import MetadataStore
from offloader.offload.runs import plan_batches
from offloader.policy import OffloadPolicy
from offloader.settings import Settings

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000, 100_000)
HOT = 50  # sealed ledgers still in the hot tier
PENDING = 5_000  # queued deletions not yet done
REPEATS = 3
LEDGER_BYTES = 1 << 20
TOPIC = "history"


def _fill(metadata: MetadataStore, rows: int) -> None:
    """``rows`` ledgers and ``rows - HOT + PENDING`` queue rows, in a few SQL statements."""
    policy = OffloadPolicy(offload_threshold_bytes=0)
    metadata.create_topic(TOPIC, policy)
    store_id = metadata.record_location(_location())
    offloaded = rows - HOT
    with metadata.transaction() as conn:
        conn.exec_driver_sql(
            """
            INSERT INTO ledgers (topic, ledger_id, version, state, entry_count, size_bytes,
                created_ms, sealed_ms, offload_state, offload_epoch, attempt_id,
                attempt_lease_ms, offload_uuid, data_key, index_key, data_len, offloaded_ms,
                hot_state, hot_deleted_ms, store_id)
            SELECT %(topic)s, n, 3, 'sealed', 1000, %(bytes)s, n, n,
                CASE WHEN n <= %(offloaded)s THEN 'offloaded' ELSE 'none' END, 1, NULL, NULL,
                CASE WHEN n <= %(offloaded)s THEN md5(n::text) END,
                CASE WHEN n <= %(offloaded)s THEN 'data/' || n END,
                CASE WHEN n <= %(offloaded)s THEN 'index/' || n END,
                CASE WHEN n <= %(offloaded)s THEN %(bytes)s END,
                CASE WHEN n <= %(offloaded)s THEN n END,
                CASE WHEN n <= %(offloaded)s THEN 'deleted' ELSE 'present' END,
                CASE WHEN n <= %(offloaded)s THEN n END,
                CASE WHEN n <= %(offloaded)s THEN %(store)s END
            FROM generate_series(1, %(rows)s) AS n
            """,
            {
                "topic": TOPIC,
                "bytes": LEDGER_BYTES,
                "offloaded": offloaded,
                "rows": rows,
                "store": store_id,
            },
        )
        conn.execute(
            sa.text("UPDATE topics SET next_ledger_id = :next WHERE name = :topic"),
            {"next": rows + 1, "topic": TOPIC},
        )
        conn.exec_driver_sql(
            """
            INSERT INTO deletion_queue (object_key, reason, attempt_id, state, enqueued_ms,
                tries, next_try_ms, last_error, done_ms, store_id)
            SELECT 'old/' || n, 'history',  NULL,
                CASE WHEN n <= %(done)s THEN 'done' ELSE 'pending' END, n, 0, n, NULL,
                CASE WHEN n <= %(done)s THEN n END, %(store)s
            FROM generate_series(1, %(total)s) AS n
            """,
            {"done": offloaded, "total": offloaded + PENDING, "store": store_id},
        )
    with metadata.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")


def _location() -> Any:
    from offloader.objectstore.location import StoreLocation

    return StoreLocation("s3", "bench-metadata-scale", "", "")


def _gc_batch(metadata: MetadataStore) -> Callable[[], None]:
    def one() -> None:
        due = metadata.deletions.due(1000)
        assert len(due) == 1000, len(due)
        metadata.deletions.complete(d.id for d in due)

    return one


def _one_size(url: str, rows: int) -> dict[str, Any]:
    from offloader.runtime import upgrade_database

    upgrade_database(Settings(metadata_url=url))
    metadata = MetadataStore.open(url)
    try:
        start = time.perf_counter()
        _fill(metadata, rows)
        fill_s = time.perf_counter() - start
        planned: list[int] = []

        def plan() -> None:
            batches = plan_batches(metadata, TOPIC, None, 500)
            planned[:] = [i for b in batches for i in b.ledger_ids]

        result = {
            "rows": rows,
            "fill_seconds": round(fill_s, 1),
            "plan": measure(plan, REPEATS),
            "gc_batch": measure(_gc_batch(metadata), REPEATS),
        }
        assert planned == list(range(rows - HOT + 1, rows + 1)), planned[:5]
        return result
    finally:
        metadata.close()


def run(quick: bool = False) -> dict:
    """Every size on PostgreSQL; skipped without PostgreSQL."""
    use_test_fixtures()
    from fixtures.databases import postgres_unreachable, temporary_database

    if postgres_unreachable():
        return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
    sizes = QUICK_SIZES if quick else SIZES
    by_size = []
    for rows in sizes:
        with temporary_database("offloader_bench") as url:
            by_size.append(_one_size(url, rows))
    return {
        "hot_ledgers": HOT,
        "pending_deletions": PENDING,
        "repeats": REPEATS,
        "sizes": by_size,
        **growth(by_size, ("plan", "gc_batch")),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
