"""The deletion queue: nothing dropped on failure, retries back off, uploads are aborted."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from offloader.exceptions import ObjectStoreError
from offloader.gc.deletion_queue import backoff_ms, process_deletions
from offloader.objectstore import DeleteResult, ObjectStore
from offloader.runtime import Runtime
from offloader.settings import Settings


class FlakyDeletes:
    """Wraps a real store; its deletes fail as S3 does under load (the real server cannot
    be made to refuse deletes on demand). Everything else goes to the real store."""

    def __init__(
        self, store: ObjectStore, *, raise_times: int = 0, refuse: Iterable[str] = ()
    ) -> None:
        self._store = store
        self._raise_times = raise_times
        self._refuse = set(refuse)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._store, name)

    def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        if self._raise_times:
            self._raise_times -= 1
            raise ObjectStoreError("503 SlowDown")
        keys = list(keys)
        result = self._store.delete_many([k for k in keys if k not in self._refuse])
        failed = {**result.failed, **{k: "AccessDenied" for k in keys if k in self._refuse}}
        return DeleteResult(result.deleted, failed)


class OnlyStore:
    """Hands out one (flaky) store for every recorded store id."""

    def __init__(self, store: FlakyDeletes) -> None:
        self._store = store

    def get(self, store_id: int | None, what: str) -> ObjectStore:
        return self._store  # type: ignore[return-value]


def enqueue(rt: Runtime, keys: list[str], reason: str) -> None:
    """Queue keys of the runtime's default store."""
    rt.metadata.enqueue_deletions(keys, reason, store_id=rt.stores.default_id())


def test_queued_objects_are_deleted(runtime: Runtime) -> None:
    rt = runtime
    for key in ("a", "b", "c"):
        rt.objects.put(key, b"x")
    enqueue(rt, ["a", "b", "missing"], "test")
    result = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (result.deleted, result.failed, result.remaining) == (3, 0, 0)
    assert [i.key for i in rt.objects.list()] == ["c"]


def test_a_failing_store_keeps_everything_queued_with_backoff(runtime: Runtime) -> None:
    rt = runtime
    settings = rt.settings.model_copy(update={"delete_retry_base_seconds": 60.0})
    rt.objects.put("a", b"x")
    rt.objects.put("b", b"x")
    enqueue(rt, ["a", "b"], "test")
    flaky = FlakyDeletes(rt.objects, raise_times=1)
    result = process_deletions(rt.metadata, OnlyStore(flaky), settings)
    assert (result.deleted, result.failed, result.remaining) == (0, 2, 2)
    pending = rt.metadata.pending_deletions()
    assert all(d.tries == 1 and "SlowDown" in (d.last_error or "") for d in pending)
    assert rt.metadata.due_deletions(10) == []  # backing off: not due yet
    # once the backoff has passed, both are due again
    far = max(d.next_try_ms for d in pending) + 1
    assert len(rt.metadata.due_deletions(10, at_ms=far)) == 2


def test_per_key_refusals_are_retried_not_dropped(runtime: Runtime) -> None:
    rt = runtime
    rt.objects.put("a", b"x")
    rt.objects.put("b", b"x")
    enqueue(rt, ["a", "b"], "test")
    flaky = FlakyDeletes(rt.objects, refuse={"b"})
    result = process_deletions(rt.metadata, OnlyStore(flaky), rt.settings)
    assert (result.deleted, result.failed, result.remaining) == (1, 1, 1)
    (left,) = rt.metadata.pending_deletions()
    assert left.object_key == "b" and left.last_error == "AccessDenied"
    assert process_deletions(rt.metadata, rt.stores, rt.settings).remaining == 0
    assert list(rt.objects.list()) == []


def test_unfinished_uploads_of_queued_keys_are_aborted(runtime: Runtime) -> None:
    rt = runtime
    upload = rt.objects.create_multipart("half-written")
    rt.objects.upload_part(upload, 1, b"x" * 1024)
    other = rt.objects.create_multipart("keep-me")
    enqueue(rt, ["half-written"], "crashed attempt")
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert [u.key for u in rt.objects.list_multipart_uploads()] == ["keep-me"]
    rt.objects.abort_multipart(other)


@pytest.mark.parametrize(
    ("tries", "expected"), [(0, 5_000), (1, 10_000), (3, 40_000), (20, 3_600_000)]
)
def test_backoff_is_exponential_and_capped(tries: int, expected: int) -> None:
    settings = Settings(delete_retry_base_seconds=5.0, delete_retry_max_seconds=3600.0)
    assert backoff_ms(tries, settings) == expected
