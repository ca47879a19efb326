"""The service-level check as the last task of garbage_collection and streaming_offload,
through real DAG runs on both backends: a breached level fails the check naming the topic
and the level, at once, and the task's failure callback fires; with the levels met the run
succeeds. (That the check runs after a failed task above and the run stays failed:
test_garbage_collection_dag.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.airflow import DagFile, return_value, task_states
from fixtures.backends import make_topic, produce_ledgers
from fixtures.clock import wait_past
from offloader.runtime import Runtime

AIRFLOW = pytest.mark.usefixtures("airflow_db", "airflow_connections")
CHECK = "check_service_levels"


def sealed_lag_of(runtime: Runtime, topic: str, seconds: float) -> None:
    """Wait on the database's clock until the topic's newest sealed ledger (and so every
    one) was sealed more than ``seconds`` ago."""
    newest = max(x.sealed_ms or 0 for x in runtime.metadata.list_ledgers(topic))
    wait_past(runtime.metadata, newest + int(seconds * 1000))


def with_callback(dag_file: DagFile, calls: Path):  # type: ignore[no-untyped-def]
    """The DAG with a failure callback on the check task that appends a line (the task,
    and its error) to ``calls``, as a deployment's alerting callback would send it on; no
    retries. (A DAG-level callback runs in the dag-processor, which dag.test() has not.)"""
    dag = dag_file.parse()

    def callback(context: dict[str, Any]) -> None:
        called = {"task": context["ti"].task_id, "error": str(context.get("exception"))}
        with calls.open("a") as out:
            out.write(json.dumps(called) + "\n")

    dag.get_task(CHECK).on_failure_callback = [callback]
    for task in dag.tasks:
        task.retries = 0
    return dag


def calls_of(calls: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


@pytest.mark.parametrize(
    ("dag_id", "last"), [("garbage_collection", "summary"), ("streaming_offload", "stream")]
)
def test_the_check_is_the_last_task_and_runs_whatever_happened_above(
    dag_id: str, last: str
) -> None:
    dag = DagFile(dag_id).parse()
    check = dag.get_task(CHECK)
    assert [t.task_id for t in dag.leaves] == [CHECK]
    assert [t.task_id for t in check.upstream_list] == [last]
    assert check.trigger_rule == "all_done"
    assert set(check.fail_with_task_ids) == set(dag.task_ids) - {CHECK}


@AIRFLOW
def test_a_breached_offload_lag_fails_the_check_and_the_callbacks_fire(
    runtime: Runtime, tmp_path: Path
) -> None:
    make_topic(runtime, "orders", max_offload_lag_seconds=1)
    make_topic(runtime, "quiet")  # no level: never breached
    produce_ledgers(runtime, "orders", [(5, 100)] * 3)
    produce_ledgers(runtime, "quiet", [(5, 100)])
    sealed_lag_of(runtime, "orders", 1)
    calls = tmp_path / "calls.jsonl"

    run = with_callback(DagFile("garbage_collection"), calls).test(run_conf={})
    assert str(run.state) == "failed"
    assert task_states(run) == {  # the GC itself did its work
        "sweep": ["success"],
        "drain": ["success"],
        "export_metadata": ["success"],
        "summary": ["success"],
        CHECK: ["failed"],
    }
    [called] = calls_of(calls)
    assert called["task"] == CHECK
    error = called["error"]
    assert error.startswith("1 service level(s) breached:\ntopic orders: offload lag ")
    assert "exceeds max_offload_lag_seconds 1 (3 ledgers, " in error
    assert "quiet" not in error

    # the level raised above the lag: the same run succeeds and no callback fires
    topic = runtime.metadata.get_topic("orders")
    runtime.metadata.set_policy(topic, topic.policy.updated({"max_offload_lag_seconds": 3600}))
    calls.unlink()
    met = with_callback(DagFile("garbage_collection"), calls).test(run_conf={})
    assert str(met.state) == "success", task_states(met)
    assert calls_of(calls) == []
    report = return_value(met, CHECK)
    assert (report["ok"], report["topics"], report["levels_checked"]) == (
        True,
        ["orders", "quiet"],
        1,
    )


@AIRFLOW
def test_a_breach_is_not_retried(runtime: Runtime) -> None:
    """AirflowFailException: one try, whatever the task's retries (a retry sees the same
    lag, later); dag.test would wait out a retry's delay."""
    make_topic(runtime, "orders", max_deletion_failing_keys=0, max_offload_lag_seconds=1)
    produce_ledgers(runtime, "orders", [(5, 100)])
    sealed_lag_of(runtime, "orders", 1)
    dag = DagFile("garbage_collection").parse()
    assert dag.get_task(CHECK).retries == 3
    run = dag.test(run_conf={})
    assert str(run.state) == "failed"
    [check] = [ti for ti in run.get_task_instances() if ti.task_id == CHECK]
    assert (str(check.state), check.try_number) == ("failed", 1)


@AIRFLOW
def test_the_streaming_check_holds_streaming_topics_only(runtime: Runtime) -> None:
    """Every minute, the streaming DAG judges the topics it streams; the hourly GC run
    judges every topic."""
    make_topic(runtime, "events", streaming=True, segment_max_age_seconds=0.5)
    make_topic(runtime, "orders", max_offload_lag_seconds=1)  # not streamed
    produce_ledgers(runtime, "orders", [(5, 100)])
    sealed_lag_of(runtime, "orders", 1)

    run = DagFile("streaming_offload").test(run_conf={}, retries=False)
    assert str(run.state) == "success", task_states(run)
    assert return_value(run, CHECK)["topics"] == ["events"]

    named = DagFile("streaming_offload").test(run_conf={"topic": "orders"}, retries=False)
    assert str(named.state) == "failed"
    assert task_states(named)[CHECK] == ["failed"]
