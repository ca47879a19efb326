"""One offload run as a scheduler sees it: a plan cut into bounded batches, then a summary.

Batches keep a thousand due ledgers from becoming a thousand tasks; each batch belongs to
one topic so a task touches one topic's policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from offloader.metadata import MetadataStore
from offloader.objectstore.location import StoreLocation
from offloader.offload.batch import DEFAULT_WINDOW, BatchOffloader
from offloader.offload.hot_deletion import HotDeletion
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult
from offloader.offload.outcome import MOVED
from offloader.offload.params import OffloadRunParams
from offloader.offload.planner import CreationWindow, due_ledgers
from offloader.results import fields_json, jsonable
from offloader.runtime import Runtime


@dataclass(frozen=True)
class Batch:
    """One task's share of a plan: ledgers of one topic (a plain dict for XCom)."""

    topic: str
    ledger_ids: list[int]
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        return f"{self.topic}: ledgers {self.ledger_ids} ({self.bytes} bytes)"


@dataclass(frozen=True)
class TopicOffloadResult:
    """`offloader offload`: a topic's due ledgers offloaded, then its hot copies past their
    deletion lag, in ``seconds``."""

    topic: str
    results: list[OffloadResult]
    hot_deleted: list[HotDeletion]
    seconds: float

    @property
    def bytes(self) -> int:
        return sum(r.bytes for r in self.results)

    def to_json(self) -> dict[str, Any]:
        moved, seconds = self.bytes, self.seconds
        return {
            "topic": self.topic,
            "results": jsonable(self.results),
            "hot_deleted": jsonable(self.hot_deleted),
            "bytes": moved,
            "seconds": round(seconds, 3),
            "mb_per_second": round(moved / 1e6 / seconds, 2) if seconds > 0 else None,
        }

    def __str__(self) -> str:
        lines = [str(r) for r in self.results]
        lines.append(f"hot copies deleted: {[h.ledger_id for h in self.hot_deleted]}")
        return "\n".join(lines)


def plan_batches(
    metadata: MetadataStore,
    topic: str | None,
    up_to: int | None,
    batch_size: int,
    batch_bytes: int | None = None,
    window: CreationWindow | None = None,
) -> list[Batch]:
    """Due ledgers of ``topic`` (or of every topic when None/empty), in batches, oldest first.

    A batch closes at ``batch_size`` ledgers or before it would pass ``batch_bytes``, so
    many small ledgers share a task while large ones get a task each. ``window`` plans the
    ledgers created inside it whatever the policy (a backfill of a past period), reading
    only those from the database. The arguments are checked by :class:`OffloadRunParams`
    (RunParamsError) before anything is read.
    """
    params = OffloadRunParams.parse(
        {
            "topic": topic,
            "up_to_ledger": up_to,
            "batch_size": batch_size,
            "batch_bytes": batch_bytes,
        }
    )
    topic, up_to, batch_size, batch_bytes = (
        params.topic,
        params.up_to_ledger,
        params.batch_size,
        params.batch_bytes,
    )
    if window is not None and not isinstance(window, CreationWindow):
        raise TypeError(f"window must be a CreationWindow, got {window!r}")
    created = (window.start_ms, window.end_ms) if window is not None else None
    names = [topic] if topic else [t.name for t in metadata.list_topics()]
    batches = []
    now = metadata.db_now_ms()  # ages are measured on the database's clock
    for name in names:
        policy = metadata.get_topic(name).policy  # NotFoundError names a missing topic
        current: list[int] = []
        size = 0
        hot = metadata.ledgers_with_hot_copy(name, offloaded=False, created=created)
        for ledger in due_ledgers(hot, policy, now, up_to, window):
            too_big = batch_bytes is not None and size + ledger.size_bytes > batch_bytes
            if current and (len(current) >= batch_size or too_big):
                batches.append(Batch(name, current, size))
                current, size = [], 0
            current.append(ledger.ledger_id)
            size += ledger.size_bytes
        if current:
            batches.append(Batch(name, current, size))
    return batches


def offload_batch(
    runtime: Runtime, topic: str, ledger_ids: Iterable[int], window: int = DEFAULT_WINDOW
) -> list[OffloadResult]:
    """One task's batch: ``window`` ledgers in flight at a time, metadata work batched."""
    return BatchOffloader(LedgerOffloader(runtime), window).offload(topic, ledger_ids)


def stores_written(
    metadata: MetadataStore, results: Iterable[OffloadResult]
) -> list[StoreLocation]:
    """Where the ledgers ``results`` moved went (their committed offloads' stores, a
    recovered attempt's too), by URL; none when nothing moved."""
    moved: dict[str, list[int]] = {}
    for r in results:
        if r.outcome in MOVED:
            moved.setdefault(r.topic, []).append(r.ledger_id)
    store_ids = [
        ledger.store_id
        for topic, ids in moved.items()
        for ledger in metadata.get_ledgers(topic, ids).values()
        if ledger.store_id is not None
    ]
    return metadata.get_locations(store_ids)


def summarize(results: Iterable[OffloadResult | dict], seconds: float | None = None) -> dict:
    """Counts by outcome, bytes moved and throughput (what the run's summary task returns)."""
    rows = [r if isinstance(r, dict) else r.to_json() for r in results]
    moved = [r for r in rows if r["outcome"] in MOVED]
    total = sum(r["bytes"] for r in moved)
    upload_seconds = sum(r["seconds"] for r in moved)
    outcomes: dict[str, int] = {}
    for r in rows:
        outcomes[str(r["outcome"])] = outcomes.get(str(r["outcome"]), 0) + 1
    elapsed = seconds if seconds is not None else upload_seconds
    return {
        "ledgers": len(rows),
        "offloaded": len(moved),
        "outcomes": outcomes,
        "bytes": total,
        "seconds": round(elapsed, 3),
        "mb_per_second": round(total / 1e6 / elapsed, 2) if elapsed > 0 else None,
    }
