"""Object store on S3 or an S3-compatible server (SeaweedFS in the tests), through boto3.

Keys are joined to the store's prefix; everything returned is relative to it again.
Every botocore error becomes one of our exceptions, with a message that names the
operation, bucket and key and never a credential.

Conditional create, as measured against SeaweedFS 4.48 (``weed mini``):

* ``PutObject`` with ``If-None-Match: *`` answers 412 PreconditionFailed when the key
  exists, and is atomic: 32 threads racing to create one key, 20 rounds, one winner each.
* ``CompleteMultipartUpload`` with ``If-None-Match: *`` answers 412 when the key exists
  beforehand, but is NOT atomic: with 12-16 uploads completing the same new key at once,
  1 round in 5 (up to 1 in 2) had two or three winners. AWS S3 documents it as atomic.
  The binding therefore serialises conditional completes of one key inside this process
  (a lock per bucket and key), so the server's check always sees the earlier winner: 0
  double winners in 15 rounds of 12. Across processes it stays best effort on SeaweedFS;
  callers that need more should write to unique keys.

Part copy (``upload_part_copy``) is UploadPartCopy with CopySourceRange. As measured
against SeaweedFS 4.48: a range past the end of the source, even in part, answers 416
InvalidRange (InvalidRangeError here), a missing source NoSuchKey, and the part's ETag is
not the part's MD5: the source object's for a single-PUT source, ``<hex>-N`` for a range
of a multipart one; completing with a part below 5 MiB, not the last, answers
EntityTooSmall (PartTooSmallError), as AWS does.

A conditional create whose reply is lost after the server stored the object (a reset in
the answer) is retried by botocore, and the retry answers 412 against the call's own
object. After a 412 to a retried attempt (never to a first one) the binding HEADs the key
and counts the create as done if the object is this call's: as measured against SeaweedFS
4.48, a single PUT's ETag is the body's MD5 hex and a completed upload's is the MD5 of its
parts' binary MD5s, ``-`` and the part count (as AWS documents it), computed from the ETags
the parts' uploads or part copies returned (a copied part's ETag may be ``<hex>-N``, see
below: its hex counts), so ETag and size must match. Any other object stays
ObjectExistsError. A completion retried without the condition answers 200 again.

botocore retries a request only until its headers arrive; a GET whose body breaks off
(reset, short body, read timeout) is re-issued by the binding, on the same clock and
within the same attempts as botocore's own retries (``_read``).

Also seen on SeaweedFS: HEAD of a missing key gives code "404", GET gives NoSuchKey; a
range at or past the end gives 416 InvalidRange; aborting an unknown upload gives
NoSuchUpload; wrong credentials give 403 (HEAD) or SignatureDoesNotMatch.
"""

from __future__ import annotations

import builtins
import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlparse, urlunparse

import boto3
import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    IncompleteReadError,
    ResponseStreamingError,
)

from offloader.exceptions import (
    InvalidRangeError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    PartTooSmallError,
)
from offloader.objectstore import (
    Capabilities,
    DeleteResult,
    GiB,
    MiB,
    MultipartUpload,
    ObjectInfo,
    ObjectStore,
    PartInfo,
    check_part_copy,
    check_part_number,
)

if TYPE_CHECKING:
    from offloader.settings import Settings

_NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
_PRECONDITION = frozenset({"412", "PreconditionFailed"})
_NO_UPLOAD = frozenset({"NoSuchUpload"})
_BAD_RANGE = frozenset({"416", "InvalidRange"})
_TOO_SMALL = frozenset({"EntityTooSmall"})
_NO_BUCKET = frozenset({"404", "NoSuchBucket", "NotFound"})
_DELETE_BATCH = 1000


