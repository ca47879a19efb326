"""offload_ledgers end to end through Airflow, on both backends (SeaweedFS + PostgreSQL too)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.airflow import (
    DagFile,
    connection_env,
    return_value,
    stored_airflow_text,
    task_states,
    xcom_values,
)
from fixtures.backends import (
    make_topic,
    produce_ledgers,
    unaccounted_objects,
    uploads_not_of_dead_attempts,
)
from fixtures.metadata import list_attempts
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState, HotState
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime
from offloader_airflow.links import OffloadedObjectsLink


@pytest.fixture
def offload_dag() -> DagFile:
    return DagFile("offload_ledgers")


def summary_of(run) -> dict:  # type: ignore[no-untyped-def]
    return return_value(run, "summary")


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_offload_run_end_to_end_then_a_second_run_changes_nothing(
    runtime: Runtime, offload_dag, capfd
) -> None:
    make_topic(runtime, "orders", offload_threshold_bytes=100_000)
    make_topic(runtime, "clicks")
    ids = produce_ledgers(runtime, "orders", [(40, 5000)] * 5)
    produce_ledgers(runtime, "clicks", [(10, 100)])
    before = {t: TopicReader(runtime).checksum(t) for t in ("orders", "clicks")}

    run = offload_dag.test(run_conf={"batch_size": 2})
    assert str(run.state) == "success", task_states(run)
    assert task_states(run)["offload"] == ["success"] * 2  # 4 due ledgers, 2 per task
    summary = summary_of(run)
    assert summary["offloaded"] == 4 and summary["planned_ledgers"] == 4
    assert summary["hot_copies_deleted"] == 4
    # the size rule keeps at most 100 kB of 'orders' hot: the newest ledger stays
    ledgers = runtime.metadata.list_ledgers("orders")
    assert [x.is_offloaded for x in ledgers] == [True, True, True, True, False]
    assert all(x.hot_state is HotState.DELETED for x in ledgers[:4])
    assert not any(x.is_offloaded for x in runtime.metadata.list_ledgers("clicks"))
    for topic, checksum in before.items():
        assert TopicReader(runtime).checksum(topic) == checksum
    assert unaccounted_objects(runtime) == set()
    objects = {i.key for i in runtime.objects.list()}
    # the extra link, built when each offload task finished, leads to an object it wrote
    links = xcom_values(run, "offload", OffloadedObjectsLink().xcom_key, decode=False)
    data_keys = {x.data_key for x in ledgers[:4]}
    assert len(links) == 2 and all(any(link.endswith(k) for k in data_keys) for link in links)

    again = offload_dag.test(run_conf={"batch_size": 2})
    assert str(again.state) == "success", task_states(again)
    assert summary_of(again)["planned_ledgers"] == 0
    assert runtime.metadata.list_ledgers("orders") == ledgers
    assert {i.key for i in runtime.objects.list()} == objects
    assert [x.ledger_id for x in ledgers] == ids  # the five produced, nothing else
    # credentials never reach logs, XComs or rendered fields
    secret = runtime.settings.s3_secret_access_key
    if secret is not None:
        out, err = capfd.readouterr()
        logs = (
            out
            + err
            + "".join(
                f.read_text(errors="replace")
                for f in Path(os.environ["AIRFLOW_HOME"]).rglob("*.log")
            )
        )
        assert "offloaded" in logs or "summary" in logs  # the logs were captured
        stored = stored_airflow_text()
        assert "offloaded" in stored  # the XComs were read
        for text in (logs, stored):
            assert secret.get_secret_value() not in text


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_dry_run_and_explicit_prefix(runtime: Runtime, offload_dag) -> None:
    make_topic(runtime, "orders")
    ids = produce_ledgers(runtime, "orders", [(10, 1000)] * 3)
    dry = offload_dag.test(run_conf={"topic": "orders", "up_to_ledger": ids[1], "dry_run": True})
    assert str(dry.state) == "success", task_states(dry)
    assert summary_of(dry)["planned_ledgers"] == 2
    assert not any(x.is_offloaded for x in runtime.metadata.list_ledgers("orders"))
    assert list(runtime.objects.list()) == []

    run = offload_dag.test(run_conf={"topic": "orders", "up_to_ledger": ids[1]})
    assert str(run.state) == "success", task_states(run)
    assert [x.is_offloaded for x in runtime.metadata.list_ledgers("orders")] == [True, True, False]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"up_to_ledger": -1}, "up_to_ledger"),
        ({"batch_size": 0}, "batch_size"),
        ({"dry_run": "maybe"}, "dry_run"),
        ({"topic": 7}, "topic"),
    ],
)
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_bad_params_are_refused_before_anything_changes(
    runtime: Runtime, offload_dag, conf, message
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    make_topic(runtime, "orders")
    produce_ledgers(runtime, "orders", [(10, 1000)])
    with pytest.raises(ParamValidationError, match=message):
        offload_dag.test(run_conf=conf)
    assert not any(x.is_offloaded for x in runtime.metadata.list_ledgers("orders"))


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_unknown_topic_fails_the_plan_and_changes_nothing(runtime: Runtime, offload_dag) -> None:
    make_topic(runtime, "orders")
    produce_ledgers(runtime, "orders", [(10, 1000)])
    run = offload_dag.test(run_conf={"topic": "nope", "up_to_ledger": 99}, retries=False)
    assert str(run.state) == "failed"
    assert task_states(run)["plan"] == ["failed"]
    assert not any(x.is_offloaded for x in runtime.metadata.list_ledgers("orders"))


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"object_store_url": "file:///tmp/x"}, "metadata_url: Field required"),
        (
            {"metadata_url": "sqlite:////tmp/x.db", "object_store_url": "ftp://x"},
            "object_store_url",
        ),
        (
            {
                "metadata_url": "sqlite:////tmp/x.db",
                "object_store_url": "s3://b",
                "aws_conn_id": "missing_aws",
            },
            "connection 'missing_aws' is not defined",
        ),
    ],
)
@pytest.mark.usefixtures("airflow_db")
def test_bad_connections_fail_clearly_and_change_nothing(
    monkeypatch: pytest.MonkeyPatch, offload_dag, capfd, extra, fragment
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_OFFLOADER_DEFAULT", json.dumps({"conn_type": "generic", "extra": extra})
    )
    run = offload_dag.test(run_conf={}, retries=False)
    assert str(run.state) == "failed"
    assert task_states(run)["plan"] == ["failed"]
    # without a plan there is nothing to wire: not a failure of its own, not retried
    assert task_states(run)["delete_hot_copies"] == ["upstream_failed"]
    out, err = capfd.readouterr()
    assert fragment in out + err
    assert not Path("/tmp/x.db").exists()


@pytest.mark.usefixtures("airflow_db")
def test_a_database_not_upgraded_fails_the_task_saying_so(
    monkeypatch: pytest.MonkeyPatch, offload_dag, capfd, tmp_path: Path
) -> None:
    """Tasks never migrate: on a database that needs `offloader db upgrade` they fail fast
    with that message and leave the database as it was."""
    database = tmp_path / "metadata.db"
    extra = {"metadata_url": f"sqlite:///{database}", "object_store_url": tmp_path.as_uri()}
    monkeypatch.setenv(
        "AIRFLOW_CONN_OFFLOADER_DEFAULT", json.dumps({"conn_type": "generic", "extra": extra})
    )
    run = offload_dag.test(run_conf={}, retries=False)
    assert str(run.state) == "failed"
    assert task_states(run)["plan"] == ["failed"]
    out, err = capfd.readouterr()
    assert "has no offloader schema" in out + err and "run `offloader db upgrade`" in out + err
    with sqlite3.connect(database) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []


@pytest.mark.parametrize(
    "backend_settings",
    # the short form kills it on the production pairing; the embedded one in the long form
    [pytest.param("fs-sqlite", marks=pytest.mark.long), "s3-postgres"],
    indirect=True,
)
def test_killed_offload_task_retried_converges(backend_settings, airflow_db) -> None:  # type: ignore[no-untyped-def]
    """`airflow dags test` in a real process, SIGKILLed mid-upload by a failpoint; the run
    is retried; the ledger is committed once and nothing is left behind."""
    with Runtime.open(backend_settings) as rt:
        make_topic(rt, "orders")
        ids = produce_ledgers(rt, "orders", [(24, 1024 * 1024)])
        checksum = TopicReader(rt).checksum("orders", Source.HOT)
    env = {**os.environ, **connection_env(backend_settings, attempt_lease_seconds=2.0)}
    airflow = str(Path(sys.executable).with_name("airflow"))
    conf = json.dumps({"topic": "orders", "up_to_ledger": ids[-1]})
    killed = subprocess.run(
        [airflow, "dags", "test", "offload_ledgers", "-c", conf],
        env={**env, "OFFLOADER_FAILPOINTS": "after-first-part"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    time.sleep(2.2)  # the killed attempt's lease runs out
    retried = subprocess.run(
        [airflow, "dags", "test", "offload_ledgers", "-c", conf],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert retried.returncode == 0, retried.stderr[-3000:]
    with Runtime.open(backend_settings) as rt:
        ledger = rt.metadata.get_ledger("orders", ids[0])
        assert ledger.is_offloaded
        attempts = list_attempts(rt.metadata, "orders")
        assert [a.state for a in attempts] == [AttemptState.SUPERSEDED, AttemptState.COMMITTED]
        assert TopicReader(rt).checksum("orders", Source.TIERED) == checksum
        assert unaccounted_objects(rt) == set()
        process_deletions(rt.metadata, rt.stores, rt.settings)
        assert {i.key for i in rt.objects.list()} == {ledger.data_key, ledger.index_key}
        assert uploads_not_of_dead_attempts(rt) == set()  # the rest is the orphan sweep's
