"""Rewrites' metadata (compaction, v1 -> v2 format migration): one rewrite segment from its
intent to the swap of its sources.

A rewrite writes one v2 segment (``origin`` 'rewrite') from a run of adjacent sources of
one topic: ledgers offloaded as v1 objects, or offloaded segments. As every state
machine of the metadata store, each step is a compare-and-set inside one transaction:

1. :meth:`RewriteStore.begin` records the intent before the first byte is uploaded
   (invariant 1): an ``assigned`` segment row with its keys, store, owner and a lease on
   the database's clock; the sources are checked first and nothing is written if one is
   no longer as planned;
2. :meth:`~RewriteStore.record_upload` records the multipart upload, so the upload of a
   run that died can be aborted; :meth:`~RewriteStore.renew` keeps the lease while parts
   upload. Once the lease has run out the run has lost its segment (invariant 6): it can
   no longer record, renew or commit, and :meth:`~RewriteStore.recover_stale` fails it;
3. :meth:`~RewriteStore.commit` swaps, in ONE transaction: the segment becomes offloaded
   with its ``segment_ledgers``; every source ledger becomes stream mode (its entries are
   now the segment's, it keeps no keys of its own) and its committed attempt superseded;
   every source segment becomes deleted. The old keys are queued for deletion after a
   grace, so a reader that looked them up before the swap still finds them. A source that
   moved meanwhile (trimmed, replaced, rewritten by someone else) rolls the whole swap
   back with a CommitFailedError naming it (invariant 2);
4. :meth:`~RewriteStore.fail` gives a rewrite up: its keys are queued at once (nobody ever
   read them) and its upload is returned for the caller to abort.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader import failpoints
from offloader.exceptions import CommitFailedError, TopicDeletedError
from offloader.metadata import schema
from offloader.metadata._rows import next_seq, read_segment, read_topic
from offloader.metadata.clock import db_now
from offloader.metadata.deletions import queue_keys, queue_rows
from offloader.metadata.engine import Database
from offloader.metadata.pieces import record_pieces
from offloader.metadata.records import (
    AttemptState,
    DeletionState,
    Ledger,
    OffloadMode,
    OffloadState,
    PieceRange,
    Position,
    Segment,
    SegmentOrigin,
    SegmentState,
)

G, SL, L, A = schema.segments, schema.segment_ledgers, schema.ledgers, schema.offload_attempts
REWRITE = G.c.origin == SegmentOrigin.REWRITE


class RewriteStore:
    """The rewrite half of the metadata store (``metadata.rewrites``); shares its engine,
    clock and deletion queue (metadata/deletions.py)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- reads ------------------------------------------------------------------------
    def open_rewrites(self, topic: str | None = None) -> list[Segment]:
        """Rewrite segments being written (assigned), oldest first."""
        query = sa.select(G).where(REWRITE, G.c.state == SegmentState.ASSIGNED)
        if topic is not None:
            query = query.where(G.c.topic == topic)
        with self.db.engine.connect() as conn:
            rows = conn.execute(query.order_by(G.c.assigned_ms, G.c.segment_id)).mappings()
            return [Segment.model_validate(dict(r)) for r in rows]

    # --- the rewrite's life ----------------------------------------------------------
    def begin(
        self,
        topic: str,
        *,
        segment_id: str,
        data_key: str,
        index_key: str,
        store_id: int,
        owner: str,
        lease_ms: int,
        ledgers: Sequence[Ledger] = (),
        segments: Sequence[Segment] = (),
    ) -> Segment:
        """Record a rewrite segment of ``ledgers`` (v1 sources) or ``segments`` before its
        upload starts (invariant 1). Every source must still be as it was read (same
        version, offloaded; a ledger in its own v1 objects, live, no attempt in flight):
        otherwise CommitFailedError names it and nothing is written."""
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
        spans = _spans(topic, ledgers, segments)
        with self.db.transaction() as conn:
            current = read_topic(conn, topic)  # NotFoundError for an unknown topic
            if current.is_deleted:
                raise TopicDeletedError(f"topic {topic!r} was deleted: nothing to rewrite")
            _check_ledgers(conn, ledgers)
            for segment in segments:
                _check_segment(conn, segment)
            conn.execute(
                G.insert().values(
                    segment_id=segment_id,
                    topic=topic,
                    seq=next_seq(conn, topic),
                    version=1,
                    state=SegmentState.ASSIGNED,
                    epoch=0,  # no stream epoch: a rewrite is fenced by its lease
                    assigned_ms=db_now(),
                    detail=f"rewrite by {owner} of {_describe(ledgers, segments)}"[:2000],
                    begin_ledger_id=spans[0][0].ledger_id,
                    begin_entry_id=spans[0][0].entry_id,
                    planned_end_ledger_id=spans[-1][1].ledger_id,
                    planned_end_entry_id=spans[-1][1].entry_id,
                    data_key=data_key,
                    index_key=index_key,
                    store_id=store_id,
                    data_len=0,
                    origin=SegmentOrigin.REWRITE,
                    lease_until_ms=db_now() + lease_ms,
                )
            )
            return read_segment(conn, segment_id)

    def record_upload(self, segment: Segment, upload_id: str) -> Segment:
        """The multipart upload the segment's parts go to (created after begin)."""
        with self.db.transaction() as conn:
            _cas_open(conn, segment, upload_id=upload_id)
            return read_segment(conn, segment.segment_id)

    def renew(self, segment: Segment, lease_ms: int) -> bool:
        """Extend the lease from the database's now; False once the segment is no longer
        open or its lease already ran out (then the run has lost it)."""
        with self.db.transaction() as conn:
            result = conn.execute(
                G.update()
                .where(_owned(segment.segment_id))
                .values(lease_until_ms=db_now() + lease_ms)
            )
            return result.rowcount == 1

    def commit(
        self,
        segment: Segment,
        pieces: Sequence[PieceRange],
        ledgers: Sequence[Ledger] = (),
        segments: Sequence[Segment] = (),
        *,
        data_len: int,
        grace_ms: int = 0,
    ) -> Segment:
        """Swap the sources onto ``segment`` (complete: data object and index written),
        all in one transaction; the old keys are queued due ``grace_ms`` later.

        ``pieces`` are the ledger ranges the segment holds: a v1 source whole, and for
        segment sources exactly the ranges they were recorded to hold (ValueError
        otherwise: the swap would lose or invent entries). CommitFailedError (the
        transaction rolled back) names the segment or the source that is no longer as
        read; the caller then fails the rewrite."""
        _check_pieces(segment, pieces, ledgers)
        if data_len <= 0:
            raise ValueError(f"segment {segment.segment_id}: a committed segment holds bytes")
        reason = f"rewritten into segment {segment.segment_id}"
        last = pieces[-1]
        with self.db.transaction() as conn:
            _cas_open(
                conn,
                segment,
                state=SegmentState.OFFLOADED,
                offloaded_ms=db_now(),
                end_ledger_id=last.ledger_id,
                end_entry_id=last.last,
                data_len=data_len,
                lease_until_ms=None,
            )
            _check_merged(conn, segment, pieces, ledgers, segments)
            if ledgers:
                self._swap_ledgers(conn, ledgers, reason, grace_ms)
                failpoints.reach("mid-rewrite-commit")
            for i, source in enumerate(segments):
                self._retire_segment(conn, source, reason, grace_ms)
                if i == 0 and not ledgers:
                    failpoints.reach("mid-rewrite-commit")
            record_pieces(conn, segment, pieces)
            return read_segment(conn, segment.segment_id)

    def fail(self, segment: Segment, detail: str) -> Segment:
        """Give the rewrite up: failed, its keys queued at once (no reader ever used them).
        A rewrite already failed (recovered after its lease ran out) has its keys queued
        again: its run may have written after they were deleted. Returns the segment as it
        now is; the caller aborts its upload. CommitFailedError if it was committed."""
        with self.db.transaction() as conn:
            result = conn.execute(
                G.update()
                .where(
                    G.c.segment_id == segment.segment_id,
                    REWRITE,
                    G.c.state == SegmentState.ASSIGNED,
                )
                .values(
                    version=G.c.version + 1,
                    state=SegmentState.FAILED,
                    finished_ms=db_now(),
                    detail=detail[:2000],
                )
            )
            current = read_segment(conn, segment.segment_id)
            if result.rowcount == 1:
                reason = "failed rewrite"
            elif current.state is SegmentState.FAILED:
                reason = "late objects of a failed rewrite"
            else:
                raise CommitFailedError(
                    f"rewrite segment {segment.segment_id} is {current.state}: nothing to fail"
                )
            self._queue(conn, current, reason, 0)
            return current

    def recover_stale(self) -> list[Segment]:
        """Fail every rewrite whose lease ran out on the database's clock (its run died or
        froze), queueing its keys; returns them so the caller aborts their uploads."""
        stale = sa.and_(REWRITE, G.c.state == SegmentState.ASSIGNED, G.c.lease_until_ms <= db_now())
        with self.db.transaction() as conn:
            rows = (
                conn.execute(
                    G.update()
                    .where(stale)
                    .values(
                        version=G.c.version + 1,
                        state=SegmentState.FAILED,
                        finished_ms=db_now(),
                        detail=sa.func.coalesce(G.c.detail, "")
                        + "; its lease ran out (database clock): recovered",
                    )
                    .returning(*G.c)
                )
                .mappings()
                .all()
            )
            failed = sorted(
                (Segment.model_validate(dict(r)) for r in rows), key=lambda s: s.segment_id
            )
            for segment in failed:
                self._queue(conn, segment, "failed rewrite (lease ran out)", 0)
            return failed

    # --- helpers ---------------------------------------------------------------------
    def _swap_ledgers(
        self, conn: Connection, ledgers: Sequence[Ledger], reason: str, grace_ms: int
    ) -> None:
        """The v1 sources become stream mode: their entries are the new segment's from
        here. Set-based (a few statements however many ledgers), each ledger still a
        compare-and-set on its committed attempt and state (``_v1_sources``)."""
        _check_ledgers(conn, ledgers)  # names the first one that moved
        result = conn.execute(
            L.update()
            .where(_v1_sources(ledgers))
            .values(
                version=L.c.version + 1,
                offload_mode=OffloadMode.STREAM,
                offload_uuid=None,
                data_key=None,
                index_key=None,
                data_len=None,
                store_id=None,
            )
        )
        if result.rowcount != len(ledgers):  # moved between the check and the update
            raise CommitFailedError(
                f"source ledgers of {ledgers[0].topic} changed: {reason} is off"
            )
        rows = [
            dict(
                object_key=key,
                reason=reason,
                attempt_id=x.offload_uuid,
                state="pending",
                tries=0,
                store_id=x.store_id,
            )
            for x in ledgers
            for key in (x.data_key, x.index_key)
            if key is not None
        ]
        queue_rows(conn, rows, grace_ms)
        conn.execute(
            A.update()
            .where(
                A.c.attempt_id.in_([x.offload_uuid for x in ledgers]),
                A.c.state == AttemptState.COMMITTED,
            )
            .values(state=AttemptState.SUPERSEDED, detail=reason)
        )

    def _retire_segment(
        self, conn: Connection, segment: Segment, reason: str, grace_ms: int
    ) -> None:
        """A source segment becomes deleted: its ledgers' entries are the new segment's."""
        _check_segment(conn, segment)  # its ledgers still live
        result = conn.execute(
            G.update()
            .where(
                G.c.segment_id == segment.segment_id,
                G.c.version == segment.version,
                G.c.state == SegmentState.OFFLOADED,
            )
            .values(
                version=G.c.version + 1,
                state=SegmentState.DELETED,
                finished_ms=db_now(),
                detail=reason,
            )
        )
        if result.rowcount != 1:
            raise CommitFailedError(_segment_change(conn, segment))
        self._queue(conn, segment, reason, grace_ms)

    def _queue(self, conn: Connection, segment: Segment, reason: str, delay_ms: int) -> None:
        keys = [segment.data_key, segment.index_key]
        queue_keys(conn, keys, reason, None, segment.store_id, delay_ms)


