"""garbage_collection end to end through Airflow, on both backends (SeaweedFS + PostgreSQL
too): the queue drains, a dry run only reports, deletions that keep failing fail the run
visibly, bad Params are refused before anything changes; the schedule is asset-or-time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fixtures.airflow import DagFile, connection_env, return_value, task_states
from fixtures.inspect import stored_keys, uploads
from fixtures.metadata import pending_deletions
from fixtures.rewrites import T, rewrite, shape, v1_topic
from fixtures.streams import crash_at
from offloader.metadata import SegmentState
from offloader.objectstore.location import FILE, S3, StoreLocation
from offloader.runtime import Runtime

KEYS = [f"gc/{n:03}" for n in range(25)]
SNAPSHOTS = "_metadata/"


@pytest.fixture
def gc_dag() -> DagFile:
    return DagFile("garbage_collection")


def queue_objects(rt: Runtime, written: list[str], missing: list[str]) -> None:
    """Objects that exist and keys that do not (both must leave the queue as deleted)."""
    for key in written:
        rt.objects.put(key, b"x" * 100)
    rt.metadata.deletions.enqueue([*written, *missing], "test", store_id=rt.stores.default_id())


def data_keys(rt: Runtime) -> list[str]:
    """The store's keys without the metadata snapshots every (non-dry) run writes."""
    return sorted(i.key for i in rt.objects.list() if not i.key.startswith(SNAPSHOTS))


def snapshot_count(rt: Runtime) -> int:
    return sum(1 for i in rt.objects.list() if i.key.endswith(".jsonl.gz"))


def test_the_schedule_is_hourly_or_on_the_deletion_queue_asset(gc_dag: DagFile) -> None:
    from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable

    from offloader_airflow.assets import DELETION_QUEUE

    dag = gc_dag.parse()
    schedule = dag.timetable
    assert isinstance(schedule, AssetOrTimeSchedule)
    assert isinstance(schedule.timetable, CronTriggerTimetable)
    assert (schedule.timetable.expression, str(schedule.timetable.timezone)) == ("0 * * * *", "UTC")
    assert schedule.asset_condition == DELETION_QUEUE
    assert (dag.catchup, dag.max_active_runs) == (False, 1)
    assert [t.task_id for t in dag.tasks] == [
        "sweep",
        "drain",
        "export_metadata",
        "summary",
        "check_service_levels",
    ]
    assert [t.task_id for t in dag.get_task("summary").upstream_list] == ["export_metadata"]
    assert [t.task_id for t in dag.get_task("check_service_levels").upstream_list] == ["summary"]
    assert dag.get_task("check_service_levels").trigger_rule == "all_done"
    assert set(dag.params.keys()) == {"max_items", "time_budget_seconds", "dry_run"}
    # scheduled on the deletion queue, it must not update it itself: it would loop
    assert all(DELETION_QUEUE not in task.outlets for task in dag.tasks)


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_a_run_drains_the_queue_and_a_second_changes_nothing(
    runtime: Runtime, gc_dag: DagFile
) -> None:
    queue_objects(runtime, KEYS[:20], KEYS[20:])
    runtime.objects.put("kept", b"y")

    run = gc_dag.test(run_conf={})
    assert str(run.state) == "success", task_states(run)
    drained = return_value(run, "drain")
    assert (drained["deleted"], drained["failed"], drained["stopped"]) == (25, 0, "drained")
    assert drained["delete_requests"] == 1
    summary = return_value(run, "summary")
    assert (summary["backlog"], summary["failing_count"], summary["oldest_age_seconds"]) == (
        0,
        0,
        None,
    )
    # "kept" is an orphan, but younger than the sweep's grace period
    assert return_value(run, "sweep")["orphans"] == 0
    assert data_keys(runtime) == ["kept"]
    assert runtime.metadata.deletions.count_pending() == 0
    assert snapshot_count(runtime) == 1

    again = gc_dag.test(run_conf={})
    assert str(again.state) == "success", task_states(again)
    assert return_value(again, "drain")["deleted"] == 0
    assert data_keys(runtime) == ["kept"]
    assert snapshot_count(runtime) == 2


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_dry_run_only_reports_and_max_items_bounds_a_run(runtime: Runtime, gc_dag: DagFile) -> None:
    queue_objects(runtime, KEYS[:5], [])
    dry = gc_dag.test(run_conf={"dry_run": True})
    assert str(dry.state) == "success", task_states(dry)
    summary = return_value(dry, "summary")
    assert (summary["dry_run"], summary["deleted"], summary["backlog"]) == (True, 0, 5)
    assert summary["oldest_age_seconds"] >= 0
    assert sorted(i.key for i in runtime.objects.list()) == KEYS[:5]  # no snapshot either
    assert return_value(dry, "export_metadata") == {"dry_run": True}

    bounded = gc_dag.test(run_conf={"max_items": 3})
    assert str(bounded.state) == "success", task_states(bounded)
    assert return_value(bounded, "drain")["stopped"] == "max items"
    assert return_value(bounded, "summary")["backlog"] == 2
    assert len(data_keys(runtime)) == 2


