"""Invariant 8 at the console script: a store that stops answering (a black hole on
loopback) or refuses connections (a closed port) fails `offload` in bounded time with one
clear line and changes nothing in the metadata; `scan` and `gc` skip a recorded store that
does not answer, name it, and still sweep and drain the reachable ones."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import SecretStr

from fixtures.blackhole import BlackHole
from fixtures.cli import run_cli
from fixtures.databases import migrated_sqlite_url
from fixtures.seaweedfs_server import SeaweedS3
from offloader.metadata import MetadataStore, schema
from offloader.objectstore.location import StoreLocation
from offloader.settings import Settings

pytestmark = pytest.mark.slow

ACCESS_KEY = "AKIAUNREACHABLETEST1"
SECRET_KEY = "unreachable-test-secret-0a1b2c3d4e"
SMALL = {
    "s3_connect_timeout_seconds": 1.0,
    "s3_read_timeout_seconds": 1.0,
    "s3_operation_deadline_seconds": 2.0,
}
# worst case of one operation (deadline + connect + read) and a margin for a loaded
# machine; measured beyond what a command that touches no store (`status`) takes, so the
# interpreter's start (1 s idle, 7 s at a load of 20 on 2 cores) does not count
BOUND_SECONDS = 2.0 + 1.0 + 1.0 + 4.0


def timed_cli(settings: Settings, *args: str, ok: bool = True) -> tuple[Any, float]:
    """Run the command; its wall time beyond a `status` run's just before it."""
    started = time.monotonic()
    run_cli(settings, "status")
    baseline = time.monotonic() - started
    started = time.monotonic()
    done = run_cli(settings, *args, ok=ok)
    return done, time.monotonic() - started - baseline


def table_counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
                for name, t in schema.metadata.tables.items()
            }
    finally:
        engine.dispose()


def local_settings(tmp_path: Path, **values: Any) -> Settings:
    """A data directory with a migrated SQLite database and a topic of one sealed ledger."""
    data = tmp_path / "data"
    data.mkdir()
    settings = Settings.from_values(
        data_dir=data, metadata_url=migrated_sqlite_url(data), **SMALL, **values
    )
    run_cli(settings, "topic", "create", "orders")
    run_cli(settings, "produce", "orders", "--count", "5", "--size", "100")
    return settings


def s3_at(settings: Settings, endpoint: str) -> Settings:
    return settings.model_copy(
        update={
            "object_store_url": "s3://unreachable-bucket/tier",
            "s3_endpoint_url": endpoint,
            "s3_access_key_id": SecretStr(ACCESS_KEY),
            "s3_secret_access_key": SecretStr(SECRET_KEY),
        }
    )


