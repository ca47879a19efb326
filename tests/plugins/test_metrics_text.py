"""What the plugin's metrics route serves (``ui/metrics.py``): the Prometheus text of the
metadata the Airflow connection names, read without opening the store or the hot tier;
and an error that names what is wrong without the URL or its password."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fixtures.airflow import use_offloader_connection
from fixtures.airflow_server import free_port
from fixtures.databases import migrated_sqlite_url
from offloader.metadata import MetadataStore
from offloader.policy import OffloadPolicy
from offloader_airflow.hooks import OffloaderHook
from offloader_airflow.ui.metrics import CONTENT_TYPE, MetricsUnavailableError, metrics_text

PASSWORD = "metrics-pass-never-shown"


def test_the_text_of_the_connections_metadata(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = migrated_sqlite_url(tmp_path)
    store = MetadataStore.open(url)
    try:
        store.create_topic("orders", OffloadPolicy())
    finally:
        store.close()
    use_offloader_connection(monkeypatch, url, tmp_path)
    text = metrics_text(OffloaderHook())
    metrics = {m.name: m for m in text_string_to_metric_families(text)}
    [hot] = metrics["offloader_hot_ledgers"].samples
    assert hot.labels == {"topic": "orders"} and hot.value == 0
    rows = {s.labels["table"]: s.value for s in metrics["offloader_metadata_rows"].samples}
    assert rows["topics"] == 1
    assert not (tmp_path / "objects").exists() and not (tmp_path / "ledgers").exists()
    assert CONTENT_TYPE.startswith("text/plain")


def test_an_unreachable_database_is_named_without_the_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"postgresql+psycopg2://offloader:{PASSWORD}@127.0.0.1:{free_port()}/nowhere"
    use_offloader_connection(monkeypatch, url, tmp_path)
    with pytest.raises(MetricsUnavailableError) as caught:
        metrics_text(OffloaderHook())
    assert str(caught.value) == "OperationalError reading the offloader metadata; see the log"


def test_a_database_behind_the_schema_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    use_offloader_connection(monkeypatch, f"sqlite:///{tmp_path}/never-upgraded.db", tmp_path)
    with pytest.raises(MetricsUnavailableError, match="offloader db upgrade"):
        metrics_text(OffloaderHook())
