"""The metadata store (the source of truth), its records and migrations."""

from offloader.metadata.clock import now_ms
from offloader.metadata.records import (
    Attempt,
    AttemptState,
    Deletion,
    DeletionBacklog,
    DeletionState,
    HotState,
    Ledger,
    LedgerPieceRecord,
    LedgerState,
    OffloadMode,
    OffloadState,
    Position,
    Segment,
    SegmentPart,
    SegmentState,
    StreamClaim,
    StreamCut,
    Topic,
    TopicState,
)
from offloader.metadata.store import MetadataStore

__all__ = [
    "Attempt",
    "AttemptState",
    "Deletion",
    "DeletionBacklog",
    "DeletionState",
    "HotState",
    "Ledger",
    "LedgerPieceRecord",
    "LedgerState",
    "MetadataStore",
    "OffloadMode",
    "OffloadState",
    "Position",
    "Segment",
    "SegmentPart",
    "SegmentState",
    "StreamClaim",
    "StreamCut",
    "Topic",
    "TopicState",
    "now_ms",
]
