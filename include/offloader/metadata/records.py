"""Immutable views of metadata rows, handed out by the store and passed back for CAS."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

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


class AttemptState(StrEnum):
    STARTED = "started"
    COMMITTED = "committed"
    SUPERSEDED = "superseded"  # its lease ran out and another attempt took over
    FAILED = "failed"  # failed or lost the commit; its objects are queued for deletion


class Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class Topic(Record):
    name: str
    version: int
    policy: OffloadPolicy
    created_ms: int
    next_ledger_id: int
    writer_epoch: int


class Ledger(Record):
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
    offload_uuid: str | None
    data_key: str | None
    index_key: str | None
    data_len: int | None
    offloaded_ms: int | None
    hot_state: HotState
    hot_deleted_ms: int | None
    store_id: int | None  # where the committed offload went (invariant 7)

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
