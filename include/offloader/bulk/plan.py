"""The export's plan, made by the Spark driver from the metadata store alone: which offloaded
ledgers, cut into entry ranges ("slices") of about ``slice_bytes`` so the work spreads over
executors. A slice carries everything an executor needs to read it (keys, the recorded store,
the ledger's last entry): executors never open the metadata database.

Slices are cut by entry id at the ledger's mean entry size, not at chunk boundaries: those
are in each ledger's index, one GET per ledger on the driver before any work is spread.
A boundary inside a chunk costs that one chunk (about a read buffer) read by two tasks.

Ledgers offloaded by streaming (``offload_mode`` stream) have no objects of their own: their
entries are spread over segments, each holding a contiguous piece of the ledger (the
metadata store's ``segment_ledgers``). Such a ledger is cut piece by piece, so a slice
never spans two segments: it names one segment's data and index objects and the piece's
first entry, which the executor's reader needs to find the ledger in the segment's v2
index."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from offloader.bulk.params import ExportParams
from offloader.exceptions import TopicDeletedError
from offloader.keys import export_file_path
from offloader.metadata import Ledger, MetadataStore, Topic
from offloader.metadata.pieces import covers
from offloader.metadata.records import OffloadMode
from offloader.objectstore.location import StoreLocation
from offloader.offload.planner import CreationWindow

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ExportSlice:
    """Entries ``first_entry_id..last_entry_id`` of one offloaded ledger."""

    topic: str
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    data_key: str
    index_key: str
    ledger_last_entry_id: int  # from the metadata: a Pulsar index does not record it
    store: StoreLocation  # where the offload went (invariant 7)
    created_ms: int
    # a streamed ledger's slice: the first entry of the ledger's piece in the segment
    # named by data_key/index_key (ledger_last_entry_id is then the piece's last)
    piece_first_entry_id: int | None = None

    @property
    def in_segment(self) -> bool:
        return self.piece_first_entry_id is not None

    @property
    def entries(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    @property
    def path(self) -> str:
        """The slice's Parquet file, partitioned by topic and ledger (Hive style; the topic
        percent-encoded, so any topic name is one safe path segment)."""
        return export_file_path(self.topic, self.ledger_id, self.first_entry_id, self.last_entry_id)


@dataclass(frozen=True)
class ExportPlan:
    """The slices to export, and what the selection holds that is not exported."""

    slices: list[ExportSlice]
    ledgers: int  # offloaded ledgers selected
    bytes: int  # their payload bytes (estimate of what is read)
    not_offloaded: list[tuple[str, int]] = field(default_factory=list)  # selected, hot only
    streamed: list[tuple[str, int]] = field(default_factory=list)  # of ``ledgers``: in segments

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.slices)

    @property
    def stores(self) -> list[str]:
        """The URLs of the stores the slices are read from (no endpoint, no credential)."""
        return sorted({s.store.store_url for s in self.slices})

    def to_json(self) -> dict[str, Any]:
        return {
            "ledgers": self.ledgers,
            "slices": len(self.slices),
            "entries": self.entries,
            "bytes": self.bytes,
            "not_offloaded": [f"{t}/{ledger}" for t, ledger in self.not_offloaded],
            "streamed": len(self.streamed),
        }

    def __str__(self) -> str:
        text = (
            f"{self.ledgers} ledgers ({len(self.streamed)} streamed) in {len(self.slices)} "
            f"slices: {self.entries} entries, {self.bytes} bytes"
        )
        if self.not_offloaded:
            text += f"; {len(self.not_offloaded)} selected ledgers not offloaded"
        return text


def plan_export(metadata: MetadataStore, params: ExportParams) -> ExportPlan:
    """Every readable entry of the selected, offloaded, live ledgers; NotFoundError or
    TopicDeletedError naming a topic the params name that cannot be exported."""
    named = params.topics or []
    topics = [metadata.get_topic(name) for name in named] or metadata.list_topics()
    window = _window(params)
    slices: list[ExportSlice] = []
    ledgers = total = 0
    skipped: list[tuple[str, int]] = []
    streamed: list[tuple[str, int]] = []
    for topic in topics:
        if topic.is_deleted:
            if named:
                raise TopicDeletedError(f"topic {topic.name!r} was deleted; nothing to export")
            continue
        for ledger in metadata.list_ledgers(topic.name, live=True):
            if not _selected(ledger, params, window):
                continue
            if not ledger.is_offloaded:
                skipped.append((topic.name, ledger.ledger_id))
                continue
            first = topic.start.entry_id if ledger.ledger_id == topic.start.ledger_id else 0
            if ledger.entry_count - 1 < first:
                continue  # empty, or trimmed to its end
            ledgers += 1
            total += ledger.size_bytes
            if ledger.offload_mode is OffloadMode.STREAM:
                streamed.append((topic.name, ledger.ledger_id))
                slices.extend(_segment_slices(metadata, topic, ledger, first, params.slice_bytes))
                continue
            location = metadata.get_location(_store_id(ledger))
            slices.extend(_slices(topic, ledger, first, location, params.slice_bytes))
    return ExportPlan(slices, ledgers, total, skipped, streamed)


def _window(params: ExportParams) -> CreationWindow | None:
    start, end = params.created_from, params.created_to
    if start is None and end is None:
        return None
    return CreationWindow(_epoch_ms(start) if start else 0, _epoch_ms(end) if end else 2**62)


def _epoch_ms(moment: datetime) -> int:
    """Floored to the millisecond in integer arithmetic (no float rounding)."""
    return (moment - EPOCH) // timedelta(milliseconds=1)


def _selected(ledger: Ledger, params: ExportParams, window: CreationWindow | None) -> bool:
    return params.in_range(ledger.ledger_id) and (window is None or window.contains(ledger))


def _store_id(ledger: Ledger) -> int:
    if ledger.store_id is None:
        raise ValueError(
            f"ledger {ledger.topic}/{ledger.ledger_id} names no object store (written "
            "before revision 0002): run `offloader db upgrade`"
        )
    return ledger.store_id


def _slices(
    topic: Topic, ledger: Ledger, first: int, location: StoreLocation, slice_bytes: int
) -> list[ExportSlice]:
    """Entry ranges of about ``slice_bytes`` each, sized by the ledger's mean entry size."""
    assert ledger.data_key is not None and ledger.index_key is not None
    last = ledger.entry_count - 1
    template = ExportSlice(
        topic=topic.name,
        ledger_id=ledger.ledger_id,
        first_entry_id=first,
        last_entry_id=last,
        data_key=ledger.data_key,
        index_key=ledger.index_key,
        ledger_last_entry_id=last,
        store=location,
        created_ms=ledger.created_ms,
    )
    return _cut(template, first, last, _step(ledger, slice_bytes))