@pytest.mark.usefixtures("airflow_db")
def test_deletions_that_keep_failing_fail_the_run_and_stay_queued(
    runtime: Runtime, gc_dag: DagFile, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A key queued for a store that is gone (a deleted directory or bucket) cannot be
    deleted: the sweep skips that store, the rest drains, the key stays queued untried,
    and the summary fails the run naming the store and the way out."""
    for name, value in connection_env(runtime.settings, gc_failing_tries=1).items():
        monkeypatch.setenv(name, value)
    if runtime.settings.resolved_object_store_url.startswith("s3://"):
        gone = StoreLocation(S3, "gc-no-such-bucket", "", runtime.settings.s3_endpoint_url or "")
    else:
        gone = StoreLocation(FILE, str(tmp_path / "gone"))
    gone_id = runtime.metadata.record_location(gone)
    runtime.metadata.deletions.enqueue(["lost/key"], "test", store_id=gone_id)
    queue_objects(runtime, KEYS[:3], [])

    run = gc_dag.test(run_conf={}, retries=False)
    assert str(run.state) == "failed"
    # the sweep and the drain skip the store that is gone and do the rest
    assert task_states(run) == {
        "sweep": ["success"],
        "drain": ["success"],
        "export_metadata": ["success"],
        "summary": ["failed"],
        # it runs after the failure (no level is set: none breached) and fails with it
        "check_service_levels": ["failed"],
    }
    assert data_keys(runtime) == []
    (stuck,) = pending_deletions(runtime.metadata)
    assert (stuck.object_key, stuck.tries) == ("lost/key", 0)
    drained = return_value(run, "drain")
    assert drained["skipped"] == 1 and str(gone) in drained["skipped_stores"][0]
    assert str(gone) in return_value(run, "sweep")["skipped"][0]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"max_items": 0}, "max_items"),
        ({"time_budget_seconds": -5}, "time_budget_seconds"),
        ({"dry_run": "maybe"}, "dry_run"),
        ({"max_items": "lots"}, "max_items"),
    ],
)
@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_bad_params_are_refused_before_anything_changes(
    runtime: Runtime, gc_dag: DagFile, conf: dict, message: str
) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    queue_objects(runtime, KEYS[:2], [])
    with pytest.raises(ParamValidationError, match=message):
        gc_dag.test(run_conf=conf)
    assert sorted(i.key for i in runtime.objects.list()) == KEYS[:2]
    assert [d.tries for d in pending_deletions(runtime.metadata)] == [0, 0]


@pytest.mark.usefixtures("airflow_db", "airflow_connections")
def test_a_run_recovers_a_dead_rewrite_and_deletes_what_it_wrote(
    runtime: Runtime, gc_dag: DagFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rewrite that died after its first part (its lease run out) is cleaned by the GC
    alone: failed, its upload aborted, its keys deleted; its sources are untouched."""
    v1_topic(runtime, 3)
    present = stored_keys(runtime.objects)
    with crash_at(monkeypatch, "rewrite-after-first-part"):
        rewrite(runtime, small_bytes=shape(runtime).target, lease_seconds=2.0)
    (dead,) = runtime.metadata.rewrites.open_rewrites(T)
    while runtime.metadata.db_now_ms() <= (dead.lease_until_ms or 0):
        time.sleep(0.05)

    run = gc_dag.test(run_conf={})
    assert str(run.state) == "success", task_states(run)
    assert return_value(run, "drain")["rewrites_recovered"] == [dead.segment_id]
    assert runtime.metadata.segments.get(dead.segment_id).state is SegmentState.FAILED
    assert uploads(runtime.objects) == set()
    assert {k for k in stored_keys(runtime.objects) if not k.startswith(SNAPSHOTS)} == present
