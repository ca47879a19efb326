"""Reading a topic: pick the hot or tiered copy by read priority, fall back when one is gone."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from offloader.exceptions import (
    HotLedgerMissingError,
    ObjectNotFoundError,
    StoreUnavailableError,
    TopicDeletedError,
    TrimmedError,
)
from offloader.metadata import Ledger, LedgerState, OffloadMode, Topic
from offloader.objectstore import ObjectStore
from offloader.policy import ReadPriority
from offloader.read.segmented import PieceSource, SegmentedLedgerReader
from offloader.read.tiered import TieredLedgerReader
from offloader.results import fields_json
from offloader.runtime import Runtime


class Source(StrEnum):
    AUTO = "auto"
    HOT = "hot"
    TIERED = "tiered"


@dataclass(frozen=True)
class Checksum:
    """One digest over every readable entry of a topic (`offloader checksum`)."""

    digest: str
    entries: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        return f"{self.digest}  {self.entries} entries, {self.bytes} bytes"


def _refuse_deleted(topic: Topic) -> None:
    if topic.is_deleted:
        raise TopicDeletedError(f"topic {topic.name!r} was deleted; nothing of it is readable")


def _check_start(topic: Topic, ledger: Ledger, first: int | None) -> int:
    """The first readable entry id of ``ledger``; TrimmedError naming the start if the
    ledger (or the requested ``first``) lies below the topic's start."""
    _refuse_deleted(topic)
    start = topic.start
    below = ledger.ledger_id < start.ledger_id or not ledger.is_live
    if ledger.ledger_id == start.ledger_id and first is not None and first < start.entry_id:
        below = True
    if below:
        what = f"ledger {ledger.ledger_id}" + ("" if first is None else f" entry {first}")
        raise TrimmedError(
            f"{what} of topic {topic.name!r} is below the topic's start {start}: trimmed"
        )
    return start.entry_id if ledger.ledger_id == start.ledger_id else 0


class TopicReader:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def read(
        self,
        topic: str,
        ledger_id: int,
        first: int | None = None,
        last: int | None = None,
        source: Source = Source.AUTO,
    ) -> Iterator[tuple[int, bytes]]:
        """Entries ``first..last`` of one ledger from the chosen copy, resuming on fallback.

        ``first`` None is the first readable entry: 0, or the topic's start entry in the
        ledger the start falls in. Anything below the topic's start is TrimmedError, raised
        before any byte is read (invariant 4). An empty ledger yields nothing for the
        default range and refuses an explicit one.
        """
        ledger = self.runtime.metadata.get_ledger(topic, ledger_id)
        owner = self.runtime.metadata.get_topic(topic)
        readable = _check_start(owner, ledger, first)
        last_id = self._last_entry_id(ledger)
        if last_id < 0:
            if first is None and last is None:
                return
            raise ValueError(f"ledger {ledger_id} of topic {topic!r} is empty")
        first = readable if first is None else first
        last = last_id if last is None else last
        if first < 0 or first > last or last > last_id:
            raise ValueError(
                f"entries {first}..{last} are outside 0..{last_id} of ledger {topic}/{ledger_id}"
            )
        sources = self._sources(owner, ledger, Source(source))
        next_id = first
        position, resolved = 0, False
        while True:
            try:
                for entry_id, payload in sources[position](next_id, last):
                    yield entry_id, payload
                    next_id = entry_id + 1
                return
            except ObjectNotFoundError:
                # the objects went while we read: a rewrite or a repair swapped the ledger
                # and the grace of its old objects ran out. Look the ledger up once more
                # and go on from the next entry with what the metadata names now.
                fresh = None if resolved else self._tiered_again(topic, ledger_id)
                resolved = True
                if fresh is not None:
                    sources[position] = fresh
                    continue
                if position == len(sources) - 1:
                    raise
            except (HotLedgerMissingError, StoreUnavailableError):
                if position == len(sources) - 1:
                    raise
            position += 1

    def read_entry(
        self, topic: str, ledger_id: int, entry_id: int, source: Source = Source.AUTO
    ) -> bytes:
        """One entry's payload; TrimmedError if it lies below the topic's start."""
        for _, payload in self.read(topic, ledger_id, entry_id, entry_id, source):
            return payload
        raise ValueError(f"ledger {ledger_id} of topic {topic!r} has no entry {entry_id}")

    def checksum(self, topic: str, source: Source = Source.AUTO) -> Checksum:
        """One SHA-256 over every readable entry (at or above the topic's start): (ledger
        id, entry id, length, payload)."""
        digest = hashlib.sha256()
        entries = total = 0
        owner = self.runtime.metadata.get_topic(topic)
        _refuse_deleted(owner)
        for ledger in self.runtime.metadata.list_ledgers(topic, live=True):
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
        self, topic: Topic, ledger: Ledger, source: Source
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
        ordered = (
            [tiered, hot]
            if topic.policy.read_priority is ReadPriority.TIERED_FIRST
            else [hot, tiered]
        )
        available = [reader for reader in ordered if reader is not None]
        if not available:
            raise HotLedgerMissingError(f"{name} has neither a hot nor a tiered copy")
        return available

    def _tiered_again(
        self, topic: str, ledger_id: int
    ) -> Callable[[int, int], Iterator[tuple[int, bytes]]] | None:
        """A tiered reader of the ledger as the metadata names it now; None when it is no
        longer offloaded or live (then nothing else holds its entries)."""
        ledger = self.runtime.metadata.get_ledger(topic, ledger_id)
        if not (ledger.is_offloaded and ledger.is_live):
            return None
        return self._tiered_reader(ledger)

    def _hot_reader(self, ledger: Ledger) -> Callable[[int, int], Iterator[tuple[int, bytes]]]:
        def read(first: int, last: int) -> Iterator[tuple[int, bytes]]:
            return self.runtime.hot.read(ledger.topic, ledger.ledger_id, first, last)

        return read

    def _tiered_reader(self, ledger: Ledger) -> Callable[[int, int], Iterator[tuple[int, bytes]]]:
        def read(first: int, last: int) -> Iterator[tuple[int, bytes]]:
            # the stores its rows recorded (invariant 7), opened only when read from
            return tiered_ledger_reader(self.runtime, ledger).read(first, last)

        return read


