"""Rebuilding the metadata from the objects of a store alone: the last resort when the
database and its snapshots are gone (docs/OPERATIONS.md, "Metadata backup, restore and
rebuild").

One listing of the store (the sweep's, the only LIST); every index object of a ledger
(``ledgers.py``) or a segment (``segments.py``) is read and checked against its key, user
metadata and data object; copies of the same entries are resolved, the newest wins; the
rows are written (``rows.py``) in one transaction into an empty database.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy.engine import Engine

from offloader.exceptions import FormatError, ObjectNotFoundError
from offloader.format.topic_start import RecordedStart, decode_start
from offloader.gc.sweep import list_objects
from offloader.keys import (
    parse_ledger_index_key,
    parse_segment_index_key,
    parse_topic_start_key,
    topic_start_key,
)
from offloader.metadata import schema
from offloader.metadata.clock import db_now_ms
from offloader.metadata.locations import record_location
from offloader.metadata.snapshot import ROWS_PER_INSERT, SnapshotError, require_empty
from offloader.objectstore import ObjectStore
from offloader.policy import OffloadPolicy
from offloader.recovery.ledgers import FoundLedger, read_ledger
from offloader.recovery.rows import attempt_row, ledger_row, stream_rows
from offloader.recovery.segments import FoundSegment, read_segment, without_overlaps
from offloader.results import fields_json


@dataclass(frozen=True)
class RebuildResult:
    """What a rebuild recorded, and every object it did not trust or need."""

    topics: list[str]
    ledgers: int  # offloaded ledgers recorded, of both modes
    skipped: list[str]  # index objects (or streamed ledgers) not used, each with the reason
    segments: int = 0  # offloaded streaming segments recorded (those some ledger needs)
    streamed_ledgers: int = 0  # of ``ledgers``, those recorded in stream mode

    def to_json(self) -> dict[str, Any]:
        return fields_json(self)

    def __str__(self) -> str:
        text = f"rebuilt {len(self.topics)} topic(s), {self.ledgers} offloaded ledger(s)"
        if self.skipped:
            skipped = "\n  ".join(self.skipped)
            text += f"; skipped {len(self.skipped)} index object(s):\n  {skipped}"
        return text


def rebuild_from_objects(engine: Engine, store: ObjectStore, location: Any) -> RebuildResult:
    """Topics, their offloaded ledgers and streaming segments from the objects of ``store``.

    Each index object (``<uuid>-ledger-<id>-index``) is read; its metadata record gives the
    topic, ledger id, entry count, length and times, and must agree with the object's user
    metadata; its data object must exist with the length the index states. Of several
    complete copies of one ledger the newest is used; the others stay unreferenced, for
    the sweep. Topics get the default policy (policies live only in the metadata).

    Each segment index (``<uuid>-index``, v2) is read the same way and becomes an offloaded
    segment with its ledger ranges (:func:`.rows.stream_rows`). Copies of the same entries are
    resolved as for ledger objects, the newest wins: a segment overlapping a newer one (the
    sources of a rewrite still waiting out their grace, a zombie's copy) is skipped, and a
    ledger whose pieces in the segments tile entries 0..N with no gap becomes a sealed
    ledger offloaded in stream mode with N + 1 entries, unless its own ledger objects are
    newer than those segments (then they are its offload). A segment that no ledger needs
    any more, every ledger it holds having newer objects of its own (released by a
    migration back to v1 and still waiting out its grace), is skipped too. Every copy not
    taken stays unreferenced, for the sweep. Segments are rebuilt with the origin 'stream'
    (the objects do not say who wrote them): the stream then continues after the last of
    them, or at the topic's start without one, and takes only ledgers not yet offloaded.
    Parts are not rebuilt: only open segments need them, and the objects hold only
    completed ones.

    A topic's start is the one recorded under ``_metadata/starts/`` (a trim or retention
    writes it before it moves the start, offloader/retention/start_record.py) when there
    is one: entries a trim hid inside a kept ledger stay hidden. Without one the start is
    0:0 (only ledgers the objects hold can be read). A record of a topic with no objects
    (deleted, all its objects gone) is reported and not used.
    """
    with engine.connect() as conn:
        require_empty(conn, "rebuild the metadata")
    found: dict[tuple[str, int], FoundLedger] = {}
    segments: list[FoundSegment] = []
    skipped: list[str] = []
    starts: dict[str, RecordedStart] = {}
    for page in list_objects(store):
        for info in page:
            if (start_of := parse_topic_start_key(info.key)) is not None:
                try:
                    starts[start_of] = _read_start(store, info.key, start_of)
                except (ObjectNotFoundError, ValueError) as exc:
                    skipped.append(f"{info.key}: {exc}")
                continue
            modified = int(info.last_modified.timestamp() * 1000) if info.last_modified else 0
            if (segment_id := parse_segment_index_key(info.key)) is not None:
                try:
                    segments.append(read_segment(store, info.key, segment_id, modified))
                except (FormatError, ObjectNotFoundError, SnapshotError, ValueError) as exc:
                    skipped.append(f"{info.key}: {exc}")
                continue
            ledger = parse_ledger_index_key(info.key)
            if ledger is None:
                continue
            try:
                item = read_ledger(store, info.key, *ledger)
            except (FormatError, ObjectNotFoundError, SnapshotError, ValueError) as exc:
                skipped.append(f"{info.key}: {exc}")
                continue
            item = FoundLedger(**{**asdict(item), "offloaded_ms": modified})
            known = found.get((item.topic, item.ledger_id))
            if known is None or known.offloaded_ms < item.offloaded_ms:
                found[(item.topic, item.ledger_id)] = item
    segments = without_overlaps(segments, skipped)
    with engine.begin() as conn:
        require_empty(conn, "rebuild the metadata")
        store_id = record_location(conn, location)
        now = db_now_ms(conn)
        streamed = stream_rows(segments, found, store_id, now, skipped)
        topics = sorted({t for t, _ in found} | {s.topic for s in segments})
        skipped += [
            f"{topic_start_key(t)}: topic {t!r} has no objects here; its start is not used"
            for t in sorted(set(starts) - set(topics))
        ]
        policy = OffloadPolicy().model_dump_json()
        for topic in topics:
            ledgers = [(f.ledger_id, f.created_ms) for (t, _), f in found.items() if t == topic]
            ledgers += [
                (r["ledger_id"], r["created_ms"]) for r in streamed.ledgers if r["topic"] == topic
            ]
            ledgers += [
                (p.ledger_id, s.offloaded_ms)
                for s in segments
                if s.topic == topic
                for p in s.pieces
            ]
            recorded = starts.get(topic)
            start_at = recorded.position if recorded is not None else (0, 0)
            conn.execute(
                schema.topics.insert().values(
                    name=topic,
                    version=1,
                    policy=policy,
                    created_ms=min(created for _, created in ledgers),
                    next_ledger_id=max(max(ledger_id for ledger_id, _ in ledgers) + 1, start_at[0]),
                    writer_epoch=0,
                    start_ledger_id=start_at[0],
                    start_entry_id=start_at[1],
                )
            )
        items = sorted(found.values(), key=lambda f: (f.topic, f.ledger_id))
        for start in range(0, len(items), ROWS_PER_INSERT):
            chunk = items[start : start + ROWS_PER_INSERT]
            conn.execute(schema.ledgers.insert(), [ledger_row(f, store_id, now) for f in chunk])
            conn.execute(
                schema.offload_attempts.insert(), [attempt_row(f, store_id) for f in chunk]
            )
        for table, rows in (
            (schema.ledgers, streamed.ledgers),
            (schema.segments, streamed.segments),
            (schema.pieces, streamed.pieces),
        ):
            for start in range(0, len(rows), ROWS_PER_INSERT):
                conn.execute(table.insert(), rows[start : start + ROWS_PER_INSERT])
    return RebuildResult(
        topics,
        len(found) + len(streamed.ledgers),
        skipped,
        segments=len(streamed.segments),
        streamed_ledgers=len(streamed.ledgers),
    )


def _read_start(store: ObjectStore, key: str, topic: str) -> RecordedStart:
    """The start recorded at ``key``; ValueError unless it names the topic its key does."""
    start = decode_start(store.get(key))
    if start.topic != topic:
        raise ValueError(f"records the start of topic {start.topic!r}, its key names {topic!r}")
    return start
