"""Offload throughput on Airflow's CeleryExecutor with one worker, then with two.

The same workload twice: 200 ledgers of 256 KiB (16 entries of 16 KiB) over 4 topics, on
SeaweedFS + PostgreSQL, offloaded by one offload_ledgers run (batches of 25 ledgers: 8
mapped offload tasks, pool `offload_uploads` 4). The first run has one worker
(concurrency 1), the second two; the second workload is produced on new topics once the
first run is over, so each run finds exactly its own 200 ledgers due. Airflow runs as the
tests run it (tests/fixtures/airflow_scheduler.py: API server, scheduler, dag-processor,
Redis as the broker on 127.0.0.1:6379, a database number of its own).

A run's time is the DAG run's, from its start to its end in Airflow's database: task
start-up (a fresh task process parses the DAG file and imports the offloader) is part of
it, as in production. Needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379.

Run alone: ``python -m benchmarks.celery_workers [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import use_test_fixtures
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime

ENTRY_SIZE = 16 << 10
ENTRIES_PER_LEDGER = 16  # 256 KiB ledgers
TOPICS = 4
BATCH_SIZE = 25


def _produce(rt: Runtime, prefix: str, ledgers: int) -> tuple[int, int]:
    """``ledgers`` ledgers spread over TOPICS new topics: their total bytes, the highest
    ledger id."""
    rng = random.Random(prefix)
    policy = OffloadPolicy(max_block_size=5 << 20, read_buffer_size=64 << 10)
    total = highest = 0
    for t in range(TOPICS):
        topic = f"{prefix}-{t}"
        rt.metadata.create_topic(topic, policy)
        with ManagedLedgerWriter(rt.metadata, rt.hot, topic) as writer:
            for _ in range(ledgers // TOPICS):
                for _ in range(ENTRIES_PER_LEDGER):
                    writer.append(rng.randbytes(ENTRY_SIZE))
                    total += ENTRY_SIZE
                sealed = writer.roll_over()
                assert sealed is not None
                highest = max(highest, sealed.ledger_id)
    return total, highest


def _offload_run(af: Any, up_to: int) -> tuple[float, list[str]]:
    """One offload_ledgers run of every due ledger up to ``up_to``: its duration in s."""
    run_id = f"bench_{time.monotonic_ns()}"
    conf = {"up_to_ledger": up_to, "batch_size": BATCH_SIZE, "batch_bytes": None}
    af.cli("dags", "trigger", "offload_ledgers", "--run-id", run_id, "--conf", json.dumps(conf))

    def finished() -> tuple[str, float] | None:
        rows = af.query(
            "SELECT state, EXTRACT(EPOCH FROM end_date - start_date) FROM dag_run"
            " WHERE run_id = :run",
            run=run_id,
        )
        done = rows and rows[0][0] in ("success", "failed")
        return (rows[0][0], float(rows[0][1])) if done else None

    state, seconds = af.wait_for(f"run {run_id}", finished, timeout=1800)
    if state != "success":
        raise RuntimeError(f"offload_ledgers run {run_id}: {state}\n{af.task_log_tail()}")
    hosts = af.query("SELECT DISTINCT hostname FROM task_instance WHERE run_id = :run", run=run_id)
    return seconds, sorted(h for (h,) in hosts)


def run(quick: bool = False, work_dir: Path | None = None) -> dict:
    use_test_fixtures()
    from benchmarks.airflow_overhead import s3_postgres_runtime
    from fixtures.airflow import connection_env
    from fixtures.airflow_scheduler import CELERY, airflow_services

    ledgers = 40 if quick else 200
    out: dict[str, Any] = {
        "ledgers": ledgers,
        "ledger_bytes": ENTRY_SIZE * ENTRIES_PER_LEDGER,
        "topics": TOPICS,
        "batch_size": BATCH_SIZE,
        "worker_concurrency": 1,
    }
    with (
        tempfile.TemporaryDirectory(prefix="bench-celery-", dir=work_dir) as tmp,
        s3_postgres_runtime(Path(tmp), "bench-celery") as rt,
    ):
        if rt is None:
            return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
        env = connection_env(rt.settings)
        with airflow_services(Path(tmp) / "airflow", ["offload_ledgers.py"], env, CELERY) as af:
            af.start_worker("worker-1", concurrency=1)
            af.wait_for(
                "the DAG to be parsed",
                lambda: af.query("SELECT 1 FROM serialized_dag WHERE dag_id = 'offload_ledgers'"),
                timeout=300,
            )
            af.cli("dags", "unpause", "offload_ledgers")
            for workers in (1, 2):
                if workers == 2:
                    af.start_worker("worker-2", concurrency=1)
                    af.wait_for_workers("worker-1", "worker-2")
                total, highest = _produce(rt, f"w{workers}", ledgers)
                seconds, hosts = _offload_run(af, up_to=highest)
                out[f"{workers}_workers"] = {
                    "seconds": round(seconds, 2),
                    "ledgers_per_s": round(ledgers / seconds, 2),
                    "mb_per_s": round(total / seconds / 1e6, 2),
                    "task_hosts": hosts,
                }
    one, two = out["1_workers"], out["2_workers"]
    out["ratio_2_to_1"] = round(two["ledgers_per_s"] / one["ledgers_per_s"], 2)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
