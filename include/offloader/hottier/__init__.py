"""The hot-tier interface: where ledgers live before (and until a while after) offload.

A ledger is an append-only sequence of entries with ids 0, 1, 2, ...; once sealed it never
changes. Bindings live in their own modules (``filestore``, with its files in
``ledger_files`` and its topic folder names in ``names``). The managed-ledger writer
(:mod:`offloader.hottier.writer`) rolls ledgers over on top of any binding.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass

# The largest entry any hot tier accepts: the file store's record length is an unsigned
# 32-bit field.
MAX_ENTRY_BYTES = 0xFFFFFFFF


@dataclass(frozen=True)
class LedgerInfo:
    topic: str
    ledger_id: int
    entry_count: int
    size_bytes: int  # sum of entry payload lengths
    sealed: bool


class WritableLedger(abc.ABC):
    """An open ledger: append entries, then seal. One writer at a time."""

    @abc.abstractmethod
    def append(self, payload: bytes) -> int:
        """Append one entry and return its id (ids count from 0)."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Make every entry appended so far durable and visible to readers."""

    @abc.abstractmethod
    def seal(self) -> LedgerInfo:
        """Make every entry durable (fsync) and the ledger immutable."""

    @abc.abstractmethod
    def info(self) -> LedgerInfo: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Release the file without sealing (the ledger can be reopened for append)."""


class HotLedgerStore(abc.ABC):
    """Stores ledgers by (topic, ledger id)."""

    @abc.abstractmethod
    def create(self, topic: str, ledger_id: int) -> WritableLedger:
        """AlreadyExistsError if the ledger exists."""

    @abc.abstractmethod
    def open_for_append(self, topic: str, ledger_id: int) -> WritableLedger:
        """Reopen an unsealed ledger after a crash; a torn tail is cut off."""

    @abc.abstractmethod
    def info(self, topic: str, ledger_id: int) -> LedgerInfo:
        """HotLedgerMissingError if absent."""

    @abc.abstractmethod
    def read(
        self, topic: str, ledger_id: int, first: int = 0, last: int | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """Entries ``first..last`` inclusive (``last`` None: to the end) as (id, payload)."""

    @abc.abstractmethod
    def exists(self, topic: str, ledger_id: int) -> bool: ...

    @abc.abstractmethod
    def delete(self, topic: str, ledger_id: int) -> None:
        """Remove the ledger; deleting an absent ledger is not an error."""