# --- conditions and checks ---------------------------------------------------------------
def _owned(segment_id: str) -> sa.ColumnElement[bool]:
    """The rewrite segment is still being written by its run: open, lease not over."""
    return sa.and_(
        G.c.segment_id == segment_id,
        REWRITE,
        G.c.state == SegmentState.ASSIGNED,
        G.c.lease_until_ms > db_now(),
    )


def _cas_open(conn: Connection, segment: Segment, **values: object) -> None:
    """CAS on an open rewrite segment at its version whose lease has not run out."""
    result = conn.execute(
        G.update()
        .where(_owned(segment.segment_id), G.c.version == segment.version)
        .values(version=G.c.version + 1, **values)
    )
    if result.rowcount == 1:
        return
    current = read_segment(conn, segment.segment_id)
    if current.state is not SegmentState.ASSIGNED or current.origin is not SegmentOrigin.REWRITE:
        why = f"is {current.origin} segment {current.state}"
    elif current.version != segment.version:
        why = f"changed since version {segment.version}"
    else:
        why = f"lost its lease (it ran out at {current.lease_until_ms} ms, database clock)"
    raise CommitFailedError(f"rewrite segment {segment.segment_id} {why}: this run commits nothing")


def _v1_sources(ledgers: Sequence[Ledger]) -> sa.ColumnElement[bool]:
    """The ledgers (of one topic) are still the v1 sources they were read as: each on the
    committed attempt it was read with (attempt ids are never reused), offloaded in those
    objects, live, nothing in flight. Not their version: their hot copies may go meanwhile
    (the routine hot deletion), which changes nothing the swap relies on, and a compare on
    the version made it throw the whole rewrite away."""
    return sa.and_(
        L.c.topic == ledgers[0].topic,
        sa.tuple_(L.c.ledger_id, L.c.offload_uuid).in_(
            [(x.ledger_id, x.offload_uuid) for x in ledgers]
        ),
        L.c.offload_state == OffloadState.OFFLOADED,
        L.c.offload_mode == OffloadMode.LEDGER,
        L.c.deletion_state == DeletionState.NONE,
        L.c.attempt_id.is_(None),
    )


