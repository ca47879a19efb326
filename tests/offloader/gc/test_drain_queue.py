"""drain_queue (the garbage_collection DAG's drain task) in-process: passes back to back
until nothing more is deleted, bounded by items and by time; a dry run only reports."""

from __future__ import annotations

import types

import pytest

from fixtures.faults import FlakyDeletes, OnlyStore
from fixtures.inspect import stored_keys
from fixtures.metadata import pending_deletions
from offloader.gc import deletion_queue
from offloader.gc.deletion_queue import drain_queue
from offloader.runtime import Runtime


def queue(rt: Runtime, count: int) -> list[str]:
    keys = [f"k{n:03d}" for n in range(count)]
    for key in keys:
        rt.objects.put(key, b"x")
    rt.metadata.deletions.enqueue(keys, "test", store_id=rt.stores.default_id())
    return keys


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_items": 0}, "^max_items must be >= 1, got 0$"),
        ({"time_budget_seconds": 0}, "^time_budget_seconds must be > 0, got 0$"),
        ({"time_budget_seconds": -1.5}, r"^time_budget_seconds must be > 0, got -1\.5$"),
    ],
)
def test_bad_bounds_are_refused_and_change_nothing(
    runtime: Runtime, kwargs: dict[str, float], message: str
) -> None:
    keys = queue(runtime, 3)
    with pytest.raises(ValueError, match=message):
        drain_queue(runtime.metadata, runtime.stores, runtime.settings, **kwargs)
    assert stored_keys(runtime.objects) == set(keys)
    assert len(pending_deletions(runtime.metadata)) == 3


def test_a_drain_runs_passes_until_one_deletes_nothing(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deletion_queue, "DEFAULT_PASS_LIMIT", 2)
    settings = runtime.settings.model_copy(update={"gc_batch_keys": 1})
    queue(runtime, 5)
    result = drain_queue(runtime.metadata, runtime.stores, settings)
    # passes of 2, 2, 1, then one that finds nothing due
    assert (result.passes, result.deleted, result.failed) == (4, 5, 0)
    assert result.delete_requests == 5  # one key per request
    assert (result.stopped, result.dry_run) == ("drained", False)
    assert result.backlog.pending == 0 and result.backlog.oldest_enqueued_ms is None
    assert stored_keys(runtime.objects) == set()
    assert result.seconds >= 0


def test_a_drain_stops_at_max_items_and_reports_the_rest(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deletion_queue, "DEFAULT_PASS_LIMIT", 2)
    keys = queue(runtime, 5)
    result = drain_queue(runtime.metadata, runtime.stores, runtime.settings, max_items=3)
    # the second pass takes only what is left of max_items (1, not 2)
    assert (result.passes, result.deleted, result.stopped) == (2, 3, "max items")
    assert result.backlog.pending == 2 and result.backlog.due == 2
    assert stored_keys(runtime.objects) == set(keys[3:])


def test_a_drain_stops_when_its_time_budget_is_spent(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deletion_queue, "DEFAULT_PASS_LIMIT", 1)
    ticks = iter([100.0, 100.0, 100.5, 101.0, 101.0])  # start, pass 1, pass 2, end of budget
    # the module's own clock only: boto3 and the database driver keep the real one
    clock = types.SimpleNamespace(monotonic=lambda: next(ticks))
    monkeypatch.setattr(deletion_queue, "time", clock)
    keys = queue(runtime, 3)
    result = drain_queue(
        runtime.metadata, runtime.stores, runtime.settings, time_budget_seconds=1.0
    )
    assert (result.passes, result.deleted, result.stopped) == (2, 2, "time budget")
    assert result.seconds == 1.0
    assert stored_keys(runtime.objects) == set(keys[2:])


