"""The DAGs on Airflow's CeleryExecutor with two workers on this machine: Redis as the
broker, PostgreSQL as Celery's result backend, the offloader on SeaweedFS + PostgreSQL.

The product's tasks meet across processes only through the metadata database and the
store (DESIGN.md), so where a task runs must not matter: the runs succeed with tasks on
both workers, and a worker killed mid-upload (its whole process group: a lost machine)
costs a retry on the other worker, never data."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.airflow import connection_env
from fixtures.airflow_scheduler import CELERY, AirflowServices, airflow_services, is_stopped
from fixtures.backends import POSTGRES_ONLY, make_topic, produce_ledgers
from fixtures.cli import CLI, child_env
from offloader.runtime import Runtime
from offloader.settings import Settings

DAGS = ("offload_ledgers", "streaming_offload", "retention", "garbage_collection")
# the scheduler declares a task dead this long after its last heartbeat (300 s by default)
HEARTBEAT_TIMEOUT = 20
SCHEDULER_ENV = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT),
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "2",
    # the runs a test triggers only (and the asset-triggered ones): no every-minute
    # streaming_offload run taking a worker's slot
    "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
}
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.s3, POSTGRES_ONLY]


def offloader_json(settings: Settings, *args: str) -> object:
    """``offloader ARGS --json`` in a child process, as an operator runs it."""
    done = subprocess.run(
        [*CLI, *args, "--json"], env=child_env(settings), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def checksums(settings: Settings, topics: tuple[str, ...]) -> dict[str, object]:
    return {t: offloader_json(settings, "checksum", t) for t in topics}


def assert_promises_hold(settings: Settings) -> None:
    """`offloader verify`: exit 0 when every promise of DESIGN.md holds (one line per
    breach otherwise)."""
    done = subprocess.run(
        [*CLI, "verify", "--json"], env=child_env(settings), capture_output=True, text=True
    )
    assert done.returncode == 0, f"offloader verify: {done.stdout}{done.stderr}"


def trigger(af: AirflowServices, dag_id: str, conf: dict[str, object]) -> str:
    run_id = f"celery_{dag_id}_{time.monotonic_ns()}"
    af.cli("dags", "trigger", dag_id, "--run-id", run_id, "--conf", json.dumps(conf))
    return run_id


def wait_for_runs(af: AirflowServices, runs: dict[str, str], timeout: float) -> None:
    """Until every (dag, run) finished; all of them successful, or the task logs."""

    def finished() -> list[tuple[str, str]] | None:
        states = [
            (dag, state)
            for dag, run in runs.items()
            for (state,) in af.query(
                "SELECT state FROM dag_run WHERE dag_id = :dag AND run_id = :run",
                dag=dag,
                run=run,
            )
        ]
        done = len(states) == len(runs) and all(s in ("success", "failed") for _, s in states)
        return states if done else None

    states = af.wait_for(f"runs of {', '.join(runs)}", finished, timeout)
    failed = [s for s in states if s[1] != "success"]
    assert not failed, f"runs not successful: {failed}\n{af.task_log_tail()}"


def task_hosts(af: AirflowServices, dag_id: str, run_id: str) -> list[tuple[str, int, str, int]]:
    """(task, map index, host, try) of every task instance of the run."""
    return af.query(
        "SELECT task_id, map_index, hostname, try_number FROM task_instance"
        " WHERE dag_id = :dag AND run_id = :run ORDER BY task_id, map_index",
        dag=dag_id,
        run=run_id,
    )


def wait_parsed(af: AirflowServices, dag_ids: tuple[str, ...]) -> None:
    af.wait_for(
        "the dag-processor to parse the DAGs",
        lambda: (
            len(af.query("SELECT dag_id FROM serialized_dag WHERE dag_id IN :ids", ids=dag_ids))
            == len(dag_ids)
            or None
        ),
        timeout=240,
    )


@pytest.mark.timeout(1200)  # four DAGs on a real scheduler and two workers
@pytest.mark.long  # 3 to 5 minutes of a 2-core machine; the short suite runs the same DAGs
# on LocalExecutor (tests/dags/) and a killed task's retry (test_offload_ledgers_dag.py)
def test_the_dags_run_on_two_workers_and_keep_every_entry(
    backend_settings: Settings, tmp_path: Path
) -> None:
    settings = backend_settings
    with Runtime.open(settings) as rt:
        # threshold 0: every sealed ledger is due
        make_topic(rt, "orders", offload_threshold_bytes=0)
        make_topic(rt, "clicks", offload_threshold_bytes=0)
        min_part = max(64 * 1024, rt.objects.capabilities.min_part_size)
        make_topic(rt, "events", streaming=True, min_part_bytes=min_part)
        produce_ledgers(rt, "orders", [(8, 4096)] * 6)
        produce_ledgers(rt, "clicks", [(8, 4096)] * 4)
        produce_ledgers(rt, "events", [(20, min_part // 8)] * 2)
    topics = ("orders", "clicks", "events")
    before = checksums(settings, topics)

    env = {**connection_env(settings, attempt_lease_seconds=2.0), **SCHEDULER_ENV}
    dag_files = [f"{d}.py" for d in DAGS]
    with airflow_services(tmp_path / "airflow", dag_files, env, executor=CELERY) as af:
        af.start_worker("worker-a", concurrency=1)
        af.start_worker("worker-b", concurrency=1)
        wait_parsed(af, DAGS)
        af.wait_for_workers("worker-a", "worker-b")  # neither gets every task by starting first
        for dag in DAGS:
            af.cli("dags", "unpause", dag)
        runs = {
            "offload_ledgers": trigger(af, "offload_ledgers", {"batch_size": 2}),
            "streaming_offload": trigger(af, "streaming_offload", {"close_now": True}),
        }
        wait_for_runs(af, runs, timeout=400)
        # retention takes cuts (no topic has a retention limit: nothing is trimmed) and
        # GC drains what the offload queued, both after the offload
        runs |= {
            "retention": trigger(af, "retention", {}),
            "garbage_collection": trigger(af, "garbage_collection", {}),
        }
        wait_for_runs(af, {d: runs[d] for d in ("retention", "garbage_collection")}, 400)

        offload_tasks = task_hosts(af, "offload_ledgers", runs["offload_ledgers"])
        offloads = [t for t in offload_tasks if t[0] == "offload"]
        # 10 ledgers due, 2 a task: 5 tasks, each of which ran (a skipped one has no host)
        assert len(offloads) == 5 and all(host for _, _, host, _ in offloads), offloads
        hosts = {h for d, r in runs.items() for _, _, h, _ in task_hosts(af, d, r) if h}
        assert hosts == {"worker-a", "worker-b"}, {d: task_hosts(af, d, r) for d, r in runs.items()}

    status = offloader_json(settings, "status")
    assert isinstance(status, dict)
    with Runtime.open(settings) as rt:
        for topic in topics:
            assert all(x.is_offloaded for x in rt.metadata.list_ledgers(topic)), topic
    assert checksums(settings, topics) == before
    assert_promises_hold(settings)


def stopped_pids(af: AirflowServices, worker: str) -> list[int]:
    """The worker's processes stopped by SIGSTOP (a failpoint's ``:stop``)."""
    return [pid for pid in af.worker_processes(worker) if is_stopped(pid)]


@pytest.mark.timeout(1200)
@pytest.mark.long  # the DAGs on two workers, above; the kill in one process:
# test_killed_offload_task_retried_converges (tests/dags/test_offload_ledgers_dag.py)
def test_a_worker_killed_mid_upload_costs_a_retry_on_the_other_worker(
    backend_settings: Settings, tmp_path: Path
) -> None:
    """worker-a's offload task freezes after its first part (a failpoint, armed on that
    worker alone); worker-b starts; worker-a and every process it started are SIGKILLed. The
    scheduler finds the task's heartbeat gone, the retry runs on worker-b, the run
    succeeds and every entry reads back as before."""
    settings = backend_settings
    with Runtime.open(settings) as rt:
        make_topic(rt, "orders")
        # 12 MiB: three 5 MiB parts, so the upload is under way at the first part
        ids = produce_ledgers(rt, "orders", [(12, 1024 * 1024)], fixed=True)
    before = checksums(settings, ("orders",))

    env = {**connection_env(settings, attempt_lease_seconds=2.0), **SCHEDULER_ENV}
    with airflow_services(tmp_path / "airflow", ["offload_ledgers.py"], env, CELERY) as af:
        af.start_worker(
            "worker-a", concurrency=1, env={"OFFLOADER_FAILPOINTS": "after-first-part:stop"}
        )
        wait_parsed(af, ("offload_ledgers",))
        af.cli("dags", "unpause", "offload_ledgers")
        run = trigger(af, "offload_ledgers", {"topic": "orders", "up_to_ledger": ids[-1]})
        af.wait_for(
            "the offload task to freeze mid-upload", lambda: stopped_pids(af, "worker-a"), 400
        )
        af.start_worker("worker-b", concurrency=1)
        af.kill_worker("worker-a")
        killed_at = time.monotonic()
        wait_for_runs(af, {"offload_ledgers": run}, timeout=400)
        took_over = time.monotonic() - killed_at

        tasks = {
            (t, i): (host, tries) for t, i, host, tries in task_hosts(af, "offload_ledgers", run)
        }
        assert tasks[("plan", -1)] == ("worker-a", 1)
        assert tasks[("offload", 0)] == ("worker-b", 2), tasks  # the second try, elsewhere
        assert took_over >= HEARTBEAT_TIMEOUT  # found dead by its missing heartbeat
        first = af.query(
            "SELECT try_number, hostname FROM task_instance_history"
            " WHERE run_id = :run AND task_id = 'offload'",
            run=run,
        )
        assert first == [(1, "worker-a")], first  # the killed try

    with Runtime.open(settings) as rt:
        assert rt.metadata.get_ledger("orders", ids[0]).is_offloaded
    assert checksums(settings, ("orders",)) == before
    assert_promises_hold(settings)
