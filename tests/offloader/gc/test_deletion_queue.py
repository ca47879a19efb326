"""The deletion queue: nothing dropped on failure, retries back off, the bucket never listed."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal

import pytest

from fixtures.cli import spawn_cli
from fixtures.counting import CountingStore
from fixtures.faults import FaultyStore, FlakyDeletes, OnlyStore
from fixtures.metadata import pending_deletions
from offloader.exceptions import ObjectStoreError
from offloader.gc.deletion_queue import backoff_ms, process_deletions
from offloader.runtime import Runtime
from offloader.settings import Settings


def enqueue(rt: Runtime, keys: list[str], reason: str) -> None:
    """Queue keys of the runtime's default store."""
    rt.metadata.deletions.enqueue(keys, reason, store_id=rt.stores.default_id())


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
    pending = pending_deletions(rt.metadata)
    assert all(d.tries == 1 and "SlowDown" in (d.last_error or "") for d in pending)
    assert rt.metadata.deletions.due(10) == []  # backing off: not due yet
    # once the backoff has passed, both are due again
    far = max(d.next_try_ms for d in pending) + 1
    assert len(rt.metadata.deletions.due(10, at_ms=far)) == 2


def test_per_key_refusals_are_retried_not_dropped(runtime: Runtime) -> None:
    rt = runtime
    rt.objects.put("a", b"x")
    rt.objects.put("b", b"x")
    enqueue(rt, ["a", "b"], "test")
    flaky = FlakyDeletes(rt.objects, refuse={"b"})
    result = process_deletions(rt.metadata, OnlyStore(flaky), rt.settings)
    assert (result.deleted, result.failed, result.remaining) == (1, 1, 1)
    (left,) = pending_deletions(rt.metadata)
    assert left.object_key == "b" and left.last_error == "AccessDenied"
    assert process_deletions(rt.metadata, rt.stores, rt.settings).remaining == 0
    assert list(rt.objects.list()) == []


def test_a_pass_never_lists_the_bucket_and_leaves_uploads_to_the_sweep(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the orphan sweep lists the store: a pass makes one delete request per batch and
    nothing else, even for a key with an unfinished multipart upload."""
    rt = runtime
    rt.objects.put("k", b"x")
    upload = rt.objects.create_multipart("half-written")
    rt.objects.upload_part(upload, 1, b"x" * 1024)
    enqueue(rt, ["k", "half-written"], "crashed attempt")
    counting = CountingStore(rt.objects)
    no_listing = FaultyStore(counting, listing_error=ObjectStoreError("the GC listed uploads"))
    with caplog.at_level(logging.WARNING):
        result = process_deletions(rt.metadata, OnlyStore(no_listing), rt.settings)
    assert (result.deleted, result.failed, result.remaining) == (2, 0, 0)
    assert counting.requests == {"delete_many": 1} and result.delete_requests == 1
    assert caplog.records == []
    assert not rt.objects.exists("k")
    assert [u.key for u in rt.objects.list_multipart_uploads()] == ["half-written"]
    rt.objects.abort_multipart(upload)


@pytest.mark.parametrize(
    ("tries", "expected"), [(0, 5_000), (1, 10_000), (3, 40_000), (20, 3_600_000)]
)
def test_backoff_is_exponential_and_capped(tries: int, expected: int) -> None:
    settings = Settings(delete_retry_base_seconds=5.0, delete_retry_max_seconds=3600.0)
    assert backoff_ms(tries, settings) == expected


def test_sigkill_between_store_delete_and_queue_update_loses_nothing(runtime: Runtime) -> None:
    """Killed after the store deleted a batch but before the queue recorded it: the keys are
    still queued; the rerun deletes again, and keys already gone are no error."""
    rt = runtime
    for key in ("a", "b"):
        rt.objects.put(key, b"x")
    rt.objects.put("keep", b"x")
    enqueue(rt, ["a", "b", "never-written"], "test")
    queued = {d.id: d.object_key for d in pending_deletions(rt.metadata)}

    killed = spawn_cli(rt.settings, "gc", failpoints="after-store-delete")
    out, _ = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, "after-store-delete was never reached"
    assert out == b""
    # the store did its part, the queue still holds every key, none marked tried
    assert [i.key for i in rt.objects.list()] == ["keep"]
    pending = pending_deletions(rt.metadata)
    assert {d.id: d.object_key for d in pending} == queued
    assert all(d.tries == 0 and d.last_error is None for d in pending)

    rerun = spawn_cli(rt.settings, "gc", "--json")
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err.decode()
    result = json.loads(out)
    assert (result["deleted"], result["failed"], result["remaining"]) == (3, 0, 0)
    assert result["backlog"]["pending"] == 0 and result["delete_requests"] == 1
    assert pending_deletions(rt.metadata) == []
    assert [i.key for i in rt.objects.list()] == ["keep"]


def test_sigkill_after_the_first_of_several_batches_then_rerun_converges(
    runtime: Runtime,
) -> None:
    """Batches of two: the kill comes after the first request; the first batch is gone from
    the store but still queued, the rest untouched; the rerun finishes and leaves nothing."""
    rt = dataclasses.replace(
        runtime, settings=runtime.settings.model_copy(update={"gc_batch_keys": 2})
    )
    keys = [f"k{n}" for n in range(5)]
    for key in [*keys, "keep"]:
        rt.objects.put(key, b"x")
    enqueue(rt, keys, "test")
    first = [d.object_key for d in rt.metadata.deletions.due(2)]

    killed = spawn_cli(rt.settings, "gc", failpoints="after-store-delete")
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, "after-store-delete was never reached"
    left = {i.key for i in rt.objects.list()}
    assert left == {"keep", *keys} - set(first)
    assert sorted(d.object_key for d in pending_deletions(rt.metadata)) == keys
    assert all(d.tries == 0 for d in pending_deletions(rt.metadata))

    rerun = spawn_cli(rt.settings, "gc", "--json")
    out, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err.decode()
    result = json.loads(out)
    assert (result["deleted"], result["failed"], result["delete_requests"]) == (5, 0, 3)
    assert rt.metadata.deletions.count_pending() == 0
    assert [i.key for i in rt.objects.list()] == ["keep"]
    again = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (again.deleted, again.failed, again.delete_requests) == (0, 0, 0)
