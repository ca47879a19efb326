"""Immutable views of metadata rows, handed out by the store and passed back for CAS."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from offloader.policy import OffloadPolicy


class LedgerState(StrEnum):
    OPEN = "open"
    SEALED = "sealed"


class OffloadState(StrEnum):
    NONE = "none"
    OFFLOADING = "offloading"
    OFFLOADED = "offloaded"


class HotState(StrEnum):
    PRESENT = "present"
    DELETING = "deleting"  # marked: the hot copy may be partly gone
    DELETED = "deleted"


class DeletionState(StrEnum):
    """A ledger's life after retention (KIP-405's DELETE_SEGMENT_STARTED / FINISHED)."""

    NONE = "none"  # live (at or above the topic's start)
    DELETING = "deleting"  # below the start: hot copy and objects on their way out
    DELETED = "deleted"  # hot copy gone and every queued key of it deleted; the row stays


class OffloadMode(StrEnum):
    """How an offloaded ledger's entries are laid out in the object store."""

    LEDGER = "ledger"  # its own v1 data and index objects (PIP-17)
    # ranges of offloaded segments (see segment_ledgers), whoever wrote them: the stream
    # (PIP-76) or a rewrite (compaction, v1 -> v2 migration)
    STREAM = "stream"


class SegmentState(StrEnum):
    """A streaming segment's life: Assigned -> Closing -> Offloaded, or Failed.

    Closing freezes the recorded parts: whoever holds the stream completes exactly those,
    so a pass fenced mid-close leaves nothing for its successor to guess."""

    ASSIGNED = "assigned"  # keys recorded; parts are uploaded and recorded pass by pass
    CLOSING = "closing"  # no more parts: complete the upload, write the index, commit
    OFFLOADED = "offloaded"
    FAILED = "failed"  # its upload cannot be completed; replaced by a new segment
    REPLACED = "replaced"  # a failed segment after its replacement was assigned
    DELETED = "deleted"  # retention: every ledger it holds was deleted; keys queued


class SegmentOrigin(StrEnum):
    """Who writes a segment: the topic's stream, or a rewrite run (compaction, migration)."""

    STREAM = "stream"  # fenced by the stream's epoch; the stream continues after it
    REWRITE = "rewrite"  # fenced by its own lease; never the stream's open segment


class TopicState(StrEnum):
    ACTIVE = "active"
    DELETED = "deleted"  # `offloader topic delete`: writer fenced, every ledger deleting


class AttemptState(StrEnum):
    STARTED = "started"
    COMMITTED = "committed"
    SUPERSEDED = "superseded"  # its lease ran out and another attempt took over
    FAILED = "failed"  # failed or lost the commit; its objects are queued for deletion


class Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class Position(Record):
    """A position in a topic: entry ``entry_id`` of ledger ``ledger_id``. Ordered as the
    log is: by ledger, then entry. Text form ``L:E``."""

    ledger_id: int = Field(ge=0)
    entry_id: int = Field(ge=0)

    @classmethod
    def parse(cls, text: str) -> Position:
        """``"L:E"`` -> Position; ValueError naming the text otherwise."""
        ledger, sep, entry = text.strip().partition(":")
        try:
            if not sep:
                raise ValueError(text)
            return cls(ledger_id=int(ledger), entry_id=int(entry))
        except ValueError:
            raise ValueError(
                f"position {text!r}: expected LEDGER:ENTRY, two integers >= 0 (e.g. 12:0)"
            ) from None

    def key(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)

    def __lt__(self, other: Position) -> bool:
        return self.key() < other.key()

    def __le__(self, other: Position) -> bool:
        return self.key() <= other.key()

    def __gt__(self, other: Position) -> bool:
        return self.key() > other.key()

    def __ge__(self, other: Position) -> bool:
        return self.key() >= other.key()

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


class Topic(Record):
    name: str
    version: int
    policy: OffloadPolicy
    created_ms: int
    next_ledger_id: int
    writer_epoch: int
    # the first readable position: everything below was trimmed (invariant 4)
    start_ledger_id: int = 0
    start_entry_id: int = 0
    state: TopicState = TopicState.ACTIVE
    deleted_ms: int | None = None

    @property
    def start(self) -> Position:
        return Position(ledger_id=self.start_ledger_id, entry_id=self.start_entry_id)

    @property
    def is_deleted(self) -> bool:
        return self.state is TopicState.DELETED