class _KeyLocks:
    """One lock per (bucket, key), dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str], tuple[threading.Lock, int]] = {}

    def acquire(self, name: tuple[str, str]) -> threading.Lock:
        with self._guard:
            lock, users = self._locks.get(name, (threading.Lock(), 0))
            self._locks[name] = (lock, users + 1)
        lock.acquire()
        return lock

    def release(self, name: tuple[str, str]) -> None:
        with self._guard:
            lock, users = self._locks[name]
            lock.release()
            if users == 1:
                del self._locks[name]
            else:
                self._locks[name] = (lock, users - 1)


_COMPLETE_LOCKS = _KeyLocks()


def _safe_endpoint(endpoint_url: str | None) -> str | None:
    """The endpoint without any user:password part, fit for logs."""
    if not endpoint_url:
        return None
    parsed = urlparse(endpoint_url)
    host = parsed.hostname or ""
    netloc = f"{host}:{parsed.port}" if parsed.port else host
    return urlunparse(parsed._replace(netloc=netloc))


def _parse_url(url: str) -> tuple[str, str]:
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc or parsed.query or parsed.fragment:
        raise ValueError(f"object store URL {url!r}: expected s3://bucket/prefix")
    if "@" in parsed.netloc or ":" in parsed.netloc:
        raise ValueError(f"object store URL {url!r}: the bucket name holds '@' or ':'")
    return parsed.netloc, parsed.path.lstrip("/")


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


#: Makes the S3 client for ``settings`` (their endpoint and region). The library's own is
#: :func:`build_client`; a host (the Airflow hook) injects one whose session refreshes its
#: credentials, so no secret has to be copied into the settings.
S3ClientFactory = Callable[["Settings"], Any]


def client_config(settings: Settings) -> Config:
    """The library's client config: bounded attempts and timeouts (invariant 8), adaptive
    retries (503 SlowDown), path addressing. The operation deadline is not a Config field:
    :func:`install_deadline` adds it to a client."""
    return Config(
        region_name=settings.s3_region,
        retries={"mode": "adaptive", "total_max_attempts": settings.s3_max_attempts},
        max_pool_connections=max(10, 2 * settings.upload_concurrency),
        s3={"addressing_style": "path"},
        connect_timeout=settings.s3_connect_timeout_seconds,
        read_timeout=settings.s3_read_timeout_seconds,
        # S3-compatible servers differ on the newer default checksums; send them only
        # where the API requires them.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


_STARTED = "offloader_operation_started"
_ATTEMPTS_LEFT = "offloader_attempts_left"


class _Budget(threading.local):
    """What is left of one store operation that makes several botocore calls (a read
    whose body broke off, re-issued): its start and the attempts it may still make.
    Set around each call by the store, read by :func:`install_deadline`'s handlers."""

    started: float | None = None
    attempts_left: int | None = None


_BUDGET = _Budget()


def _start_clock(context: dict[str, Any], **_: Any) -> None:
    started = _BUDGET.started
    context[_STARTED] = time.monotonic() if started is None else started
    if _BUDGET.attempts_left is not None:
        context[_ATTEMPTS_LEFT] = _BUDGET.attempts_left


def _worst_backoff(attempts: int) -> float:
    """The longest sleep botocore's standard and adaptive modes take after ``attempts``
    attempts: a random share of 2**(attempts - 1) seconds, capped at 20."""
    return float(min(2 ** (attempts - 1), _MAX_BACKOFF_SECONDS))


_MAX_BACKOFF_SECONDS = 20


def install_deadline(client: Any, deadline_seconds: float) -> Any:
    """Retry an operation of ``client`` only while the next attempt can still start
    before ``deadline_seconds`` have passed since the operation began; botocore bounds
    the number of attempts and each attempt's waits, not their total.

    The ``needs-retry`` handler runs before botocore's retry handler and answers False (no
    retry) when the time spent plus the longest backoff botocore might sleep reaches the
    deadline: the last attempt's error is raised as it is. So the last attempt starts
    before the deadline and an operation ends within deadline + connect + read timeout
    (docs/CONFIGURATION.md, "Deadlines"). An operation the store makes of several calls
    (a GET re-issued after its body broke off) runs them all on its first call's clock
    and within one budget of attempts (:class:`_Budget`). Returns ``client``.
    """
    if getattr(client.meta, "offloader_deadline", None) is not None:
        return client  # installed already (a factory's client given to us twice)

    def _stop_when_spent(request_dict: dict[str, Any], attempts: int, **_: Any) -> bool | None:
        context = request_dict.get("context", {})
        started = context.get(_STARTED)
        if started is None:
            return None
        left = context.get(_ATTEMPTS_LEFT)
        if left is not None and attempts >= left:
            return False  # the operation's earlier calls spent the rest
        if time.monotonic() - started + _worst_backoff(attempts) >= deadline_seconds:
            return False
        return None

    client.meta.events.register("before-call.s3", _start_clock)
    client.meta.events.register_first("needs-retry.s3", _stop_when_spent)
    client.meta.offloader_deadline = deadline_seconds
    return client


