"""Crash safety of scrub's repair of a damaged streaming segment: ``offloader scrub``
killed with SIGKILL while it offloads the segment's first ledger again (intent, objects,
inside the swap's transaction, after it). Right after the kill that ledger is still on
its segments with the dead attempt recorded, or swapped to its own objects; the segment
stays (its other ledgers need it). The next scrub, once the lease ran out, repairs the
rest and releases the segment; a scrub after it finds nothing, reads equal the hot
copies, every ledger has exactly one committed attempt, and GC leaves no orphan."""

from __future__ import annotations

import json
import signal
import time

import pytest

from fixtures.backends import crash_cases, tiered_digests, unaccounted_objects
from fixtures.cli import spawn_cli
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.streamed import (
    flip_a_payload_byte,
    ledgers_by_segment,
    shared_segment,
    streamed_topic,
)
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState, OffloadMode, SegmentState
from offloader.runtime import Runtime

T = "events"
POINTS = ("after-begin-attempt", "after-index-upload", "mid-replacement-commit", "after-commit")
CASES = crash_cases(POINTS)


def scrub(rt: Runtime, failpoints: str = "") -> tuple[int, bytes]:
    proc = spawn_cli(rt.settings, "scrub", "--json", T, failpoints=failpoints)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


@pytest.mark.parametrize(("backend_settings", "point"), CASES, indirect=["backend_settings"])
def test_sigkill_during_a_segment_repair_leaves_a_state_the_next_scrub_resolves(
    runtime: Runtime, point: str
) -> None:
    rt = runtime
    streamed_topic(rt, T, 6)
    hot = tiered_digests(rt, "hot")
    victim = shared_segment(rt, T)
    ids = sorted(ledgers_by_segment(rt, T)[victim.segment_id])
    flip_a_payload_byte(rt, victim)

    code, out = scrub(rt, point)
    assert code == -signal.SIGKILL and out == b"", f"{point} was never reached"
    first = rt.metadata.get_ledger(T, ids[0])
    (dead,) = list_attempts(rt.metadata, T)
    assert dead.ledger_id == ids[0]
    if point == "after-commit":
        assert (
            first.offload_mode is OffloadMode.LEDGER and first.offload_attempt_id == dead.attempt_id
        )
        assert dead.state is AttemptState.COMMITTED
    else:
        assert first.offload_mode is OffloadMode.STREAM and first.attempt_id == dead.attempt_id
        assert dead.state is AttemptState.STARTED and pending_deletions(rt.metadata) == []
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.OFFLOADED
    assert all(rt.metadata.get_ledger(T, n).offload_mode is OffloadMode.STREAM for n in ids[1:])
    assert unaccounted_objects(rt) == set()

    time.sleep(rt.settings.attempt_lease_seconds + 0.2)  # the dead attempt's lease runs out
    code, out = scrub(rt)
    assert code == 0, out
    (verdict,) = json.loads(out)["damaged_ledgers"]
    assert verdict["offload_uuid"] == victim.segment_id and verdict["action"] == "repaired"
    again = "changed" if point == "after-commit" else "repaired"
    assert [(x["ledger_id"], x["action"]) for x in verdict["ledgers"]] == [
        (ids[0], again),
        *((n, "repaired") for n in ids[1:]),
    ]
    if point != "after-commit":
        assert rt.metadata.attempts.get(dead.attempt_id).state is AttemptState.SUPERSEDED
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.DELETED
    for n in ids:
        ledger = rt.metadata.get_ledger(T, n)
        committed = [
            a.attempt_id
            for a in list_attempts(rt.metadata, T, AttemptState.COMMITTED)
            if a.ledger_id == n
        ]
        assert ledger.offload_mode is OffloadMode.LEDGER and committed == [
            ledger.offload_attempt_id
        ]
    assert tiered_digests(rt) == hot
    assert unaccounted_objects(rt) == set()
    code, out = scrub(rt)
    assert code == 0 and json.loads(out)["damaged_ledgers"] == []
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    assert unaccounted_objects(rt) == set()
    assert tiered_digests(rt) == hot
