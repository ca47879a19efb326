"""A rewrite's sources, checked: as given (one topic, in position order, no overlap), against
the database (each still the source it was read as: a v1 ledger on the committed attempt
it was read with, a segment at the version it was read at, nothing of them trimmed), and
against the pieces the new segment holds (exactly the entries the sources held, no entry
more or less). A source that moved is a CommitFailedError naming it; a rewrite that could
never be right is a ValueError.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.exceptions import CommitFailedError
from offloader.metadata import schema
from offloader.metadata.records import (
    DeletionState,
    Ledger,
    OffloadMode,
    OffloadState,
    PieceRange,
    Position,
    Segment,
    SegmentState,
)

G, SL, L = schema.segments, schema.pieces, schema.ledgers


def v1_sources(ledgers: Sequence[Ledger]) -> sa.ColumnElement[bool]:
    """The ledgers (of one topic) are still the v1 sources they were read as: each on the
    committed attempt it was read with (attempt ids are never reused), offloaded in those
    objects, live, nothing in flight. Not their version: their hot copies may go meanwhile
    (the routine hot deletion), which changes nothing the swap relies on, and a compare on
    the version made it throw the whole rewrite away."""
    return sa.and_(
        L.c.topic == ledgers[0].topic,
        sa.tuple_(L.c.ledger_id, L.c.offload_uuid).in_(
            [(x.ledger_id, x.offload_attempt_id) for x in ledgers]
        ),
        L.c.offload_state == OffloadState.OFFLOADED,
        L.c.offload_mode == OffloadMode.LEDGER,
        L.c.deletion_state == DeletionState.NONE,
        L.c.attempt_id.is_(None),
    )


def check_ledgers(conn: Connection, ledgers: Sequence[Ledger]) -> None:
    """Every ledger is still the v1 source it was read as (one query); CommitFailedError
    naming the first that is not."""
    for ledger in ledgers:
        if not (ledger.is_offloaded and ledger.offload_mode is OffloadMode.LEDGER):
            raise ValueError(
                f"ledger {ledger.topic}/{ledger.ledger_id} is not offloaded in its own v1 "
                f"objects ({ledger.offload_state}, mode {ledger.offload_mode}): not a v1 source"
            )
    if not ledgers:
        return
    found = set(conn.execute(sa.select(L.c.ledger_id).where(v1_sources(ledgers))).scalars())
    moved = [x for x in ledgers if x.ledger_id not in found]
    if moved:
        raise CommitFailedError(ledger_change(conn, moved[0]))


def ledger_change(conn: Connection, ledger: Ledger) -> str:
    """Why ``ledger`` is no longer the v1 source it was read as."""
    what = f"ledger {ledger.topic}/{ledger.ledger_id}"
    row = conn.execute(
        sa.select(L).where(L.c.topic == ledger.topic, L.c.ledger_id == ledger.ledger_id)
    )
    current = row.mappings().first()
    if current is None:
        return f"{what} does not exist"
    now = Ledger.model_validate(dict(current))
    if not now.is_live:
        why = f"was trimmed ({now.deletion_state})"
    elif now.attempt_id is not None:
        why = f"has offload attempt {now.attempt_id} in flight"
    elif now.offload_mode is not OffloadMode.LEDGER or not now.is_offloaded:
        why = f"is {now.offload_state} in mode {now.offload_mode} (already rewritten?)"
    else:  # the only other way to stop being the source it was read as (v1_sources)
        was = ledger.offload_attempt_id
        why = f"was offloaded again (attempt {now.offload_attempt_id}, was {was})"
    return f"{what} {why}: the rewrite of it is called off"


def check_segment(conn: Connection, segment: Segment) -> None:
    """The source segment is as read (same version, offloaded) and holds no trimmed
    ledger (a deleting ledger's entries are not copied into a new segment)."""
    current = conn.execute(
        sa.select(G.c.version, G.c.state).where(G.c.segment_id == segment.segment_id)
    ).first()
    if current is None or (current[0], current[1]) != (segment.version, SegmentState.OFFLOADED):
        raise CommitFailedError(segment_change(conn, segment))
    trimmed = conn.execute(
        sa.select(SL.c.ledger_id)
        .join(L, sa.and_(L.c.topic == SL.c.topic, L.c.ledger_id == SL.c.ledger_id))
        .where(SL.c.segment_id == segment.segment_id, L.c.deletion_state != DeletionState.NONE)
        .order_by(SL.c.ledger_id)
        .limit(1)
    ).scalar()
    if trimmed is not None:
        raise CommitFailedError(
            f"segment {segment.segment_id} holds trimmed ledger {trimmed}: the rewrite of it "
            "is called off"
        )


def segment_change(conn: Connection, segment: Segment) -> str:
    row = conn.execute(
        sa.select(G.c.version, G.c.state).where(G.c.segment_id == segment.segment_id)
    ).first()
    now = "gone" if row is None else f"{row[1]} at version {row[0]}"
    return (
        f"segment {segment.segment_id} changed since it was read ({segment.state} at version "
        f"{segment.version}, now {now}): the rewrite of it is called off"
    )


def source_spans(
    topic: str, ledgers: Sequence[Ledger], segments: Sequence[Segment]
) -> list[tuple[Position, Position]]:
    """Each source's first and last position, checked: one topic, in position order, no
    overlap."""
    spans: list[tuple[Position, Position]] = []
    for ledger in ledgers:
        if ledger.entry_count < 1:
            raise ValueError(f"ledger {ledger.topic}/{ledger.ledger_id} is empty: not a source")
        first = Position(ledger_id=ledger.ledger_id, entry_id=0)
        spans.append((first, Position(ledger_id=ledger.ledger_id, entry_id=ledger.entry_count - 1)))
    for segment in segments:
        if segment.end is None:
            raise ValueError(f"segment {segment.segment_id} holds no entries: not a source")
        spans.append((segment.begin, segment.end))
    if not spans:
        raise ValueError("a rewrite needs at least one source")
    topics = {x.topic for x in ledgers} | {s.topic for s in segments}
    if topics != {topic}:
        raise ValueError(
            f"a rewrite of topic {topic!r} takes sources of that topic only, got {sorted(topics)}"
        )
    spans.sort()
    for (_, end), (begin, _) in itertools.pairwise(spans):
        if begin <= end:
            raise ValueError(f"sources overlap: one ends at {end}, the next begins at {begin}")
    return spans


def check_pieces(segment: Segment, pieces: Sequence[PieceRange], ledgers: Sequence[Ledger]) -> None:
    if not pieces:
        raise ValueError(f"segment {segment.segment_id}: a committed segment holds entries")
    named = [x.ledger_id for x in ledgers]
    twice = sorted({i for i in named if named.count(i) > 1})
    if twice:
        raise ValueError(f"segment {segment.segment_id}: ledger(s) {twice} named twice as sources")
    held = {(p.ledger_id, p.first, p.last) for p in pieces}
    for ledger in ledgers:
        if (ledger.ledger_id, 0, ledger.entry_count - 1) not in held:
            raise ValueError(
                f"segment {segment.segment_id} does not hold ledger {ledger.ledger_id} whole "
                f"(entries 0..{ledger.entry_count - 1}): the swap would lose entries"
            )
    ids = [p.ledger_id for p in pieces]
    if ids != sorted(set(ids)):
        raise ValueError(
            f"segment {segment.segment_id}: pieces must name rising ledger ids, got {ids}"
        )


def check_merged(
    conn: Connection,
    segment: Segment,
    pieces: Sequence[PieceRange],
    ledgers: Sequence[Ledger],
    segments: Sequence[Segment],
) -> None:
    """The pieces of segment sources are, per ledger, the union of the ranges those
    segments were recorded to hold (a ledger split over two adjacent sources is one
    piece): what the readers found in them before the swap, no entry more or less."""
    if not segments:
        return
    rows = conn.execute(
        sa.select(SL.c.ledger_id, SL.c.first_entry_id, SL.c.last_entry_id)
        .where(SL.c.segment_id.in_([s.segment_id for s in segments]))
        .order_by(SL.c.ledger_id, SL.c.first_entry_id)
    ).all()
    held: dict[int, tuple[int, int]] = {}
    for ledger_id, first, last in rows:
        known = held.get(ledger_id)
        if known is not None and first != known[1] + 1:
            raise ValueError(
                f"segment {segment.segment_id}: the source segments hold ledger {ledger_id} "
                f"with a gap or an overlap at entry {first}: not one run of sources"
            )
        held[ledger_id] = (first if known is None else known[0], last)
    v1 = {x.ledger_id for x in ledgers}
    merged = {p.ledger_id: (p.first, p.last) for p in pieces if p.ledger_id not in v1}
    if merged != held:
        raise ValueError(
            f"segment {segment.segment_id}: its pieces {merged} are not what its source "
            f"segments held {held}: the swap would lose or invent entries"
        )


def describe(ledgers: Sequence[Ledger], segments: Sequence[Segment]) -> str:
    parts = []
    if ledgers:
        ids = [x.ledger_id for x in ledgers]
        parts.append(f"{len(ids)} ledger object(s) {ids[0]}..{ids[-1]}")
    if segments:
        parts.append(f"{len(segments)} segment(s) {', '.join(s.segment_id for s in segments)}")
    return " and ".join(parts)
