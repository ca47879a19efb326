"""Streaming offload's metadata (PIP-76): a topic's segments and their parts.

A pass holds the topic's stream (metadata/streams.py: every commit here is fenced by its
epoch). Segments are recorded before their upload starts (invariant 1), their parts as
each is uploaded (a pass that dies is resumed after the last recorded part), and they move
Assigned -> Closing -> Offloaded by compare-and-set on their version (invariant 2). A
committed segment records the pieces of ledgers it holds; which ledgers that settles and
when a segment is released follow from them (metadata/pieces.py).

Rewrites (compaction, format migration: metadata/rewrites.py) write segments too, with
``origin`` 'rewrite'. Everything here that asks where the stream stands (its open
segment, where it continues) looks at the stream's own segments only (:data:`STREAM`): a
rewrite segment is never the stream's open segment and never moves where it continues.
Reads, settling and release look at every offloaded segment, whoever wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.exceptions import CommitFailedError
from offloader.metadata import schema
from offloader.metadata._rows import next_seq, read_segment
from offloader.metadata.clock import db_now
from offloader.metadata.deletions import queue_keys
from offloader.metadata.engine import Database
from offloader.metadata.pieces import pieces_query, record_pieces, settle, settle_topic
from offloader.metadata.records import (
    Piece,
    PieceRange,
    Position,
    Segment,
    SegmentOrigin,
    SegmentPart,
    SegmentState,
    StreamClaim,
)
from offloader.metadata.streams import claim_stream, fence, release_stream

G, P, SL = schema.segments, schema.segment_parts, schema.pieces

OPEN_STATES = (SegmentState.ASSIGNED, SegmentState.CLOSING)
STREAM = G.c.origin == SegmentOrigin.STREAM  # the stream's own segments, not rewrites'
_COMMITTED = (SegmentState.OFFLOADED, SegmentState.DELETED)


class SegmentStore:
    """The streaming half of the metadata store (``metadata.segments``)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- the stream: claim, fence, release (metadata/streams.py) ------------------------
    def claim(self, topic: str, owner: str, lease_ms: int) -> StreamClaim:
        """Take the topic's stream with a new epoch, unless a pass holds a live lease
        (StreamBusyError naming it). The previous holder is fenced from here on."""
        with self.db.transaction() as conn:
            return claim_stream(conn, topic, owner, lease_ms)

    def renew(self, claim: StreamClaim) -> None:
        """Extend the lease; StreamFencedError once a newer pass took the stream."""
        with self.db.transaction() as conn:
            fence(conn, claim)

    def release(self, claim: StreamClaim) -> bool:
        """Let the next pass start at once; False if the claim was already fenced."""
        with self.db.transaction() as conn:
            return release_stream(conn, claim)

    # --- reads ---------------------------------------------------------------------------
    def get(self, segment_id: str) -> Segment:
        with self.db.engine.connect() as conn:
            return read_segment(conn, segment_id)

    def of_topic(self, topic: str, states: Iterable[SegmentState] | None = None) -> list[Segment]:
        """The segments of ``topic`` (only those in ``states`` if given), in sequence order."""
        query = sa.select(G).where(G.c.topic == topic)
        if states is not None:
            query = query.where(G.c.state.in_(list(states)))
        with self.db.engine.connect() as conn:
            rows = conn.execute(query.order_by(G.c.seq)).mappings()
            return [Segment.model_validate(dict(r)) for r in rows]

    def topics_with_open_segments(self) -> list[str]:
        """Topics whose newest segment is open: a pass must complete it even when the
        topic's policy no longer streams."""
        with self.db.engine.connect() as conn:
            rows = conn.execute(
                sa.select(G.c.topic).where(G.c.state.in_(OPEN_STATES), STREAM).distinct()
            ).scalars()
            return sorted(rows)

    def current(self, topic: str) -> Segment | None:
        """The stream's newest segment if it is not offloaded (open, or failed and waiting
        to be replaced); None when the next pass assigns a fresh one."""
        with self.db.engine.connect() as conn:
            newest = _newest(conn, topic)
        if newest is None or newest.state in (SegmentState.OFFLOADED, SegmentState.DELETED):
            return None
        return newest

    def last_offloaded_end(self, topic: str) -> Position | None:
        """Where the stream's newest committed segment ends: it continues after it."""
        with self.db.engine.connect() as conn:
            return _last_committed_end(conn, topic)

    def parts(self, segment: Segment) -> list[SegmentPart]:
        with self.db.engine.connect() as conn:
            rows = conn.execute(
                sa.select(P).where(P.c.segment_id == segment.segment_id).order_by(P.c.part_number)
            ).mappings()
            return [SegmentPart.model_validate(dict(r)) for r in rows]

    def pieces(self, topic: str, ledger_id: int) -> list[Piece]:
        """Where a streamed ledger's entries are: its ranges in offloaded segments, in
        entry order."""
        query = pieces_query(topic, ledger_id, G, SL.c.first_entry_id, SL.c.last_entry_id)
        with self.db.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        segment_columns = set(G.c.keys())
        return [
            Piece(
                segment=Segment.model_validate({k: r[k] for k in segment_columns}),
                ledger_id=ledger_id,
                first_entry_id=r["first_entry_id"],
                last_entry_id=r["last_entry_id"],
            )
            for r in rows
        ]

    def offloaded_pieces(self, topic: str) -> dict[str, list[PieceRange]]:
        """The ledger ranges of every offloaded segment of ``topic``, by segment id."""
        query = (
            sa.select(SL.c.segment_id, SL.c.ledger_id, SL.c.first_entry_id, SL.c.last_entry_id)
            .join(G, G.c.segment_id == SL.c.segment_id)
            .where(SL.c.topic == topic, G.c.state == SegmentState.OFFLOADED)
            .order_by(SL.c.segment_id, SL.c.ledger_id)
        )
        pieces: dict[str, list[PieceRange]] = {}
        with self.db.engine.connect() as conn:
            for segment_id, ledger_id, first, last in conn.execute(query):
                pieces.setdefault(segment_id, []).append(PieceRange(ledger_id, first, last))
        return pieces

    # --- the segment's life --------------------------------------------------------------
    def assign(
        self,
        claim: StreamClaim,
        *,
        segment_id: str,
        data_key: str,
        index_key: str,
        store_id: int,
        begin: Position,
        planned_end: Position | None = None,
    ) -> Segment:
        """Record a new segment's keys and store before its upload starts (invariant 1).

        Refused while the topic has an open segment; a failed one is marked replaced
        here, in the same transaction. ``begin`` must lie after every committed segment
        (no entry offloaded twice by the stream)."""
        if planned_end is not None and planned_end < begin:
            raise ValueError(f"planned end {planned_end} is before the segment's begin {begin}")
        with self.db.transaction() as conn:
            fence(conn, claim)
            newest = _newest(conn, claim.topic)
            replaces = None
            if newest is not None and newest.is_open:
                raise CommitFailedError(
                    f"topic {claim.topic!r} has open segment {newest.segment_id} "
                    f"({newest.state}): it is resumed, not replaced"
                )
            if newest is not None and newest.state is SegmentState.FAILED:
                replaces = newest.segment_id
                _cas_segment(
                    conn,
                    newest,
                    SegmentState.FAILED,
                    state=SegmentState.REPLACED,
                    detail=(newest.detail or "") + f"; replaced by {segment_id}",
                )
            last_end = _last_committed_end(conn, claim.topic)
            if last_end is not None and begin <= last_end:
                raise CommitFailedError(
                    f"segment of {claim.topic!r} cannot begin at {begin}: the stream's "
                    f"offloaded segments reach {last_end}"
                )
            conn.execute(
                G.insert().values(
                    segment_id=segment_id,
                    topic=claim.topic,
                    seq=next_seq(conn, claim.topic),
                    version=1,
                    state=SegmentState.ASSIGNED,
                    epoch=claim.epoch,
                    assigned_ms=db_now(),
                    begin_ledger_id=begin.ledger_id,
                    begin_entry_id=begin.entry_id,
                    planned_end_ledger_id=None if planned_end is None else planned_end.ledger_id,
                    planned_end_entry_id=None if planned_end is None else planned_end.entry_id,
                    data_key=data_key,
                    index_key=index_key,
                    store_id=store_id,
                    data_len=0,
                    replaces=replaces,
                )
            )
            return read_segment(conn, segment_id)

    def record_upload(self, claim: StreamClaim, segment: Segment, upload_id: str) -> Segment:
        """The multipart upload the segment's parts go to (created after assign)."""
        with self.db.transaction() as conn:
            fence(conn, claim)
            _cas_segment(conn, segment, SegmentState.ASSIGNED, upload_id=upload_id)
            return read_segment(conn, segment.segment_id)

    def record_part(
        self,
        claim: StreamClaim,
        segment: Segment,
        *,
        part_number: int,
        etag: str,
        offset: int,
        length: int,
        last: Position,
        blocks: str,
    ) -> Segment:
        """Record an uploaded part: the segment grows to ``offset + length`` bytes and ends
        at ``last``. Parts are contiguous: the part must start where the last one ended."""
        if offset != segment.data_len:
            raise ValueError(
                f"part {part_number} of segment {segment.segment_id} starts at {offset}, "
                f"the recorded parts end at {segment.data_len}"
            )
        if segment.end is not None and last <= segment.end:
            raise ValueError(
                f"part {part_number} of segment {segment.segment_id} ends at {last}, "
                f"not after the recorded end {segment.end}"
            )
        with self.db.transaction() as conn:
            fence(conn, claim)
            _cas_segment(
                conn,
                segment,
                SegmentState.ASSIGNED,
                end_ledger_id=last.ledger_id,
                end_entry_id=last.entry_id,
                data_len=offset + length,
            )
            conn.execute(
                P.insert().values(
                    segment_id=segment.segment_id,
                    part_number=part_number,
                    etag=etag,
                    offset=offset,
                    length=length,
                    last_ledger_id=last.ledger_id,
                    last_entry_id=last.entry_id,
                    blocks=blocks,
                    created_ms=db_now(),
                )
            )
            return read_segment(conn, segment.segment_id)

    def begin_close(self, claim: StreamClaim, segment: Segment) -> Segment:
        """No more parts: the recorded ones are what the upload is completed with."""
        if segment.end is None:
            raise ValueError(f"segment {segment.segment_id} has no part: nothing to close")
        with self.db.transaction() as conn:
            fence(conn, claim)
            _cas_segment(conn, segment, SegmentState.ASSIGNED, state=SegmentState.CLOSING)
            return read_segment(conn, segment.segment_id)

    def commit(self, claim: StreamClaim, segment: Segment, pieces: Sequence[PieceRange]) -> Segment:
        """Closing -> Offloaded once the data object and index exist; records which
        entries of which ledgers it holds and settles the ledgers it completes."""
        if not pieces:
            raise ValueError(f"segment {segment.segment_id}: a committed segment holds entries")
        with self.db.transaction() as conn:
            fence(conn, claim)
            _cas_segment(
                conn,
                segment,
                SegmentState.CLOSING,
                state=SegmentState.OFFLOADED,
                offloaded_ms=db_now(),
            )
            record_pieces(conn, segment, pieces)
            settle(conn, segment.topic, [p.ledger_id for p in pieces])
            return read_segment(conn, segment.segment_id)

    def fail(self, claim: StreamClaim, segment: Segment, detail: str) -> Segment:
        """An open segment whose upload cannot be completed: its keys are queued for
        deletion (a data object may exist) and the next segment replaces it from its
        begin; its multipart upload is no longer referenced, so the sweep aborts it."""
        with self.db.transaction() as conn:
            fence(conn, claim)
            current = read_segment(conn, segment.segment_id)
            if current.version != segment.version or not current.is_open:
                raise CommitFailedError(
                    f"segment {segment.segment_id} changed since version {segment.version}"
                )
            _cas_segment(
                conn,
                segment,
                current.state,
                state=SegmentState.FAILED,
                finished_ms=db_now(),
                detail=detail[:2000],
            )
            queue_keys(
                conn,
                [segment.data_key, segment.index_key],
                "failed segment",
                None,
                segment.store_id,
            )
            return read_segment(conn, segment.segment_id)

    def settle_ledgers(self, topic: str) -> list[int]:
        """Mark offloaded (stream mode) the ledgers sealed since their last segment was
        committed whose every entry is in offloaded segments; returns their ids."""
        with self.db.transaction() as conn:
            return settle_topic(conn, topic)


