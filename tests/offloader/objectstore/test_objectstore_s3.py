"""What only the S3 binding promises: URL parsing, prefixes, client setup, secrets kept."""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from botocore.exceptions import ClientError
from pydantic import SecretStr

from fixtures.seaweedfs import SeaweedS3
from offloader.exceptions import ObjectExistsError, ObjectNotFoundError, ObjectStoreError
from offloader.objectstore import MultipartUpload, s3
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.objectstore.registry import open_object_store
from offloader.objectstore.s3 import S3ObjectStore, build_client
from offloader.settings import Settings

WRONG_SECRET = "wrong-secret-9f8e7d6c5b4a"


@pytest.fixture
def bucket_settings(s3_server: SeaweedS3) -> Settings:
    return s3_server.make_settings("s3-binding", prefix="base/dir")


def _bucket(settings: Settings) -> str:
    assert settings.object_store_url is not None
    return settings.object_store_url.removeprefix("s3://").split("/")[0]


def _recorder(store: S3ObjectStore, event: str) -> list[Any]:
    """Collect the requests or parameters botocore emits for ``event``."""
    seen: list[Any] = []
    store._client.meta.events.register(event, lambda **kw: seen.append(kw))
    return seen


@pytest.mark.parametrize(
    "url",
    ["s3://", "s3:///prefix", "file:///x", "s3://bucket/p?versionId=1", "s3://user@bucket/p"],
)
def test_bad_urls_name_the_url(url: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(url))):
        S3ObjectStore.from_url(url, Settings(s3_endpoint_url="http://127.0.0.1:9"))


def test_open_object_store_picks_binding_by_scheme(
    bucket_settings: Settings, tmp_path: Path
) -> None:
    assert bucket_settings.object_store_url is not None
    s3_store = open_object_store(bucket_settings.object_store_url, bucket_settings)
    file_store = open_object_store((tmp_path / "o").as_uri())
    try:
        assert isinstance(s3_store, S3ObjectStore)
        assert isinstance(file_store, FilesystemObjectStore)
        with pytest.raises(ValueError, match="scheme"):
            open_object_store("gs://bucket/x", bucket_settings)
    finally:
        s3_store.close()


def test_keys_are_joined_to_the_prefix(bucket_settings: Settings, s3_server: SeaweedS3) -> None:
    assert bucket_settings.object_store_url is not None
    store = S3ObjectStore.from_url(bucket_settings.object_store_url, bucket_settings)
    store.put("ledger/1", b"x")
    upload = store.create_multipart("ledger/2")

    raw = s3_server.client()
    listed = raw.list_objects_v2(Bucket=_bucket(bucket_settings))["Contents"]
    assert [item["Key"] for item in listed] == ["base/dir/ledger/1"]
    assert [info.key for info in store.list("ledger/")] == ["ledger/1"]
    assert [u.key for u in store.list_multipart_uploads("ledger/")] == ["ledger/2"]
    assert store.url == f"s3://{_bucket(bucket_settings)}/base/dir at {s3_server.endpoint_url}"
    store.abort_multipart(upload)
    raw.close()
    store.close()


def test_client_configuration(s3_server: SeaweedS3) -> None:
    settings = s3_server.make_settings("cfg", upload_concurrency=16)
    client = build_client(settings)
    config = client.meta.config

    assert config.retries == {"mode": "adaptive", "total_max_attempts": settings.s3_max_attempts}
    assert config.max_pool_connections >= 32
    assert config.s3 == {"addressing_style": "path"}
    assert config.connect_timeout == settings.s3_connect_timeout_seconds
    assert config.read_timeout == settings.s3_read_timeout_seconds
    assert client.meta.offloader_deadline == settings.s3_operation_deadline_seconds
    assert client.meta.endpoint_url == s3_server.endpoint_url
    client.close()


def test_clients_share_parsed_models_but_not_credentials(s3_server: SeaweedS3) -> None:
    """Clients are built from one process-wide loader of botocore's data files; each keeps
    the keys it was given and works with them (a wrong key is refused)."""
    good = s3_server.make_settings("keys")
    wrong = good.model_copy(update={"s3_secret_access_key": SecretStr("not-the-secret")})
    ok, refused = build_client(good), build_client(wrong)
    bucket = _bucket(good)
    try:
        assert ok.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
        with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
            refused.list_objects_v2(Bucket=bucket)
        assert ok.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    finally:
        ok.close()
        refused.close()


def test_read_range_sends_a_range_header(s3_store: S3ObjectStore) -> None:
    s3_store.put("r", b"0123456789")
    requests = _recorder(s3_store, "before-send.s3.GetObject")

    assert s3_store.read_range("r", 3, 4) == b"3456"
    assert requests[0]["request"].headers["Range"] == b"bytes=3-6"


