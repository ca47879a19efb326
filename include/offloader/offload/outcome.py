"""What offloading one ledger came to: shared by the one-ledger path (ledger_offloader.py)
and the batched one (batch.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from offloader.results import fields_json


class Outcome(StrEnum):
    OFFLOADED = "offloaded"
    RECOVERED = "recovered"  # a crashed attempt's complete objects were committed
    ALREADY_OFFLOADED = "already-offloaded"
    IN_PROGRESS = "in-progress"  # another live attempt holds the lease
    LOST = "lost"  # another attempt committed first; ours is queued for deletion
    RETIRED_EMPTY = "retired-empty"  # sealed with no entries: hot file removed, nothing uploaded
    TRIMMED = "trimmed"  # below the topic's start: deleting or deleted, never offloaded
    REPLACED = "replaced"  # offloaded again as its own objects; the old ones are queued


#: the outcomes whose ledger's data this offload moved into the object tier
MOVED = frozenset({Outcome.OFFLOADED, Outcome.RECOVERED})


@dataclass(frozen=True)
class OffloadResult:
    topic: str
    ledger_id: int
    outcome: Outcome
    attempt_id: str | None = None
    bytes: int = 0
    seconds: float = 0.0  # batched: the whole window's time, its ledgers moved together

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        return f"ledger {self.ledger_id}: {self.outcome} ({self.bytes} bytes)"
