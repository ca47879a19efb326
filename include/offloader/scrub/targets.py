"""What a scrub reads: every live offloaded ledger of the chosen topics, as plain records.

A target carries everything :func:`offloader.scrub.check.scrub_ledger` compares the objects
with (the metadata store's view of the ledger) and the location of its store, so the check
can run anywhere (a Spark executor opens the store from the location) without the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from offloader.metadata import Ledger, MetadataStore
from offloader.objectstore.location import StoreLocation


@dataclass(frozen=True)
class ScrubTarget:
    """One offloaded ledger as the metadata store recorded it (picklable, no secrets)."""

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

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.ledger_id}"

    @classmethod
    def of(cls, ledger: Ledger, location: StoreLocation | None) -> ScrubTarget:
        assert ledger.offload_uuid is not None
        assert ledger.data_key is not None and ledger.index_key is not None
        return cls(
            topic=ledger.topic,
            ledger_id=ledger.ledger_id,
            offload_uuid=ledger.offload_uuid,
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
    and ledger id. A named topic that does not exist is NotFoundError, and a deleted one
    ValueError, before anything is read."""
    names = check_topics(metadata, topics)
    locations: dict[int, StoreLocation] = {}
    targets = []
    for name in names:
        for ledger in _offloaded(metadata.list_ledgers(name, live=True)):
            location = None
            if ledger.store_id is not None:
                if ledger.store_id not in locations:
                    locations[ledger.store_id] = metadata.get_store(ledger.store_id)
                location = locations[ledger.store_id]
            targets.append(ScrubTarget.of(ledger, location))
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
    return [x for x in ledgers if x.is_offloaded and x.offload_uuid is not None]