def assert_one_clear_line(stderr: str, endpoint: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: object store s3://unreachable-bucket/tier at ")
    assert endpoint in lines[0] and "is not reachable" in lines[0]
    assert ACCESS_KEY not in stderr and SECRET_KEY not in stderr


def record_dead_store(settings: Settings, endpoint_url: str) -> tuple[StoreLocation, int]:
    """A recorded store at ``endpoint_url`` (which never answers) with one queued deletion."""
    dead = StoreLocation("s3", "unreachable-bucket", "tier", endpoint_url)
    metadata = MetadataStore.open(settings.resolved_metadata_url)
    try:
        dead_id = metadata.record_location(dead)
        metadata.deletions.enqueue(["dead-key"], "test", store_id=dead_id)
    finally:
        metadata.close()
    return dead, dead_id


def test_offload_to_a_black_hole_fails_in_bounded_time_and_changes_nothing(
    black_hole: BlackHole, tmp_path: Path
) -> None:
    settings = s3_at(local_settings(tmp_path), black_hole.endpoint_url)
    before = table_counts(settings.resolved_metadata_url)
    done, elapsed = timed_cli(settings, "offload", "orders", "--up-to", "100", ok=False)
    assert done.returncode == 2 and done.stdout == ""
    assert elapsed < BOUND_SECONDS, f"{elapsed:.1f} s"
    assert black_hole.accepted >= 1
    assert_one_clear_line(done.stderr, black_hole.endpoint_url)
    assert table_counts(settings.resolved_metadata_url) == before


def test_scan_and_gc_skip_a_recorded_store_that_does_not_answer(
    black_hole: BlackHole, tmp_path: Path
) -> None:
    """The configured store (a directory) is swept and drained; the recorded black hole is
    visited once per command, skipped within the bound, and named; its rows stay queued."""
    settings = local_settings(tmp_path)
    dead, _ = record_dead_store(settings, black_hole.endpoint_url)
    run_cli(settings, "offload", "orders", "--up-to", "100")  # records the default store
    metadata = MetadataStore.open(settings.resolved_metadata_url)
    try:
        (default_id,) = [i for i, loc in metadata.list_locations() if loc != dead]
        metadata.deletions.enqueue(["live-key"], "test", store_id=default_id)
    finally:
        metadata.close()
    for command in ("scan", "gc"):
        done, elapsed = timed_cli(settings, command, "--json")
        assert elapsed < BOUND_SECONDS, f"{command}: {elapsed:.1f} s"
        assert str(dead) in done.stdout and "not reachable" in done.stdout
        assert ACCESS_KEY not in done.stdout + done.stderr
    metadata = MetadataStore.open(settings.resolved_metadata_url)
    try:
        pending = {d.object_key: d for d in metadata.deletions.due(100, 2**62)}
    finally:
        metadata.close()
    assert set(pending) == {"dead-key"}  # the live one drained, the dead one kept
    assert pending["dead-key"].tries == 0 and str(dead) in (pending["dead-key"].last_error or "")
    text = run_cli(settings, "gc").stdout
    assert "skipped 1 (store unreachable)" in text and f"skipped store object store {dead}" in text


@pytest.mark.s3
def test_offload_to_a_closed_port_changes_nothing_and_the_right_settings_then_work(
    closed_port: str, s3_server: SeaweedS3, tmp_path: Path
) -> None:
    """A wrong endpoint records no attempt, no store and no deletion, so `offload`,
    `scan` and `gc` with the right settings afterwards work and visit no dead store."""
    wrong = s3_at(local_settings(tmp_path), closed_port)
    before = table_counts(wrong.resolved_metadata_url)
    done, elapsed = timed_cli(wrong, "offload", "orders", "--up-to", "100", ok=False)
    assert elapsed < BOUND_SECONDS
    assert done.returncode == 2
    assert_one_clear_line(done.stderr, closed_port)
    assert table_counts(wrong.resolved_metadata_url) == before
    right = s3_server.make_settings(
        "right",
        data_dir=wrong.data_dir,
        metadata_url=wrong.resolved_metadata_url,
        **SMALL,
    )
    assert "offloaded" in run_cli(right, "offload", "orders", "--up-to", "100").stdout.lower()
    for command in ("scan", "gc"):
        done = run_cli(right, command)
        assert "not reachable" not in done.stdout and "skipped" not in done.stdout.lower()
    metadata = MetadataStore.open(right.resolved_metadata_url)
    try:
        assert [loc.endpoint for _, loc in metadata.list_locations()] == [s3_server.endpoint_url]
    finally:
        metadata.close()


def test_store_list_names_the_dead_store_and_retire_stops_the_visits(
    black_hole: BlackHole, tmp_path: Path
) -> None:
    """`store list` says which store does not answer and what names each; `store retire`
    refuses a store committed data names, says how many queued deletions it would drop,
    then retires the dead one: scan and gc no longer visit it."""
    settings = local_settings(tmp_path)
    dead, dead_id = record_dead_store(settings, black_hole.endpoint_url)
    run_cli(settings, "offload", "orders", "--up-to", "100")
    done, elapsed = timed_cli(settings, "store", "list", "--json")
    assert elapsed < BOUND_SECONDS
    listed = {s["store_id"]: s for s in json.loads(done.stdout)}
    (live_id,) = set(listed) - {dead_id}
    assert (listed[live_id]["reachable"], listed[live_id]["committed_ledgers"]) == (True, 1)
    assert (listed[dead_id]["reachable"], listed[dead_id]["queued_deletions"]) == (False, 1)
    assert listed[dead_id]["location"] == str(dead)
    assert ACCESS_KEY not in done.stdout + done.stderr

    refused = run_cli(
        settings, "store", "retire", str(live_id), "--confirm", str(live_id), ok=False
    )
    assert refused.returncode == 2 and "still holds data: 1 committed ledgers" in refused.stderr
    asked = run_cli(settings, "store", "retire", str(dead_id), ok=False)
    assert asked.returncode == 2
    assert asked.stderr.strip() == (
        f"error: retiring object store {dead_id} ({dead}) drops its 1 queued deletions: "
        f"run again with --confirm {dead_id}"
    )
    before = table_counts(settings.resolved_metadata_url)
    wrong = run_cli(settings, "store", "retire", str(dead_id), "--confirm", "999", ok=False)
    assert wrong.returncode == 2
    assert table_counts(settings.resolved_metadata_url) == before

    retired = run_cli(settings, "store", "retire", str(dead_id), "--confirm", str(dead_id))
    assert retired.stdout.startswith(f"retired store {dead_id} ({dead}): dropped 1 ")
    accepted = black_hole.accepted
    for command in ("scan", "gc"):
        done = run_cli(settings, command)
        assert str(dead) not in done.stdout and "skipped" not in done.stdout.lower()
    assert black_hole.accepted == accepted  # not visited
    text = run_cli(settings, "store", "list").stdout
    assert f"{dead_id} retired" in " ".join(text.split())


def test_a_killed_offload_leaves_a_lease_the_next_run_does_not_wait_on(tmp_path: Path) -> None:
    """Killed after recording its attempt (SIGKILL at `after-begin-attempt`): the ledger is
    `offloading`; the next run within the lease reports it `in-progress` at once, with no
    wait on the dead attempt. (Taking over once the lease has run out: the crash tests in
    tests/offloader/offload.)"""
    settings = local_settings(tmp_path, attempt_lease_seconds=120.0)
    killed = run_cli(
        settings, "offload", "orders", "--up-to", "100", failpoints="after-begin-attempt", ok=False
    )
    assert killed.returncode == -9
    done, elapsed = timed_cli(settings, "offload", "orders", "--up-to", "100", "--json")
    assert elapsed < BOUND_SECONDS
    (result,) = json.loads(done.stdout)["results"]
    assert result["outcome"] == "in-progress"
    metadata = MetadataStore.open(settings.resolved_metadata_url)
    try:
        (ledger,) = metadata.list_ledgers("orders")
        assert ledger.offload_state == "offloading"
    finally:
        metadata.close()
