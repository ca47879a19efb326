"""Orphan sweep over a bucket of 100,000 objects on SeaweedFS + PostgreSQL.

Half the objects are referenced by offloaded ledgers (rows written straight into the
metadata: an index and a data key each), half are orphans older than the grace period
(0 s here, so all count). Measured, against one ``weed mini`` on loopback:

- ``sweep`` (queue every orphan): wall time, LIST requests (ListObjectsV2 and
  ListMultipartUploads, counted on the client), metadata statements, orphans queued;
- the same sweep again with the queue emptied, under ``tracemalloc``: peak Python memory
  (the sweep holds one page of 1,000 keys at a time, so it should not grow with the
  bucket), next to the size of the key set it would otherwise hold;
- a raw boto3 ListObjectsV2 of the bucket (pages of 1,000, bodies dropped): the floor the
  listing costs.

Run alone: ``python -m benchmarks.sweep_scale [--quick]`` (quick: 2,000 objects); prints JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from offloader.gc.sweep import sweep
from offloader.keys import ledger_object_keys
from offloader.metadata import schema
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime

FULL, QUICK = 100_000, 2_000
PUT_THREADS = 32


def _plant(rt: Runtime, count: int) -> int:
    """``count`` objects: the even ones referenced by a ledger row, the odd ones orphans.
    Returns how many are referenced."""
    store_id = rt.stores.default_id()
    rt.metadata.create_topic("bench", OffloadPolicy())
    ledgers = count // 4  # two objects (data + index) per referenced ledger
    keys, rows = [], []
    for n in range(ledgers):
        data_key, index_key = ledger_object_keys(str(uuid.uuid4()), n + 1)
        keys += [data_key, index_key]
        rows.append(_ledger_row(n + 1, data_key, index_key, store_id))
    keys += [ledger_object_keys(str(uuid.uuid4()), n)[0] for n in range(count - len(keys))]
    with rt.metadata.transaction() as conn:
        for start in range(0, len(rows), 1000):
            conn.execute(schema.ledgers.insert(), rows[start : start + 1000])
    body = b"o" * 16
    with ThreadPoolExecutor(PUT_THREADS) as pool:
        list(pool.map(lambda key: rt.objects.put(key, body), keys, chunksize=64))
    return 2 * ledgers


def _ledger_row(ledger_id: int, data_key: str, index_key: str, store_id: int) -> dict[str, Any]:
    return dict(
        topic="bench",
        ledger_id=ledger_id,
        version=1,
        state="sealed",
        entry_count=1,
        size_bytes=16,
        created_ms=0,
        sealed_ms=0,
        offload_state="offloaded",
        offload_epoch=1,
        offload_uuid=data_key[:36],
        data_key=data_key,
        index_key=index_key,
        data_len=16,
        offloaded_ms=0,
        hot_state="deleted",
        store_id=store_id,
    )


@contextmanager
def _counted(rt: Runtime) -> Iterator[dict[str, int]]:
    """LIST requests on the store's client and statements on the metadata engine."""
    counts = {"ListObjectsV2": 0, "ListMultipartUploads": 0, "statements": 0}
    client = rt.objects._client  # type: ignore[attr-defined]

    def on_call(model: Any, **_: Any) -> None:
        if model.name in counts:
            counts[model.name] += 1

    def on_statement(*_: Any) -> None:
        counts["statements"] += 1

    client.meta.events.register("before-call.s3", on_call)
    event.listen(rt.metadata.engine, "before_cursor_execute", on_statement)
    try:
        yield counts
    finally:
        client.meta.events.unregister("before-call.s3", on_call)
        event.remove(rt.metadata.engine, "before_cursor_execute", on_statement)


def _raw_list(rt: Runtime) -> tuple[float, int]:
    client = rt.objects._client  # type: ignore[attr-defined]
    start = time.perf_counter()
    listed = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=rt.objects.bucket):  # type: ignore[attr-defined]
        listed += len(page.get("Contents", []))
    return time.perf_counter() - start, listed


def _bench(rt: Runtime, count: int) -> dict[str, Any]:
    start = time.perf_counter()
    referenced = _plant(rt, count)
    plant_s = time.perf_counter() - start

    raw_s, raw_listed = _raw_list(rt)
    with _counted(rt) as counts:
        start = time.perf_counter()
        result = sweep(rt.metadata, rt.stores, rt.settings)
        sweep_s = time.perf_counter() - start
    (store,) = result.stores
    assert store.listed == count and store.queued == count - referenced, store

    with rt.metadata.transaction() as conn:  # the same work again, measured for memory
        conn.execute(sa.delete(schema.deletion_queue))
    tracemalloc.start()
    again = sweep(rt.metadata, rt.stores, rt.settings)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert again.stores[0].queued == count - referenced
    key_set = sys.getsizeof(set()) + count * (sys.getsizeof("x" * 50) + 16)
    return {
        "objects": count,
        "referenced": referenced,
        "orphans_queued": store.queued,
        "plant_s": round(plant_s, 1),
        "sweep_s": round(sweep_s, 2),
        "objects_per_s": round(count / sweep_s),
        "raw_list_s": round(raw_s, 2),
        "raw_listed": raw_listed,
        "ratio_sweep_to_raw_list": round(sweep_s / raw_s, 2) if raw_s else None,
        "list_objects_requests": counts["ListObjectsV2"],
        "list_uploads_requests": counts["ListMultipartUploads"],
        "metadata_statements": counts["statements"],
        "peak_python_mib": round(peak / 2**20, 2),
        "all_keys_in_a_set_mib_estimate": round(key_set / 2**20, 2),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run(quick: bool = False, work_dir: Path | None = None, count: int | None = None) -> dict:
    """The sweep benchmark; skipped without PostgreSQL (as the other S3 + PostgreSQL ones)."""
    from benchmarks.airflow_overhead import s3_postgres_runtime

    count = count or (QUICK if quick else FULL)
    with (
        tempfile.TemporaryDirectory(prefix="bench-sweep-", dir=work_dir) as tmp,
        s3_postgres_runtime(
            Path(tmp), "bench-sweep", sweep_grace_seconds=0, multipart_max_age_seconds=86400
        ) as rt,
    ):
        if rt is None:
            return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
        return _bench(rt, count)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
