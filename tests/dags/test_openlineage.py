"""OpenLineage from real DAG runs (dag.test), on both pairings: the events the provider's
listener writes to its file transport carry each data-moving task's hot topics and stores,
named by the OpenLineage naming spec (plugins/offloader_airflow/lineage.py), and never a
credential."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fixtures.airflow import DagFile, connection_env, task_states, without_session_token
from fixtures.backends import POSTGRES_ONLY, make_topic, produce_ledgers
from fixtures.lineage import LineageLog, datasets
from offloader.hottier.names import NAME_FILE, encode_topic
from offloader.objectstore.location import FILE, StoreLocation
from offloader.runtime import Runtime
from offloader.settings import Settings

AIRFLOW = pytest.mark.usefixtures("airflow_db", "airflow_connections")


def store_dataset(settings: Settings, host: str) -> tuple[str, str]:
    """The store's dataset, written out from the spec rather than by the module under test."""
    location = StoreLocation.from_url(settings.resolved_object_store_url)
    if location.kind == FILE:
        return f"file://{host}", location.location
    return f"s3://{location.location}", location.prefix or "/"


def hot_dataset(settings: Settings, topic: str, host: str) -> tuple[str, str]:
    return f"file://{host}", str(Path(settings.resolved_ledger_dir) / encode_topic(topic))


@AIRFLOW
def test_offload_reports_each_batch_hot_topic_into_the_store(
    runtime: Runtime, lineage_log: LineageLog
) -> None:
    make_topic(runtime, "orders", offload_threshold_bytes=0)
    make_topic(runtime, "clicks")  # no offload rule: nothing due
    produce_ledgers(runtime, "orders", [(10, 500)] * 3)
    produce_ledgers(runtime, "clicks", [(10, 500)])

    run = DagFile("offload_ledgers").test(run_conf={"batch_size": 2})
    assert str(run.state) == "success", task_states(run)
    host = socket.getfqdn()
    offloads = lineage_log.of_task("offload_ledgers", "offload", "COMPLETE")
    assert len(offloads) == 2  # two batches of orders, one event each
    for event in offloads:
        assert datasets([event], "inputs") == {hot_dataset(runtime.settings, "orders", host)}
        assert datasets([event], "outputs") == {store_dataset(runtime.settings, host)}
    # the tasks that move nothing report nothing
    for task in ("plan", "delete_hot_copies", "summary"):
        done = lineage_log.of_task("offload_ledgers", task, "COMPLETE")
        assert len(done) == 1 and done[0]["inputs"] == done[0]["outputs"] == []

    again = DagFile("offload_ledgers").test(run_conf={"batch_size": 2})
    assert str(again.state) == "success", task_states(again)
    assert len(lineage_log.of_task("offload_ledgers", "offload", "COMPLETE")) == 2  # none due


@AIRFLOW
def test_a_streaming_pass_reports_the_topic_into_the_segment_store(
    runtime: Runtime, lineage_log: LineageLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the connection names the host local paths are named under (workers sharing a volume)
    env = connection_env(runtime.settings, attempt_lease_seconds=2.0, lineage_host="tier-1.example")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    part = max(64 * 1024, runtime.objects.capabilities.min_part_size)
    make_topic(runtime, "events", streaming=True, min_part_bytes=part)
    make_topic(runtime, "quiet", streaming=True, min_part_bytes=part)  # nothing to stream
    produce_ledgers(runtime, "events", [(40, 5000)] * 2)

    run = DagFile("streaming_offload").test(run_conf={"close_now": True})
    assert str(run.state) == "success", task_states(run)
    streams = lineage_log.of_task("streaming_offload", "stream", "COMPLETE")
    assert len(streams) == 2  # one mapped task per topic
    assert datasets(streams, "inputs") == {
        hot_dataset(runtime.settings, "events", "tier-1.example")
    }
    assert datasets(streams, "outputs") == {store_dataset(runtime.settings, "tier-1.example")}
    quiet = [e for e in streams if not e["outputs"]]
    assert len(quiet) == 1 and quiet[0]["inputs"] == []  # the topic that moved nothing


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
@AIRFLOW
def test_a_failed_offload_reports_no_dataset(runtime: Runtime, lineage_log: LineageLog) -> None:
    make_topic(runtime, "orders", offload_threshold_bytes=0)
    produce_ledgers(runtime, "orders", [(5, 200)] * 2)
    # the hot copies' files gone (the metadata still lists them): the plan plans them,
    # the offload cannot read them
    folder = Path(runtime.settings.resolved_ledger_dir) / encode_topic("orders")
    for path in folder.iterdir():
        if path.is_file() and path.name != NAME_FILE:
            path.unlink()

    run = DagFile("offload_ledgers").test(run_conf={}, retries=False)
    assert task_states(run)["offload"] == ["failed"]
    failed = lineage_log.of_task("offload_ledgers", "offload", "FAIL")
    assert len(failed) == 1 and failed[0]["inputs"] == failed[0]["outputs"] == []
    assert not lineage_log.of_task("offload_ledgers", "offload", "COMPLETE")


@POSTGRES_ONLY
@pytest.mark.usefixtures("airflow_db")
def test_no_credential_reaches_an_event(
    runtime: Runtime,
    lineage_log: LineageLog,
    secret_connections: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the S3 secret key and the database password; SeaweedFS refuses the session token on
    # the HeadBucket a store's first use makes (fixtures.airflow.without_session_token)
    secret_connections = without_session_token(monkeypatch, secret_connections)
    make_topic(runtime, "orders", offload_threshold_bytes=0)
    produce_ledgers(runtime, "orders", [(5, 200)] * 2)
    run = DagFile("offload_ledgers").test(run_conf={})
    assert str(run.state) == "success", task_states(run)
    text = lineage_log.text()
    assert lineage_log.of_task("offload_ledgers", "offload", "COMPLETE")  # events were written
    assert runtime.settings.s3_endpoint_url and runtime.settings.s3_access_key_id
    for secret in [*secret_connections, runtime.settings.s3_access_key_id.get_secret_value()]:
        assert secret not in text
    assert runtime.settings.s3_endpoint_url not in text  # no endpoint either
