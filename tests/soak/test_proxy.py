"""The soak's fault-injecting S3 proxy alone: with faults off it is invisible to the library
(every request kind the library makes passes through unchanged, SigV4 included); each fault
kind gives the client the error a real store's would, and the library's retries ride over
a single one."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ReadTimeoutError

from fixtures.seaweedfs_server import SeaweedS3
from offloader.objectstore.s3 import S3ObjectStore
from soak.proxy import (
    INTERNAL,
    RESET_BEFORE,
    RESET_MID,
    SLOWDOWN,
    STALL,
    FaultPlan,
    FaultProxy,
    FaultRule,
)

pytestmark = pytest.mark.s3

MiB = 1024 * 1024


@pytest.fixture
def proxy(s3_server: SeaweedS3) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url, FaultPlan(seed=7)) as running:
        yield running


@pytest.fixture
def stores(
    s3_server: SeaweedS3, proxy: FaultProxy, request: pytest.FixtureRequest
) -> Iterator[tuple[S3ObjectStore, S3ObjectStore]]:
    """The same bucket and prefix twice: through the proxy, and direct."""
    direct = s3_server.make_settings(request.node.name[:24], prefix="soak-proxy")
    assert direct.object_store_url is not None
    through = direct.model_copy(update={"s3_endpoint_url": proxy.endpoint_url})
    proxied = S3ObjectStore.from_url(direct.object_store_url, through)
    plain = S3ObjectStore.from_url(direct.object_store_url, direct)
    try:
        yield proxied, plain
    finally:
        proxied.close()
        plain.close()


def client_through(s3_server: SeaweedS3, proxy: FaultProxy, **config: Any) -> Any:
    """A boto3 client through the proxy that does not retry: it shows the raw error."""
    return boto3.client(
        "s3",
        endpoint_url=proxy.endpoint_url,
        region_name=s3_server.region,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key=s3_server.secret_key,
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}, **config),
    )


def test_faults_off_every_library_request_passes_unchanged(
    stores: tuple[S3ObjectStore, S3ObjectStore], proxy: FaultProxy
) -> None:
    proxied, plain = stores
    small, large = os.urandom(1000), os.urandom(6 * MiB + 17)
    proxied.put("small", small)
    proxied.put("large", large)  # PutObject with Content-Length
    upload = proxied.create_multipart("multi")  # POST ?uploads
    parts = [
        proxied.upload_part(upload, 1, large[: 5 * MiB]),  # UploadPart
        proxied.upload_part(upload, 2, large[5 * MiB :]),
    ]
    proxied.complete_multipart(upload, parts)  # POST ?uploadId
    aborted = proxied.create_multipart("aborted")
    proxied.abort_multipart(aborted)  # DELETE ?uploadId

    for key, data in (("small", small), ("large", large), ("multi", large)):
        assert plain.get(key) == data  # what went through is what the server holds
        assert proxied.get(key) == data
        assert proxied.stat(key).size == len(data)  # HEAD
    assert proxied.read_range("large", 5 * MiB - 3, 1000) == large[5 * MiB - 3 : 5 * MiB + 997]
    assert sorted(info.key for info in proxied.list()) == ["large", "multi", "small"]
    assert proxied.delete_many(["small", "large"]).failed == {}  # DeleteObjects POST
    assert [info.key for info in plain.list()] == ["multi"]
    assert sum(proxy.plan.snapshot().values()) == 0
    assert {"GET", "PUT", "POST", "DELETE", "HEAD"} <= set(proxy.plan.requests)


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [(SLOWDOWN, 503, "SlowDown"), (INTERNAL, 500, "InternalError")],
)
def test_error_replies_are_s3_errors(
    s3_server: SeaweedS3, proxy: FaultProxy, kind: str, status: int, code: str
) -> None:
    client = client_through(s3_server, proxy)
    bucket = _bucket(s3_server)
    proxy.plan.replace_rules([FaultRule("PUT", r"/k$", kind, 1.0)])
    proxy.plan.set_enabled(True)
    with pytest.raises(ClientError) as caught:
        client.put_object(Bucket=bucket, Key="k", Body=b"x")
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert caught.value.response["Error"]["Code"] == code
    assert proxy.plan.snapshot()[kind] == 1
    client.close()


def test_reset_before_the_request_reaches_the_server(
    s3_server: SeaweedS3, proxy: FaultProxy
) -> None:
    client = client_through(s3_server, proxy)
    bucket = _bucket(s3_server)
    proxy.plan.replace_rules([FaultRule("PUT", r"/k$", RESET_BEFORE, 1.0)])
    proxy.plan.set_enabled(True)
    with pytest.raises(BotoCoreError):
        client.put_object(Bucket=bucket, Key="k", Body=b"x")
    proxy.plan.set_enabled(False)
    with pytest.raises(ClientError):  # never stored
        client.head_object(Bucket=bucket, Key="k")
    client.close()


def test_reset_mid_response_after_the_server_acted(s3_server: SeaweedS3, proxy: FaultProxy) -> None:
    client = client_through(s3_server, proxy)
    bucket = _bucket(s3_server)
    data = os.urandom(MiB)
    proxy.plan.replace_rules(
        [FaultRule("PUT", r"/k$", RESET_MID, 1.0), FaultRule("GET", r"/k$", RESET_MID, 1.0)]
    )
    proxy.plan.set_enabled(True)
    with pytest.raises(BotoCoreError):  # cut in the answer's headers
        client.put_object(Bucket=bucket, Key="k", Body=data)
    with pytest.raises(BotoCoreError):  # cut in the body
        client.get_object(Bucket=bucket, Key="k")["Body"].read()
    proxy.plan.set_enabled(False)
    stored = client.get_object(Bucket=bucket, Key="k")["Body"].read()
    assert hashlib.sha256(stored).digest() == hashlib.sha256(data).digest()  # it was applied
    assert proxy.plan.snapshot()[RESET_MID] == 2
    client.close()


def test_stall_runs_into_the_clients_read_timeout(s3_server: SeaweedS3, proxy: FaultProxy) -> None:
    client = client_through(s3_server, proxy, read_timeout=1, connect_timeout=1)
    bucket = _bucket(s3_server)
    proxy.plan.stall_seconds = 3
    proxy.plan.replace_rules([FaultRule("HEAD", r".", STALL, 1.0)])
    proxy.plan.set_enabled(True)
    with pytest.raises(ReadTimeoutError):
        client.head_bucket(Bucket=bucket)
    client.close()


@pytest.mark.parametrize("kind", [SLOWDOWN, INTERNAL, RESET_BEFORE, RESET_MID])
def test_the_library_retries_a_put_over_one_fault(
    stores: tuple[S3ObjectStore, S3ObjectStore], proxy: FaultProxy, kind: str
) -> None:
    proxied, plain = stores
    data = os.urandom(100_000)
    proxy.plan.replace_rules([FaultRule("PUT", r".", kind, 1.0, limit=1)])
    proxy.plan.set_enabled(True)
    proxied.put("retried", data)
    assert plain.get("retried") == data
    assert proxy.plan.snapshot()[kind] == 1
    assert proxy.plan.requests["PUT"] == 2


@pytest.mark.parametrize("kind", [SLOWDOWN, INTERNAL, RESET_BEFORE, RESET_MID])
def test_the_library_retries_a_ranged_get_over_one_fault(
    stores: tuple[S3ObjectStore, S3ObjectStore], proxy: FaultProxy, kind: str
) -> None:
    """RESET_MID cuts the body after the headers came: botocore does not retry that, the
    binding reads again (tests/offloader/objectstore/test_s3_lost_replies.py)."""
    proxied, plain = stores
    data = os.urandom(100_000)
    plain.put("read", data)
    proxy.plan.replace_rules([FaultRule("GET", r".", kind, 1.0, limit=1)])
    proxy.plan.set_enabled(True)
    assert proxied.read_range("read", 10, 5000) == data[10:5010]
    assert proxy.plan.snapshot()[kind] == 1
    assert proxy.plan.requests["GET"] == 2


def test_rules_are_checked() -> None:
    with pytest.raises(ValueError, match="fault kind 'teapot'"):
        FaultRule("GET", ".", "teapot", 0.1)
    with pytest.raises(ValueError, match="between 0 and 1"):
        FaultRule("GET", ".", SLOWDOWN, 1.5)


def _bucket(s3_server: SeaweedS3) -> str:
    settings = s3_server.make_settings("soak-raw")
    assert settings.object_store_url is not None
    return settings.object_store_url.removeprefix("s3://").split("/")[0]
