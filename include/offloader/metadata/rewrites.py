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
    Ledger,
    OffloadMode,
    PieceRange,
    Segment,
    SegmentOrigin,
    SegmentState,
)
from offloader.metadata.rewrite_sources import (
    check_ledgers,
    check_merged,
    check_pieces,
    check_segment,
    describe,
    segment_change,
    source_spans,
    v1_sources,
)

G, SL, L, A = schema.segments, schema.pieces, schema.ledgers, schema.offload_attempts
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
        spans = source_spans(topic, ledgers, segments)
        with self.db.transaction() as conn:
            current = read_topic(conn, topic)  # NotFoundError for an unknown topic
            if current.is_deleted:
                raise TopicDeletedError(f"topic {topic!r} was deleted: nothing to rewrite")
            check_ledgers(conn, ledgers)
            for segment in segments:
                check_segment(conn, segment)
            conn.execute(
                G.insert().values(
                    segment_id=segment_id,
                    topic=topic,
                    seq=next_seq(conn, topic),
                    version=1,
                    state=SegmentState.ASSIGNED,
                    epoch=0,  # no stream epoch: a rewrite is fenced by its lease
                    assigned_ms=db_now(),
                    detail=f"rewrite by {owner} of {describe(ledgers, segments)}"[:2000],
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
        check_pieces(segment, pieces, ledgers)
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
            check_merged(conn, segment, pieces, ledgers, segments)
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
        compare-and-set on its committed attempt and state (``v1_sources``)."""
        check_ledgers(conn, ledgers)  # names the first one that moved
        result = conn.execute(
            L.update()
            .where(v1_sources(ledgers))
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
                attempt_id=x.offload_attempt_id,
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
                A.c.attempt_id.in_([x.offload_attempt_id for x in ledgers]),
                A.c.state == AttemptState.COMMITTED,
            )
            .values(state=AttemptState.SUPERSEDED, detail=reason)
        )

    def _retire_segment(
        self, conn: Connection, segment: Segment, reason: str, grace_ms: int
    ) -> None:
        """A source segment becomes deleted: its ledgers' entries are the new segment's."""
        check_segment(conn, segment)  # its ledgers still live
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
            raise CommitFailedError(segment_change(conn, segment))
        self._queue(conn, segment, reason, grace_ms)

    def _queue(self, conn: Connection, segment: Segment, reason: str, delay_ms: int) -> None:
        keys = [segment.data_key, segment.index_key]
        queue_keys(conn, keys, reason, None, segment.store_id, delay_ms)


# --- the open rewrite segment: its run still owns it --------------------------------------
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
