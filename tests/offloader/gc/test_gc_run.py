"""collect_garbage, the sequence `offloader gc` and the garbage_collection DAG's drain task
both run, in-process on both backends: trimmed ledgers become ``deleted`` once their keys
are gone, whichever drain; a dry run only drains (dry) and changes nothing."""

from __future__ import annotations

from functools import partial
from typing import Any

from fixtures.metadata import pending_deletions
from fixtures.retention import mixed_topic
from offloader.gc.deletion_queue import drain_queue, process_deletions
from offloader.gc.run import collect_garbage
from offloader.metadata import DeletionState, Position
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime


def trimmed(rt: Runtime) -> list[int]:
    """'orders' trimmed below its fourth ledger: three ledgers deleting, six keys queued."""
    ids = mixed_topic(rt)
    trim_topic(rt, "orders", Position(ledger_id=ids[3], entry_id=0))
    return ids


def states(rt: Runtime, ids: list[int]) -> list[DeletionState]:
    return [rt.metadata.get_ledger("orders", i).deletion_state for i in ids]


def test_one_pass_finishes_the_trimmed_ledgers_its_drain_emptied(runtime: Runtime) -> None:
    ids = trimmed(runtime)
    run = collect_garbage(runtime, partial(process_deletions, limit=10))
    assert (run.drained.deleted, run.drained.failed, run.drained.remaining) == (6, 0, 0)
    assert (run.ledgers_deleted, run.rewrites_recovered) == (3, [])
    assert states(runtime, ids) == [DeletionState.DELETED] * 3 + [DeletionState.NONE] * 3
    again = collect_garbage(runtime, process_deletions)
    assert (again.drained.deleted, again.ledgers_deleted) == (0, 0)


def test_a_bounded_drain_and_a_dry_run(runtime: Runtime) -> None:
    ids = trimmed(runtime)
    before = pending_deletions(runtime.metadata)
    dry = collect_garbage(runtime, partial(drain_queue, dry_run=True), dry_run=True)
    assert (dry.drained.stopped, dry.drained.backlog.pending) == ("dry run", 6)
    assert (dry.ledgers_deleted, dry.rewrites_recovered) == (0, [])
    assert pending_deletions(runtime.metadata) == before
    assert states(runtime, ids[:3]) == [DeletionState.DELETING] * 3

    run = collect_garbage(runtime, partial(drain_queue, max_items=100))
    assert (run.drained.deleted, run.drained.stopped, run.ledgers_deleted) == (6, "drained", 3)
    assert states(runtime, ids[:3]) == [DeletionState.DELETED] * 3


def test_a_dry_run_hands_the_drain_the_runtime_s_metadata_stores_and_settings(
    runtime: Runtime,
) -> None:
    trimmed(runtime)
    seen: list[tuple[Any, ...]] = []

    def drain(*args: Any) -> Any:
        seen.append(args)
        return drain_queue(*args, dry_run=True)

    collect_garbage(runtime, drain, dry_run=True)
    assert len(seen) == 1
    metadata, stores, settings = seen[0]
    assert (metadata, stores, settings) == (runtime.metadata, runtime.stores, runtime.settings)


def test_a_run_counts_the_ledgers_it_finishes_before_its_drain(runtime: Runtime) -> None:
    """The trim's keys are all gone (a bare drain) before the run: its drain has nothing
    left, and the three ledgers it records deleted before draining still count."""
    ids = trimmed(runtime)
    process_deletions(runtime.metadata, runtime.stores, runtime.settings, limit=10)
    assert states(runtime, ids[:3]) == [DeletionState.DELETING] * 3

    run = collect_garbage(runtime, partial(process_deletions, limit=10))
    assert (run.drained.deleted, run.ledgers_deleted) == (0, 3)
    assert states(runtime, ids) == [DeletionState.DELETED] * 3 + [DeletionState.NONE] * 3
