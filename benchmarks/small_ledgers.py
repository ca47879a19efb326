"""Fleets of small ledgers: 1,000 x 64 KiB on SeaweedFS + PostgreSQL, ours vs raw boto3.

Three paths over identical data (two topics produced alike, one SeaweedFS, one database):

- before: ``LedgerOffloader.offload_ledger`` one ledger after another (the old batch task);
- after: ``offload_batch`` (runs.py), the batched path: windows of ledgers in flight, one
  begin and one commit transaction per window, ``upload_concurrency`` uploads at once;
- raw: boto3 ``put_object`` of the very same two objects per ledger (data, then index; the
  bytes read back from the store beforehand, untimed) with ``upload_concurrency`` ledgers
  in flight (ThreadPoolExecutor).

The ledgers are split into 10 rounds, each running the three paths one after the other
(before, raw, after), and each path's times are summed, so drift on a shared machine hits
all three alike.

Requests are counted by a wrapper of the ObjectStore, transactions by a SQLAlchemy ``begin``
event listener (explicit and autobegun, reads included) on the metadata engine.

Run alone: ``python -m benchmarks.small_ledgers [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import use_test_fixtures
from benchmarks.airflow_overhead import ENTRIES_PER_LEDGER, ENTRY_SIZE, _postgres_url, _produce
from offloader.objectstore.s3 import build_client
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult, Outcome
from offloader.offload.runs import offload_batch
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime, upgrade_database

TARGET_RATIO = 0.5  # ours (batched) / raw, in ledgers per second
ROUNDS = 10  # interleaved rounds of before, raw and after


class Tally:
    """Time, object-store requests and metadata transactions of one path, over rounds."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.requests: Counter[str] = Counter()
        self.max_in_flight = 0
        self.transactions = 0
        self.ledgers = 0

    def measure(self, rt: Runtime, run: Callable[[], list[OffloadResult]]) -> None:
        use_test_fixtures()
        from fixtures.counting import CountingStore, counting_transactions

        counting = CountingStore(rt.objects)
        inner, rt.objects = rt.objects, counting  # type: ignore[assignment]
        try:
            with counting_transactions(rt.metadata.engine) as transactions:
                start = time.perf_counter()
                results = run()
                self.seconds += time.perf_counter() - start
        finally:
            rt.objects = inner
        outcomes = {str(r.outcome) for r in results}
        if outcomes != {Outcome.OFFLOADED}:
            raise RuntimeError(f"expected only offloaded ledgers, got outcomes {outcomes}")
        self.ledgers += len(results)
        self.requests.update(counting.requests)
        self.max_in_flight = max(self.max_in_flight, counting.max_in_flight)
        self.transactions += transactions.count

    def report(self, raw_seconds: float) -> dict:
        return {
            "seconds": round(self.seconds, 3),
            "ms_per_ledger": round(self.seconds * 1000 / self.ledgers, 2),
            "requests_per_ledger": round(sum(self.requests.values()) / self.ledgers, 3),
            "requests_by_verb": dict(self.requests),
            "max_requests_in_flight": self.max_in_flight,
            "transactions_per_ledger": round(self.transactions / self.ledgers, 3),
            "ratio_to_raw": round(raw_seconds / self.seconds, 3),
        }


def _one_by_one(rt: Runtime, topic: str, ids: list[int]) -> list[OffloadResult]:
    """The path before batching: one offloader, one ledger after another."""
    offloader = LedgerOffloader(rt)
    return [offloader.offload_ledger(topic, ledger_id) for ledger_id in ids]


def _objects(rt: Runtime, topic: str, ids: list[int]) -> list[tuple[bytes, bytes]]:
    """The committed data and index objects of ``ids``, read back (untimed)."""
    out = []
    for ledger_id in ids:
        ledger = rt.metadata.get_ledger(topic, ledger_id)
        assert ledger.data_key and ledger.index_key
        out.append((rt.objects.get(ledger.data_key), rt.objects.get(ledger.index_key)))
    return out


