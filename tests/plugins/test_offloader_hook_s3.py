"""OffloaderHook against a real SeaweedFS: S3 clients come from the AWS connection's
session, so credentials that refresh keep refreshing; the worker's OFFLOADER_* environment
never reaches hook-built settings; secrets stay out of logs, XComs and rendered fields."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import certifi
import pytest

from fixtures.databases import upgraded
from fixtures.seaweedfs import SeaweedS3
from offloader_airflow.hooks import OffloaderHook

PROFILE = "offloader-refreshing"
LIFETIME_SECONDS = 3

# Prints credentials that expire LIFETIME_SECONDS from now and counts its calls: the AWS
# CLI's credential_process protocol, as an SSO helper or vault agent would speak it.
CREDENTIAL_PROCESS = """\
import datetime, json, pathlib, sys
calls = pathlib.Path(sys.argv[1])
calls.write_text(str(int(calls.read_text() or 0) + 1) if calls.exists() else "1")
expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds={lifetime})
print(json.dumps({{"Version": 1, "AccessKeyId": sys.argv[2], "SecretAccessKey": sys.argv[3],
                  "Expiration": expires.isoformat()}}))
"""


def set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, value: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))


def offloader_conn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, store_url: str) -> None:
    metadata_url = f"sqlite:///{tmp_path}/metadata.db"
    set_conn(
        monkeypatch,
        "offloader_default",
        {
            "conn_type": "generic",
            "extra": {
                "metadata_url": metadata_url,
                "object_store_url": store_url,
                "ledger_dir": str(tmp_path / "ledgers"),
                "aws_conn_id": "offloader_aws",
            },
        },
    )


@pytest.fixture
def refreshing_profile(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3_server: SeaweedS3
) -> Path:
    """An AWS config whose profile gets short-lived credentials from a process; returns
    the file counting the process's calls. No static key anywhere in the environment."""
    script = tmp_path / "credential_process.py"
    script.write_text(CREDENTIAL_PROCESS.format(lifetime=LIFETIME_SECONDS))
    calls = tmp_path / "calls"
    config = tmp_path / "aws-config"
    config.write_text(
        f"[profile {PROFILE}]\n"
        f"credential_process = {sys.executable} {script} {calls} "
        f"{s3_server.access_key} {s3_server.secret_key}\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    set_conn(
        monkeypatch,
        "offloader_aws",
        {
            "conn_type": "aws",
            "extra": {
                "profile_name": PROFILE,
                "endpoint_url": s3_server.endpoint_url,
                "region_name": s3_server.region,
                "config_kwargs": {"read_timeout": 17},  # the provider's botocore_config
                "verify": certifi.where(),
            },
        },
    )
    return calls


def call_count(calls: Path) -> int:
    return int(calls.read_text()) if calls.exists() else 0


def test_credentials_from_a_process_are_refreshed_not_frozen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3_server: SeaweedS3, refreshing_profile
) -> None:
    store_url = s3_server.make_settings("refresh").object_store_url
    assert store_url is not None
    offloader_conn(monkeypatch, tmp_path, store_url)
    hook = OffloaderHook()
    upgraded(hook.get_settings())
    with hook.get_runtime() as runtime:
        runtime.objects.put("before-expiry", b"one")
        first = call_count(refreshing_profile)
        assert first >= 1  # the process gave the credentials, nothing else did
        time.sleep(LIFETIME_SECONDS + 1)  # the credentials the client holds have expired
        runtime.objects.put("after-expiry", b"two")  # the same client, still working
        assert runtime.objects.get("before-expiry") == b"one"
        assert call_count(refreshing_profile) > first  # ... because it asked again
        # the connection's botocore_config applies over the library's client config, and
        # its verify (a CA bundle here) reaches the client's HTTP session
        client = runtime.objects._client
        assert client.meta.config.read_timeout == 17
        assert client.meta.config.s3 == {"addressing_style": "path"}
        # ... and the library's deadlines reach the hook's client (invariant 8)
        tuned = runtime.settings
        assert client.meta.config.connect_timeout == tuned.s3_connect_timeout_seconds
        assert client.meta.config.retries["total_max_attempts"] == tuned.s3_max_attempts
        assert client.meta.offloader_deadline == tuned.s3_operation_deadline_seconds
        assert client._endpoint.http_session._verify == certifi.where()
    settings = hook.get_settings()
    assert settings.s3_access_key_id is None and settings.s3_secret_access_key is None
    assert settings.s3_endpoint_url == s3_server.endpoint_url