def test_failures_end_the_drain_and_stay_queued(runtime: Runtime) -> None:
    keys = queue(runtime, 2)
    settings = runtime.settings.model_copy(update={"delete_retry_base_seconds": 60.0})
    flaky = FlakyDeletes(runtime.objects, raise_times=1)
    result = drain_queue(runtime.metadata, OnlyStore(flaky), settings)
    assert (result.passes, result.deleted, result.failed) == (1, 0, 2)
    assert result.stopped == "drained"
    assert result.backlog.pending == 2 and result.backlog.due == 0  # backing off
    assert stored_keys(runtime.objects) == set(keys)


def test_failing_items_are_counted_once_they_reach_the_failing_tries(runtime: Runtime) -> None:
    queue(runtime, 1)
    settings = runtime.settings.model_copy(
        update={"gc_failing_tries": 1, "delete_retry_base_seconds": 0.0}
    )
    flaky = FlakyDeletes(runtime.objects, raise_times=1)
    result = drain_queue(runtime.metadata, OnlyStore(flaky), settings)
    assert result.backlog.failing_tries == 1
    assert result.backlog.failing_count == 1
    assert [d.object_key for d in result.backlog.failing] == ["k000"]


def test_a_dry_run_only_reports_the_backlog(runtime: Runtime) -> None:
    keys = queue(runtime, 4)
    result = drain_queue(runtime.metadata, runtime.stores, runtime.settings, dry_run=True)
    assert (result.passes, result.deleted, result.failed, result.delete_requests) == (0, 0, 0, 0)
    assert (result.stopped, result.dry_run) == ("dry run", True)
    assert result.backlog.pending == 4 and result.backlog.due == 4
    assert result.backlog.oldest_enqueued_ms is not None
    assert stored_keys(runtime.objects) == set(keys)


def test_one_item_is_a_valid_bound(runtime: Runtime) -> None:
    keys = queue(runtime, 2)
    result = drain_queue(runtime.metadata, runtime.stores, runtime.settings, max_items=1)
    assert (result.passes, result.deleted, result.stopped) == (1, 1, "max items")
    assert stored_keys(runtime.objects) == set(keys[1:])


def test_failed_items_count_against_max_items_and_each_pass_is_logged(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(deletion_queue, "DEFAULT_PASS_LIMIT", 2)
    keys = queue(runtime, 5)
    settings = runtime.settings.model_copy(update={"delete_retry_base_seconds": 60.0})
    refusing = FlakyDeletes(runtime.objects, refuse=["k001"])
    with caplog.at_level("INFO", logger=deletion_queue.__name__):
        result = drain_queue(runtime.metadata, OnlyStore(refusing), settings, max_items=3)
    # pass 1 takes k000 (deleted) and k001 (refused); pass 2 may take only 3 - 1 - 1 = 1
    assert (result.passes, result.deleted, result.failed) == (2, 2, 1)
    assert result.stopped == "max items"
    assert stored_keys(runtime.objects) == {"k001", *keys[3:]}
    passes = [m for m in caplog.messages if m.startswith("pass ")]
    assert passes == ["pass 1: deleted 1, failed 1", "pass 2: deleted 1, failed 0"]


def test_the_default_time_budget_is_half_an_hour(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = iter([0.0, 1800.0, 1800.0])  # start, the first budget check, the end
    # the module's own clock only: boto3 and the database driver keep the real one
    clock = types.SimpleNamespace(monotonic=lambda: next(ticks))
    monkeypatch.setattr(deletion_queue, "time", clock)
    keys = queue(runtime, 1)
    result = drain_queue(runtime.metadata, runtime.stores, runtime.settings)
    assert (result.passes, result.deleted, result.stopped) == (0, 0, "time budget")
    assert stored_keys(runtime.objects) == set(keys)


def test_the_reported_duration_is_rounded_to_milliseconds(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = iter([100.0, 101.23456])  # start, the end (a dry run checks no budget)
    # the module's own clock only: boto3 and the database driver keep the real one
    clock = types.SimpleNamespace(monotonic=lambda: next(ticks))
    monkeypatch.setattr(deletion_queue, "time", clock)
    result = drain_queue(runtime.metadata, runtime.stores, runtime.settings, dry_run=True)
    assert result.seconds == 1.235