def ledger_object_reader(store: ObjectStore, ledger: Ledger, prefetch: int) -> TieredLedgerReader:
    """A reader of ``ledger``'s own (v1) objects in ``store``, the one its row recorded."""
    if ledger.data_key is None or ledger.index_key is None:
        raise ValueError(f"ledger {ledger.topic}/{ledger.ledger_id} has no objects of its own")
    return TieredLedgerReader(
        store,
        ledger.data_key,
        ledger.index_key,
        topic=ledger.topic,
        ledger_id=ledger.ledger_id,
        last_entry_id=ledger.entry_count - 1,
        prefetch=prefetch,
    )


def tiered_ledger_reader(
    runtime: Runtime, ledger: Ledger
) -> TieredLedgerReader | SegmentedLedgerReader:
    """A reader of an offloaded ledger's tiered copy: its own v1 objects, or (mode
    ``stream``, PIP-76) the segments holding it, each in the store its row recorded
    (invariant 7).

    A stream-mode ledger whose segments are gone when they are looked up moved to objects
    of its own since ``ledger`` was read (a migration back to v1 or scrub's repair swapped
    it, and no ledger needed the segments any more): the reader follows it there."""
    if ledger.offload_mode is OffloadMode.LEDGER:
        store = runtime.stores.get(ledger.store_id, f"ledger {ledger.topic}/{ledger.ledger_id}")
        return ledger_object_reader(store, ledger, runtime.settings.read_prefetch)
    records = runtime.metadata.segments.pieces(ledger.topic, ledger.ledger_id)
    if not records:
        now = runtime.metadata.get_ledger(ledger.topic, ledger.ledger_id)
        if now.is_offloaded and now.offload_mode is OffloadMode.LEDGER:
            return tiered_ledger_reader(runtime, now)
        raise ObjectNotFoundError(
            f"ledger {ledger.topic}/{ledger.ledger_id} is streamed but no offloaded "
            "segment holds it"
        )
    pieces = [
        PieceSource(
            runtime.stores.get(r.segment.store_id, f"segment {r.segment.segment_id}"),
            r.segment.data_key,
            r.segment.index_key,
            r.first_entry_id,
            min(r.last_entry_id, ledger.entry_count - 1),
        )
        for r in records
        if r.first_entry_id < ledger.entry_count
    ]
    return SegmentedLedgerReader(
        pieces,
        ledger_id=ledger.ledger_id,
        topic=ledger.topic,
        prefetch=runtime.settings.read_prefetch,
    )
