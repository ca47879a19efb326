"""bulk_rewrite through Airflow (dag.test) with real Spark local[2], SeaweedFS and PostgreSQL:
executors write the parts, the driver records and swaps.

Each submission costs a JVM start, so the data is small (a few single-block v1 ledgers)
and the cases few: compaction (entries unchanged, fewer objects, nothing left after the
GC, a rerun that plans nothing, no secret anywhere), v1 -> v2 -> v1, the refusals and dry
run that change nothing, a driver SIGKILLed between completing an upload and the swap
(readers unaffected, the GC cleans up, the next run finishes), and one run on a standalone
master with one worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from fixtures.airflow import (
    DagFile,
    airflow_logs,
    connection_env,
    return_value,
    set_secret_connections,
    stored_airflow_text,
    task_states,
    without_session_token,
)
from fixtures.backends import POSTGRES_ONLY
from fixtures.inspect import checksum, stored_keys
from fixtures.lineage import LineageLog, datasets
from fixtures.rewrites import T, check_clean_store, check_one_copy, entry_digests, shape, v1_topic
from fixtures.spark import BIN, SparkSetup, assert_no_secret
from offloader.gc.run import recover_stale_rewrites
from offloader.metadata import OffloadMode, SegmentOrigin, SegmentState
from offloader.objectstore.location import StoreLocation
from offloader.runtime import Runtime
from offloader.settings import Settings
from offloader_airflow.spark import SPARK_JOBS, child_environment

pytestmark = [pytest.mark.spark, POSTGRES_ONLY]


@pytest.fixture
def rewrite_dag(monkeypatch: pytest.MonkeyPatch, backend_settings: Settings) -> DagFile:
    """The DAG, its connection with a lease long enough for a loaded machine (the driver
    holds every lease of a wave while the executors write) and replaced objects queued for
    deletion at once, as the test runtime has it."""
    tuning = {"attempt_lease_seconds": 60.0, "replaced_object_grace_seconds": 0.0}
    for key, value in connection_env(backend_settings, **tuning).items():
        monkeypatch.setenv(key, value)
    return DagFile("bulk_rewrite")


def compact_conf(rt: Runtime, **more: object) -> dict[str, object]:
    return {"target_bytes": shape(rt).target, "small_bytes": shape(rt).target // 2, **more}


@pytest.mark.slow  # a Spark submission: tens of seconds
@pytest.mark.usefixtures("airflow_db")
def test_compaction_keeps_every_entry_in_fewer_objects_and_no_secret_leaks(
    monkeypatch: pytest.MonkeyPatch,
    runtime: Runtime,
    rewrite_dag: DagFile,
    spark_local: SparkSetup,
    capfd: pytest.CaptureFixture,
    lineage_log: LineageLog,
) -> None:
    # the connections of rewrite_dag (its tuning) with every credential set; multipart
    # uploads: SeaweedFS refuses them with a session token (without_session_token)
    tuning = {"attempt_lease_seconds": 60.0, "replaced_object_grace_seconds": 0.0}
    secrets = set_secret_connections(monkeypatch, runtime.settings, **tuning)
    secret_connections = without_session_token(monkeypatch, secrets)
    rt = runtime
    v1_topic(rt, 5)
    before, digests, count = checksum(rt, T), entry_digests(rt), len(stored_keys(rt.objects))
    run = rewrite_dag.test(run_conf=compact_conf(rt), retries=False)
    assert str(run.state) == "success", task_states(run)
    summary = return_value(run, "rewrite")
    assert summary["mode"] == "compact" and summary["dry_run"] is False
    groups = summary["totals"]["groups"]
    assert groups >= 1 and all(line.endswith(": rewritten") for line in summary["groups"])
    assert summary["totals"]["objects_after"] == 2 * groups < summary["totals"]["objects_before"]

    assert checksum(rt, T) == before and entry_digests(rt) == digests
    check_one_copy(rt)
    check_clean_store(rt)  # the replaced objects deleted, no orphan, no open upload
    assert len(stored_keys(rt.objects)) < count
    live = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    assert len(live) == groups and {s.origin for s in live} == {SegmentOrigin.REWRITE}

    # OpenLineage: the store's objects into the store's objects (keys are flat under its
    # prefix: one dataset), named as the spec names S3 data
    (done,) = lineage_log.of_task("bulk_rewrite", "rewrite", "COMPLETE")
    where = StoreLocation.from_url(rt.settings.resolved_object_store_url)
    store = (f"s3://{where.location}", where.prefix or "/")
    assert datasets([done], "inputs") == datasets([done], "outputs") == {store}

    again = rewrite_dag.test(run_conf=compact_conf(rt), retries=False)
    assert str(again.state) == "success", task_states(again)
    assert return_value(again, "rewrite")["groups"] == []  # nothing left to compact
    nothing = lineage_log.of_task("bulk_rewrite", "rewrite", "COMPLETE")[1]
    assert nothing["inputs"] == nothing["outputs"] == []  # it moved nothing

    out, err = capfd.readouterr()
    logs = out + err + airflow_logs()
    assert "Spark-Submit cmd:" in logs and "rewrite report:" in logs
    events = spark_local.event_log_text()
    assert "bulk_rewrite.py" in events and "spark.master" in events
    stored = stored_airflow_text()
    assert "'mode': 'compact'" in stored  # the rendered params and XComs were read
    texts = {
        "logs": logs,
        "spark conf": events,
        "airflow db": stored,
        "lineage": lineage_log.text(),
    }
    for secret in secret_connections:  # the S3 secret key, session token, database password
        assert_no_secret(secret, texts)


@pytest.mark.long  # the short form: the compaction run here, the same submission; the spread
# migration both ways in tests/offloader/rewrite/test_rewrite_spread.py
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_v1_to_v2_and_back_keeps_every_entry(
    runtime: Runtime, rewrite_dag: DagFile, spark_local: SparkSetup
) -> None:
    rt = runtime
    ids = v1_topic(rt, 3)
    digests = entry_digests(rt)
    to_v2 = rewrite_dag.test(run_conf={"mode": "to-v2"}, retries=False)
    assert str(to_v2.state) == "success", task_states(to_v2)
    modes = {x.ledger_id: x.offload_mode for x in rt.metadata.list_ledgers(T)}
    assert modes == {i: OffloadMode.STREAM for i in ids}
    assert entry_digests(rt) == digests

    to_v1 = rewrite_dag.test(run_conf={"mode": "to-v1"}, retries=False)
    assert str(to_v1.state) == "success", task_states(to_v1)
    assert len(return_value(to_v1, "rewrite")["groups"]) == len(ids)
    modes = {x.ledger_id: x.offload_mode for x in rt.metadata.list_ledgers(T)}
    assert modes == {i: OffloadMode.LEDGER for i in ids}
    assert entry_digests(rt) == digests
    check_one_copy(rt)
    check_clean_store(rt)


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_bad_params_submit_nothing_and_a_dry_run_changes_nothing(
    runtime: Runtime, rewrite_dag: DagFile, spark_local: SparkSetup, capfd: pytest.CaptureFixture
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    rt = runtime
    v1_topic(rt, 3)
    stored = stored_keys(rt.objects)
    with pytest.raises(ParamValidationError, match="mode"):
        rewrite_dag.test(run_conf={"mode": "defrag"})
    # what the form's schema cannot say is refused by the task, before Spark is asked
    for conf in ({"topics": ["nope"]}, {"mode": "to-v2", "small_bytes": 10}):
        bad = rewrite_dag.test(run_conf=conf, retries=False)
        assert str(bad.state) == "failed", conf
    out, err = capfd.readouterr()
    logs = out + err + airflow_logs()
    assert "Spark-Submit cmd" not in logs
    assert "'nope'" in logs and "small_bytes applies to mode compact only" in logs

    dry = rewrite_dag.test(run_conf=compact_conf(rt, dry_run=True), retries=False)
    assert str(dry.state) == "success", task_states(dry)
    summary = return_value(dry, "rewrite")
    assert summary["dry_run"] is True and summary["totals"]["groups"] >= 1
    assert all(line.endswith(": planned") for line in summary["groups"])
    assert stored_keys(rt.objects) == stored and rt.metadata.segments.of_topic(T) == []


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_a_driver_killed_before_the_swap_leaves_readers_whole_and_the_gc_cleans_up(
    runtime: Runtime, rewrite_dag: DagFile, spark_local: SparkSetup, tmp_path: Path
) -> None:
    from offloader.bulk.shipping import library_zip

    rt = runtime
    v1_topic(rt, 5)
    before, stored = checksum(rt, T), stored_keys(rt.objects)
    params = json.dumps({"mode": "compact", **compact_conf(rt)})
    settings = rt.settings.model_copy(update={"attempt_lease_seconds": 3.0})
    env = {
        **child_environment(os.environ, settings),
        "OFFLOADER_FAILPOINTS": "rewrite-after-complete",
    }
    app = str(SPARK_JOBS / "bulk_rewrite.py")
    submit = [str(BIN / "spark-submit"), "--master", "local[2]", app, params]
    done = subprocess.run(
        [*submit, str(library_zip(tmp_path))], env=env, capture_output=True, timeout=600
    )
    assert done.returncode != 0, done.stderr.decode(errors="replace")[-2000:]

    # right after the kill: the wave's two intents recorded, the first group's upload
    # completed, nothing swapped, readers unaffected
    open_rewrites = rt.metadata.segments.of_topic(T, [SegmentState.ASSIGNED])
    assert len(open_rewrites) == 2
    assert {s.origin for s in open_rewrites} == {SegmentOrigin.REWRITE}
    assert rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED]) == []
    assert {x.offload_mode for x in rt.metadata.list_ledgers(T)} == {OffloadMode.LEDGER}
    assert open_rewrites[0].data_key in stored_keys(rt.objects)
    assert checksum(rt, T) == before

    time.sleep(3.5)  # the dead driver's leases run out
    recovered = {s.segment_id for s in recover_stale_rewrites(rt)}
    assert recovered == {s.segment_id for s in open_rewrites}
    check_clean_store(rt)
    assert stored_keys(rt.objects) == stored and checksum(rt, T) == before

    run = rewrite_dag.test(run_conf=compact_conf(rt), retries=False)  # the next run finishes
    assert str(run.state) == "success", task_states(run)
    assert checksum(rt, T) == before
    check_one_copy(rt)
    check_clean_store(rt)
    assert len(stored_keys(rt.objects)) < len(stored)


@pytest.mark.long  # the short form: bulk_export on a standalone master, this on local[2]
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_compaction_on_a_standalone_master(
    runtime: Runtime, rewrite_dag: DagFile, spark_standalone: SparkSetup
) -> None:
    """Executors of a real worker import the shipped zip, write the parts, send them back."""
    rt = runtime
    v1_topic(rt, 4)
    before = checksum(rt, T)
    run = rewrite_dag.test(run_conf=compact_conf(rt), retries=False)
    assert str(run.state) == "success", task_states(run)
    assert "spark://127.0.0.1" in spark_standalone.event_log_text()
    assert return_value(run, "rewrite")["totals"]["groups"] >= 1
    assert checksum(rt, T) == before
    check_clean_store(rt)