def _cas_segment(
    conn: Connection, segment: Segment, expected: SegmentState, **values: object
) -> None:
    result = conn.execute(
        G.update()
        .where(
            G.c.segment_id == segment.segment_id,
            G.c.version == segment.version,
            G.c.state == expected,
        )
        .values(version=G.c.version + 1, **values)
    )
    if result.rowcount != 1:
        raise CommitFailedError(
            f"segment {segment.segment_id} is no longer {expected} at version {segment.version}: "
            "someone else moved"
        )


def _newest(conn: Connection, topic: str) -> Segment | None:
    """The stream's newest segment (rewrites' segments are not the stream's)."""
    row = (
        conn.execute(
            sa.select(G).where(G.c.topic == topic, STREAM).order_by(G.c.seq.desc()).limit(1)
        )
        .mappings()
        .first()
    )
    return None if row is None else Segment.model_validate(dict(row))


def _last_committed_end(conn: Connection, topic: str) -> Position | None:
    """Where the stream's newest committed segment ends; a stream segment a rewrite merged
    away is ``deleted`` and still counts (the stream wrote it)."""
    row = conn.execute(
        sa.select(G.c.end_ledger_id, G.c.end_entry_id)
        .where(G.c.topic == topic, G.c.state.in_(_COMMITTED), STREAM)
        .order_by(G.c.seq.desc())
        .limit(1)
    ).first()
    return None if row is None else Position(ledger_id=row[0], entry_id=row[1])
