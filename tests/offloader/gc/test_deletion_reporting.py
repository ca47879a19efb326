"""What a deletion pass reports: counts over several delete batches, the pass limit, and
failures in the queue and the log with the key, the try and the error."""

from __future__ import annotations

import logging

import pytest

from fixtures.faults import FaultyStore, OnlyStore
from fixtures.metadata import pending_deletions
from offloader.exceptions import ObjectStoreError
from offloader.gc.deletion_queue import process_deletions
from offloader.runtime import Runtime

LOGGER = "offloader.gc.deletion_queue"


def test_counts_add_up_over_more_than_one_delete_batch(runtime: Runtime) -> None:
    rt = runtime
    keys = [f"gone/{n:05}" for n in range(rt.objects.capabilities.max_delete_batch + 1)]
    rt.objects.put(keys[-1], b"x")  # the rest are already gone: they count as deleted
    rt.metadata.deletions.enqueue(keys, "test", store_id=rt.stores.default_id())
    result = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (result.deleted, result.failed, result.remaining) == (len(keys), 0, 0)
    assert not rt.objects.exists(keys[-1])


def test_a_pass_takes_at_most_limit_rows(runtime: Runtime) -> None:
    rt = runtime
    rt.metadata.deletions.enqueue(["a", "b", "c"], "test", store_id=rt.stores.default_id())
    result = process_deletions(rt.metadata, rt.stores, rt.settings, limit=2)
    assert (result.deleted, result.failed, result.remaining) == (2, 0, 1)


def test_a_pass_takes_10000_rows_unless_told_otherwise(runtime: Runtime) -> None:
    """The default bound of one pass (the DAG's drain task relies on it)."""
    rt = runtime
    keys = [f"gone/{n:05}" for n in range(10_001)]  # already gone: each counts as deleted
    rt.metadata.deletions.enqueue(keys, "test", store_id=rt.stores.default_id())
    result = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (result.deleted, result.failed, result.remaining) == (10_000, 0, 1)
    assert [d.object_key for d in pending_deletions(rt.metadata)] == [keys[-1]]


def test_a_failed_delete_is_recorded_and_logged_with_key_try_and_error(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    rt.metadata.deletions.enqueue(["k"], "test", store_id=rt.stores.default_id())
    failing = FaultyStore(rt.objects, delete_error=ObjectStoreError("503 SlowDown"))
    assert rt.settings.delete_retry_base_seconds == 0  # no backoff: due again at once
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2):
            process_deletions(rt.metadata, OnlyStore(failing), rt.settings)
    (row,) = pending_deletions(rt.metadata)
    assert row.last_error == "ObjectStoreError: 503 SlowDown"
    messages = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert messages == [
        "delete of k failed (try 1): ObjectStoreError: 503 SlowDown",
        "delete of k failed (try 2): ObjectStoreError: 503 SlowDown",
    ]
