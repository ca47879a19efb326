"""Reading a topic: pick the hot or tiered copy by read priority, fall back when one is gone."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from offloader.exceptions import (
    HotLedgerMissingError,
    ObjectNotFoundError,
    StoreUnavailableError,
)
from offloader.metadata import Ledger, LedgerState
from offloader.policy import ReadPriority
from offloader.read.tiered import TieredLedgerReader
from offloader.runtime import Runtime


class Source(StrEnum):
    AUTO = "auto"
    HOT = "hot"
    TIERED = "tiered"


@dataclass(frozen=True)
class Checksum:
    digest: str
    entries: int
    bytes: int


class TopicReader:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def read(
        self,
        topic: str,
        ledger_id: int,
        first: int = 0,
        last: int | None = None,
        source: Source = Source.AUTO,
    ) -> Iterator[tuple[int, bytes]]:
        """Entries ``first..last`` of one ledger from the chosen copy, resuming on fallback.

        An empty ledger yields nothing for the default range and refuses an explicit one.
        """
        ledger = self.runtime.metadata.get_ledger(topic, ledger_id)
        last_id = self._last_entry_id(ledger)
        if last_id < 0:
            if first == 0 and last is None:
                return
            raise ValueError(f"ledger {ledger_id} of topic {topic!r} is empty")
        last = last_id if last is None else last
        if first < 0 or first > last or last > last_id:
            raise ValueError(
                f"entries {first}..{last} are outside 0..{last_id} of ledger {topic}/{ledger_id}"
            )
        sources = self._sources(ledger, Source(source))
        next_id = first
        for position, reader in enumerate(sources):
            try:
                for entry_id, payload in reader(next_id, last):
                    yield entry_id, payload
                    next_id = entry_id + 1
                return
            except (HotLedgerMissingError, ObjectNotFoundError, StoreUnavailableError):
                if position == len(sources) - 1:
                    raise

    def checksum(self, topic: str, source: Source = Source.AUTO) -> Checksum:
        """One SHA-256 over every readable entry: (ledger id, entry id, length, payload)."""
        digest = hashlib.sha256()
        entries = total = 0
        for ledger in self.runtime.metadata.list_ledgers(topic):
            if self._last_entry_id(ledger) < 0:
                continue
            for entry_id, payload in self.read(topic, ledger.ledger_id, source=source):
                digest.update(struct.pack(">qqi", ledger.ledger_id, entry_id, len(payload)))
                digest.update(payload)
                entries += 1
                total += len(payload)
        return Checksum(digest.hexdigest(), entries, total)

    def _last_entry_id(self, ledger: Ledger) -> int:
        if ledger.state is LedgerState.OPEN:
            if not self.runtime.hot.exists(ledger.topic, ledger.ledger_id):
                return -1
            return self.runtime.hot.info(ledger.topic, ledger.ledger_id).entry_count - 1
        return ledger.entry_count - 1

    def _sources(
        self, ledger: Ledger, source: Source
    ) -> list[Callable[[int, int], Iterator[tuple[int, bytes]]]]:
        name = f"ledger {ledger.topic}/{ledger.ledger_id}"
        hot = self._hot_reader(ledger) if ledger.has_hot_copy else None
        tiered = self._tiered_reader(ledger) if ledger.is_offloaded else None
        if source is Source.HOT:
            if hot is None:
                raise HotLedgerMissingError(
                    f"{name} has no hot copy (hot state {ledger.hot_state})"
                )
            return [hot]
        if source is Source.TIERED:
            if tiered is None:
                raise ObjectNotFoundError(f"{name} is not offloaded")
            return [tiered]
        policy = self.runtime.metadata.get_topic(ledger.topic).policy
        ordered = (
            [tiered, hot] if policy.read_priority is ReadPriority.TIERED_FIRST else [hot, tiered]
        )
        available = [reader for reader in ordered if reader is not None]
        if not available:
            raise HotLedgerMissingError(f"{name} has neither a hot nor a tiered copy")
        return available

    def _hot_reader(self, ledger: Ledger) -> Callable[[int, int], Iterator[tuple[int, bytes]]]:
        def read(first: int, last: int) -> Iterator[tuple[int, bytes]]:
            return self.runtime.hot.read(ledger.topic, ledger.ledger_id, first, last)

        return read

    def _tiered_reader(self, ledger: Ledger) -> Callable[[int, int], Iterator[tuple[int, bytes]]]:
        assert ledger.data_key is not None and ledger.index_key is not None
        data_key, index_key = ledger.data_key, ledger.index_key

        def read(first: int, last: int) -> Iterator[tuple[int, bytes]]:
            # the store the offload recorded (invariant 7), opened only when read from
            what = f"ledger {ledger.topic}/{ledger.ledger_id}"
            reader = TieredLedgerReader(
                self.runtime.stores.get(ledger.store_id, what),
                data_key,
                index_key,
                topic=ledger.topic,
                ledger_id=ledger.ledger_id,
                last_entry_id=ledger.entry_count - 1,
                prefetch=self.runtime.settings.read_prefetch,
            )
            return reader.read(first, last)

        return read