# botocore parses its JSON service models (about 0.3 s of CPU for S3) once per session's
# loader; every Runtime builds a client, and a DAG task or a test opens several. One loader
# for the process keeps those files parsed; it holds no credentials.
_DATA_LOADER = botocore.loaders.create_loader()


def _botocore_session() -> botocore.session.Session:
    session = botocore.session.get_session()
    session.register_component("data_loader", _DATA_LOADER)
    return session


def build_client(settings: Settings) -> Any:
    """A thread-safe boto3 S3 client from the settings' keys (or boto3's default chain)."""
    session = boto3.session.Session(
        botocore_session=_botocore_session(),
        aws_access_key_id=_secret(settings.s3_access_key_id),
        aws_secret_access_key=_secret(settings.s3_secret_access_key),
        aws_session_token=_secret(settings.s3_session_token),
        region_name=settings.s3_region,
    )
    client = session.client(
        "s3", endpoint_url=settings.s3_endpoint_url, config=client_config(settings)
    )
    return install_deadline(client, settings.s3_operation_deadline_seconds)


class S3ObjectStore(ObjectStore):
    """One bucket and key prefix on S3; safe to share between threads."""

    capabilities = Capabilities(
        multipart=True,
        conditional_create=True,
        ranged_read=True,
        part_copy=True,
        min_part_size=5 * MiB,
        max_part_size=5 * GiB,
        max_parts=10_000,
        max_delete_batch=_DELETE_BATCH,
    )

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        if not bucket:
            raise ValueError("S3 object store: bucket must not be empty")
        self._client = client
        self.bucket = bucket
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.endpoint_url = _safe_endpoint(getattr(client.meta, "endpoint_url", None))

    @classmethod
    def from_url(
        cls,
        url: str,
        settings: Settings | None = None,
        client_factory: S3ClientFactory | None = None,
    ) -> S3ObjectStore:
        """``s3://bucket/prefix``; endpoint and region come from ``settings``, credentials
        from them too unless ``client_factory`` makes the client."""
        bucket, prefix = _parse_url(url)
        if settings is None:
            from offloader.settings import Settings

            settings = Settings()
        client = (client_factory or build_client)(settings)
        # a host's factory (the Airflow hook) gets the same deadline as our own clients
        install_deadline(client, settings.s3_operation_deadline_seconds)
        return cls(client, bucket, prefix)

    @property
    def url(self) -> str:
        location = f"s3://{self.bucket}/{self.prefix.rstrip('/')}"
        return f"{location} at {self.endpoint_url}" if self.endpoint_url else location

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url!r})"

    def close(self) -> None:
        self._client.close()

    # --- keys and errors ------------------------------------------------------------
    def _full(self, key: str) -> str:
        if not isinstance(key, str) or not key or key.startswith("/") or "\0" in key:
            raise ValueError(f"object key {key!r}: must be non-empty, no leading '/', no NUL")
        return self.prefix + key

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.prefix) :]

    def _fail(self, err: Exception, operation: str, key: str | None = None) -> NoReturn:
        """Raise our exception for a botocore one; messages never carry credentials."""
        where = f"s3://{self.bucket}/{self.prefix}{key or ''}"
        if isinstance(err, ClientError):
            error = err.response.get("Error", {})
            code = str(error.get("Code", "")) or "Unknown"
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = f"S3 {operation} on {where} failed: {code} {error.get('Message', '')}"
            if code in _NOT_FOUND:
                raise ObjectNotFoundError(message.strip()) from err
            if code in _PRECONDITION or status == 412:
                raise ObjectExistsError(message.strip()) from err
            if code in _TOO_SMALL:
                raise PartTooSmallError(message.strip()) from err
            raise ObjectStoreError(message.strip()) from err
        raise ObjectStoreError(f"S3 {operation} on {where} failed: {err}") from err

    @staticmethod
    def _code(err: ClientError) -> str:
        return str(err.response.get("Error", {}).get("Code", ""))

    # --- whole objects --------------------------------------------------------------
    def put(
        self,
        key: str,
        data: bytes | bytearray,
        *,
        metadata: Mapping[str, str] | None = None,
        if_none_match: bool = False,
    ) -> None:
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._full(key),
            "Body": bytes(data),
            "Metadata": dict(metadata or {}),
        }
        if if_none_match:
            args["IfNoneMatch"] = "*"
        try:
            self._client.put_object(**args)
        except ClientError as err:
            body_md5 = hashlib.md5(args["Body"], usedforsecurity=False).hexdigest()
            if self._our_lost_reply(err, key, etag=body_md5, size=len(args["Body"])):
                return
            self._fail(err, "PutObject", key)
        except BotoCoreError as err:
            self._fail(err, "PutObject", key)

    def _our_lost_reply(self, err: ClientError, key: str, *, etag: str | None, size: int) -> bool:
        """Whether a conditional create's 412 answers a retry of this very call whose
        first reply was lost after the server stored it: botocore retried, and the object
        under ``key`` has the ETag and size this call's request gives. A 412 to the first
        attempt is always a conflict; so is any other object (a competitor's), unless its
        bytes are the same as ours, and then the outcome is the same."""
        if self._code(err) not in _PRECONDITION and _status(err) != 412:
            return False
        if not err.response.get("ResponseMetadata", {}).get("RetryAttempts") or etag is None:
            return False
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ClientError as head_err:
            if self._code(head_err) in _NOT_FOUND:
                return False
            self._fail(head_err, "HeadObject (checking a conditional create)", key)
        except BotoCoreError as head_err:
            self._fail(head_err, "HeadObject (checking a conditional create)", key)
        stored = str(head.get("ETag", "")).strip('"')
        return stored == etag and head.get("ContentLength") == size

    def get(self, key: str) -> bytes:
        try:
            return self._read("GetObject", key, {"Bucket": self.bucket, "Key": self._full(key)})
        except (ClientError, BotoCoreError) as err:
            self._fail(err, "GetObject", key)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """One ranged GET; nothing is read beyond ``offset + length``."""
        if offset < 0 or length < 0:
            raise ValueError(f"read_range {key!r}: offset and length must be >= 0")
        if length == 0:
            self.stat(key)  # still report a missing object
            return b""
        byte_range = f"bytes={offset}-{offset + length - 1}"
        args = {"Bucket": self.bucket, "Key": self._full(key), "Range": byte_range}
        try:
            return self._read("GetObject (range)", key, args)
        except ClientError as err:
            if self._code(err) in _BAD_RANGE:
                return b""
            self._fail(err, "GetObject (range)", key)
        except BotoCoreError as err:
            self._fail(err, "GetObject (range)", key)

    def _read(self, operation: str, key: str, args: dict[str, Any]) -> bytes:
        """GetObject's body. botocore retries a GET only until its headers arrive; a body
        that breaks off (a reset, a short body, a read timeout) re-issues the same GET,
        within the operation's budget: all calls together make at most the client's
        attempts, and none starts once the deadline (``install_deadline``) is near.
        Then one ObjectStoreError saying how many attempts broke off."""
        limit = _max_attempts(self._client)
        deadline = getattr(self._client.meta, "offloader_deadline", None)
        started = time.monotonic()
        spent = 0
        while True:
            _BUDGET.started, _BUDGET.attempts_left = started, limit - spent
            try:
                response = self._client.get_object(**args)
            finally:
                _BUDGET.started = _BUDGET.attempts_left = None
            spent += 1 + int(response.get("ResponseMetadata", {}).get("RetryAttempts", 0))
            try:
                return response["Body"].read()
            except _BODY_ERRORS as err:
                response["Body"].close()
                backoff = _worst_backoff(spent)
                late = deadline is not None and time.monotonic() - started + backoff >= deadline
                if spent >= limit or late:
                    where = f"s3://{self.bucket}/{self.prefix}{key}"
                    raise ObjectStoreError(
                        f"S3 {operation} on {where} failed: the body broke off "
                        f"({spent} attempts in {time.monotonic() - started:.1f} s): {err}"
                    ) from err
                time.sleep(random.uniform(0, backoff))  # jitter, as botocore

    def stat(self, key: str) -> ObjectInfo:
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=self._full(key))
        except (ClientError, BotoCoreError) as err:
            self._fail(err, "HeadObject", key)
        return ObjectInfo(
            key=key,
            size=response["ContentLength"],
            metadata=dict(response.get("Metadata", {})),
            last_modified=response.get("LastModified"),
        )

    # --- multipart ------------------------------------------------------------------
    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        try:
            response = self._client.create_multipart_upload(
                Bucket=self.bucket, Key=self._full(key), Metadata=dict(metadata or {})
            )
        except (ClientError, BotoCoreError) as err:
            self._fail(err, "CreateMultipartUpload", key)
        return MultipartUpload(key=key, upload_id=response["UploadId"], initiated=_now())

    def upload_part(
        self, upload: MultipartUpload, part_number: int, data: bytes | bytearray
    ) -> PartInfo:
        check_part_number(self, part_number)
        data = bytes(data)
        try:
            response = self._client.upload_part(
                Bucket=self.bucket,
                Key=self._full(upload.key),
                UploadId=upload.upload_id,
                PartNumber=part_number,
                Body=data,
            )
        except (ClientError, BotoCoreError) as err:
            self._fail(err, f"UploadPart {part_number}", upload.key)
        return PartInfo(part_number=part_number, etag=response["ETag"], size=len(data))

    def complete_multipart(
        self, upload: MultipartUpload, parts: Iterable[PartInfo], *, if_none_match: bool = False
    ) -> None:
        ordered = sorted(parts, key=lambda part: part.part_number)
        if not ordered:
            raise ValueError("complete_multipart needs at least one part")
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._full(upload.key),
            "UploadId": upload.upload_id,
            "MultipartUpload": {
                "Parts": [{"PartNumber": p.part_number, "ETag": p.etag} for p in ordered]
            },
        }
        if not if_none_match:
            self._complete(args, upload.key, ordered)
            return
        args["IfNoneMatch"] = "*"
        name = (self.bucket, args["Key"])
        _COMPLETE_LOCKS.acquire(name)  # see the module docstring: SeaweedFS races here
        try:
            self._complete(args, upload.key, ordered)
        finally:
            _COMPLETE_LOCKS.release(name)

    def _complete(self, args: dict[str, Any], key: str, parts: builtins.list[PartInfo]) -> None:
        try:
            self._client.complete_multipart_upload(**args)
        except ClientError as err:
            etag, size = _multipart_etag(parts), sum(part.size for part in parts)
            if self._our_lost_reply(err, key, etag=etag, size=size):
                return
            self._fail(err, "CompleteMultipartUpload", key)
        except BotoCoreError as err:
            self._fail(err, "CompleteMultipartUpload", key)

    def abort_multipart(self, upload: MultipartUpload) -> None:
        try:
            self._client.abort_multipart_upload(
                Bucket=self.bucket, Key=self._full(upload.key), UploadId=upload.upload_id
            )
        except ClientError as err:
            if self._code(err) in _NO_UPLOAD or self._code(err) in _NOT_FOUND:
                return
            self._fail(err, "AbortMultipartUpload", upload.key)
        except BotoCoreError as err:
            self._fail(err, "AbortMultipartUpload", upload.key)

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[MultipartUpload]:
        for item in self._listed(
            "list_multipart_uploads", "ListMultipartUploads", "Uploads", prefix
        ):
            yield MultipartUpload(
                key=self._relative(item["Key"]),
                upload_id=item["UploadId"],
                initiated=item.get("Initiated"),
            )

    def upload_part_copy(
        self, upload: MultipartUpload, part_number: int, source_key: str, offset: int, length: int
    ) -> PartInfo:
        """UploadPartCopy with CopySourceRange: the server copies, no byte comes here."""
        check_part_copy(self, part_number, source_key, offset, length)
        operation = f"UploadPartCopy {part_number} from {source_key!r} at {offset}+{length}"
        try:
            response = self._client.upload_part_copy(
                Bucket=self.bucket,
                Key=self._full(upload.key),
                UploadId=upload.upload_id,
                PartNumber=part_number,
                CopySource={"Bucket": self.bucket, "Key": self._full(source_key)},
                CopySourceRange=f"bytes={offset}-{offset + length - 1}",
            )
        except ClientError as err:
            if self._code(err) in _BAD_RANGE:
                raise InvalidRangeError(
                    f"S3 {operation} on s3://{self.bucket}/{self.prefix}{upload.key} failed: "
                    f"the range does not lie inside {source_key!r}"
                ) from err
            self._fail(err, operation, upload.key)
        except BotoCoreError as err:
            self._fail(err, operation, upload.key)
        return PartInfo(part_number, etag=response["CopyPartResult"]["ETag"], size=length)

    # --- listing and deleting -------------------------------------------------------
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        for item in self._listed("list_objects_v2", "ListObjectsV2", "Contents", prefix):
            yield ObjectInfo(
                key=self._relative(item["Key"]),
                size=item["Size"],
                last_modified=item.get("LastModified"),
            )

    def _listed(
        self, api: str, operation: str, field: str, prefix: str
    ) -> Iterator[dict[str, Any]]:
        """Every item (``field`` of each page) the paginated listing ``api`` gives under
        ``prefix``; a failed page raises our exception, naming ``operation``."""
        paginator = self._client.get_paginator(api)
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                yield from page.get(field, [])
        except (ClientError, BotoCoreError) as err:
            self._fail(err, operation, prefix)

    def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        """DeleteObjects in batches of 1,000 (Quiet): only failures come back per key."""
        keys = list(dict.fromkeys(keys))
        full_keys = [self._full(key) for key in keys]
        failed: dict[str, str] = {}
        for start in range(0, len(full_keys), _DELETE_BATCH):
            failed.update(self._delete_batch(full_keys[start : start + _DELETE_BATCH]))
        return DeleteResult(deleted=[k for k in keys if k not in failed], failed=failed)

    def _delete_batch(self, full_keys: builtins.list[str]) -> dict[str, str]:
        request = {"Objects": [{"Key": key} for key in full_keys], "Quiet": True}
        try:
            response = self._client.delete_objects(Bucket=self.bucket, Delete=request)
        except (ClientError, BotoCoreError) as err:
            self._fail(err, f"DeleteObjects ({len(full_keys)} keys)")
        failed: dict[str, str] = {}
        for error in response.get("Errors", []):
            if error.get("Code") in _NOT_FOUND:
                continue  # a missing key counts as deleted
            failed[self._relative(error["Key"])] = f"{error.get('Code')}: {error.get('Message')}"
        return failed

    # --- bucket ---------------------------------------------------------------------
    def check_available(self) -> None:
        """The bucket exists and answers (HeadBucket); our exception otherwise."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (ClientError, BotoCoreError) as err:
            self._fail(err, "HeadBucket")

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing (tests and the demo; production buckets exist)."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as err:
            if self._code(err) not in _NO_BUCKET:
                self._fail(err, "HeadBucket")
        except BotoCoreError as err:
            self._fail(err, "HeadBucket")
        args: dict[str, Any] = {"Bucket": self.bucket}
        region = self._client.meta.region_name
        if region and region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(**args)
        except ClientError as err:
            if self._code(err) != "BucketAlreadyOwnedByYou":
                self._fail(err, "CreateBucket")
        except BotoCoreError as err:
            self._fail(err, "CreateBucket")


#: a GET body that broke off after its headers arrived: re-issued by ``_read``
_BODY_ERRORS = (IncompleteReadError, ResponseStreamingError, HTTPClientError, ConnectionError)


def _status(err: ClientError) -> int | None:
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _max_attempts(client: Any) -> int:
    """The client's attempts per operation (``s3_max_attempts`` for ours)."""
    retries = getattr(client.meta.config, "retries", None) or {}
    if "total_max_attempts" in retries:
        return max(1, int(retries["total_max_attempts"]))
    if "max_attempts" in retries:
        return max(1, int(retries["max_attempts"]) + 1)
    return 3  # botocore's standard mode


def _multipart_etag(parts: Iterable[PartInfo]) -> str | None:
    """The ETag S3 gives a completed multipart object: the MD5 of the parts' binary MD5s,
    then ``-`` and their count. SeaweedFS 4.48 gives the same, for copied parts too, from
    the ETags their UploadPartCopy returned (``"<hex>-N"`` for a range of a multipart
    source: the hex part counts). None if a part's ETag is not hex (a server that differs)."""
    digests = []
    for part in parts:
        try:
            digests.append(bytes.fromhex(part.etag.strip('"').split("-", 1)[0]))
        except ValueError:
            return None
    digest = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
    return f"{digest}-{len(digests)}"


def _now() -> datetime:
    return datetime.now(UTC)
