"""The export's plan, made by the Spark driver from the metadata store alone: which offloaded
ledgers, cut into entry ranges ("slices") of about ``slice_bytes`` so the work spreads over
executors. A slice carries everything an executor needs to read it (keys, the recorded store,
the ledger's last entry): executors never open the metadata database.

Slices are cut by entry id at the ledger's mean entry size, not at chunk boundaries: those
are in each ledger's index, one GET per ledger on the driver before any work is spread.
A boundary inside a chunk costs that one chunk (about a read buffer) read by two tasks.

Ledgers offloaded by streaming (``offload_mode`` stream) have no objects of their own: their
entries are spread over segments, which a slice (one data and one v1 index object, read
whole-ledger by the executor's reader) cannot name. They are not exported yet: the plan
lists them under ``streamed_not_exported`` (and logs a warning), so a run says what it left
out instead of failing on them."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from offloader.bulk.params import ExportParams
from offloader.exceptions import TopicDeletedError
from offloader.metadata import Ledger, MetadataStore, Topic
from offloader.metadata.records import OffloadMode
from offloader.objectstore.location import StoreLocation
from offloader.offload.planner import CreationWindow

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STREAMED_NOTE = (
    "offloaded by streaming (their entries are in segments): bulk export reads ledger "
    "objects only and leaves them out; `offloader read` reads them"
)


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

    @property
    def entries(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    @property
    def path(self) -> str:
        """The slice's Parquet file, partitioned by topic and ledger (Hive style; the topic
        percent-encoded, so any topic name is one safe path segment)."""
        return (
            f"topic={quote(self.topic, safe='')}/ledger_id={self.ledger_id}/"
            f"part-{self.first_entry_id:020d}-{self.last_entry_id:020d}.parquet"
        )


@dataclass(frozen=True)
class ExportPlan:
    slices: list[ExportSlice]
    ledgers: int  # offloaded ledgers selected
    bytes: int  # their payload bytes (estimate of what is read)
    not_offloaded: list[tuple[str, int]] = field(default_factory=list)  # selected, hot only
    # selected and offloaded, but by streaming: left out (module docstring)
    streamed: list[tuple[str, int]] = field(default_factory=list)

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.slices)

    def summary(self) -> dict[str, object]:
        return {
            "ledgers": self.ledgers,
            "slices": len(self.slices),
            "entries": self.entries,
            "bytes": self.bytes,
            "not_offloaded": [f"{t}/{ledger}" for t, ledger in self.not_offloaded],
            "streamed_not_exported": [f"{t}/{ledger}" for t, ledger in self.streamed],
            **({"streamed_note": STREAMED_NOTE} if self.streamed else {}),
        }


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
            if ledger.offload_mode is OffloadMode.STREAM:
                streamed.append((topic.name, ledger.ledger_id))
                continue
            ledgers += 1
            total += ledger.size_bytes
            location = metadata.get_store(_store_id(ledger))
            slices.extend(_slices(topic, ledger, first, location, params.slice_bytes))
    if streamed:
        shown = ", ".join(f"{t}/{ledger}" for t, ledger in streamed[:10])
        more = f" and {len(streamed) - 10} more" if len(streamed) > 10 else ""
        log.warning(
            "export leaves out %d ledger(s) %s: %s%s", len(streamed), STREAMED_NOTE, shown, more
        )
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
    if params.first_ledger is not None and ledger.ledger_id < params.first_ledger:
        return False
    if params.last_ledger is not None and ledger.ledger_id > params.last_ledger:
        return False
    return window is None or window.contains(ledger)


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
    mean = max(1, ledger.size_bytes // max(1, ledger.entry_count))
    step = max(1, slice_bytes // mean)
    return [
        ExportSlice(
            topic=topic.name,
            ledger_id=ledger.ledger_id,
            first_entry_id=start,
            last_entry_id=min(start + step - 1, last),
            data_key=ledger.data_key,
            index_key=ledger.index_key,
            ledger_last_entry_id=last,
            store=location,
            created_ms=ledger.created_ms,
        )
        for start in range(first, last + 1, step)
    ]
