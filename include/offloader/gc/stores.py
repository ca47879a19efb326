"""Recorded stores for people: `offloader store list` (what names each store, whether it
answers) and `offloader store retire` (a store that is gone for good: the sweep and the GC
stop visiting it, its queued deletions are dropped). A store that committed data still
names is never retired: its objects are the only copy once the hot one is deleted."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from offloader.exceptions import NotFoundError
from offloader.metadata.locations import StoreUsage
from offloader.results import fields_json
from offloader.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreStatus:
    """A recorded store, what names it, and whether it answered just now (None: retired,
    not asked)."""

    usage: StoreUsage
    reachable: bool | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.usage.model_dump(mode="json"),
            "reachable": self.reachable,
            "error": self.error,
        }

    def __str__(self) -> str:
        u = self.usage
        answer = {None: "retired", True: "reachable", False: "UNREACHABLE"}[self.reachable]
        return (
            f"{u.store_id:>4} {answer:<11} {u.location}  ledgers={u.committed_ledgers} "
            f"segments={u.live_segments} attempts={u.started_attempts} "
            f"queued_deletions={u.queued_deletions}"
        )


def list_stores(rt: Runtime) -> list[StoreStatus]:
    """Every recorded store with its counts; each live one asked once (HeadBucket on S3,
    bounded by the S3 deadlines)."""
    listed = []
    for usage in rt.metadata.store_usage():
        if usage.retired:
            listed.append(StoreStatus(usage, None))
            continue
        try:
            rt.stores.get(usage.store_id, f"store {usage.store_id}").check_available()
        except Exception as exc:
            log.warning("store %s is not reachable: %s", usage.store_id, exc)
            listed.append(StoreStatus(usage, False, str(exc)))
            continue
        listed.append(StoreStatus(usage, True))
    return listed


@dataclass(frozen=True)
class Retired:
    """What `store retire` did."""

    store_id: int
    location: str
    dropped_deletions: int

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        return (
            f"retired store {self.store_id} ({self.location}): dropped "
            f"{self.dropped_deletions} queued deletions; scan and gc no longer visit it"
        )


def retire_store(rt: Runtime, store_id: int, confirm: int | None) -> Retired:
    """Retire ``store_id`` once ``confirm`` repeats it; before that, ValueError saying how
    many queued deletions it would drop. Refused while committed data names the store."""
    usage = {u.store_id: u for u in rt.metadata.store_usage()}.get(store_id)
    if usage is None:
        raise NotFoundError(f"object store {store_id} is not recorded in the metadata")
    if usage.retired:
        raise ValueError(f"object store {store_id} ({usage.location}) is retired already")
    if usage.holds_data:
        rt.metadata.retire_store(store_id)  # raises, naming what still names it
    if confirm != store_id:
        raise ValueError(
            f"retiring object store {store_id} ({usage.location}) drops its "
            f"{usage.queued_deletions} queued deletions: run again with --confirm {store_id}"
        )
    dropped = rt.metadata.retire_store(store_id)
    return Retired(store_id, usage.location, dropped)