def _check_ledgers(conn: Connection, ledgers: Sequence[Ledger]) -> None:
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
    found = set(conn.execute(sa.select(L.c.ledger_id).where(_v1_sources(ledgers))).scalars())
    moved = [x for x in ledgers if x.ledger_id not in found]
    if moved:
        raise CommitFailedError(_ledger_change(conn, moved[0]))


def _ledger_change(conn: Connection, ledger: Ledger) -> str:
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
    else:  # the only other way to stop being the source it was read as (_v1_sources)
        why = f"was offloaded again (attempt {now.offload_uuid}, was {ledger.offload_uuid})"
    return f"{what} {why}: the rewrite of it is called off"


def _check_segment(conn: Connection, segment: Segment) -> None:
    """The source segment is as read (same version, offloaded) and holds no trimmed
    ledger (a deleting ledger's entries are not copied into a new segment)."""
    current = conn.execute(
        sa.select(G.c.version, G.c.state).where(G.c.segment_id == segment.segment_id)
    ).first()
    if current is None or (current[0], current[1]) != (segment.version, SegmentState.OFFLOADED):
        raise CommitFailedError(_segment_change(conn, segment))
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


def _segment_change(conn: Connection, segment: Segment) -> str:
    row = conn.execute(
        sa.select(G.c.version, G.c.state).where(G.c.segment_id == segment.segment_id)
    ).first()
    now = "gone" if row is None else f"{row[1]} at version {row[0]}"
    return (
        f"segment {segment.segment_id} changed since it was read ({segment.state} at version "
        f"{segment.version}, now {now}): the rewrite of it is called off"
    )


def _spans(
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


def _check_pieces(
    segment: Segment, pieces: Sequence[PieceRange], ledgers: Sequence[Ledger]
) -> None:
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


def _check_merged(
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


def _describe(ledgers: Sequence[Ledger], segments: Sequence[Segment]) -> str:
    parts = []
    if ledgers:
        ids = [x.ledger_id for x in ledgers]
        parts.append(f"{len(ids)} ledger object(s) {ids[0]}..{ids[-1]}")
    if segments:
        parts.append(f"{len(segments)} segment(s) {', '.join(s.segment_id for s in segments)}")
    return " and ".join(parts)
