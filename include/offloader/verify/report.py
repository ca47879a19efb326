"""What `offloader verify` found: one :class:`Breach` per broken promise, and the counts of
what it looked at (docs/OPERATIONS.md, "After an incident: verify").

The kinds and the JSON shape are a contract: the crash tests and the chaos soak read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from offloader.results import BreachReport, fields_json


class BreachKind(StrEnum):
    """Which promise a breach broke."""

    MISSING_OBJECT = "missing_object"  # a recorded object is not in its store
    SIZE_MISMATCH = "size_mismatch"  # ... or not of its recorded size
    ORPHAN = "orphan"  # an offloader-shaped object no row ever recorded (invariant 1)
    DOUBLE_COMMIT = "double_commit"  # a ledger with two committed offloads (invariant 2)
    UNREADABLE = "unreadable"  # entries at or above the start readable from no tier
    CORRUPT = "corrupt"  # --deep: a block or index fails its checks
    READABLE_BELOW_START = "readable_below_start"  # trimmed data still readable (invariant 4)
    QUEUED_BUT_REFERENCED = "queued_but_referenced"  # a queued deletion of a live object
    STORE_UNAVAILABLE = "store_unavailable"  # a recorded store could not be opened or listed


@dataclass(frozen=True)
class Breach:
    """One broken promise: its kind, one line for people, and where (topic, key, ...)."""

    kind: BreachKind
    message: str
    topic: str | None = None
    key: str | None = None
    ledger_id: int | None = None
    segment_id: str | None = None
    store: str | None = None  # the store's location (never a credential)

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        return f"{self.kind}: {' '.join(self.message.split())}"  # always one line


@dataclass
class VerifyCounts:
    """What verify looked at."""

    stores: int = 0  # recorded stores listed
    ledgers: int = 0  # live ledgers judged readable or not
    segments: int = 0  # offloaded segments
    objects_listed: int = 0
    referenced: int = 0  # listed objects a row references (or a kept snapshot)
    awaiting_sweep: int = 0  # keys of failed/superseded attempts or dead segments: queued once
    foreign: int = 0  # not an offloader key shape: left alone
    stale_uploads: int = 0  # multipart uploads the sweep would abort
    unreleased_below_start: int = 0  # ledgers below a start an unfinished trim left: gc's
    blocks_read: int = 0  # --deep
    entries_checked: int = 0  # entries at or above a start found readable


@dataclass
class VerifyReport(BreachReport):
    """`offloader verify`: ok when no promise is broken; exit status 1 otherwise."""

    deep: bool
    topics: list[str]
    breaches: list[Breach] = field(default_factory=list)
    counts: VerifyCounts = field(default_factory=VerifyCounts)

    def add(self, kind: BreachKind, message: str, **where: Any) -> None:
        self.breaches.append(Breach(kind, message, **where))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "deep": self.deep,
            "topics": list(self.topics),
            "breaches": [b.to_json() for b in self.breaches],
            "counts": fields_json(self.counts),
        }

    def __str__(self) -> str:
        """One line per breach; when there is none, one line that says what was checked."""
        if self.breaches:
            return "\n".join(str(b) for b in self.breaches)
        c = self.counts
        deep = f", {c.blocks_read} blocks read" if self.deep else ""
        return (
            f"ok: {len(self.topics)} topic(s), {c.ledgers} ledgers, {c.segments} segments, "
            f"{c.entries_checked} entries readable, {c.objects_listed} objects listed in "
            f"{c.stores} store(s) ({c.awaiting_sweep} awaiting the sweep, {c.foreign} foreign, "
            f"{c.stale_uploads} stale uploads){deep}"
        )
