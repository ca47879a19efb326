"""Crash safety of the migration back to v1: a process running ``migrate_to_v1`` killed
with SIGKILL at every point of its first ledger's replacement (intent, objects, inside the
swap's transaction, after it). Right after the kill the ledger is either still streamed
(on its segments, with the dead attempt recorded) or swapped (its own objects, the
segments no ledger needs released): never half, and reads return the same bytes. The next
run, once the dead attempt's lease ran out, converges: every ledger v1 with exactly one
committed attempt, every segment released, and after GC only the v1 objects are left."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from fixtures.backends import crash_cases, unaccounted_objects
from fixtures.cli import child_env
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.streamed import SWAP_POINTS, ledgers_by_segment, streamed_topic
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState, OffloadMode, SegmentState
from offloader.read.topic_reader import Source, TopicReader
from offloader.rewrite.to_v1 import ToV1Outcome, migrate_to_v1
from offloader.runtime import Runtime

T = "s"
CASES = crash_cases(SWAP_POINTS)
CHILD = (
    "import sys; from offloader.runtime import Runtime; "
    "from offloader.rewrite.to_v1 import migrate_to_v1; "
    "migrate_to_v1(Runtime.open(), sys.argv[1:])"
)


def migrate_in_a_child(rt: Runtime, point: str) -> None:
    env = child_env(rt.settings, failpoints=point)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, T], env=env, capture_output=True, timeout=300
    )
    assert child.returncode == -signal.SIGKILL, f"{point} was never reached: {child.stderr!r}"


@pytest.mark.parametrize(("backend_settings", "point"), CASES, indirect=["backend_settings"])
def test_sigkill_during_a_migration_leaves_a_state_the_next_run_converges(
    runtime: Runtime, point: str
) -> None:
    rt = runtime
    ids = streamed_topic(rt, T, 4)
    digest = TopicReader(rt).checksum(T, Source.TIERED)
    held = ledgers_by_segment(rt, T)
    migrate_in_a_child(rt, point)

    first = rt.metadata.get_ledger(T, ids[0])
    (dead,) = list_attempts(rt.metadata, T)
    assert dead.ledger_id == ids[0]
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    states = {s.segment_id: s.state for s in rt.metadata.segments.of_topic(T)}
    if point == "after-commit":  # swapped, with what only it needed released
        assert first.offload_mode is OffloadMode.LEDGER and first.attempt_id is None
        assert (first.offload_attempt_id, first.data_key) == (dead.attempt_id, dead.data_key)
        assert dead.state is AttemptState.COMMITTED
        gone = {s for s, ledger_ids in held.items() if ledger_ids == {ids[0]}}
        assert {s for s, state in states.items() if state is SegmentState.DELETED} == gone
        assert queued == {
            k
            for s in rt.metadata.segments.of_topic(T)
            if s.segment_id in gone
            for k in (s.data_key, s.index_key)
        }
    else:  # still on its segments, the attempt recorded and in flight
        assert first.is_offloaded and first.offload_mode is OffloadMode.STREAM
        assert first.attempt_id == dead.attempt_id and dead.state is AttemptState.STARTED
        assert set(states.values()) == {SegmentState.OFFLOADED} and queued == set()
        written = point in ("after-index-upload", "mid-replacement-commit")
        assert rt.objects.exists(dead.index_key) is written
    assert all(rt.metadata.get_ledger(T, n).offload_mode is OffloadMode.STREAM for n in ids[1:])
    assert TopicReader(rt).checksum(T, Source.TIERED) == digest
    assert unaccounted_objects(rt) == set()

    time.sleep(rt.settings.attempt_lease_seconds + 0.2)  # the dead attempt's lease runs out
    results = migrate_to_v1(rt, [T])
    rest = ids[1:] if point == "after-commit" else ids
    assert [(r.ledger_id, r.outcome) for r in results] == [(n, ToV1Outcome.MIGRATED) for n in rest]
    if point != "after-commit":
        assert rt.metadata.attempts.get(dead.attempt_id).state is AttemptState.SUPERSEDED
    for n in ids:
        ledger = rt.metadata.get_ledger(T, n)
        assert ledger.offload_mode is OffloadMode.LEDGER
        committed = [
            a.attempt_id
            for a in list_attempts(rt.metadata, T, AttemptState.COMMITTED)
            if a.ledger_id == n
        ]
        assert committed == [ledger.offload_attempt_id]  # exactly one
    assert {s.state for s in rt.metadata.segments.of_topic(T)} == {SegmentState.DELETED}
    assert TopicReader(rt).checksum(T, Source.TIERED) == digest
    assert unaccounted_objects(rt) == set()
    assert migrate_to_v1(rt, [T]) == []
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    kept = {k for x in rt.metadata.list_ledgers(T) for k in (x.data_key, x.index_key)}
    assert {info.key for info in rt.objects.list()} == kept
    assert TopicReader(rt).checksum(T, Source.TIERED) == digest
