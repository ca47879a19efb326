"""A garbage collection run: what `offloader gc` and the `garbage_collection` DAG's drain task
both do, written once.

Rewrites whose lease ran out are failed (their keys queued, their uploads aborted) and
trims cut short are finished first, so their keys join this drain; then the queue is
drained; then the trimmed ledgers whose queued keys are all gone are recorded ``deleted``.
How the queue is drained is the caller's: one bounded pass (:func:`process_deletions`, the
CLI) or passes until a budget is spent (:func:`drain_queue`, the DAG).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from offloader.gc.deletion_queue import DeletionPass, DrainResult, Stores
from offloader.metadata import MetadataStore
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.rewrite.run import recover_stale_rewrites
from offloader.runtime import Runtime
from offloader.settings import Settings

#: what the drain step returned
Drained = TypeVar("Drained", DeletionPass, DrainResult)


@dataclass(frozen=True)
class GcRun(Generic[Drained]):
    """What a garbage collection run did: its drain's result, how many trimmed ledgers
    became ``deleted``, and the dead rewrites it recovered (segment ids)."""

    drained: Drained
    ledgers_deleted: int
    rewrites_recovered: list[str]


def collect_garbage(
    rt: Runtime,
    drain: Callable[[MetadataStore, Stores, Settings], Drained],
    *,
    dry_run: bool = False,
) -> GcRun[Drained]:
    """Recover dead rewrites, finish trims cut short, ``drain`` the deletion queue (called
    with the runtime's metadata, stores and settings), then record ``deleted`` the trimmed
    ledgers whose keys are all gone. ``dry_run``: only ``drain`` (a dry drain only counts)."""
    if dry_run:
        return GcRun(drain(rt.metadata, rt.stores, rt.settings), 0, [])
    recovered = [s.segment_id for s in recover_stale_rewrites(rt)]
    finished = finish_deleted_ledgers(rt)
    drained = drain(rt.metadata, rt.stores, rt.settings)
    finished += finish_deleted_ledgers(rt)
    return GcRun(drained, finished, recovered)
