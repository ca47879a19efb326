"""The Spark operators' checks before anything is submitted, and the driver's environment.

The submissions themselves run in tests/spark/ (real Spark); here nothing reaches Spark: a
fake ``spark-submit`` on the PATH records what it was given.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException

from fixtures.airflow import connection_env
from fixtures.databases import sqlite_url, upgraded
from offloader.exceptions import NotFoundError
from offloader.params import RunParamsError
from offloader.settings import Settings
from offloader_airflow.spark import (
    GIVEN_HOOK_ARGUMENTS,
    RENDERED_HOOK_ARGUMENTS,
    SPARK_JOBS,
    BulkExportOperator,
    ScrubOperator,
    child_environment,
)

#: records its arguments and environment (one JSON line a run), then sleeps and exits as
#: FAKE_SPARK_SUBMIT_SLEEP and FAKE_SPARK_SUBMIT_EXIT say
FAKE_SPARK_SUBMIT = """
import json, os, sys, time
with open(os.environ["FAKE_SPARK_SUBMIT_LOG"], "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}) + "\\n")
print("the fake driver started", flush=True)
time.sleep(float(os.environ.get("FAKE_SPARK_SUBMIT_SLEEP", "0")))
sys.exit(int(os.environ.get("FAKE_SPARK_SUBMIT_EXIT", "0")))
"""


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    settings = upgraded(Settings(data_dir=tmp_path / "data", metadata_url=sqlite_url(tmp_path)))
    for key, value in connection_env(settings).items():
        monkeypatch.setenv(key, value)
    return settings


def spark_conn(monkeypatch: pytest.MonkeyPatch, deploy_mode: str) -> None:
    conn = {"conn_type": "spark", "host": "local[1]", "extra": {"deploy-mode": deploy_mode}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(conn))


@pytest.fixture
def fake_spark_submit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A ``spark-submit`` first on the PATH that records its runs; the file they go to."""
    bin_dir, runs = tmp_path / "fake-bin", tmp_path / "spark-submit-runs.jsonl"
    bin_dir.mkdir()
    script = bin_dir / "spark-submit"
    script.write_text(f"#!{sys.executable}\n{FAKE_SPARK_SUBMIT}")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SPARK_SUBMIT_LOG", str(runs))
    return runs


def submissions(runs: Path) -> list[dict]:
    return [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []


def test_the_driver_sees_exactly_the_connections_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings.from_values(
        metadata_url="postgresql://u:pw@db/x", s3_secret_access_key="s3cr3t", read_prefetch=2
    )
    parent = {"PATH": "/bin", "OFFLOADER_LEDGER_DIR": "/stray", "OFFLOADER_READ_PREFETCH": "9"}
    env = child_environment(parent, settings)
    assert env["PATH"] == "/bin" and "OFFLOADER_LEDGER_DIR" not in env
    assert env["OFFLOADER_READ_PREFETCH"] == "2"
    # the driver builds Settings() from that environment: the same settings come out
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings() == settings


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"export_params": {"slice_bytes": 0}}, RunParamsError, "slice_bytes"),
        ({"export_params": {"first_ledger": 3, "last_ledger": 1}}, RunParamsError, "above"),
        ({"env_vars": {"X": "1"}}, ValueError, "env_vars is not taken"),
    ],
)
def test_bad_input_is_refused_before_submitting(
    monkeypatch: pytest.MonkeyPatch, connections: Settings, kwargs, error, message
) -> None:
    spark_conn(monkeypatch, "client")
    operator = BulkExportOperator(task_id="export", **kwargs)
    with pytest.raises(error, match=message):
        operator.execute({"run_id": "r1"})  # type: ignore[arg-type]
    assert operator.submit_hook is None  # no spark-submit was built


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"scrub_params": {"report": "rel/x.json"}}, RunParamsError, "report: 'rel/x.json'"),
        ({"scrub_params": {"report": "/r/"}}, RunParamsError, "names a folder"),
        ({"scrub_params": {"repair": None}}, RunParamsError, "repair: None is not of type"),
        ({"scrub_params": {"topics": ["nope"]}}, NotFoundError, "topic 'nope' does not exist"),
        ({"env_vars": {"X": "1"}}, ValueError, "env_vars is not taken"),
    ],
)
def test_scrub_refuses_bad_input_before_submitting(
    monkeypatch: pytest.MonkeyPatch, connections: Settings, kwargs, error, message
) -> None:
    spark_conn(monkeypatch, "client")
    operator = ScrubOperator(task_id="scrub", **kwargs)
    with pytest.raises(error, match=message):
        operator.execute({"run_id": "r1"})  # type: ignore[arg-type]
    assert operator.submit_hook is None  # no spark-submit was built


