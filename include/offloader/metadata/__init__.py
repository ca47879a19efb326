"""The metadata store (the source of truth), its records and migrations."""

from offloader.metadata.records import (
    Attempt,
    AttemptState,
    Deletion,
    HotState,
    Ledger,
    LedgerState,
    OffloadState,
    Topic,
)
from offloader.metadata.store import MetadataStore, now_ms

__all__ = [
    "Attempt",
    "AttemptState",
    "Deletion",
    "HotState",
    "Ledger",
    "LedgerState",
    "MetadataStore",
    "OffloadState",
    "Topic",
    "now_ms",
]
