"""Removing hot copies of offloaded ledgers (invariant 3: mark first, delete second)."""

from __future__ import annotations

from dataclasses import dataclass

from offloader import failpoints
from offloader.exceptions import CommitFailedError
from offloader.hottier import HotLedgerStore
from offloader.metadata import HotState, Ledger, MetadataStore


@dataclass(frozen=True)
class HotDeletion:
    topic: str
    ledger_id: int
    bytes: int


def hot_copies_due(ledgers: list[Ledger], deletion_lag_seconds: float, at_ms: int) -> list[Ledger]:
    """Offloaded ledgers whose lag has passed, plus deletions a crash interrupted."""
    lag_ms = int(deletion_lag_seconds * 1000)
    return [
        ledger
        for ledger in ledgers
        if ledger.is_offloaded
        and (
            ledger.hot_state is HotState.DELETING
            or (
                ledger.hot_state is HotState.PRESENT
                and ledger.offloaded_ms is not None
                and ledger.offloaded_ms + lag_ms <= at_ms
            )
        )
    ]


def delete_hot_copies(
    metadata: MetadataStore, hot: HotLedgerStore, topic: str, *, dry_run: bool = False
) -> list[HotDeletion]:
    """Delete the hot copies that are due; with ``dry_run``, only say which they are.

    The lag is measured on the database's clock, and marking checks it again in SQL, so a
    worker whose clock runs ahead cannot delete a hot copy early (invariants 3 and 6).
    """
    policy = metadata.get_topic(topic).policy
    lag_ms = int(policy.deletion_lag_seconds * 1000)
    due = hot_copies_due(
        metadata.ledgers_with_hot_copy(topic, offloaded=True),
        policy.deletion_lag_seconds,
        metadata.db_now_ms(),
    )
    if dry_run:
        return [HotDeletion(topic, x.ledger_id, x.size_bytes) for x in due]
    done = []
    for ledger in due:
        try:
            if ledger.hot_state is HotState.PRESENT:
                ledger = metadata.mark_hot_deleting(ledger, lag_ms)
                failpoints.reach("after-mark-hot-deleting")
            hot.delete(topic, ledger.ledger_id)
            metadata.mark_hot_deleted(ledger)
        except CommitFailedError:
            continue  # another run is deleting it; it will finish or the next run will
        done.append(HotDeletion(topic, ledger.ledger_id, ledger.size_bytes))
    return done


def retire_empty_ledger(metadata: MetadataStore, hot: HotLedgerStore, ledger: Ledger) -> Ledger:
    """Remove the hot file of a sealed empty ledger: there is nothing to offload or index.

    Mark first, delete second, as for offloaded ledgers; a crash in between leaves the
    ledger ``deleting`` and the next run finishes it. Idempotent.
    """
    if ledger.hot_state is HotState.DELETED:
        return ledger
    try:
        if ledger.hot_state is HotState.PRESENT:
            ledger = metadata.mark_hot_deleting(ledger)
            failpoints.reach("after-mark-hot-deleting")
        hot.delete(ledger.topic, ledger.ledger_id)
        return metadata.mark_hot_deleted(ledger)
    except CommitFailedError:
        # another run is retiring it; it will finish, or the next run will
        return metadata.get_ledger(ledger.topic, ledger.ledger_id)
