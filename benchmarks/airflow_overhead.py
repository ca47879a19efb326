"""What Airflow adds: 1,000 small ledgers through one offload_ledgers DAG run versus the
library alone.

Three topics get identical data (64 KiB ledgers of 16 x 4 KiB entries). One is offloaded
by ``LedgerOffloader.offload_topic`` plus ``delete_hot_copies`` in this process (what the
CLI's ``offload`` command runs), one by ``offloader offload TOPIC --up-to N`` as a
subprocess, one by a single ``dag.test()`` run of dags/offload_ledgers.py with its default
params (batches of at most 500 ledgers or 1 GiB: 2 mapped offload tasks here, plus plan,
delete_hot_copies and summary) in a child process with a throw-away, migrated AIRFLOW_HOME
and the connections in AIRFLOW_CONN_* variables. Before the measured run, the child runs
the DAG once as a dry run: the first run in a process pays a one-off start-up (dag.test()
starts Airflow's execution API in-process; a deployment's API server is already up),
which is reported separately as ``cold_dry_run_s``. Backends: the embedded default (files +
SQLite) and SeaweedFS + PostgreSQL (a fresh database on 127.0.0.1:5432), when reachable.

Run alone: ``python -m benchmarks.airflow_overhead [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import ROOT, use_test_fixtures
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime, upgrade_database
from offloader.settings import Settings

ENTRY_SIZE = 4 << 10
ENTRIES_PER_LEDGER = 16  # 64 KiB ledgers
TARGET_RATIO = 2.0
MARKER = "BENCH-RESULT "
PG_DSN = "host=127.0.0.1 port=5432 user=postgres"
BIN = Path(sys.executable).parent


def _policy() -> OffloadPolicy:
    # the defaults, minus deletion right away: both paths do the same hot deletion work
    return OffloadPolicy(max_block_size=5 << 20, read_buffer_size=64 << 10)


def _produce(rt: Runtime, topic: str, ledgers: int) -> list[int]:
    rng = random.Random(11)
    ids = []
    with ManagedLedgerWriter(rt.metadata, rt.hot, topic) as writer:
        for _ in range(ledgers):
            for _ in range(ENTRIES_PER_LEDGER):
                writer.append(rng.randbytes(ENTRY_SIZE))
            sealed = writer.roll_over()
            assert sealed is not None
            ids.append(sealed.ledger_id)
    return ids


def _airflow_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OFFLOADER_", "AIRFLOW"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
    )
    return env


def _migrate(home: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"],
        capture_output=True,
        text=True,
        timeout=600,
        env=_airflow_env(home),
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def _run_dag(home: Path, settings: Settings, topic: str, up_to: int) -> dict:
    use_test_fixtures()
    from fixtures.airflow import connection_env

    env = _airflow_env(home) | connection_env(settings)
    conf = {"topic": topic, "up_to_ledger": up_to}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.airflow_overhead", "--dag-child", json.dumps(conf)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=ROOT,
    )
    wall = time.perf_counter() - start
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(MARKER)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"DAG child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1][len(MARKER) :])
    result["child_process_s"] = round(wall, 3)
    return result


def _dag_child(conf: dict) -> None:
    """In the child (environment already set): a warm-up dry run, then the measured run."""
    from airflow.dag_processing.dagbag import DagBag

    def parse():  # type: ignore[no-untyped-def]
        # afresh per run: an in-process run renders templates onto the task objects
        bag = DagBag(dag_folder=str(ROOT / "dags" / "offload_ledgers.py"))
        assert bag.import_errors == {}, bag.import_errors
        return bag.get_dag("offload_ledgers")

    start = time.perf_counter()
    dry = parse().test(run_conf={**conf, "dry_run": True})
    cold_s = time.perf_counter() - start
    assert str(dry.state) == "success", dry.state
    start = time.perf_counter()
    dag = parse()
    parse_s = time.perf_counter() - start
    start = time.perf_counter()
    run = dag.test(run_conf=conf)
    run_s = time.perf_counter() - start
    tis = run.get_task_instances()
    durations = [ti.duration or 0.0 for ti in tis]
    states: dict[str, int] = {}
    for ti in tis:
        states[str(ti.state)] = states.get(str(ti.state), 0) + 1
    offload_tis = [ti for ti in tis if ti.task_id == "offload"]
    by_task: dict[str, float] = {}
    for ti in tis:
        by_task[ti.task_id] = round(by_task.get(ti.task_id, 0.0) + (ti.duration or 0.0), 3)
    result = {
        "state": str(run.state),
        "parse_s": round(parse_s, 3),
        "cold_dry_run_s": round(cold_s, 3),
        "dag_test_s": round(run_s, 3),
        "task_instances": len(tis),
        "offload_tasks": len(offload_tis),
        "task_states": states,
        "sum_task_duration_s": round(sum(durations), 3),
        "sum_offload_task_duration_s": round(sum(ti.duration or 0.0 for ti in offload_tis), 3),
        "task_duration_s_by_task": by_task,
    }
    print(MARKER + json.dumps(result), flush=True)


@contextlib.contextmanager
def _postgres_url() -> Iterator[str | None]:
    """A fresh database, dropped afterwards; None when PostgreSQL is not reachable."""
    use_test_fixtures()
    from fixtures.databases import postgres_unreachable, temporary_database

    if postgres_unreachable():
        yield None
        return
    with temporary_database("offloader_bench") as url:
        yield url


@contextlib.contextmanager
def s3_postgres_runtime(base: Path, bucket: str, **overrides: Any) -> Iterator[Runtime | None]:
    """A runtime on a fresh SeaweedFS bucket and a fresh, upgraded PostgreSQL database under
    ``base``; None when PostgreSQL is not reachable."""
    use_test_fixtures()
    from fixtures.seaweedfs_server import SeaweedS3

    with _postgres_url() as url:
        if url is None:
            yield None
            return
        with SeaweedS3.start(base / "seaweedfs") as server:
            settings = server.make_settings(
                bucket, data_dir=base / "data", metadata_url=url, **overrides
            )
            upgrade_database(settings)  # `offloader db upgrade`: opening never migrates
            with Runtime.open(settings) as rt:
                yield rt


def on_s3_postgres(
    name: str, bench: Callable[[Runtime, Path], dict], work_dir: Path | None = None
) -> dict:
    """``bench(runtime, folder)`` on a fresh SeaweedFS bucket and PostgreSQL database, in a
    temporary folder (the system's by default: SeaweedFS's unix socket path must be short);
    a "skipped" result without PostgreSQL."""
    with (
        tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=work_dir) as tmp,
        s3_postgres_runtime(Path(tmp), f"bench-{name}") as rt,
    ):
        if rt is None:
            return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
        return bench(rt, Path(tmp))


def _bench_backend(settings: Settings, home: Path, ledgers: int) -> dict:
    upgrade_database(settings)  # `offloader db upgrade`: opening never migrates
    with Runtime.open(settings) as rt:
        ids = {}
        for topic in ("lib", "cli", "dag"):
            rt.metadata.create_topic(topic, _policy())
            ids[topic] = _produce(rt, topic, ledgers)

        start = time.perf_counter()
        results = LedgerOffloader(rt).offload_topic("lib", up_to=ids["lib"][-1])
        lib_offload_s = time.perf_counter() - start
        delete_hot_copies(rt.metadata, rt.hot, "lib")
        lib_s = time.perf_counter() - start
        assert len(results) == ledgers
        assert all(r.outcome is Outcome.OFFLOADED for r in results)

    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOADER_")}
    use_test_fixtures()
    from fixtures.backends import settings_env

    env |= settings_env(settings)
    start = time.perf_counter()
    done = subprocess.run(
        [str(BIN / "offloader"), "offload", "cli", "--up-to", str(ids["cli"][-1])],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    cli_s = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"offloader offload failed:\n{done.stderr[-3000:]}")

    dag = _run_dag(home, settings, "dag", ids["dag"][-1])

    with Runtime.open(settings) as rt:
        for topic in ("cli", "dag"):
            offloaded = sum(x.is_offloaded for x in rt.metadata.list_ledgers(topic))
            if offloaded != ledgers:
                raise RuntimeError(f"{topic}: {offloaded} of {ledgers} ledgers offloaded")
    n_tis = dag["task_instances"]
    return {
        "ledgers": ledgers,
        "ledger_kib": ENTRY_SIZE * ENTRIES_PER_LEDGER // 1024,
        "batch_size": "DAG default (500 ledgers / 1 GiB)",
        "library_s": round(lib_s, 3),
        "library_offload_s": round(lib_offload_s, 3),
        "library_delete_hot_s": round(lib_s - lib_offload_s, 3),
        "cli_s": round(cli_s, 3),
        "dag": dag,
        "ratio_dag_to_library": round(dag["dag_test_s"] / lib_s, 3),
        "ratio_dag_to_cli": round(dag["dag_test_s"] / cli_s, 3),
        "per_task_overhead_s": round((dag["dag_test_s"] - lib_s) / n_tis, 3),
        "per_ledger_library_ms": round(lib_s / ledgers * 1000, 2),
        "target": TARGET_RATIO,
        "met": dag["dag_test_s"] / lib_s < TARGET_RATIO,
    }


def run(quick: bool = False, work_dir: Path | None = None) -> dict:
    """Both backends (PostgreSQL + SeaweedFS when reachable); one dict per backend."""
    use_test_fixtures()
    from fixtures.seaweedfs_server import SeaweedS3

    ledgers = 200 if quick else 1000
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-airflow-", dir=work_dir) as tmp:
        base = Path(tmp)
        home = base / "airflow-home"
        home.mkdir()
        out["airflow_db_migrate_s"] = round(_migrate(home), 3)
        fs = Settings(data_dir=base / "fs-sqlite")
        out["fs-sqlite"] = _bench_backend(fs, home, ledgers)
        with _postgres_url() as url:
            if url is None:
                out["s3-postgres"] = {"skipped": f"PostgreSQL not reachable at {PG_DSN}"}
            else:
                with SeaweedS3.start(base / "seaweedfs") as server:
                    s3 = server.make_settings(
                        "bench-airflow", data_dir=base / "s3-postgres", metadata_url=url
                    )
                    out["s3-postgres"] = _bench_backend(s3, home, ledgers)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dag-child", metavar="CONF", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dag_child:
        _dag_child(json.loads(args.dag_child))
    else:
        print(json.dumps(run(args.quick), indent=2))