def test_recorded_stores_open_with_the_hook_session(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3_server: SeaweedS3, refreshing_profile
) -> None:
    """A store recorded earlier (another bucket) is opened with the same credentials."""
    old_url = s3_server.make_settings("old-store").object_store_url
    new_url = s3_server.make_settings("new-store").object_store_url
    assert old_url and new_url
    offloader_conn(monkeypatch, tmp_path, old_url)
    upgraded(OffloaderHook().get_settings())
    with OffloaderHook().get_runtime() as runtime:
        old_id = runtime.stores.default_id()
        runtime.objects.put("kept", b"old data")
    offloader_conn(monkeypatch, tmp_path, new_url)
    with OffloaderHook().get_runtime() as runtime:
        assert runtime.stores.get(old_id, "a test").get("kept") == b"old data"
    # the default store is a directory now: the S3 store still opens through the AWS
    # connection (its endpoint and session), not with the worker's ambient credentials
    offloader_conn(monkeypatch, tmp_path, f"file://{tmp_path}/objects")
    with OffloaderHook().get_runtime() as runtime:
        assert runtime.stores.get(old_id, "a test").get("kept") == b"old data"


def test_offloader_environment_does_not_change_hook_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    set_conn(
        monkeypatch,
        "offloader_default",
        {
            "conn_type": "generic",
            "extra": {
                "metadata_url": f"sqlite:///{tmp_path}/m.db",
                "object_store_url": f"file://{tmp_path}/objects",
                "read_prefetch": 2,
            },
        },
    )
    clean = OffloaderHook().get_settings()
    # a stray variable on the worker: out of range (would make settings invalid) ...
    monkeypatch.setenv("OFFLOADER_UPLOAD_CONCURRENCY", "999")
    # ... or valid but different, for a key the connection sets and ones it does not
    monkeypatch.setenv("OFFLOADER_READ_PREFETCH", "9")
    monkeypatch.setenv("OFFLOADER_GC_BATCH_KEYS", "7")
    monkeypatch.setenv("OFFLOADER_OBJECT_STORE_URL", "s3://elsewhere")
    monkeypatch.setenv("OFFLOADER_S3_ACCESS_KEY_ID", "AKIDSTRAY")
    settings = OffloaderHook().get_settings()
    assert settings == clean
    assert settings.upload_concurrency == 4 and settings.read_prefetch == 2
    assert settings.gc_batch_keys == 1000 and settings.s3_access_key_id is None


def test_secrets_stay_out_of_logs_and_errors(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    s3_server: SeaweedS3,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Static keys in the AWS connection: masked once read, never in settings or errors."""
    from airflow.sdk._shared.secrets_masker.secrets_masker import _secrets_masker

    store_url = s3_server.make_settings("secrets").object_store_url
    assert store_url is not None
    offloader_conn(monkeypatch, tmp_path, store_url)
    set_conn(
        monkeypatch,
        "offloader_aws",
        {
            "conn_type": "aws",
            "login": s3_server.access_key,
            "password": s3_server.secret_key,
            "extra": {"endpoint_url": s3_server.endpoint_url, "region_name": s3_server.region},
        },
    )
    caplog.set_level(logging.DEBUG)
    hook = OffloaderHook()
    upgraded(hook.get_settings())
    ok, message = hook.test_connection()
    assert ok, message
    settings = hook.get_settings()
    texts = [message, repr(settings), str(settings), repr(hook.connection), caplog.text]
    assert not [t for t in texts if s3_server.secret_key in t]
    redacted = _secrets_masker().redact(f"the key is {s3_server.secret_key}")
    assert s3_server.secret_key not in redacted


def test_portable_settings_carry_the_sessions_keys_masked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3_server: SeaweedS3, refreshing_profile
) -> None:
    """For Spark: the session's current keys, frozen into settings that need no Airflow,
    each masked as it is read; the connection's settings stay without keys."""
    from airflow.sdk._shared.secrets_masker.secrets_masker import _secrets_masker

    from offloader.runtime import Runtime

    store_url = s3_server.make_settings("portable").object_store_url
    assert store_url is not None
    offloader_conn(monkeypatch, tmp_path, store_url)
    hook = OffloaderHook()
    upgraded(hook.get_settings())
    portable = hook.get_portable_settings()
    assert portable.s3_access_key_id is not None and portable.s3_secret_access_key is not None
    assert portable.s3_secret_access_key.get_secret_value() == s3_server.secret_key
    assert s3_server.secret_key not in repr(portable) + str(portable)
    assert s3_server.secret_key not in _secrets_masker().redact(f"key {s3_server.secret_key}")
    assert hook.get_settings().s3_secret_access_key is None
    with Runtime.open(portable) as runtime:  # no hook, no client factory: the keys suffice
        runtime.objects.put("portable", b"ok")
        assert runtime.objects.get("portable") == b"ok"
