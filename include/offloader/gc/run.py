"""A garbage collection run: what `offloader gc` and the `garbage_collection` DAG's drain task
both do, written once.

Rewrites whose lease ran out are failed (their keys queued, their uploads aborted) and
trims cut short are finished first, so their keys join this drain; then the queue is
drained; then the trimmed ledgers whose queued keys are all gone are recorded ``deleted``.
How the queue is drained is the caller's: one bounded pass (:func:`process_deletions`, the
CLI) or passes until a budget is spent (:func:`drain_queue`, the DAG).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from offloader.gc.deletion_queue import DeletionPass, DrainResult, Stores
from offloader.metadata import MetadataStore, Segment
from offloader.objectstore import MultipartUpload
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.runtime import Runtime
from offloader.settings import Settings

log = logging.getLogger(__name__)

#: what the drain step returned
Drained = TypeVar("Drained", DeletionPass, DrainResult)


@dataclass(frozen=True)
class GcRun(Generic[Drained]):
    """What a garbage collection run did: its drain's result, how many trimmed ledgers
    became ``deleted``, and the dead rewrites it recovered (segment ids)."""

    drained: Drained
    ledgers_deleted: int
    rewrites_recovered: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.drained.to_json(),
            "ledgers_deleted": self.ledgers_deleted,
            "rewrites_recovered": self.rewrites_recovered,
        }

    def __str__(self) -> str:
        """The drain's first line with what the run added to it, then the drain's others."""
        first, *more = str(self.drained).split("\n")
        text = f"{first}; {self.ledgers_deleted} trimmed ledgers now deleted"
        if self.rewrites_recovered:
            text += f"; dead rewrites recovered: {', '.join(self.rewrites_recovered)}"
        return "\n".join([text, *more])


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


def recover_stale_rewrites(runtime: Runtime) -> list[Segment]:
    """Fail the rewrites whose lease ran out (their keys queued) and abort their recorded
    uploads; what `offloader gc` and the `garbage_collection` DAG run before draining. An
    upload that cannot be aborted now is left to the orphan sweep."""
    failed = runtime.metadata.rewrites.recover_stale()
    for segment in failed:
        log.warning("rewrite segment %s lost its lease: failed, keys queued", segment.segment_id)
        if segment.upload_id is None:
            continue
        try:
            store = runtime.stores.get(segment.store_id, f"segment {segment.segment_id}")
            store.abort_multipart(MultipartUpload(segment.data_key, segment.upload_id))
        except Exception:
            log.warning("could not abort the upload of %s", segment.segment_id, exc_info=True)
    return failed