@pytest.mark.parametrize("operator_class", [BulkExportOperator, ScrubOperator])
def test_cluster_deploy_mode_is_refused(
    monkeypatch: pytest.MonkeyPatch, connections: Settings, operator_class: type
) -> None:
    spark_conn(monkeypatch, "cluster")
    operator = operator_class(task_id="job")
    with pytest.raises(ValueError, match="runs in client mode"):
        operator.execute({"run_id": "r1"})  # type: ignore[arg-type]
    objects = connections.data_dir / "objects"
    assert not (objects / "exports").exists() and not (objects / "scrub-reports").exists()


@pytest.mark.usefixtures("connections")
def test_cluster_deploy_mode_given_to_the_operator_is_refused(
    monkeypatch: pytest.MonkeyPatch, fake_spark_submit: Path
) -> None:
    spark_conn(monkeypatch, "client")
    operator = BulkExportOperator(task_id="export", deploy_mode="cluster")
    with pytest.raises(ValueError, match="runs in client mode"):
        operator.execute({"run_id": "r1"})  # type: ignore[arg-type]
    assert operator.submit_hook is None and submissions(fake_spark_submit) == []


SPARK_OPTIONS = {"conn_id": "spark_default", "name": "bulk_export", "executor_memory": "1g"}


@pytest.mark.usefixtures("connections")
def test_the_command_line_is_spark_submit_operators_and_the_driver_gets_the_settings(
    monkeypatch: pytest.MonkeyPatch, fake_spark_submit: Path
) -> None:
    spark_conn(monkeypatch, "client")
    operator = BulkExportOperator(
        task_id="export",
        conf={"spark.ui.enabled": "false"},
        export_params={"dry_run": True},
        **SPARK_OPTIONS,
    )
    assert operator.execute({"run_id": "r1"})["dry_run"] is True  # type: ignore[index]
    (ours,) = submissions(fake_spark_submit)
    # the provider's own operator, given the same options and arguments, runs the same command
    SparkSubmitOperator(
        task_id="provider",
        application=str(SPARK_JOBS / "bulk_export.py"),
        conf={"spark.ui.enabled": "false"},
        # the params, the library zip and the file the driver writes its result to
        application_args=ours["argv"][-3:],
        **SPARK_OPTIONS,
    ).execute({})  # type: ignore[arg-type]
    theirs = submissions(fake_spark_submit)[1]
    assert ours["argv"] == theirs["argv"]
    assert ours["argv"][:2] == ["--master", "local[1]"] and "--deploy-mode" in ours["argv"]
    assert "1g" in ours["argv"] and "spark.ui.enabled=false" in ours["argv"]
    driver = {k: v for k, v in ours["env"].items() if k.startswith("OFFLOADER_")}
    assert driver == operator.portable_settings().environment()


@pytest.mark.usefixtures("connections")
def test_a_failed_spark_submit_fails_the_task(
    monkeypatch: pytest.MonkeyPatch, fake_spark_submit: Path
) -> None:
    spark_conn(monkeypatch, "client")
    monkeypatch.setenv("FAKE_SPARK_SUBMIT_EXIT", "3")
    operator = BulkExportOperator(task_id="export", export_params={"dry_run": True})
    with pytest.raises(AirflowException, match="Error code is: 3"):
        operator.execute({"run_id": "r1"})  # type: ignore[arg-type]
    assert len(submissions(fake_spark_submit)) == 1


@pytest.mark.usefixtures("connections")
def test_killing_the_task_stops_spark_submit(
    monkeypatch: pytest.MonkeyPatch, fake_spark_submit: Path
) -> None:
    spark_conn(monkeypatch, "client")
    monkeypatch.setenv("FAKE_SPARK_SUBMIT_SLEEP", "120")
    operator = BulkExportOperator(task_id="export", export_params={"dry_run": True})
    failures: list[BaseException] = []

    def run() -> None:
        try:
            operator.execute({"run_id": "r1"})  # type: ignore[arg-type]
        except BaseException as error:  # handed to the test's thread
            failures.append(error)

    started = time.monotonic()
    thread = threading.Thread(target=run)
    thread.start()
    while not submissions(fake_spark_submit) and time.monotonic() - started < 60:
        time.sleep(0.05)
    assert submissions(fake_spark_submit), "spark-submit never started"
    operator.on_kill()
    thread.join(timeout=60)
    assert not thread.is_alive() and time.monotonic() - started < 60
    assert len(failures) == 1 and isinstance(failures[0], AirflowException)
    assert "Error code is: -9" in str(failures[0])


def test_an_option_left_out_means_the_same_to_the_operator_and_the_hook() -> None:
    """The task gives the hook only the options it was given: their defaults must agree."""
    operator = inspect.signature(SparkSubmitOperator).parameters
    hook = inspect.signature(SparkSubmitHook).parameters
    assert GIVEN_HOOK_ARGUMENTS and RENDERED_HOOK_ARGUMENTS
    for name in GIVEN_HOOK_ARGUMENTS:
        assert operator[name].default == hook[name].default, name
