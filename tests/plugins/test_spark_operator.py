"""The Spark operators' checks before anything is submitted, and the driver's environment.

The submissions themselves run in tests/spark/ (real Spark); here nothing reaches Spark.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.airflow import connection_env
from fixtures.databases import sqlite_url, upgraded
from offloader.exceptions import NotFoundError
from offloader.params import RunParamsError
from offloader.settings import Settings
from offloader_airflow.spark import BulkExportOperator, ScrubOperator, child_environment


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    settings = upgraded(Settings(data_dir=tmp_path / "data", metadata_url=sqlite_url(tmp_path)))
    for key, value in connection_env(settings).items():
        monkeypatch.setenv(key, value)
    return settings


def spark_conn(monkeypatch: pytest.MonkeyPatch, deploy_mode: str) -> None:
    conn = {"conn_type": "spark", "host": "local[1]", "extra": {"deploy-mode": deploy_mode}}
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(conn))


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
    assert operator._hook is None  # no spark-submit was built


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
    assert operator._hook is None  # no spark-submit was built


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
