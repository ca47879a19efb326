"""What a scrub reads: every live offloaded ledger of the chosen topics, and every offloaded
streaming segment of them, as plain records.

A ledger offloaded in stream mode has no objects of its own (no data or index key): its
entries are in segments, each scrubbed once as a target of its own (``segment_id`` set),
carrying the ledger ranges the metadata store says it holds.

A target carries everything :func:`offloader.scrub.check.scrub_ledger` compares the objects
with (the metadata store's view of the ledger) and the location of its store, so the check
can run anywhere (a Spark executor opens the store from the location) without the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from offloader.metadata import Ledger, MetadataStore
from offloader.metadata.records import Segment, SegmentState
from offloader.objectstore.location import StoreLocation


@dataclass(frozen=True)
class ScrubTarget:
    """One offloaded ledger, or one offloaded segment, as the metadata store recorded it
    (picklable, no secrets).

    For a segment (``segment_id`` set): ``offload_uuid`` is the segment id, ``ledger_id``
    the first ledger it holds, ``pieces`` the (ledger id, first entry, last entry) ranges
    recorded for it, ``entry_count`` their sum and ``size_bytes`` 0 (payload bytes are not
    recorded per piece)."""

    topic: str
    ledger_id: int
    offload_uuid: str
    data_key: str
    index_key: str
    data_len: int | None  # the data object's length at commit
    entry_count: int
    size_bytes: int  # payload bytes (the index metadata's ``length``)
    store_id: int | None
    location: StoreLocation | None  # None only for rows written before revision 0002
    segment_id: str | None = None  # a streaming segment, not a ledger's own objects
    pieces: tuple[tuple[int, int, int], ...] = ()  # a segment's (ledger, first, last)

    @property
    def name(self) -> str:
        if self.segment_id is not None:
            return f"{self.topic}/segment {self.segment_id}"
        return f"{self.topic}/{self.ledger_id}"

    @property
    def described(self) -> str:
        """The target as errors name it: ``ledger events/7``, ``events/segment <id>``."""
        return self.name if self.segment_id is not None else f"ledger {self.name}"

    @classmethod
    def of_segment(
        cls,
        segment: Segment,
        pieces: Sequence[tuple[int, int, int]],
        location: StoreLocation | None,
    ) -> ScrubTarget:
        pieces = tuple(sorted(pieces))
        return cls(
            topic=segment.topic,
            ledger_id=pieces[0][0] if pieces else segment.begin_ledger_id,
            offload_uuid=segment.segment_id,
            data_key=segment.data_key,
            index_key=segment.index_key,
            data_len=segment.data_len,
            entry_count=sum(last - first + 1 for _, first, last in pieces),
            size_bytes=0,
            store_id=segment.store_id,
            location=location,
            segment_id=segment.segment_id,
            pieces=pieces,
        )

    @classmethod
    def of(cls, ledger: Ledger, location: StoreLocation | None) -> ScrubTarget:
        assert ledger.offload_attempt_id is not None
        assert ledger.data_key is not None and ledger.index_key is not None
        return cls(
            topic=ledger.topic,
            ledger_id=ledger.ledger_id,
            offload_uuid=ledger.offload_attempt_id,
            data_key=ledger.data_key,
            index_key=ledger.index_key,
            data_len=ledger.data_len,
            entry_count=ledger.entry_count,
            size_bytes=ledger.size_bytes,
            store_id=ledger.store_id,
            location=location,
        )


def plan_scrub(metadata: MetadataStore, topics: Sequence[str] | None = None) -> list[ScrubTarget]:
    """The live offloaded ledgers of ``topics`` (default: every topic not deleted), by topic
    and ledger id, each topic's offloaded segments after its ledgers (in stream order). A
    named topic that does not exist is NotFoundError, and a deleted one ValueError, before
    anything is read."""
    names = check_topics(metadata, topics)
    locations: dict[int, StoreLocation] = {}

    def location_of(store_id: int | None) -> StoreLocation | None:
        if store_id is None:
            return None
        if store_id not in locations:
            locations[store_id] = metadata.get_location(store_id)
        return locations[store_id]

    targets = []
    for name in names:
        for ledger in _offloaded(metadata.list_ledgers(name, live=True)):
            targets.append(ScrubTarget.of(ledger, location_of(ledger.store_id)))
        pieces = metadata.segments.offloaded_pieces(name)
        for segment in metadata.segments.of_topic(name, [SegmentState.OFFLOADED]):
            ranges = [(p.ledger_id, p.first, p.last) for p in pieces.get(segment.segment_id, [])]
            targets.append(ScrubTarget.of_segment(segment, ranges, location_of(segment.store_id)))
    return targets


def check_topics(metadata: MetadataStore, topics: Sequence[str] | None = None) -> list[str]:
    """The names of ``topics`` (default: every topic not deleted), checked: NotFoundError
    for one that does not exist, ValueError for a deleted one."""
    if not topics:
        return [t.name for t in metadata.list_topics() if not t.is_deleted]
    names = list(dict.fromkeys(topics))
    for name in names:
        if metadata.get_topic(name).is_deleted:
            raise ValueError(f"topic {name!r} was deleted; it has nothing to scrub")
    return names


def _offloaded(ledgers: Iterable[Ledger]) -> list[Ledger]:
    """Ledgers with objects of their own: stream-mode ones are scrubbed by their segments."""
    return [
        x
        for x in ledgers
        if x.is_offloaded and x.offload_attempt_id is not None and x.data_key and x.index_key
    ]