def _segment_slices(
    metadata: MetadataStore, topic: Topic, ledger: Ledger, first: int, slice_bytes: int
) -> list[ExportSlice]:
    """A streamed ledger's entries from ``first``, cut piece by piece (one segment each)."""
    pieces = metadata.segments.pieces(topic.name, ledger.ledger_id)
    ranges = [(p.first_entry_id, p.last_entry_id) for p in pieces]
    if not covers(ranges, ledger.entry_count):
        raise ValueError(
            f"ledger {topic.name}/{ledger.ledger_id} is offloaded by streaming, but its "
            f"offloaded segments hold entries {ranges}, not [(0, {ledger.entry_count - 1})]: "
            "run `offloader scrub`"
        )
    step = _step(ledger, slice_bytes)
    out: list[ExportSlice] = []
    for piece in pieces:
        if piece.last_entry_id < first:
            continue
        segment = piece.segment
        template = ExportSlice(
            topic=topic.name,
            ledger_id=ledger.ledger_id,
            first_entry_id=piece.first_entry_id,
            last_entry_id=piece.last_entry_id,
            data_key=segment.data_key,
            index_key=segment.index_key,
            ledger_last_entry_id=piece.last_entry_id,
            store=metadata.get_location(segment.store_id),
            created_ms=ledger.created_ms,
            piece_first_entry_id=piece.first_entry_id,
        )
        out += _cut(template, max(first, piece.first_entry_id), piece.last_entry_id, step)
    return out


def _step(ledger: Ledger, slice_bytes: int) -> int:
    """Entries per slice: about ``slice_bytes`` at the ledger's mean entry size."""
    mean = max(1, ledger.size_bytes // max(1, ledger.entry_count))
    return max(1, slice_bytes // mean)


def _cut(template: ExportSlice, first: int, last: int, step: int) -> list[ExportSlice]:
    return [
        replace(template, first_entry_id=start, last_entry_id=min(start + step - 1, last))
        for start in range(first, last + 1, step)
    ]
