"""Crash safety of scrub's repair: an ``offloader scrub`` process killed with SIGKILL at
every point of the second offload of a damaged ledger (intent, parts, objects, inside the
commit's transaction, after it). Right after the kill the ledger still names exactly one
set of objects (the damaged ones, or the new ones with the damaged ones queued); the next
scrub, once the dead attempt's lease ran out, converges: one committed attempt, reads equal
to the hot copy, every object referenced or queued, and after GC only the committed ones."""

from __future__ import annotations

import json
import signal
import time

import pytest

from fixtures.backends import crash_cases, unaccounted_objects, uploads_not_of_dead_attempts
from fixtures.cli import spawn_cli
from fixtures.inspect import entries_digest
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.scrub import DAMAGES, offloaded_topic
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import Attempt, AttemptState, Ledger
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime

# the replacement's points in order; before the commit's transaction ends, nothing it did
# is visible to a reader
POINTS = (
    "after-begin-attempt",
    "after-first-part",
    "before-complete",
    "after-data-upload",
    "after-index-upload",
    "mid-replacement-commit",
    "after-commit",
)
CASES = crash_cases(POINTS)


def digest(rt: Runtime, ledger: Ledger, source: Source) -> str:
    return entries_digest(TopicReader(rt).read("orders", ledger.ledger_id, source=source))


def attempts_of(rt: Runtime, ledger: Ledger) -> dict[str, Attempt]:
    return {
        a.attempt_id: a
        for a in list_attempts(rt.metadata, "orders")
        if a.ledger_id == ledger.ledger_id
    }


def scrub_json(rt: Runtime) -> dict[str, object]:
    proc = spawn_cli(rt.settings, "scrub", "--json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def check_killed(rt: Runtime, victim: Ledger, point: str) -> Attempt:
    """The state the kill left: the replacement recorded; committed or not, never half."""
    attempts = attempts_of(rt, victim)
    assert victim.offload_attempt_id is not None
    (replacement,) = [a for a in attempts.values() if a.attempt_id != victim.offload_attempt_id]
    ledger = rt.metadata.get_ledger("orders", victim.ledger_id)
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    if point == "after-commit":
        assert ledger.offload_attempt_id == replacement.attempt_id and ledger.attempt_id is None
        assert replacement.state is AttemptState.COMMITTED
        assert attempts[victim.offload_attempt_id].state is AttemptState.SUPERSEDED
        assert queued == {victim.data_key, victim.index_key}
    else:  # the damaged objects are still the ledger's; the replacement is in flight
        assert ledger.is_offloaded and ledger.offload_attempt_id == victim.offload_attempt_id
        assert (ledger.data_key, ledger.index_key) == (victim.data_key, victim.index_key)
        assert ledger.attempt_id == replacement.attempt_id
        assert replacement.state is AttemptState.STARTED
        assert attempts[victim.offload_attempt_id].state is AttemptState.COMMITTED
        assert queued == set()
        index_written = point in ("after-index-upload", "mid-replacement-commit")
        assert rt.objects.exists(replacement.index_key) is index_written
    assert rt.objects.exists(victim.index_key or "") and rt.objects.exists(victim.data_key or "")
    return replacement


@pytest.mark.parametrize(("backend_settings", "point"), CASES, indirect=["backend_settings"])
def test_sigkill_during_a_repair_leaves_a_state_the_next_scrub_resolves(
    runtime: Runtime, point: str
) -> None:
    rt = runtime
    ledgers = offloaded_topic(rt)
    victim = ledgers[0]  # two blocks: uploaded as a multipart object
    hot = digest(rt, victim, Source.HOT)
    DAMAGES["flipped-payload-byte"](rt, victim)
    crashed = spawn_cli(rt.settings, "scrub", "--json", failpoints=point)
    out, _ = crashed.communicate(timeout=300)
    assert crashed.returncode == -signal.SIGKILL, f"{point} was never reached"
    assert out == b""
    replacement = check_killed(rt, victim, point)

    time.sleep(rt.settings.attempt_lease_seconds + 0.2)  # the dead attempt's lease runs out
    report = scrub_json(rt)
    ledger = rt.metadata.get_ledger("orders", victim.ledger_id)
    if point == "after-commit":
        assert report["damaged_ledgers"] == []
        assert ledger.offload_attempt_id == replacement.attempt_id
    else:
        (repaired,) = report["damaged_ledgers"]  # type: ignore[misc]
        assert repaired["action"] == "repaired" and repaired["ledger_id"] == victim.ledger_id
        assert ledger.offload_attempt_id == repaired["replaced_by"] != replacement.attempt_id
        assert rt.metadata.attempts.get(replacement.attempt_id).state is AttemptState.SUPERSEDED
    committed = [a for a in attempts_of(rt, victim).values() if a.state is AttemptState.COMMITTED]
    assert [a.attempt_id for a in committed] == [ledger.offload_attempt_id]  # exactly one
    assert digest(rt, victim, Source.TIERED) == hot
    assert unaccounted_objects(rt) == set()
    assert scrub_json(rt)["damaged_ledgers"] == []
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    kept = {k for x in rt.metadata.list_ledgers("orders") for k in (x.data_key, x.index_key)}
    assert {info.key for info in rt.objects.list()} == kept
    assert uploads_not_of_dead_attempts(rt) == set()  # the rest is the orphan sweep's
