"""One offload run as a scheduler sees it: a plan cut into bounded batches, then a summary.

Batches keep a thousand due ledgers from becoming a thousand tasks; each batch belongs to
one topic so a task touches one topic's policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from offloader.metadata import MetadataStore
from offloader.metadata.store import now_ms
from offloader.offload.ledger_offloader import LedgerOffloader, OffloadResult, Outcome
from offloader.offload.planner import due_ledgers
from offloader.runtime import Runtime


@dataclass(frozen=True)
class Batch:
    topic: str
    ledger_ids: list[int]
    bytes: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def validate_run_params(topic: str | None, up_to: int | None, batch_size: int) -> None:
    if topic is not None and not isinstance(topic, str):
        raise TypeError(f"topic must be a string, got {type(topic).__name__}")
    if up_to is not None and (isinstance(up_to, bool) or not isinstance(up_to, int) or up_to < 0):
        raise ValueError(f"up_to_ledger must be a ledger id >= 0 or empty, got {up_to!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def plan_batches(
    metadata: MetadataStore, topic: str | None, up_to: int | None, batch_size: int
) -> list[Batch]:
    """Due ledgers of ``topic`` (or of every topic when None/empty), in batches, oldest first."""
    validate_run_params(topic, up_to, batch_size)
    names = [topic] if topic else [t.name for t in metadata.list_topics()]
    batches = []
    now = now_ms()
    for name in names:
        policy = metadata.get_topic(name).policy  # NotFoundError names a missing topic
        due = due_ledgers(metadata.list_ledgers(name), policy, now, up_to)
        for start in range(0, len(due), batch_size):
            chunk = due[start : start + batch_size]
            batches.append(
                Batch(name, [x.ledger_id for x in chunk], sum(x.size_bytes for x in chunk))
            )
    return batches


def offload_batch(runtime: Runtime, topic: str, ledger_ids: Iterable[int]) -> list[OffloadResult]:
    offloader = LedgerOffloader(runtime)
    return [offloader.offload_ledger(topic, ledger_id) for ledger_id in ledger_ids]


def summarize(results: Iterable[OffloadResult | dict], seconds: float | None = None) -> dict:
    """Counts by outcome, bytes moved and throughput (what the run's summary task returns)."""
    rows = [r if isinstance(r, dict) else asdict(r) for r in results]
    moved = [r for r in rows if r["outcome"] in (Outcome.OFFLOADED, Outcome.RECOVERED)]
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
