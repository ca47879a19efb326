"""The managed-ledger writer: a topic's append path, rolling ledgers over and sealing them.

Like Pulsar's ManagedLedger: entries go to the current ledger until it reaches the policy's
entry, byte or age limit; then it is sealed (fsync in the hot tier, then the sealed length
in the metadata) and a new one is allocated. Ownership is an epoch on the topic: a writer
fenced by a newer one can neither seal nor allocate.
"""

from __future__ import annotations

import logging
import time

from offloader.exceptions import LedgerInUseError
from offloader.hottier import HotLedgerStore, LedgerInfo, WritableLedger
from offloader.metadata import Ledger, LedgerState, MetadataStore
from offloader.policy import OffloadPolicy

log = logging.getLogger(__name__)


class ManagedLedgerWriter:
    """Appends to one topic. Use as a context manager; closing seals the current ledger."""

    def __init__(self, metadata: MetadataStore, hot: HotLedgerStore, topic: str) -> None:
        self._metadata = metadata
        self._hot = hot
        self._topic = topic
        owned = metadata.claim_writer(topic)
        self._epoch = owned.writer_epoch
        self._policy: OffloadPolicy = owned.policy
        self._ledger: Ledger | None = None
        self._writable: WritableLedger | None = None
        self._opened_at = 0.0
        self.sealed: list[Ledger] = []
        recover_open_ledgers(metadata, hot, topic)

    def __enter__(self) -> ManagedLedgerWriter:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception:
            # Sealing after a failed append (a full disk) fails too; the original error is
            # the one to report. The ledger stays open and the next writer's recovery seals
            # it, cutting the torn tail.
            log.warning("could not seal %s after %r", self._topic, exc, exc_info=True)

    def append(self, payload: bytes) -> tuple[int, int]:
        """Append one entry; returns (ledger id, entry id)."""
        if self._writable is None:
            self._open_new_ledger()
        assert self._writable is not None and self._ledger is not None
        entry_id = self._writable.append(payload)
        ledger_id = self._ledger.ledger_id
        info = self._writable.info()
        policy = self._policy
        if (
            info.entry_count >= policy.ledger_max_entries
            or info.size_bytes >= policy.ledger_max_bytes
            or (
                policy.ledger_max_age_seconds is not None
                and time.monotonic() - self._opened_at >= policy.ledger_max_age_seconds
            )
        ):
            self.roll_over()
        return ledger_id, entry_id

    def sync(self) -> None:
        """Confirm every entry appended so far: durable (fsync) and visible to readers of
        the hot tier, such as a streaming pass, which offloads an open ledger up to its
        last confirmed entry. Entries appended after the last sync may be lost in a crash
        (the ledger is then sealed at what reached the disk), so none of them is read."""
        if self._writable is not None:
            self._writable.sync()

    def roll_over(self) -> Ledger | None:
        """Seal the current ledger (if it holds entries); the next append opens a new one.

        A fenced writer's seal fails in the metadata; the hot file it sealed is picked up
        by the new owner's recovery, so no acknowledged entry is lost.
        """
        if self._writable is None or self._ledger is None:
            return None
        writable, ledger = self._writable, self._ledger
        self._writable = None
        self._ledger = None
        try:
            info = writable.seal()
        finally:
            writable.close()
        sealed = self._metadata.seal_ledger(ledger, info.entry_count, info.size_bytes, self._epoch)
        self.sealed.append(sealed)
        return sealed

    def close(self) -> None:
        self.roll_over()

    def _open_new_ledger(self) -> None:
        ledger = self._metadata.allocate_ledger(self._topic, self._epoch)
        self._writable = self._hot.create(self._topic, ledger.ledger_id)
        self._ledger = ledger
        self._opened_at = time.monotonic()


def recover_open_ledgers(metadata: MetadataStore, hot: HotLedgerStore, topic: str) -> list[Ledger]:
    """Seal ledgers a crashed writer left open: cut the torn tail, then record the length."""
    recovered = []
    for ledger in metadata.list_ledgers(topic):
        if ledger.state is not LedgerState.OPEN:
            continue
        entry_count, size_bytes = 0, 0  # allocated, but the writer died before the file
        if hot.exists(topic, ledger.ledger_id):
            try:
                info = _seal_hot(hot, topic, ledger.ledger_id)
            except LedgerInUseError:
                log.warning(
                    "ledger %s/%s is still held by a fenced writer; it is sealed "
                    "by the next recovery after that writer exits",
                    topic,
                    ledger.ledger_id,
                )
                continue
            entry_count, size_bytes = info.entry_count, info.size_bytes
        recovered.append(metadata.seal_ledger(ledger, entry_count, size_bytes, None))
    return recovered


def _seal_hot(hot: HotLedgerStore, topic: str, ledger_id: int) -> LedgerInfo:
    """Seal the hot file (cutting a torn tail); a file the old writer sealed is kept as is."""
    info = hot.info(topic, ledger_id)
    if info.sealed:
        return info
    writable = hot.open_for_append(topic, ledger_id)
    try:
        return writable.seal()
    finally:
        writable.close()