class Ledger(Record):
    # the committed attempt's id is offload_attempt_id here, the column (and every output:
    # ``ledger list --json``, snapshots) keeps its name offload_uuid
    model_config = ConfigDict(
        frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    topic: str
    ledger_id: int
    version: int
    state: LedgerState
    entry_count: int
    size_bytes: int
    created_ms: int
    sealed_ms: int | None
    offload_state: OffloadState
    offload_epoch: int
    attempt_id: str | None
    attempt_lease_ms: int | None
    offload_attempt_id: str | None = Field(alias="offload_uuid")  # the committed attempt
    data_key: str | None
    index_key: str | None
    data_len: int | None
    offloaded_ms: int | None
    hot_state: HotState
    hot_deleted_ms: int | None
    store_id: int | None  # where the committed offload went (invariant 7)
    deletion_state: DeletionState = DeletionState.NONE
    deleting_ms: int | None = None  # when retention marked it (the intent)
    deleted_ms: int | None = None
    offload_mode: OffloadMode = OffloadMode.LEDGER

    @property
    def is_live(self) -> bool:
        """Not trimmed: neither deleting nor deleted."""
        return self.deletion_state is DeletionState.NONE

    @property
    def is_offloaded(self) -> bool:
        return self.offload_state is OffloadState.OFFLOADED

    @property
    def has_hot_copy(self) -> bool:
        return self.hot_state is HotState.PRESENT


class Attempt(Record):
    attempt_id: str
    topic: str
    ledger_id: int
    epoch: int
    data_key: str
    index_key: str
    state: AttemptState
    owner: str
    created_ms: int
    finished_ms: int | None
    detail: str | None
    store_id: int | None  # None only before ``offloader db upgrade`` of a 0001 database


class Deletion(Record):
    id: int
    object_key: str
    reason: str
    attempt_id: str | None
    state: str
    enqueued_ms: int
    tries: int
    next_try_ms: int
    last_error: str | None
    done_ms: int | None
    store_id: int | None  # the store the key lives in
    # the ledger whose deletion waits for this key (retention); None for attempts' leftovers
    topic: str | None = None
    ledger_id: int | None = None


class StreamCut(Record):
    """A position of a topic taken at ``created_ms`` (database clock), with the topic's
    bytes from its first ever entry up to (excluding) the position (PDP-19)."""

    topic: str
    cut_id: int
    ledger_id: int
    entry_id: int
    created_ms: int
    offset_bytes: int

    @property
    def position(self) -> Position:
        return Position(ledger_id=self.ledger_id, entry_id=self.entry_id)


class DeletionBacklog(Record):
    """What the deletion queue still holds (invariant 5: bounded and visible).

    Counts are SQL COUNTs over pending rows; ``oldest_age_ms`` is measured on the database's
    clock. ``failing`` lists at most a few items that failed ``failing_tries`` times or more,
    most tried first, each with its last error; ``failing_count`` counts all of them.
    """

    pending: int
    due: int
    oldest_enqueued_ms: int | None
    oldest_age_ms: int | None
    failing_tries: int
    failing_count: int
    failing: list[Deletion]


class TopicTiers(Record):
    """One topic's tiers now. Ledgers deleted by retention count nowhere; a ledger whose hot
    copy is being deleted still counts as hot (its files may still be there)."""

    topic: str
    state: str
    hot_ledgers: int
    hot_bytes: int
    offloaded_ledgers: int
    offloaded_bytes: int
    pending_deletions: int
    oldest_pending_deletion_ms: int | None


class StreamClaim(Record):
    """A pass's hold on a topic's stream: every commit it makes checks ``epoch``."""

    topic: str
    epoch: int
    owner: str
    lease_ms: int
    # time since the previous pass claimed the stream (database clock); None for the first
    pass_interval_ms: int | None = None


class Segment(Record):
    segment_id: str
    topic: str
    seq: int
    version: int
    state: SegmentState
    epoch: int
    assigned_ms: int
    offloaded_ms: int | None
    finished_ms: int | None
    detail: str | None
    begin_ledger_id: int
    begin_entry_id: int
    end_ledger_id: int | None
    end_entry_id: int | None
    planned_end_ledger_id: int | None
    planned_end_entry_id: int | None
    data_key: str
    index_key: str
    store_id: int
    upload_id: str | None
    data_len: int
    replaces: str | None
    origin: SegmentOrigin = SegmentOrigin.STREAM
    lease_until_ms: int | None = None  # a rewrite's lease while it is written

    @property
    def begin(self) -> Position:
        return Position(ledger_id=self.begin_ledger_id, entry_id=self.begin_entry_id)

    @property
    def end(self) -> Position | None:
        """The last position in the recorded parts; None before the first part."""
        if self.end_ledger_id is None or self.end_entry_id is None:
            return None
        return Position(ledger_id=self.end_ledger_id, entry_id=self.end_entry_id)

    @property
    def planned_end(self) -> Position | None:
        if self.planned_end_ledger_id is None or self.planned_end_entry_id is None:
            return None
        return Position(ledger_id=self.planned_end_ledger_id, entry_id=self.planned_end_entry_id)

    @property
    def is_open(self) -> bool:
        """Still the stream's current segment: parts may be added or it is being closed."""
        return self.state in (SegmentState.ASSIGNED, SegmentState.CLOSING)


class SegmentPart(Record):
    """One uploaded part of a segment, as recorded; ``blocks`` is its block table."""

    segment_id: str
    part_number: int
    etag: str
    offset: int
    length: int
    last_ledger_id: int
    last_entry_id: int
    blocks: str
    created_ms: int

    @property
    def last_position(self) -> Position:
        return Position(ledger_id=self.last_ledger_id, entry_id=self.last_entry_id)


class Piece(Record):
    """A ledger's piece: entries ``first_entry_id..last_entry_id`` of a streamed ledger in
    one offloaded segment (a row of ``schema.pieces``, with its segment)."""

    segment: Segment
    ledger_id: int
    first_entry_id: int
    last_entry_id: int


@dataclass(frozen=True)
class PieceRange:
    """Entries ``first..last`` of ``ledger_id`` held by a segment being committed."""

    ledger_id: int
    first: int
    last: int
