"""bulk_export through Airflow (dag.test) with real Spark, SeaweedFS and PostgreSQL.

Each submission costs a JVM start (20 to 40 s on a loaded 2-core machine), so the cases
are few and the data tiny: local[2] for the export, its rerun and a dry run; one run on a
standalone master with one worker that the fixture starts.
"""

from __future__ import annotations

from pathlib import Path

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
from fixtures.exports import (
    export_files,
    export_table,
    offloaded_topics,
    parquet_digests,
    streamed_topic,
)
from fixtures.lineage import LineageLog, datasets
from fixtures.spark import SparkSetup, assert_no_secret
from offloader.bulk.manifest import BulkExportResult
from offloader.keys import EXPORT_ATTEMPTS_DIR
from offloader.objectstore.location import StoreLocation
from offloader.runtime import Runtime

pytestmark = [pytest.mark.spark, POSTGRES_ONLY]


@pytest.fixture
def export_dag() -> DagFile:
    return DagFile("bulk_export")


def exports_url(rt: Runtime) -> str:
    return rt.settings.resolved_object_store_url.rstrip("/") + "/exports"


@pytest.mark.slow  # a Spark submission: tens of seconds
@pytest.mark.usefixtures("airflow_db")
def test_export_equals_the_source_a_rerun_changes_nothing_and_no_secret_leaks(
    secret_connections: list[str],
    monkeypatch: pytest.MonkeyPatch,
    runtime: Runtime,
    export_dag: DagFile,
    spark_local: SparkSetup,
    capfd: pytest.CaptureFixture,
    lineage_log: LineageLog,
) -> None:
    # multipart uploads: SeaweedFS refuses them with a session token (without_session_token)
    secret_connections = without_session_token(monkeypatch, secret_connections)
    offloaded_topics(runtime)
    streamed_topic(runtime)  # its ledgers are read from segments
    conf = {"export_id": "daily", "slice_bytes": 20_000}
    run = export_dag.test(run_conf=conf, retries=False)
    assert str(run.state) == "success", task_states(run)
    manifest, files = export_files(exports_url(runtime), "daily", runtime.settings)
    published = BulkExportResult(manifest).to_json()
    assert return_value(run, "export") == {**published, "output": exports_url(runtime)}
    assert published["ledgers"] == 4 + 3 and len(files) > 7  # ledgers cut in slices
    assert parquet_digests(export_table(files)) == tiered_digests(runtime)
    # OpenLineage: the store the job read into the export's folder, with what was written
    (done,) = lineage_log.of_task("bulk_export", "export", "COMPLETE")
    where = StoreLocation.from_url(runtime.settings.resolved_object_store_url)
    assert where.prefix == ""  # the fixture's bucket: its root is the store
    assert datasets([done], "inputs") == {(f"s3://{where.location}", "/")}
    assert datasets([done], "outputs") == {(f"s3://{where.location}", "exports/daily")}
    statistics = done["outputs"][0]["outputFacets"]["outputStatistics"]
    assert (statistics["rowCount"], statistics["size"], statistics["fileCount"]) == (
        published["rows"],
        published["bytes"],
        published["files"],
    )

    again = export_dag.test(run_conf=conf, retries=False)
    assert str(again.state) == "success", task_states(again)
    rerun, rerun_files = export_files(exports_url(runtime), "daily", runtime.settings)
    assert rerun.attempt != manifest.attempt and rerun.files == manifest.files
    assert sorted(rerun_files.values()) == sorted(files.values())
    keys = {i.key for i in runtime.objects.list("exports/daily/")}
    assert keys == {"exports/daily/_manifest.json"} | {
        f"exports/daily/{p}" for p in rerun.file_paths()
    }  # the first attempt is gone, nothing else is there

    out, err = capfd.readouterr()
    logs = out + err + airflow_logs()
    assert "Spark-Submit cmd:" in logs and "offloader.zip" in logs  # the command was logged
    assert "published" in logs  # and the driver's own output
    events = spark_local.event_log_text()
    assert "spark.master" in events  # Spark's conf as the UI's environment page shows it
    assert "bulk_export.py" in events  # ... and the real command line (sun.java.command)
    stored = stored_airflow_text()
    assert "daily" in stored  # rendered fields and XComs were read
    texts = {
        "logs": logs,
        "spark conf": events,
        "airflow db": stored,
        "lineage": lineage_log.text(),
    }
    for secret in secret_connections:  # the S3 secret key, session token, database password
        assert_no_secret(secret, texts)


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_a_dry_run_and_bad_params_write_nothing(
    runtime: Runtime, export_dag: DagFile, spark_local: SparkSetup, capfd: pytest.CaptureFixture
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    offloaded_topics(runtime, {"orders": [(10, 100)]})
    with pytest.raises(ParamValidationError, match="slice_bytes"):
        export_dag.test(run_conf={"slice_bytes": 0})
    # what the form's schema cannot say is refused by the task, before Spark is asked
    bad = export_dag.test(run_conf={"first_ledger": 5, "last_ledger": 4}, retries=False)
    assert str(bad.state) == "failed"
    assert "Spark-Submit cmd" not in capfd.readouterr().out + airflow_logs()

    dry = export_dag.test(run_conf={"export_id": "d", "dry_run": True}, retries=False)
    assert str(dry.state) == "success", task_states(dry)
    assert return_value(dry, "export")["dry_run"] is True
    out, err = capfd.readouterr()
    assert '"entries": 10' in out + err + airflow_logs()  # the plan was logged
    assert list(runtime.objects.list("exports/")) == []


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_export_on_a_standalone_master_to_a_local_directory(
    runtime: Runtime, export_dag: DagFile, spark_standalone: SparkSetup, tmp_path: Path
) -> None:
    offloaded_topics(runtime)
    out = tmp_path / "out"
    conf = {"export_id": "e", "output": str(out), "slice_bytes": 50_000}
    run = export_dag.test(run_conf=conf, retries=False)
    assert str(run.state) == "success", task_states(run)
    assert "spark://127.0.0.1" in spark_standalone.event_log_text()
    manifest, files = export_files(out.as_uri(), "e", runtime.settings)
    assert parquet_digests(export_table(files)) == tiered_digests(runtime)
    # the export is a symlink to its one attempt: a directory reader sees it whole
    assert (out / "e").is_symlink()
    assert [p.name for p in (out / EXPORT_ATTEMPTS_DIR / "e").iterdir()] == [manifest.attempt]
