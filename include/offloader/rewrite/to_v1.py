"""Migration back to v1: streamed ledgers rewritten as ledger objects of their own.

A ledger offloaded in mode ``stream`` has its entries in ranges of PIP-76 segments. Each
one goes back through the replacement transition of an offloaded ledger
(``LedgerOffloader.replace_ledger`` with the tier as source): a new attempt's keys and
store recorded against the ledger's version before a byte moves, its entries read from
its segments through their indexes (every chunk's CRC checked) and uploaded as v1 data and
index objects, then one transaction swaps the ledger to mode ``ledger`` on them by CAS and
releases every segment that no ledger needs any more (its keys queued, due after
``replaced_object_grace_seconds``: a reader may be inside). Until that commit the ledger
is read from its segments; a killed migration leaves an attempt that the next run
supersedes once its lease is over (its objects queued), so reruns converge and a run with
nothing left to do changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from offloader.diagnostics import describe_error
from offloader.metadata import Ledger, MetadataStore, OffloadMode
from offloader.offload.ledger_offloader import EntrySource, LedgerOffloader, Outcome
from offloader.runtime import Runtime
from offloader.scrub.targets import check_topics

log = logging.getLogger(__name__)

REASON = "migrated to v1"


class ToV1Outcome(StrEnum):
    MIGRATED = "migrated"  # its own v1 objects now; segments no ledger needs released
    CHANGED = "changed"  # no longer a live stream-mode ledger (trimmed, or moved meanwhile)
    IN_PROGRESS = "in-progress"  # another replacement holds it: run again after its lease
    FAILED = "failed"  # reading or uploading failed; it stays on its segments
    PLANNED = "planned"  # dry run: would be migrated


@dataclass(frozen=True)
class ToV1Result:
    topic: str
    ledger_id: int
    outcome: ToV1Outcome
    bytes: int = 0  # migrated: the v1 data object's length; planned: the payload bytes
    attempt_id: str | None = None  # migrated: the committed attempt
    detail: str = ""  # the replacement's outcome and attempt, or the error

    @property
    def failed(self) -> bool:
        return self.outcome is ToV1Outcome.FAILED


_OUTCOMES = {
    Outcome.REPLACED: ToV1Outcome.MIGRATED,
    Outcome.ALREADY_OFFLOADED: ToV1Outcome.CHANGED,
    Outcome.TRIMMED: ToV1Outcome.CHANGED,
    Outcome.IN_PROGRESS: ToV1Outcome.IN_PROGRESS,
    Outcome.LOST: ToV1Outcome.IN_PROGRESS,  # another attempt took the ledger over
}


def plan_to_v1(
    metadata: MetadataStore,
    topics: Sequence[str] | None,
    first_ledger: int | None = None,
    last_ledger: int | None = None,
) -> list[Ledger]:
    """The live ledgers offloaded in mode ``stream`` of ``topics`` (default: every topic
    not deleted) with ids in ``first_ledger..last_ledger``, by topic, oldest first. A bad
    range, an unknown or a deleted topic is refused (one line) before anything is read."""
    for name, value in (("first_ledger", first_ledger), ("last_ledger", last_ledger)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be a ledger id (>= 0), got {value}")
    if first_ledger is not None and last_ledger is not None and first_ledger > last_ledger:
        raise ValueError(f"first_ledger {first_ledger} is after last_ledger {last_ledger}")
    low, high = first_ledger or 0, last_ledger
    return [
        ledger
        for name in check_topics(metadata, topics)
        for ledger in metadata.list_ledgers(name, live=True)
        if ledger.is_offloaded
        and ledger.offload_mode is OffloadMode.STREAM
        and low <= ledger.ledger_id
        and (high is None or ledger.ledger_id <= high)
    ]


def migrate_to_v1(
    runtime: Runtime,
    topics: Sequence[str] | None,
    first_ledger: int | None = None,
    last_ledger: int | None = None,
    dry_run: bool = False,
) -> list[ToV1Result]:
    """Rewrite every planned ledger (:func:`plan_to_v1`) as v1 objects, one replacement
    each, oldest first; one result per ledger. A ledger that fails is reported and the
    others go on. ``dry_run``: the plan only, nothing written."""
    planned = plan_to_v1(runtime.metadata, topics, first_ledger, last_ledger)
    if dry_run:
        return [
            ToV1Result(x.topic, x.ledger_id, ToV1Outcome.PLANNED, x.size_bytes) for x in planned
        ]
    offloader = LedgerOffloader(runtime)
    return [_migrate(offloader, ledger) for ledger in planned]


def _migrate(offloader: LedgerOffloader, ledger: Ledger) -> ToV1Result:
    topic, ledger_id = ledger.topic, ledger.ledger_id
    try:
        done = offloader.replace_ledger(topic, ledger_id, None, REASON, source=EntrySource.TIER)
    except Exception as err:
        log.error("migration of %s/%s to v1 failed: %s", topic, ledger_id, describe_error(err))
        return ToV1Result(topic, ledger_id, ToV1Outcome.FAILED, detail=describe_error(err))
    outcome = _OUTCOMES[done.outcome]
    log.info("%s/%s to v1: %s (%d bytes)", topic, ledger_id, outcome, done.bytes)
    detail = str(done.outcome) + ("" if done.attempt_id is None else f": {done.attempt_id}")
    attempt = done.attempt_id if outcome is ToV1Outcome.MIGRATED else None
    return ToV1Result(topic, ledger_id, outcome, done.bytes, attempt, detail)
