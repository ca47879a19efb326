"""scrub through Airflow (dag.test) with real Spark local[2], SeaweedFS and PostgreSQL.

Each submission costs a JVM start, so the data is tiny (two single-block ledgers) and each
case one run: a clean store, damage repaired from a hot copy (of a ledger, and of the
ledgers of a damaged streaming segment), damage without one, the
refusals and dry run that submit nothing or read nothing; and one run on a standalone
master with one worker that the fixture starts.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from fixtures.airflow import (
    DagFile,
    airflow_logs,
    return_value,
    stored_airflow_text,
    task_states,
    without_session_token,
)
from fixtures.backends import POSTGRES_ONLY, tiered_digests
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.scrub import (
    expected_counts,
    missing_data_object,
    missing_index_object,
    offloaded_topic,
    truncated_data_object,
)
from fixtures.spark import SparkSetup, assert_no_secret
from fixtures.streamed import (
    flip_a_payload_byte,
    ledgers_by_segment,
    shared_segment,
    streamed_topic,
)
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.runtime import Runtime
from offloader.scrub.output import read_report_at

pytestmark = [pytest.mark.spark, POSTGRES_ONLY]

#: two single-block ledgers of small entries
SHAPES = [(40, 2000), (30, 1000)]


@pytest.fixture
def scrub_dag() -> DagFile:
    return DagFile("scrub")


def store_state(rt: Runtime) -> dict[str, Any]:
    return {
        "ledgers": rt.metadata.list_ledgers("orders"),
        "attempts": list_attempts(rt.metadata),
        "deletions": pending_deletions(rt.metadata),
        "objects": {i.key: rt.objects.get(i.key) for i in rt.objects.list()},
    }


@pytest.mark.slow  # a Spark submission: tens of seconds
@pytest.mark.usefixtures("airflow_db")
def test_a_clean_store_passes_with_exact_counts_and_no_secret_leaks(
    secret_connections: list[str],
    monkeypatch: pytest.MonkeyPatch,
    runtime: Runtime,
    scrub_dag: DagFile,
    spark_local: SparkSetup,
    capfd: pytest.CaptureFixture,
) -> None:
    # SeaweedFS refuses the executors' calls that carry a session token (InvalidAccessKeyId)
    secret_connections = without_session_token(monkeypatch, secret_connections)
    ledgers = offloaded_topic(runtime, "orders", SHAPES)
    run = scrub_dag.test(run_conf={}, retries=False)
    assert str(run.state) == "success", task_states(run)
    summary = return_value(run, "scrub")
    name = run.run_id.replace(" ", "_")
    store_url = runtime.settings.resolved_object_store_url.rstrip("/")
    assert summary["report"] == f"{store_url}/scrub-reports/{name}.json"
    report = read_report_at(summary["report"], runtime.settings)
    assert report is not None
    assert report["counts"] == asdict(expected_counts(runtime, ledgers)) == summary["counts"]
    assert report["damaged_ledgers"] == [] and report["failed"] is False
    assert report["topics"] is None and report["repair"] is True
    assert summary["damaged"] == {} and summary["failed"] is False

    out, err = capfd.readouterr()
    logs = out + err + airflow_logs()
    assert "Spark-Submit cmd:" in logs and "offloader.zip" in logs  # the command was logged
    assert "scrubbed 2 ledgers" in logs  # and the driver's summary
    events = spark_local.event_log_text()
    assert "spark.master" in events and "scrub.py" in events  # conf and command line
    stored = stored_airflow_text()
    assert "scrub-reports" in stored  # rendered fields and XComs were read
    for secret in secret_connections:  # the S3 secret key, session token, database password
        assert_no_secret(secret, {"logs": logs, "spark conf": events, "airflow db": stored})


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_damage_with_a_hot_copy_is_repaired_and_reported(
    runtime: Runtime, scrub_dag: DagFile, spark_local: SparkSetup, tmp_path: Path
) -> None:
    ledgers = offloaded_topic(runtime, "orders", SHAPES)
    digests = tiered_digests(runtime)
    victim = ledgers[0]
    planted = truncated_data_object(runtime, victim)
    report_file = tmp_path / "reports" / "scrub.json"
    conf = {"topics": ["orders"], "report": str(report_file)}
    run = scrub_dag.test(run_conf=conf, retries=False)
    assert str(run.state) == "success", task_states(run)
    report = read_report_at(report_file.as_uri(), runtime.settings)
    assert report is not None and report["failed"] is False and report["topics"] == ["orders"]
    (verdict,) = report["damaged_ledgers"]
    now = runtime.metadata.get_ledger("orders", victim.ledger_id)
    assert verdict["ledger_id"] == victim.ledger_id and verdict["action"] == "repaired"
    assert verdict["offload_uuid"] == victim.offload_attempt_id
    assert verdict["replaced_by"] == now.offload_attempt_id != victim.offload_attempt_id
    assert [(f["key"], f["kind"]) for f in verdict["findings"]] == [(planted.key, planted.kind)]
    assert planted.reason in verdict["findings"][0]["reason"]
    assert return_value(run, "scrub")["damaged"] == {f"orders/{victim.ledger_id}": "repaired"}
    assert tiered_digests(runtime) == digests  # the tier reads the same entries again
    # the counts are what was read: the truncated object's blocks were not read whole
    assert report["counts"]["entries"] == ledgers[1].entry_count


@pytest.mark.long  # the short form: a ledger repaired through this DAG; segment repairs in
# tests/offloader/scrub/test_scrub_segment_repair.py and test_scrub_segment_crash.py
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_a_damaged_segment_is_repaired_on_the_driver(
    runtime: Runtime, scrub_dag: DagFile, spark_local: SparkSetup, tmp_path: Path
) -> None:
    """Executors read the segments; the driver offloads the damaged one's ledgers again
    from their hot copies as v1 objects and releases it."""
    streamed_topic(runtime, "events", 4)
    digests = tiered_digests(runtime)
    victim = shared_segment(runtime, "events")
    ids = sorted(ledgers_by_segment(runtime, "events")[victim.segment_id])
    flip_a_payload_byte(runtime, victim)
    report_file = tmp_path / "scrub.json"
    run = scrub_dag.test(run_conf={"report": str(report_file)}, retries=False)
    assert str(run.state) == "success", task_states(run)
    report = read_report_at(report_file.as_uri(), runtime.settings)
    assert report is not None and report["failed"] is False
    (verdict,) = report["damaged_ledgers"]
    assert (verdict["offload_uuid"], verdict["action"]) == (victim.segment_id, "repaired")
    assert [(x["ledger_id"], x["action"]) for x in verdict["ledgers"]] == [
        (n, "repaired") for n in ids
    ]
    damaged = return_value(run, "scrub")["damaged"]
    assert damaged == {f"events/{n}": "repaired" for n in ids}
    assert runtime.metadata.segments.get(victim.segment_id).state.value == "deleted"
    assert tiered_digests(runtime) == digests


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_damage_without_a_hot_copy_fails_the_task_and_changes_nothing(
    runtime: Runtime,
    scrub_dag: DagFile,
    spark_local: SparkSetup,
    tmp_path: Path,
    capfd: pytest.CaptureFixture,
) -> None:
    ledgers = offloaded_topic(runtime, "orders", SHAPES)
    delete_hot_copies(runtime.metadata, runtime.hot, "orders")
    victim = runtime.metadata.get_ledger("orders", ledgers[1].ledger_id)
    assert not victim.has_hot_copy
    planted = missing_data_object(runtime, victim)
    before = store_state(runtime)
    report_file = tmp_path / "scrub.json"
    run = scrub_dag.test(run_conf={"report": report_file.as_uri()}, retries=False)
    assert str(run.state) == "failed", task_states(run)
    report = read_report_at(report_file.as_uri(), runtime.settings)
    assert report is not None and report["failed"] is True
    (verdict,) = report["damaged_ledgers"]
    assert (verdict["ledger_id"], verdict["action"]) == (victim.ledger_id, "no-hot-copy")
    assert "hot copy deleted" in verdict["detail"] and verdict["replaced_by"] is None
    assert [(f["key"], f["kind"]) for f in verdict["findings"]] == [(planted.key, planted.kind)]
    out, err = capfd.readouterr()
    logs = out + err + airflow_logs()
    assert f"orders/{victim.ledger_id} (no-hot-copy)" in logs  # the driver's error line
    assert store_state(runtime) == before


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_bad_params_submit_nothing_and_a_dry_run_reads_nothing(
    runtime: Runtime, scrub_dag: DagFile, spark_local: SparkSetup, capfd: pytest.CaptureFixture
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    offloaded_topic(runtime, "orders", SHAPES)
    with pytest.raises(ParamValidationError, match="report"):
        scrub_dag.test(run_conf={"report": "reports/x.json"})
    # what the form's schema cannot say is refused by the task, before Spark is asked
    for conf in ({"topics": ["nope"]}, {"report": "s3://bucket/folder/"}):
        bad = scrub_dag.test(run_conf=conf, retries=False)
        assert str(bad.state) == "failed", conf
    out, err = capfd.readouterr()
    logs = out + err + airflow_logs()
    assert "Spark-Submit cmd" not in logs
    assert "'nope'" in logs and "names a folder" in logs

    before = store_state(runtime)
    dry = scrub_dag.test(run_conf={"dry_run": True}, retries=False)
    assert str(dry.state) == "success", task_states(dry)
    assert return_value(dry, "scrub")["dry_run"] is True
    out, err = capfd.readouterr()
    assert "scrub plan: 2 ledgers" in out + err + airflow_logs()
    assert store_state(runtime) == before  # no report, nothing repaired


@pytest.mark.long  # the short form: bulk_export on a standalone master, scrub on local[2]
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_scrub_on_a_standalone_master(
    runtime: Runtime, scrub_dag: DagFile, spark_standalone: SparkSetup, tmp_path: Path
) -> None:
    """Executors of a real worker import the shipped zip and send their findings back."""
    ledgers = offloaded_topic(runtime, "orders", SHAPES)
    planted = missing_index_object(runtime, ledgers[1])
    report_file = tmp_path / "scrub.json"
    run = scrub_dag.test(run_conf={"report": str(report_file)}, retries=False)
    assert str(run.state) == "success", task_states(run)
    assert "spark://127.0.0.1" in spark_standalone.event_log_text()
    report = read_report_at(report_file.as_uri(), runtime.settings)
    assert report is not None
    (verdict,) = report["damaged_ledgers"]
    assert (verdict["ledger_id"], verdict["action"]) == (ledgers[1].ledger_id, "repaired")
    assert [(f["key"], f["kind"]) for f in verdict["findings"]] == [(planted.key, planted.kind)]
    assert report["counts"]["entries"] == ledgers[0].entry_count
