"""No credential leaks from any DAG: each runs with every credential the hook handles set
(the S3 secret key and a session token in the AWS connection, a password in the metadata
URL: ``fixtures.airflow.secret_connections``) on SeaweedFS and PostgreSQL, and none of them
may show in a task log, an XCom, a rendered template field, a failed task's error, or the
tiered-storage view's page and ``/api/tiers``. The Spark DAGs (bulk_export, scrub,
bulk_rewrite) get the same check from their own no-secret tests in ``tests/spark/``, which
use the same fixture and also read Spark's event log."""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from fixtures.airflow import (
    DagFile,
    airflow_logs,
    stored_airflow_text,
    task_states,
    without_session_token,
)
from fixtures.backends import POSTGRES_ONLY, make_topic, produce_ledgers
from fixtures.spark import assert_no_secret
from offloader.runtime import Runtime

pytestmark = [POSTGRES_ONLY, pytest.mark.slow]

MARCH_2 = datetime(2026, 3, 2, tzinfo=UTC)


def orders(rt: Runtime) -> None:
    make_topic(rt, "orders")
    produce_ledgers(rt, "orders", [(5, 200)] * 3)


def streamed(rt: Runtime) -> None:
    make_topic(
        rt,
        "events",
        streaming=True,
        min_part_bytes=max(64 * 1024, rt.objects.capabilities.min_part_size),
    )
    produce_ledgers(rt, "events", [(5, 200)] * 2)


def offloaded(rt: Runtime) -> None:
    """Ledgers offloaded, so retention and the GC have objects and rows to work on."""
    from offloader.offload.ledger_offloader import LedgerOffloader

    make_topic(rt, "orders", retention_size_bytes=0)
    ids = produce_ledgers(rt, "orders", [(5, 200)] * 3)
    LedgerOffloader(rt).offload_topic("orders", up_to=ids[-1])


#: dag id -> (what the store holds first, the run's conf, its logical date)
RUNS: dict[str, tuple[Callable[[Runtime], None], dict[str, Any], datetime | None]] = {
    "offload_ledgers": (orders, {}, None),
    "streaming_offload": (streamed, {"close_now": True}, None),
    "retention": (offloaded, {}, None),
    "garbage_collection": (offloaded, {}, None),
    "offload_historical": (orders, {}, MARCH_2),
}


#: the runs whose S3 calls SeaweedFS takes with a session token (single PUTs and GETs);
#: it refuses multipart calls that carry one (InvalidAccessKeyId), answers HeadBucket with
#: one 403 (retention's check of the store it records the topic's start in), and a GC run
#: with one did not finish in minutes; the others run with the secret key and the
#: database password alone (fixtures.airflow.without_session_token)
SESSION_TOKEN_OK = {"offload_ledgers", "offload_historical"}


def assert_nowhere(secrets: list[str], texts: dict[str, str]) -> None:
    for secret in secrets:
        assert_no_secret(secret, texts)


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.parametrize("dag_id", list(RUNS))
def test_a_run_shows_no_credential(
    runtime: Runtime,
    secret_connections: list[str],
    dag_id: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)  # where dag.test's task logs go once logging is set up
    secrets = secret_connections
    if dag_id not in SESSION_TOKEN_OK:
        secrets = without_session_token(monkeypatch, secret_connections)
    setup, conf, logical_date = RUNS[dag_id]
    setup(runtime)
    run = DagFile(dag_id).test(run_conf=conf, logical_date=logical_date)
    assert str(run.state) == "success", task_states(run)
    out, err = capfd.readouterr()
    logs = out + err + caplog.text + airflow_logs()
    stored = stored_airflow_text()
    for task in DagFile(dag_id).parse().task_ids:  # every task's log and output was read
        assert task in logs
    assert "metadata_url" in stored or "topic" in stored  # rendered fields and XComs
    assert_nowhere(secrets, {"logs": logs, "airflow db": stored})


# every DAG's first task opens the runtime through the same hook: offload_ledgers's failure
# in the short form; the others' are its long form
FAILING = [
    pytest.param(d, marks=[] if d == "offload_ledgers" else [pytest.mark.long]) for d in RUNS
]


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.parametrize("dag_id", FAILING)
def test_a_failed_run_shows_no_credential(
    runtime: Runtime,
    secret_connections: list[str],
    dag_id: str,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A database that refuses the connection fails the first task: its error, the
    traceback in the log and what Airflow stored carry no credential."""
    caplog.set_level(logging.INFO)
    var = "AIRFLOW_CONN_OFFLOADER_DEFAULT"
    conn = json.loads(os.environ[var])
    url = make_url(conn["extra"]["metadata_url"]).set(database="no_such_database")
    conn["extra"]["metadata_url"] = url.render_as_string(hide_password=False)
    monkeypatch.setenv(var, json.dumps(conn))
    _, conf, logical_date = RUNS[dag_id]
    run = DagFile(dag_id).test(run_conf=conf, logical_date=logical_date, retries=False)
    assert str(run.state) == "failed", task_states(run)
    out, err = capfd.readouterr()
    logs = out + err + caplog.text + airflow_logs()
    assert "no_such_database" in logs  # the error was logged, naming what is wrong
    assert_nowhere(secret_connections, {"logs": logs, "airflow db": stored_airflow_text()})


@pytest.mark.usefixtures("airflow_db")
def test_the_tiered_storage_view_shows_no_credential(
    runtime: Runtime, secret_connections: list[str]
) -> None:
    """The page, ``/api/tiers`` and ``/metrics`` of the plugin, through its FastAPI app."""
    from airflow.api_fastapi.app import create_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    ui = importlib.import_module("offloader_airflow.ui.app")  # the package exports `app`
    access = importlib.import_module("offloader_airflow.ui.access")

    offloaded(runtime)
    create_auth_manager()
    user = SimpleAuthManagerUser(username="admin", role="admin")
    # tests/ui/test_access.py signs in for real; here the checks are lifted
    ui.app.dependency_overrides[access.permitted_user] = lambda: user
    ui.app.dependency_overrides[access.signed_in_or_none] = lambda: user
    ui.app.dependency_overrides[access.scraper_or_user] = lambda: None
    try:
        client = TestClient(ui.app)
        api, page, metrics = client.get("/api/tiers"), client.get("/"), client.get("/metrics")
    finally:
        ui.app.dependency_overrides.clear()
    assert {api.status_code, page.status_code, metrics.status_code} == {200}, (api, page, metrics)
    assert "orders" in api.text and "orders" in page.text
    assert 'topic="orders"' in metrics.text
    assert api.json()["store"]["metadata_url"].startswith("postgresql")
    answers = {"/api/tiers": api.text, "page": page.text, "/metrics": metrics.text}
    assert_nowhere(secret_connections, answers)