def test_read_range_of_empty_range_still_checks_existence(s3_store: S3ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        s3_store.read_range("missing", 0, 0)


def test_delete_many_batches_by_a_thousand(s3_store: S3ObjectStore) -> None:
    calls = _recorder(s3_store, "provide-client-params.s3.DeleteObjects")

    result = s3_store.delete_many(f"absent/{n}" for n in range(2500))

    assert [len(c["params"]["Delete"]["Objects"]) for c in calls] == [1000, 1000, 500]
    assert all(c["params"]["Delete"]["Quiet"] for c in calls)
    assert len(result.deleted) == 2500
    assert result.failed == {}


def test_conditional_headers_are_sent(s3_store: S3ObjectStore) -> None:
    puts = _recorder(s3_store, "before-send.s3.PutObject")
    completes = _recorder(s3_store, "before-send.s3.CompleteMultipartUpload")

    s3_store.put("p", b"x", if_none_match=True)
    upload = s3_store.create_multipart("m")
    s3_store.complete_multipart(upload, [s3_store.upload_part(upload, 1, b"y")], if_none_match=True)

    assert puts[0]["request"].headers["If-None-Match"] == b"*"
    assert completes[0]["request"].headers["If-None-Match"] == b"*"


def test_part_copy_is_one_upload_part_copy_with_a_range(s3_store: S3ObjectStore) -> None:
    s3_store.put("src", b"0123456789")
    requests = _recorder(s3_store, "before-send.s3.UploadPartCopy")
    gets = _recorder(s3_store, "before-send.s3.GetObject")
    upload = s3_store.create_multipart("dst")

    part = s3_store.upload_part_copy(upload, 1, "src", 2, 5)
    s3_store.complete_multipart(upload, [part])

    (request,) = requests
    assert request["request"].headers["x-amz-copy-source-range"] == b"bytes=2-6"
    assert request["request"].headers["x-amz-copy-source"].endswith(b"/store-prefix/src")
    assert gets == []  # no byte of the source came through the client
    assert s3_store.get("dst") == b"23456"


def test_conditional_complete_locks_are_released(s3_store: S3ObjectStore) -> None:
    upload = s3_store.create_multipart("locked")
    s3_store.complete_multipart(upload, [s3_store.upload_part(upload, 1, b"x")], if_none_match=True)
    again = s3_store.create_multipart("locked")

    part = s3_store.upload_part(again, 1, b"y")

    with pytest.raises(ObjectExistsError):
        s3_store.complete_multipart(again, [part], if_none_match=True)

    assert s3._COMPLETE_LOCKS._locks == {}
    s3_store.abort_multipart(again)


@pytest.mark.parametrize("key", ["", "/abs", "a\0b"])
def test_bad_keys_are_refused(s3_store: S3ObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        s3_store.put(key, b"x")


def _wrong_credentials_store(s3_server: SeaweedS3, bucket: str) -> S3ObjectStore:
    settings = Settings(
        s3_endpoint_url=s3_server.endpoint_url,
        s3_access_key_id=s3_server.access_key,
        s3_secret_access_key=WRONG_SECRET,
    )
    return S3ObjectStore.from_url(f"s3://{bucket}/x", settings)


def _calls(store: S3ObjectStore) -> Iterator[Any]:
    yield lambda: store.put("k", b"x")
    yield lambda: store.get("k")
    yield lambda: store.stat("k")
    yield lambda: list(store.list())
    yield lambda: store.delete_many(["k"])
    yield lambda: store.create_multipart("k")
    yield lambda: store.upload_part_copy(MultipartUpload("k", "u1"), 1, "src", 0, 1)


def test_wrong_credentials_fail_without_leaking_the_secret(
    s3_server: SeaweedS3, bucket_settings: Settings
) -> None:
    store = _wrong_credentials_store(s3_server, _bucket(bucket_settings))
    for call in _calls(store):
        with pytest.raises(ObjectStoreError) as caught:
            call()
        assert not isinstance(caught.value, ObjectNotFoundError)
        text = "".join(traceback.format_exception(caught.value))
        assert WRONG_SECRET not in text
        assert s3_server.secret_key not in text
        assert _bucket(bucket_settings) in str(caught.value)
    store.close()


def test_anonymous_requests_are_refused(s3_server: SeaweedS3, bucket_settings: Settings) -> None:
    from botocore import UNSIGNED

    anonymous = s3_server.client(signature_version=UNSIGNED)
    store = S3ObjectStore(anonymous, _bucket(bucket_settings))

    with pytest.raises(ObjectStoreError):
        store.put("k", b"x")
    store.close()


def test_secret_never_in_repr_or_url(s3_server: SeaweedS3, bucket_settings: Settings) -> None:
    assert bucket_settings.object_store_url is not None
    store = S3ObjectStore.from_url(bucket_settings.object_store_url, bucket_settings)

    for text in (repr(store), str(store), store.url, repr(bucket_settings)):
        assert s3_server.secret_key not in text
        assert s3_server.access_key not in text
    store.close()


def test_endpoint_userinfo_is_hidden(s3_server: SeaweedS3) -> None:
    endpoint = s3_server.endpoint_url.replace("http://", "http://user:pw-in-url@")
    store = S3ObjectStore.from_url("s3://bucket-x/p", Settings(s3_endpoint_url=endpoint))

    assert "pw-in-url" not in store.url
    assert "pw-in-url" not in repr(store)
    store.close()


def test_default_credential_chain_is_used_without_explicit_keys(
    s3_server: SeaweedS3, bucket_settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    settings = Settings(s3_endpoint_url=s3_server.endpoint_url)
    store = S3ObjectStore.from_url(f"s3://{_bucket(bucket_settings)}/chain", settings)

    store.put("k", b"from env credentials")

    assert store.get("k") == b"from env credentials"
    store.close()


def test_ensure_bucket_is_idempotent(s3_server: SeaweedS3) -> None:
    store = S3ObjectStore(s3_server.client(), "ensure-me-twice")

    store.ensure_bucket()
    store.ensure_bucket()
    store.put("k", b"x")

    assert store.get("k") == b"x"
    store.close()


def test_server_listens_on_loopback_and_chosen_ports_only(s3_server: SeaweedS3) -> None:
    connections = psutil.Process(s3_server.process.pid).net_connections(kind="inet")
    listening = [conn.laddr for conn in connections if conn.status == psutil.CONN_LISTEN]
    remote = {conn.raddr.ip for conn in connections if conn.raddr}

    assert listening
    assert remote <= {"127.0.0.1"}
    assert {addr.ip for addr in listening} == {"127.0.0.1"}
    assert {addr.port for addr in listening} <= set(s3_server.ports.values())
