"""The tiered-storage view never shows a secret: a metadata URL with a password is shown
without it, and a database that cannot be reached is named by the error's type only (a
driver's message may quote the URL). Real PostgreSQL (trust auth ignores the password)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from fixtures.airflow import use_offloader_connection
from fixtures.airflow_server import free_port
from fixtures.databases import postgres_database, upgraded
from offloader.settings import Settings
from offloader_airflow.hooks import OffloaderHook
from offloader_airflow.ui.app import tiers_state
from offloader_airflow.ui.page import render_page

PASSWORD = "view-pass-never-shown"


@pytest.fixture
def pg_url_with_password(tmp_path: Path) -> Iterator[str]:
    for url in postgres_database():
        upgraded(Settings(metadata_url=url, data_dir=tmp_path))
        yield make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


def shown(state: dict) -> str:
    return json.dumps(state) + render_page({"dags": [], **state})


@pytest.mark.postgres
def test_the_metadata_url_is_shown_without_its_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pg_url_with_password: str
) -> None:
    use_offloader_connection(monkeypatch, pg_url_with_password, tmp_path)
    state = tiers_state(OffloaderHook())
    assert state["error"] is None
    assert state["report"]["topics"] == []
    assert state["store"]["metadata_url"].startswith("postgresql+psycopg2://postgres:***@")
    assert PASSWORD not in shown(state)


def test_an_unreachable_database_is_named_without_the_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"postgresql+psycopg2://offloader:{PASSWORD}@127.0.0.1:{free_port()}/nowhere"
    use_offloader_connection(monkeypatch, url, tmp_path)
    state = tiers_state(OffloaderHook())
    assert state == {"error": "OperationalError reading the offloader metadata; see the log"}
    assert PASSWORD not in shown(state)
    assert "The offloader metadata cannot be read: OperationalError" in shown(state)


def test_a_malformed_connection_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_OFFLOADER_DEFAULT",
        json.dumps({"conn_type": "generic", "extra": {"metadata_url": "sqlite://"}}),
    )
    state = tiers_state(OffloaderHook())
    assert state["error"].startswith(
        "connection 'offloader_default': extra object_store_url: Field required"
    )