def _raw_puts(
    client: Any, bucket: str, prefix: str, objects: list[tuple[bytes, bytes]], concurrency: int
) -> float:
    def ledger(item: tuple[int, tuple[bytes, bytes]]) -> None:
        i, (data, index) = item
        client.put_object(Bucket=bucket, Key=f"{prefix}{i}", Body=data)
        client.put_object(Bucket=bucket, Key=f"{prefix}{i}-index", Body=index)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(ledger, enumerate(objects)))
    return time.perf_counter() - start


def _bench(rt: Runtime, ledgers: int, rounds: int) -> dict:
    policy = OffloadPolicy(max_block_size=5 << 20, read_buffer_size=64 << 10)
    ids = {}
    for topic in ("sequential", "batched"):
        rt.metadata.create_topic(topic, policy)
        ids[topic] = _produce(rt, topic, ledgers)
    concurrency = rt.settings.upload_concurrency
    store = rt.objects
    client = build_client(rt.settings)
    before, after = Tally(), Tally()
    raw_s: list[float] = []
    object_bytes = 0
    step = -(-ledgers // rounds)
    for r in range(rounds):  # interleaved, so drift in a shared machine hits all three
        seq, batch = (ids[t][r * step : (r + 1) * step] for t in ("sequential", "batched"))
        before.measure(rt, lambda seq=seq: _one_by_one(rt, "sequential", seq))
        objects = _objects(rt, "sequential", seq)
        object_bytes += sum(len(d) + len(i) for d, i in objects)
        raw_s.append(
            _raw_puts(client, store.bucket, f"{store.prefix}raw-{r}/", objects, concurrency)
        )
        after.measure(rt, lambda batch=batch: offload_batch(rt, "batched", batch))
    client.close()
    raw = sum(raw_s)
    result = {
        "ledgers": ledgers,
        "rounds": rounds,
        "ledger_kib": ENTRIES_PER_LEDGER * ENTRY_SIZE // 1024,
        "object_mib": round(object_bytes / (1 << 20), 1),
        "concurrency": concurrency,
        "raw": {
            "seconds": round(raw, 3),
            "seconds_by_round": [round(x, 3) for x in raw_s],
            "ms_per_ledger": round(raw * 1000 / ledgers, 2),
            "requests_per_ledger": 2,
        },
        "before_sequential": before.report(raw),
        "after_batched": after.report(raw),
        "target_ratio": TARGET_RATIO,
    }
    result["met"] = result["after_batched"]["ratio_to_raw"] >= TARGET_RATIO
    return result


def run(quick: bool = False, work_dir: Path | None = None) -> dict:
    """1,000 (quick: 200) small ledgers on SeaweedFS + PostgreSQL; skipped without PostgreSQL."""
    ledgers = 200 if quick else 1000
    with s3_postgres_runtime("bench-small", work_dir) as rt:
        if rt is None:
            return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
        return _bench(rt, ledgers, rounds=ROUNDS)


@contextmanager
def s3_postgres_runtime(bucket: str, work_dir: Path | None = None) -> Iterator[Runtime | None]:
    """A Runtime on a fresh SeaweedFS bucket and a fresh PostgreSQL database (upgraded, as
    `offloader db upgrade` does: opening never migrates), or None without PostgreSQL."""
    use_test_fixtures()
    from fixtures.seaweedfs_server import SeaweedS3

    with tempfile.TemporaryDirectory(prefix=f"{bucket}-", dir=work_dir) as tmp:
        base = Path(tmp)
        with _postgres_url() as url:
            if url is None:
                yield None
                return
            with SeaweedS3.start(base / "seaweedfs") as server:
                settings = server.make_settings(bucket, data_dir=base / "data", metadata_url=url)
                upgrade_database(settings)
                with Runtime.open(settings) as rt:
                    yield rt


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
