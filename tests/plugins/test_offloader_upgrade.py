"""`python -m offloader_airflow.upgrade`: the init container's `offloader db upgrade`, with
the settings of the Airflow offloader connection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offloader.metadata.migrate import head_revision
from offloader.metadata.store import MetadataStore
from offloader_airflow.upgrade import main


def test_check_upgrade_check_through_the_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/m.db"
    extra = {"metadata_url": url, "object_store_url": (tmp_path / "objects").as_uri()}
    monkeypatch.setenv(
        "AIRFLOW_CONN_OFFLOADER_DEFAULT", json.dumps({"conn_type": "generic", "extra": extra})
    )
    assert main(["--check"]) == 2
    assert "run `offloader db upgrade`" in capsys.readouterr().err
    assert main([]) == 0
    upgraded = f"metadata database at revision {head_revision()} (was None)\n"
    assert capsys.readouterr().out == upgraded
    assert main(["--check"]) == 0
    MetadataStore.open(url).close()
