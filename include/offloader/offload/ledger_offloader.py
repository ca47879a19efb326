"""The ledger offloader (PIP-17): the invariant sequence for one sealed ledger.

record the attempt (uuid, keys) -> upload data blocks and index -> commit by compare-and-set.
A crash anywhere leaves nothing, or an attempt the next run finishes (its objects are
complete) or supersedes (its objects are queued for deletion once its lease has run out).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from enum import StrEnum

from offloader import failpoints
from offloader.exceptions import (
    CommitFailedError,
    FormatError,
    HotLedgerMissingError,
    ObjectNotFoundError,
    StoreUnavailableError,
)
from offloader.format import LedgerMetadata, decode_index, encode_blocks, encode_index
from offloader.format.object_metadata import ledger_user_metadata
from offloader.keys import ledger_object_keys
from offloader.metadata import Attempt, Ledger, LedgerState, OffloadMode
from offloader.offload.batch import BatchOffloader
from offloader.offload.hot_deletion import retire_empty_ledger
from offloader.offload.lease import LeaseKeeper, owner_id
from offloader.offload.outcome import OffloadResult, Outcome
from offloader.offload.planner import due_ledgers
from offloader.offload.upload import upload_blocks
from offloader.policy import OffloadPolicy
from offloader.read.topic_reader import tiered_ledger_reader
from offloader.runtime import Runtime

log = logging.getLogger(__name__)


class EntrySource(StrEnum):
    """Where a replacement (a second offload of an offloaded ledger) reads the entries."""

    HOT = "hot"  # the hot copy: scrub's repair, the normal offload path
    TIER = "tier"  # the ledger's objects or segments, every chunk CRC-checked: back to v1


class LedgerOffloader:
    """Offloads sealed ledgers of a runtime's hot tier into its object store."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.metadata = runtime.metadata
        self.store = runtime.objects
        self._policies: dict[str, OffloadPolicy] = {}

    def policy(self, topic: str) -> OffloadPolicy:
        """The topic's policy, read once per offloader (one run or one batch)."""
        if topic not in self._policies:
            self._policies[topic] = self.metadata.get_topic(topic).policy
        return self._policies[topic]

    def plan(self, topic: str, up_to: int | None = None) -> list[Ledger]:
        if up_to is not None and up_to < 0:
            raise ValueError(f"up_to {up_to}: a ledger id is 0 or more")
        ledgers = self.metadata.ledgers_with_hot_copy(topic, offloaded=False)
        return due_ledgers(ledgers, self.policy(topic), self.metadata.db_now_ms(), up_to)

    def offload_topic(self, topic: str, up_to: int | None = None) -> list[OffloadResult]:
        """Offload every due ledger of ``topic``, oldest first, through the batched path."""
        return BatchOffloader(self).offload(topic, [x.ledger_id for x in self.plan(topic, up_to)])

    def offload_ledger(self, topic: str, ledger_id: int) -> OffloadResult:
        """Idempotent: run it any number of times, concurrently or after a crash."""
        ledger = self.metadata.get_ledger(topic, ledger_id)
        if not ledger.is_live or ledger_id < self.metadata.get_topic(topic).start_ledger_id:
            return OffloadResult(topic, ledger_id, Outcome.TRIMMED)  # below the start
        if ledger.is_offloaded:
            return OffloadResult(
                topic, ledger_id, Outcome.ALREADY_OFFLOADED, ledger.offload_attempt_id
            )
        if ledger.state is not LedgerState.SEALED:
            raise ValueError(f"ledger {topic}/{ledger_id} is open; only sealed ledgers move")
        if ledger.entry_count == 0:
            retire_empty_ledger(self.metadata, self.runtime.hot, ledger)
            return OffloadResult(topic, ledger_id, Outcome.RETIRED_EMPTY)
        if ledger.attempt_id is not None:
            # the database's clock says whether the lease is over (invariant 6); attempts.begin
            # checks it again in its conditional update, in case the owner renews meanwhile
            if (ledger.attempt_lease_ms or 0) > self.metadata.db_now_ms():
                return OffloadResult(topic, ledger_id, Outcome.IN_PROGRESS, ledger.attempt_id)
            finished = self._finish_stale(ledger)
            if finished is not None:
                return finished
            ledger = self.metadata.get_ledger(topic, ledger_id)
        return self._attempt(ledger)

    def replace_ledger(
        self,
        topic: str,
        ledger_id: int,
        replaced_attempt_id: str | None,
        reason: str,
        *,
        source: EntrySource = EntrySource.HOT,
    ) -> OffloadResult:
        """Offload an offloaded ledger again as v1 objects of its own: intent, upload and a
        CAS commit exactly as a first offload, then what it was offloaded as is let go in
        the commit's transaction (``AttemptStore.commit_replacement``).

        ``replaced_attempt_id`` is what the caller saw the ledger offloaded as: the attempt whose
        objects are replaced (mode ``ledger``; scrub's repair of damaged objects), or None
        for a ledger offloaded in mode ``stream`` (its entries in segments: a damaged
        segment's repair, or a migration back to v1). ALREADY_OFFLOADED if the ledger is
        offloaded as something else now (someone replaced or migrated it meanwhile).
        ``source``: the entries come from the hot copy (HotLedgerMissingError, nothing
        changed, if there is none) or from the tier (read through the index's CRCs)."""
        ledger = self.metadata.get_ledger(topic, ledger_id)
        if not ledger.is_live or ledger_id < self.metadata.get_topic(topic).start_ledger_id:
            return OffloadResult(topic, ledger_id, Outcome.TRIMMED)
        if not offloaded_as(ledger, replaced_attempt_id):
            return OffloadResult(
                topic, ledger_id, Outcome.ALREADY_OFFLOADED, ledger.offload_attempt_id
            )
        hot = source is EntrySource.HOT
        if hot and (not ledger.has_hot_copy or not self.runtime.hot.exists(topic, ledger_id)):
            raise HotLedgerMissingError(
                f"ledger {topic}/{ledger_id} has no hot copy (hot state {ledger.hot_state}): "
                "its damaged objects cannot be offloaded again"
            )
        if (ledger.attempt_lease_ms or 0) > self.metadata.db_now_ms():
            return OffloadResult(topic, ledger_id, Outcome.IN_PROGRESS, ledger.attempt_id)
        return self._attempt(ledger, replacing=reason, source=source)

    def _attempt(
        self,
        ledger: Ledger,
        replacing: str | None = None,
        source: EntrySource = EntrySource.HOT,
    ) -> OffloadResult:
        """Intent, upload, CAS commit; ``replacing`` (the reason) swaps an offloaded
        ledger's objects instead of committing a first offload."""
        started = time.monotonic()
        attempt_id = str(uuid.uuid4())
        data_key, index_key = ledger_object_keys(attempt_id, ledger.ledger_id)
        settings = self.runtime.settings
        try:
            ledger, attempt = self.metadata.attempts.begin(
                ledger,
                attempt_id,
                data_key,
                index_key,
                owner_id(),
                int(settings.attempt_lease_seconds * 1000),
                store_id=self.runtime.stores.default_id(),
                replace=replacing is not None,
                from_tier=source is EntrySource.TIER,
            )
        except CommitFailedError:
            current = self.metadata.get_ledger(ledger.topic, ledger.ledger_id)
            outcome = Outcome.ALREADY_OFFLOADED if current.is_offloaded else Outcome.IN_PROGRESS
            if replacing is not None and current.attempt_id is not None:
                outcome = Outcome.IN_PROGRESS
            return OffloadResult(ledger.topic, ledger.ledger_id, outcome, current.attempt_id)
        failpoints.reach("after-begin-attempt")
        try:
            with LeaseKeeper(
                self.metadata.attempts, attempt, settings.attempt_lease_seconds
            ) as lease:
                length = self._upload(ledger, attempt, lease.check, source)
                lease.check()
            if replacing is None:
                self.metadata.attempts.commit(attempt, length)
            else:
                grace_ms = int(settings.replaced_object_grace_seconds * 1000)
                self.metadata.attempts.commit_replacement(
                    attempt, length, replacing, grace_ms=grace_ms
                )
            failpoints.reach("after-commit")
        except Exception as exc:
            if isinstance(exc, CommitFailedError) or not self._still_owns(attempt):
                # a zombie: another attempt took over; whatever broke is moot
                log.warning("offload of %s/%s lost: %s", ledger.topic, ledger.ledger_id, exc)
                self.metadata.attempts.fail(attempt, f"lost: {exc}")
                return OffloadResult(ledger.topic, ledger.ledger_id, Outcome.LOST, attempt_id)
            self._fail_quietly(attempt, exc)
            raise
        except BaseException as exc:
            self._fail_quietly(attempt, exc)
            raise
        seconds = time.monotonic() - started
        log.info(
            "%s %s/%s: %d bytes in %.3fs (attempt %s)",
            "offloaded" if replacing is None else "offloaded again (replaced)",
            ledger.topic,
            ledger.ledger_id,
            length,
            seconds,
            attempt_id,
        )
        outcome = Outcome.OFFLOADED if replacing is None else Outcome.REPLACED
        return OffloadResult(ledger.topic, ledger.ledger_id, outcome, attempt_id, length, seconds)

    def _upload(
        self,
        ledger: Ledger,
        attempt: Attempt,
        check: Callable[[], None],
        source: EntrySource = EntrySource.HOT,
    ) -> int:
        policy = self.policy(ledger.topic)
        entries = self._entries(ledger, source)
        uploaded = upload_blocks(
            self.store,
            attempt.data_key,
            encode_blocks(
                entries, max_block_size=policy.max_block_size, chunk_target=policy.read_buffer_size
            ),
            metadata=ledger_user_metadata(ledger.topic, ledger.ledger_id, "data"),
            concurrency=self.runtime.settings.upload_concurrency,
            check=check,
        )
        meta = LedgerMetadata(
            topic=ledger.topic,
            ledger_id=ledger.ledger_id,
            entry_count=ledger.entry_count,
            last_entry_id=ledger.entry_count - 1,
            length=ledger.size_bytes,
            created_ms=ledger.created_ms,
            sealed_ms=ledger.sealed_ms or 0,
        )
        failpoints.reach("after-data-upload")
        check()
        self.store.put(
            attempt.index_key,
            encode_index(meta, uploaded.blocks, uploaded.chunks),
            metadata=ledger_user_metadata(ledger.topic, ledger.ledger_id, "index"),
            if_none_match=True,
        )
        failpoints.reach("after-index-upload")
        return uploaded.length

    def _entries(self, ledger: Ledger, source: EntrySource) -> Iterator[tuple[int, bytes]]:
        """Entries 0..entry_count-1 from ``source``; the tier's are held against the
        metadata store's count and bytes, so no index disagreeing with it is written."""
        last = ledger.entry_count - 1
        if source is EntrySource.HOT:
            return self.runtime.hot.read(ledger.topic, ledger.ledger_id, 0, last)
        return _as_recorded(ledger, tiered_ledger_reader(self.runtime, ledger).read(0, last))

    def _finish_stale(self, ledger: Ledger) -> OffloadResult | None:
        """Commit a crashed attempt whose objects are complete; None if they are not."""
        assert ledger.attempt_id is not None
        attempt = self.metadata.attempts.get(ledger.attempt_id)
        try:
            # the attempt's own store: the default may have changed since it began
            store = self.runtime.stores.get(attempt.store_id, f"attempt {attempt.attempt_id}")
            index = decode_index(store.get(attempt.index_key))
            data = store.stat(attempt.data_key)
        except StoreUnavailableError as exc:
            log.warning("cannot finish stale attempt %s: %s", attempt.attempt_id, exc)
            return None
        except (ObjectNotFoundError, FormatError):
            return None
        meta = index.metadata
        if (
            data.size != index.data_object_len
            or meta is None
            or meta.entry_count != ledger.entry_count
            or meta.length != ledger.size_bytes
        ):
            return None
        try:
            self.metadata.attempts.commit(attempt, data.size)
        except CommitFailedError:
            return None
        log.info(
            "recovered attempt %s of %s/%s", attempt.attempt_id, ledger.topic, ledger.ledger_id
        )
        return OffloadResult(
            ledger.topic, ledger.ledger_id, Outcome.RECOVERED, attempt.attempt_id, data.size
        )

    def _still_owns(self, attempt: Attempt) -> bool:
        try:
            return self.metadata.attempts.renew(
                attempt, int(self.runtime.settings.attempt_lease_seconds * 1000)
            )
        except Exception:
            return True

    def _fail_quietly(self, attempt: Attempt, exc: BaseException) -> None:
        """Queue the attempt's objects for deletion; if even that fails, its lease will."""
        try:
            self.metadata.attempts.fail(attempt, f"{type(exc).__name__}: {exc}")
        except Exception:
            log.exception("could not record the failure of attempt %s", attempt.attempt_id)


def offloaded_as(ledger: Ledger, attempt_id: str | None) -> bool:
    """``ledger`` is offloaded on the objects of attempt ``attempt_id``, or, ``attempt_id``
    None, on segments (mode ``stream``: the segments holding a stream-mode ledger change
    only with its row, so the mode and the row's version say which ones)."""
    if not ledger.is_offloaded:
        return False
    if attempt_id is None:
        return ledger.offload_mode is OffloadMode.STREAM
    return ledger.offload_attempt_id == attempt_id


def _as_recorded(
    ledger: Ledger, entries: Iterator[tuple[int, bytes]]
) -> Iterator[tuple[int, bytes]]:
    """``entries``, then FormatError if they are not the ledger's count and payload bytes
    as the metadata store recorded them."""
    count = size = 0
    for entry in entries:
        count += 1
        size += len(entry[1])
        yield entry
    if (count, size) != (ledger.entry_count, ledger.size_bytes):
        raise FormatError(
            f"ledger {ledger.topic}/{ledger.ledger_id}: the tier holds {count} entries of "
            f"{size} bytes, the metadata store {ledger.entry_count} of {ledger.size_bytes}"
        )


__all__ = ["EntrySource", "LedgerOffloader", "OffloadResult", "Outcome"]
