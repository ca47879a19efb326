"""``/offloader/metrics`` in process: 503 when the metadata cannot be read, with a message that
names what is wrong and never the URL or its password (the access check lifted: who may
scrape is tests/ui/test_access.py's, against a real API server); the scrape token read from
the ``offloader_metrics`` connection, masked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fixtures.airflow import use_offloader_connection
from fixtures.airflow_server import free_port
from offloader_airflow.ui.access import SCRAPE_CONN_ID, scrape_token, scraper_or_user
from offloader_airflow.ui.app import app

PASSWORD = "metrics-route-pass-never-shown"


@pytest.fixture
def client() -> Iterator[TestClient]:
    app.dependency_overrides[scraper_or_user] = lambda: None
    try:
        with TestClient(app) as client:
            yield client
    finally:
        app.dependency_overrides.clear()


def test_an_unreachable_database_answers_503_without_the_url(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"postgresql+psycopg2://offloader:{PASSWORD}@127.0.0.1:{free_port()}/nowhere"
    use_offloader_connection(monkeypatch, url, tmp_path)
    response = client.get("/metrics")
    assert response.status_code == 503
    assert response.text == "OperationalError reading the offloader metadata; see the log"
    assert PASSWORD not in response.text and "nowhere" not in response.text


def test_a_database_behind_the_schema_answers_503_naming_the_fix(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_offloader_connection(monkeypatch, f"sqlite:///{tmp_path}/never-upgraded.db", tmp_path)
    response = client.get("/metrics")
    assert response.status_code == 503
    assert "offloader db upgrade" in response.text
    assert not (tmp_path / "objects").exists()


def test_the_scrape_token_is_the_connections_password_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.sdk._shared.secrets_masker.secrets_masker import _secrets_masker

    token = "scrape-token-never-logged-7d1f0b"
    conn = {"conn_type": "generic", "password": token}
    monkeypatch.setenv(f"AIRFLOW_CONN_{SCRAPE_CONN_ID.upper()}", json.dumps(conn))
    assert scrape_token() == token
    assert token not in _secrets_masker().redact(f"Authorization: Bearer {token}")


@pytest.mark.parametrize("conn", [None, {"conn_type": "generic", "login": "prometheus"}])
def test_no_connection_or_no_password_means_no_scrape_token(
    monkeypatch: pytest.MonkeyPatch, conn: dict[str, str] | None
) -> None:
    name = f"AIRFLOW_CONN_{SCRAPE_CONN_ID.upper()}"
    if conn is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, json.dumps(conn))
    assert scrape_token() is None
