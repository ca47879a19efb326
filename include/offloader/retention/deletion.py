"""Deleting what a trim left below a topic's start, across both tiers.

Each step is recorded before it acts: ledgers are marked ``deleting`` in one transaction
with their objects queued (invariants 4 and 5) and their hot copies marked (invariant 3);
then the hot files go and are marked gone; the GC drains the queue; then
:func:`finish_deleted_ledgers` records them ``deleted``. Every step selects its rows in SQL
by index (the topic's key range below the start, or the deletion state), in batches of
``trim_batch_ledgers``, and is idempotent, so a run killed anywhere is finished by the next.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from offloader import failpoints
from offloader.metadata import Topic
from offloader.runtime import Runtime


@dataclass
class Marked:
    """What marking and hot deletion did (or, dry, would do)."""

    ledgers_deleting: list[int] = field(default_factory=list)
    queued_keys: int = 0
    hot_deleted: list[int] = field(default_factory=list)


def mark_below_start(rt: Runtime, topic: Topic) -> Marked:
    """Mark every live ledger below the topic's start deleting, a batch per transaction."""
    marked = Marked()
    batch = rt.settings.trim_batch_ledgers
    while True:
        ids, queued = rt.metadata.retention.mark_ledgers_deleting(
            topic.name, topic.start_ledger_id, batch
        )
        if not ids:
            break
        marked.ledgers_deleting += ids
        marked.queued_keys += queued
        if len(ids) == batch:  # more may follow: a crash here leaves the rest unmarked
            failpoints.reach("mid-trim-ledgers")
    if marked.ledgers_deleting:
        failpoints.reach("after-ledger-deleting")
    return marked


def delete_marked_hot_copies(rt: Runtime, topic: str | None = None) -> list[int]:
    """Remove the hot files of deleting ledgers whose hot copy is marked, then record them
    gone (mark first, delete second). The ids of those removed."""
    done: list[int] = []
    batch = rt.settings.trim_batch_ledgers
    while ledgers := rt.metadata.retention.hot_copies_of_deleting(batch, topic):
        by_topic: dict[str, list[int]] = defaultdict(list)
        for ledger in ledgers:
            rt.hot.delete(ledger.topic, ledger.ledger_id)
            failpoints.reach("after-trim-hot-delete")
            by_topic[ledger.topic].append(ledger.ledger_id)
        for name, ids in by_topic.items():
            rt.metadata.retention.mark_hot_copies_deleted(name, ids)
            done += ids
    return done


def finish_deleted_ledgers(rt: Runtime) -> int:
    """Finish every trim cut short, then record ``deleted`` the deleting ledgers whose hot
    copy is gone and whose queued keys are all done. The GC calls this after each pass;
    returns how many ledgers became deleted. A segment released on the way that some of
    its ledgers left for v1 objects of their own waits out the replaced objects' grace."""
    for topic in rt.metadata.retention.topics_with_unmarked_ledgers():
        mark_below_start(rt, topic)
    delete_marked_hot_copies(rt)
    grace_ms = int(rt.settings.replaced_object_grace_seconds * 1000)
    return rt.metadata.retention.finish_deleted_ledgers(grace_ms)
