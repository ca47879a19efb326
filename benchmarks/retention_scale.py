"""Retention's cost does not grow with history: planning ``apply_retention`` over a topic
of 10,000 / 100,000 / 1,000,000 ledger rows on PostgreSQL (quick: 1,000 / 10,000 /
100,000).

Each size gets a fresh database, filled with SQL (``generate_series``), shaped like a
long-lived topic under retention: every ledger but the newest ``LIVE`` was trimmed long
ago (``deleted``, below the topic's start); the live ones are offloaded, the newest
``HOT`` of them still hot; a cut was taken every ``CUT_EVERY`` ledgers across the whole
history, a minute apart. The policy (time and size at once) truncates ``TRIMMED``
ledgers above the start, at every size. Measured, best of ``REPEATS``:

- plan: ``apply_retention(dry_run=True)``: the end of the topic and its committed bytes,
  both rules' cuts selected in SQL, and the trim's plan (the ledgers it would mark and the
  keys it would queue);
- cut: ``take_cut`` (the "retention cut generation" task's work for one topic).

Time is wall-clock seconds; peak memory is Python's allocations during one more call
(tracemalloc, apart from the timed calls). Flat = the same at every size.

Run alone: ``python -m benchmarks.retention_scale [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from benchmarks import use_test_fixtures
from benchmarks.scale import growth, measure
from offloader.objectstore.location import StoreLocation
from offloader.policy import OffloadPolicy
from offloader.retention.cuts import take_cut
from offloader.retention.run import apply_retention
from offloader.runtime import Runtime, upgrade_database
from offloader.settings import Settings

SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000, 100_000)
LIVE = 500  # ledgers at or above the start
HOT = 50  # the newest live ledgers, not yet offloaded
CUT_EVERY = 10  # a cut every this many ledgers, over the whole history
TRIMMED = 100  # what the policy truncates above the start
REPEATS = 3
LEDGER_BYTES = 1 << 20
MINUTE_MS = 60_000
TOPIC = "history"


def _fill(rt: Runtime, rows: int) -> int:
    """``rows`` ledgers and ``rows // CUT_EVERY`` cuts in a few SQL statements; returns
    the database time the newest cut was taken at."""
    live_from = rows - LIVE + 1
    rt.metadata.create_topic(TOPIC, OffloadPolicy())
    store_id = rt.metadata.record_location(StoreLocation("file", "/bench", "", ""))
    now_ms = rt.metadata.db_now_ms()
    first_ms = now_ms - (rows // CUT_EVERY) * MINUTE_MS
    params = {
        "topic": TOPIC,
        "bytes": LEDGER_BYTES,
        "live": live_from,
        "hot": rows - HOT + 1,
        "rows": rows,
        "store": store_id,
        "first_ms": first_ms,
        "minute": MINUTE_MS,
        "every": CUT_EVERY,
    }
    with rt.metadata.transaction() as conn:
        conn.exec_driver_sql(
            """
            INSERT INTO ledgers (topic, ledger_id, version, state, entry_count, size_bytes,
                created_ms, sealed_ms, offload_state, offload_epoch, offload_uuid, data_key,
                index_key, data_len, offloaded_ms, hot_state, hot_deleted_ms, store_id,
                deletion_state, deleting_ms, deleted_ms)
            SELECT %(topic)s, n, 3, 'sealed', 1000, %(bytes)s, n, n,
                CASE WHEN n < %(hot)s THEN 'offloaded' ELSE 'none' END, 1,
                CASE WHEN n < %(hot)s THEN md5(n::text) END,
                CASE WHEN n < %(hot)s THEN 'data/' || n END,
                CASE WHEN n < %(hot)s THEN 'index/' || n END,
                CASE WHEN n < %(hot)s THEN %(bytes)s END,
                CASE WHEN n < %(hot)s THEN n END,
                CASE WHEN n < %(live)s THEN 'deleted' ELSE 'present' END,
                CASE WHEN n < %(live)s THEN n END,
                CASE WHEN n < %(hot)s THEN %(store)s END,
                CASE WHEN n < %(live)s THEN 'deleted' ELSE 'none' END,
                CASE WHEN n < %(live)s THEN n END,
                CASE WHEN n < %(live)s THEN n END
            FROM generate_series(1, %(rows)s) AS n
            """,
            params,
        )
        # cut k sits at the start of ledger k * CUT_EVERY + 1, taken k minutes in
        conn.exec_driver_sql(
            """
            INSERT INTO stream_cuts (topic, ledger_id, entry_id, created_ms, offset_bytes)
            SELECT %(topic)s, k * %(every)s + 1, 0, %(first_ms)s + k * %(minute)s,
                k * %(every)s * %(bytes)s
            FROM generate_series(0::bigint, %(rows)s::bigint / %(every)s) AS k
            ORDER BY k
            """,
            params,
        )
        conn.execute(
            sa.text(
                "UPDATE topics SET next_ledger_id = :next, start_ledger_id = :start "
                "WHERE name = :topic"
            ),
            {"next": rows + 1, "start": live_from, "topic": TOPIC},
        )
    with rt.metadata.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE")
    return first_ms + (rows // CUT_EVERY) * MINUTE_MS


def _policy(rows: int) -> OffloadPolicy:
    """Keep the newest LIVE - TRIMMED ledgers by size and by time (cuts are a minute per
    CUT_EVERY ledgers apart): both rules choose the same cut, TRIMMED above the start."""
    keep = LIVE - TRIMMED
    return OffloadPolicy(
        retention_size_bytes=keep * LEDGER_BYTES,
        retention_time_seconds=keep // CUT_EVERY * MINUTE_MS / 1000,
    )


def _one_size(url: str, rows: int, work: Path) -> dict[str, Any]:
    settings = Settings(metadata_url=url, data_dir=work)
    upgrade_database(settings)
    with Runtime.open(settings) as rt:
        start = time.perf_counter()
        _fill(rt, rows)
        fill_s = time.perf_counter() - start
        policy = _policy(rows)
        chosen: list[Any] = []

        def plan() -> None:
            result = apply_retention(rt, TOPIC, dry_run=True, policy=policy)
            chosen[:] = [result]

        measured = {"plan": measure(plan, REPEATS)}
        (result,) = chosen
        live_from = rows - LIVE + 1
        assert result.trim is not None, result
        assert result.trim.ledgers_deleting == list(range(live_from, live_from + TRIMMED))
        assert result.end.ledger_id == rows + 1
        measured["cut"] = measure(lambda: take_cut(rt, TOPIC), REPEATS)
        return {"rows": rows, "cuts": rows // CUT_EVERY + 1, "fill_seconds": round(fill_s, 1)} | (
            measured
        )


def run(quick: bool = False) -> dict:
    """Every size on PostgreSQL; skipped without PostgreSQL."""
    use_test_fixtures()
    from fixtures.databases import postgres_unreachable, temporary_database

    if postgres_unreachable():
        return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
    by_size = []
    for rows in QUICK_SIZES if quick else SIZES:
        with temporary_database("offloader_bench") as url, tempfile.TemporaryDirectory() as d:
            by_size.append(_one_size(url, rows, Path(d)))
        print(json.dumps(by_size[-1]), file=sys.stderr, flush=True)  # progress
    return {
        "live_ledgers": LIVE,
        "trimmed_per_plan": TRIMMED,
        "repeats": REPEATS,
        "sizes": by_size,
        **growth(by_size, ("plan", "cut")),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
