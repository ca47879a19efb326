"""OffloaderHook: connections -> validated settings, clear errors, secrets masked."""

from __future__ import annotations

import json

import pytest

from fixtures.databases import upgraded
from offloader_airflow.hooks import OffloaderConnectionError, OffloaderHook

SECRET = "s3cr3t-never-printed"
DB_PASSWORD = "pg-pass-never-printed"


def set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, value: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))


@pytest.fixture
def s3_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(
        monkeypatch,
        "offloader_default",
        {
            "conn_type": "generic",
            "extra": {
                "metadata_url": f"postgresql+psycopg2://off:{DB_PASSWORD}@127.0.0.1:5432/x",
                "object_store_url": "s3://bucket/prefix",
                "upload_concurrency": 8,
            },
        },
    )
    set_conn(
        monkeypatch,
        "aws_default",
        {
            "conn_type": "aws",
            "login": "AKIDEXAMPLE",
            "password": SECRET,
            "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"},
        },
    )


@pytest.mark.usefixtures("s3_connections")
def test_settings_come_from_both_connections() -> None:
    settings = OffloaderHook().get_settings()
    assert settings.resolved_object_store_url == "s3://bucket/prefix"
    assert settings.s3_endpoint_url == "http://127.0.0.1:9"
    assert settings.s3_region == "eu-west-1"
    # no credential is copied into the settings: S3 clients come from the AWS session
    assert settings.s3_access_key_id is None and settings.s3_secret_access_key is None
    assert settings.upload_concurrency == 8
    assert DB_PASSWORD in settings.resolved_metadata_url


@pytest.mark.usefixtures("s3_connections")
def test_secrets_are_masked_and_never_in_repr() -> None:
    from airflow.sdk._shared.secrets_masker.secrets_masker import _secrets_masker

    hook = OffloaderHook()
    settings = hook.get_settings()
    for text in (repr(settings), str(settings), repr(hook.connection)):
        assert SECRET not in text and DB_PASSWORD not in text
    redacted = _secrets_masker().redact(f"url has {DB_PASSWORD} and key {SECRET}")
    assert SECRET not in redacted and DB_PASSWORD not in redacted
    assert DB_PASSWORD not in hook.connection.safe_metadata_url


@pytest.mark.usefixtures("s3_connections")
def test_connection_test_reports_failure_without_secrets() -> None:
    ok, message = OffloaderHook().test_connection()
    assert not ok  # nothing listens on 127.0.0.1:5432/x with that password, nor on :9
    assert SECRET not in message and DB_PASSWORD not in message


def test_connection_test_succeeds_on_the_embedded_default(monkeypatch, tmp_path) -> None:
    set_conn(
        monkeypatch,
        "offloader_default",
        {
            "conn_type": "generic",
            "extra": {
                "metadata_url": f"sqlite:///{tmp_path}/m.db",
                "object_store_url": f"file://{tmp_path}/objects",
            },
        },
    )
    hook = OffloaderHook()
    ok, message = hook.test_connection()
    assert not ok and "run `offloader db upgrade`" in message  # opening never migrates
    upgraded(hook.get_settings())
    ok, message = OffloaderHook().test_connection()
    assert ok, message
    assert "reachable" in message


@pytest.mark.parametrize(
    ("conns", "fragment"),
    [
        ({}, "the offloader connection 'offloader_default' is not defined"),
        (
            {"offloader_default": {"conn_type": "generic", "extra": {"metadata_url": "sqlite://"}}},
            "extra object_store_url: Field required",
        ),
        (
            {
                "offloader_default": {
                    "conn_type": "generic",
                    "extra": {
                        "metadata_url": "sqlite://",
                        "object_store_url": "file:///x",
                        "colour": "red",
                    },
                }
            },
            "colour: Extra inputs are not permitted",
        ),
        (
            {
                "offloader_default": {
                    "conn_type": "generic",
                    "extra": {
                        "metadata_url": "sqlite://",
                        "object_store_url": "file:///x",
                        "upload_concurrency": 0,
                    },
                }
            },
            "upload_concurrency: Input should be greater than or equal to 1",
        ),
        (
            {
                "offloader_default": {
                    "conn_type": "generic",
                    "extra": {"metadata_url": "sqlite://", "object_store_url": "s3://b"},
                }
            },
            "the AWS connection 'aws_default' is not defined",
        ),
    ],
)
def test_bad_connections_name_what_is_wrong(monkeypatch, conns, fragment) -> None:
    for conn_id, value in conns.items():
        set_conn(monkeypatch, conn_id, value)
    with pytest.raises(OffloaderConnectionError) as info:
        OffloaderHook().get_settings()
    assert fragment in str(info.value)
