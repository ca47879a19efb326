"""The S3 binding over a network that loses replies: the soak's fault proxy
(tests/soak/proxy.py) in front of SeaweedFS injects one fault where each test says.

* A conditional create whose reply is cut after SeaweedFS stored the object is retried by
  botocore and answered 412 against the call's own object: that is a success; an object
  someone else put there stays a conflict.
* A GET whose body is cut after its headers came is re-issued, within the attempts and
  the deadline of one operation, and then fails with one clear error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from fixtures.seaweedfs_server import SeaweedS3
from offloader.exceptions import ObjectExistsError, ObjectStoreError
from offloader.objectstore import MultipartUpload, PartInfo
from offloader.objectstore.s3 import S3ObjectStore
from soak.proxy import RESET_MID, SLOWDOWN, FaultPlan, FaultProxy, FaultRule

pytestmark = pytest.mark.s3

MiB = 1024 * 1024
COMPLETE = r"\?uploadId="  # POST ?uploadId=...: CompleteMultipartUpload, not ?uploads


@pytest.fixture
def proxy(s3_server: SeaweedS3) -> Iterator[FaultProxy]:
    with FaultProxy(s3_server.endpoint_url, FaultPlan(seed=11)) as running:
        yield running


class Stores:
    """One bucket and prefix through the proxy (with the given settings) and direct."""

    def __init__(
        self, s3_server: SeaweedS3, proxy: FaultProxy, name: str, **overrides: object
    ) -> None:
        direct = s3_server.make_settings(name[:24], prefix="lost-replies")
        assert direct.object_store_url is not None
        through = direct.model_copy(update={"s3_endpoint_url": proxy.endpoint_url, **overrides})
        self.proxied = S3ObjectStore.from_url(direct.object_store_url, through)
        self.plain = S3ObjectStore.from_url(direct.object_store_url, direct)
        self.proxy = proxy

    def inject(self, verb: str, pattern: str, kind: str = RESET_MID, limit: int | None = 1) -> None:
        self.proxy.plan.replace_rules([FaultRule(verb, pattern, kind, 1.0, limit=limit)])
        self.proxy.plan.requests.clear()
        self.proxy.plan.set_enabled(True)

    def close(self) -> None:
        self.proxied.close()
        self.plain.close()


@pytest.fixture
def stores(
    s3_server: SeaweedS3, proxy: FaultProxy, request: pytest.FixtureRequest
) -> Iterator[Stores]:
    opened = Stores(s3_server, proxy, request.node.name)
    try:
        yield opened
    finally:
        opened.close()


# --- conditional create ---------------------------------------------------------------


def test_a_conditional_put_whose_reply_was_lost_succeeds(stores: Stores) -> None:
    data = os.urandom(200_000)
    stores.inject("PUT", r"/index$")
    stores.proxied.put("index", data, metadata={"kind": "index"}, if_none_match=True)
    assert stores.plain.get("index") == data
    assert stores.proxy.plan.snapshot()[RESET_MID] == 1
    assert stores.proxy.plan.requests["PUT"] == 2  # the retry met the call's own object


@pytest.mark.parametrize("planted_size", ["same", "other"])
def test_a_conditional_put_onto_another_object_stays_a_conflict(
    stores: Stores, planted_size: str
) -> None:
    """The 412 comes to a retry (the first answer was cut), yet the object is not ours:
    other bytes, of the same length or not."""
    data = os.urandom(200_000)
    theirs = os.urandom(len(data) if planted_size == "same" else 1234)
    stores.plain.put("index", theirs)
    stores.inject("PUT", r"/index$")
    with pytest.raises(ObjectExistsError, match=r"PutObject on s3://.*/index failed"):
        stores.proxied.put("index", data, if_none_match=True)
    assert stores.proxy.plan.requests["PUT"] == 2
    assert stores.plain.get("index") == theirs


def test_a_first_attempts_412_is_a_conflict_even_for_the_same_bytes(stores: Stores) -> None:
    """Only a retried attempt is checked: a 412 at once means the key was taken before."""
    data = os.urandom(1000)
    stores.plain.put("index", data)
    with pytest.raises(ObjectExistsError):
        stores.proxied.put("index", data, if_none_match=True)


def _upload_parts(
    store: S3ObjectStore, key: str, data: bytes
) -> tuple[MultipartUpload, list[PartInfo]]:
    upload = store.create_multipart(key)
    parts = [
        store.upload_part(upload, 1, data[: 5 * MiB]),
        store.upload_part(upload, 2, data[5 * MiB :]),
    ]
    return upload, parts


def test_a_conditional_complete_whose_reply_was_lost_succeeds(stores: Stores) -> None:
    data = os.urandom(5 * MiB + 4321)
    upload, parts = _upload_parts(stores.proxied, "segment", data)
    stores.inject("POST", COMPLETE)
    stores.proxied.complete_multipart(upload, parts, if_none_match=True)
    assert stores.plain.get("segment") == data
    assert stores.proxy.plan.requests["POST"] == 2


def test_a_conditional_complete_of_copied_parts_whose_reply_was_lost_succeeds(
    stores: Stores,
) -> None:
    """As rewrite completes: parts copied server-side from a multipart source (SeaweedFS
    answers such a part copy with an ETag ``<hex>-N``) and from a single-PUT one."""
    source = os.urandom(5 * MiB + 100)
    upload, parts = _upload_parts(stores.plain, "source", source)
    stores.plain.complete_multipart(upload, parts)
    small = os.urandom(3000)
    stores.plain.put("small", small)
    target = stores.proxied.create_multipart("merged")
    copied = [
        stores.proxied.upload_part_copy(target, 1, "source", 0, 5 * MiB),
        stores.proxied.upload_part_copy(target, 2, "small", 10, 2000),
    ]
    stores.inject("POST", COMPLETE)
    stores.proxied.complete_multipart(target, copied, if_none_match=True)
    assert stores.plain.get("merged") == source[: 5 * MiB] + small[10:2010]
    assert stores.proxy.plan.requests["POST"] == 2


def test_a_conditional_complete_onto_another_object_stays_a_conflict(stores: Stores) -> None:
    data = os.urandom(5 * MiB + 4321)
    theirs = os.urandom(len(data))
    stores.plain.put("segment", theirs)
    upload, parts = _upload_parts(stores.proxied, "segment", data)
    stores.inject("POST", COMPLETE)
    with pytest.raises(ObjectExistsError, match=r"CompleteMultipartUpload on s3://.*/segment"):
        stores.proxied.complete_multipart(upload, parts, if_none_match=True)
    assert stores.proxy.plan.requests["POST"] == 2
    assert stores.plain.get("segment") == theirs
    stores.proxied.abort_multipart(upload)


# --- reads ----------------------------------------------------------------------------


def test_a_ranged_get_cut_in_its_body_is_read_again(stores: Stores) -> None:
    data = os.urandom(300_000)
    stores.plain.put("data", data)
    stores.inject("GET", r"/data$")
    assert stores.proxied.read_range("data", 1000, 250_000) == data[1000:251_000]
    assert stores.proxy.plan.snapshot()[RESET_MID] == 1
    assert stores.proxy.plan.requests["GET"] == 2


def test_a_whole_get_cut_in_its_body_is_read_again(stores: Stores) -> None:
    data = os.urandom(300_000)
    stores.plain.put("data", data)
    stores.inject("GET", r"/data$")
    assert stores.proxied.get("data") == data
    assert stores.proxy.plan.requests["GET"] == 2


def test_a_get_cut_every_time_fails_clearly_after_the_allowed_attempts(
    s3_server: SeaweedS3, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    """s3_max_attempts=3: three GETs, two jittered backoffs of at most 1 s and 2 s."""
    stores = Stores(s3_server, proxy, request.node.name, s3_max_attempts=3)
    try:
        data = os.urandom(100_000)
        stores.plain.put("data", data)
        stores.inject("GET", r"/data$", limit=None)
        started = time.monotonic()
        with pytest.raises(ObjectStoreError) as caught:
            stores.proxied.read_range("data", 0, 50_000)
        elapsed = time.monotonic() - started
        message = str(caught.value)
        assert "GetObject (range) on s3://" in message and "/data failed" in message
        assert "the body broke off (3 attempts" in message
        assert s3_server.secret_key not in message
        assert proxy.plan.requests["GET"] == 3
        assert elapsed < 3.0 + 2.0  # backoffs, plus slack for a loaded machine
    finally:
        stores.close()


def test_a_get_cut_every_time_stops_at_the_deadline(
    s3_server: SeaweedS3, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    """20 attempts allowed, a 2.5 s deadline: no attempt starts once the time spent plus
    the next backoff reaches it."""
    stores = Stores(
        s3_server, proxy, request.node.name, s3_max_attempts=20, s3_operation_deadline_seconds=2.5
    )
    try:
        stores.plain.put("data", os.urandom(100_000))
        stores.inject("GET", r"/data$", limit=None)
        started = time.monotonic()
        with pytest.raises(ObjectStoreError, match="the body broke off"):
            stores.proxied.get("data")
        assert time.monotonic() - started < 2.5 + 1.0
        assert 1 <= proxy.plan.requests["GET"] <= 3  # 1 s and 2 s worst backoffs: 1 + 2 > 2.5
    finally:
        stores.close()


def test_botocores_retries_and_the_reads_share_one_budget(
    s3_server: SeaweedS3, proxy: FaultProxy, request: pytest.FixtureRequest
) -> None:
    """s3_max_attempts=2: a 503 that botocore retries, then a body cut: no third GET."""
    stores = Stores(s3_server, proxy, request.node.name, s3_max_attempts=2)
    try:
        stores.plain.put("data", os.urandom(100_000))
        proxy.plan.replace_rules(
            [
                FaultRule("GET", r"/data$", SLOWDOWN, 1.0, limit=1),
                FaultRule("GET", r"/data$", RESET_MID, 1.0),
            ]
        )
        proxy.plan.requests.clear()
        proxy.plan.set_enabled(True)
        with pytest.raises(ObjectStoreError, match=r"the body broke off \(2 attempts"):
            stores.proxied.read_range("data", 0, 50_000)
        assert proxy.plan.requests["GET"] == 2
    finally:
        stores.close()
