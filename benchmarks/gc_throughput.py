"""Garbage collection throughput on SeaweedFS + PostgreSQL, next to raw boto3 DeleteObjects.

100,000 (quick: 5,000) objects of 100 bytes are written for each path, then deleted in
``ROUNDS`` interleaved rounds so both paths see the same server in the same state:

- ours: the keys are queued (``deletions.enqueue``, untimed) and ``drain_queue`` empties
  the queue: bounded passes reading due rows through the index, one DeleteObjects of
  ``gc_batch_keys`` (1,000) keys per batch, each batch marked done in one transaction;
- raw: boto3 ``delete_objects`` of the same number of keys in batches of 1,000 (Quiet),
  one request after another, as ours sends them.

Reported: deletions per second for each, ours/raw (target >= 0.8), DeleteObjects requests
each used (ours also counted at the HTTP layer, by botocore's ``request-created``
event, retries included), and that
the bucket is empty and the queue drained afterwards.

Run alone: ``python -m benchmarks.gc_throughput [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.airflow_overhead import s3_postgres_runtime
from offloader.gc.deletion_queue import drain_queue
from offloader.objectstore.s3 import build_client
from offloader.runtime import Runtime

TARGET_RATIO = 0.8
BATCH = 1000
ROUNDS = 4


def _chunks(keys: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def _write(client: Any, bucket: str, keys: list[str]) -> None:
    """Untimed set-up: 16 PUTs in flight."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: client.put_object(Bucket=bucket, Key=k, Body=b"x" * 100), keys))


def _raw_delete(client: Any, bucket: str, keys: list[str]) -> int:
    requests = 0
    for batch in _chunks(keys, BATCH):
        response = client.delete_objects(
            Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
        )
        assert not response.get("Errors"), response["Errors"][:3]
        requests += 1
    return requests


def _http_requests(client: Any) -> Counter[str]:
    """HTTP requests the client sends (retries included), by operation."""
    seen: Counter[str] = Counter()

    def count(operation_name: str, **_: Any) -> None:
        seen[operation_name] += 1

    client.meta.events.register("request-created.s3", count)
    return seen


def _bench(rt: Runtime, total: int) -> dict:
    store = rt.objects
    bucket, prefix = store.bucket, store.prefix  # type: ignore[attr-defined]
    client = build_client(rt.settings)
    store_id = rt.stores.default_id()  # asks the store once (HeadBucket) before recording it
    ours_http = _http_requests(store._client)  # type: ignore[attr-defined]
    per_round = total // ROUNDS
    ours_s = raw_s = 0.0
    ours_requests = raw_requests = deleted = passes = 0
    for r in range(ROUNDS):
        ours_keys = [f"ours-{r}/{n:07}" for n in range(per_round)]
        raw_keys = [f"raw-{r}/{n:07}" for n in range(per_round)]
        _write(client, bucket, [prefix + k for k in ours_keys + raw_keys])
        for chunk in _chunks(ours_keys, 10_000):
            rt.metadata.deletions.enqueue(chunk, "benchmark", store_id=store_id)

        start = time.perf_counter()
        raw_requests += _raw_delete(client, bucket, [prefix + k for k in raw_keys])
        raw_s += time.perf_counter() - start

        start = time.perf_counter()
        result = drain_queue(rt.metadata, rt.stores, rt.settings, max_items=per_round)
        ours_s += time.perf_counter() - start
        assert (result.deleted, result.failed) == (per_round, 0), result
        ours_requests += result.delete_requests
        deleted += result.deleted
        passes += result.passes
    left = client.list_objects_v2(Bucket=bucket, MaxKeys=10).get("KeyCount", 0)
    pending = rt.metadata.deletions.count_pending()
    n = per_round * ROUNDS
    ours_rate, raw_rate = n / ours_s, n / raw_s
    return {
        "deletions_per_path": n,
        "rounds": ROUNDS,
        "batch_keys": rt.settings.gc_batch_keys,
        "ours": {
            "seconds": round(ours_s, 3),
            "deletions_per_s": round(ours_rate),
            "delete_requests": ours_requests,
            "http_delete_objects": ours_http["DeleteObjects"],
            "http_other": sum(v for k, v in ours_http.items() if k != "DeleteObjects"),
            "passes": passes,
        },
        "raw": {
            "seconds": round(raw_s, 3),
            "deletions_per_s": round(raw_rate),
            "delete_requests": raw_requests,
        },
        "ratio": round(ours_rate / raw_rate, 3),
        "target_ratio": TARGET_RATIO,
        "met": ours_rate / raw_rate >= TARGET_RATIO,
        "objects_left": left,
        "pending_left": pending,
    }


def run(quick: bool = False, work_dir: Path | None = None) -> dict:
    """100,000 (quick: 5,000) deletions per path on SeaweedFS + PostgreSQL; skipped without
    PostgreSQL."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-gc-", dir=work_dir) as tmp,
        s3_postgres_runtime(Path(tmp), "bench-gc") as rt,
    ):
        if rt is None:
            return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
        return _bench(rt, 5_000 if quick else 100_000)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
