"""The metadata store (the source of truth), its records and migrations."""

from offloader.metadata.clock import now_ms
from offloader.metadata.records import (
    Attempt,
    AttemptState,
    Deletion,
    DeletionBacklog,
    HotState,
    Ledger,
    LedgerState,
    OffloadState,
    Topic,
)
from offloader.metadata.store import MetadataStore

__all__ = [
    "Attempt",
    "AttemptState",
    "Deletion",
    "DeletionBacklog",
    "HotState",
    "Ledger",
    "LedgerState",
    "MetadataStore",
    "OffloadState",
    "Topic",
    "now_ms",
]
