"""Streaming offload's metadata (PIP-76): a topic's stream, its segments and their parts.

A pass claims the topic's stream and gets a new epoch (PDP-34 fencing); every commit it
makes renews the claim's lease only if the epoch is still the stream's, in the same
transaction as the change, so a pass that lost the stream (a timed-out task still running
beside its retry) can never advance a segment. Segments are recorded before their upload
starts (invariant 1), their parts as each is uploaded (a pass that dies is resumed after
the last recorded part), and they move Assigned -> Closing -> Offloaded by compare-and-set
on their version (invariant 2). A ledger becomes offloaded in ``stream`` mode once it is
sealed and every entry of it sits in offloaded segments; only then may its hot copy go
(invariant 3). A segment's objects are queued for deletion once no ledger it holds needs
it: every one is deleted (invariant 4, PIP-76) or has its own v1 objects (offloaded again
from the hot copy by scrub's repair, or migrated back by ``offloader/rewrite/to_v1.py``).

Rewrites (compaction, format migration: metadata/rewrites.py) write segments too, with
``origin`` 'rewrite'. Everything here that asks where the stream stands (its open
segment, where it continues) looks at the stream's own segments only (:data:`STREAM`): a
rewrite segment is never the stream's open segment and never moves where it continues.
Reads, settling and release look at every offloaded segment, whoever wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from offloader.exceptions import (
    CommitFailedError,
    NotFoundError,
    StreamBusyError,
    StreamFencedError,
)
from offloader.metadata import schema
from offloader.metadata.clock import db_now
from offloader.metadata.records import (
    DeletionState,
    HotState,
    LedgerPieceRecord,
    LedgerState,
    OffloadMode,
    OffloadState,
    Position,
    Segment,
    SegmentOrigin,
    SegmentPart,
    SegmentState,
    StreamClaim,
)

if TYPE_CHECKING:
    from offloader.metadata.store import MetadataStore

S, G, P, SL = schema.streams, schema.segments, schema.segment_parts, schema.segment_ledgers
L, D = schema.ledgers, schema.deletion_queue

OPEN_STATES = (SegmentState.ASSIGNED, SegmentState.CLOSING)
STREAM = G.c.origin == SegmentOrigin.STREAM  # the stream's own segments, not rewrites'


@dataclass(frozen=True)
class PieceRange:
    """Entries ``first..last`` of ``ledger_id`` held by a segment being committed."""

    ledger_id: int
    first: int
    last: int


class SegmentStore:
    """The streaming half of the metadata store; shares its engine and clock."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    # --- the stream: claim, fence, release ----------------------------------------------
    def claim(self, topic: str, owner: str, lease_ms: int) -> StreamClaim:
        """Take the topic's stream with a new epoch, unless a pass holds a live lease
        (StreamBusyError naming it). The previous holder is fenced from here on."""
        if lease_ms <= 0:
            raise ValueError(f"lease_ms must be positive, got {lease_ms}")
        owner = owner[:255]
        with self.metadata.transaction() as conn:
            self.metadata._topic(conn, topic)  # NotFoundError for an unknown topic
            row = conn.execute(sa.select(S).where(S.c.topic == topic)).mappings().first()
            if row is None:
                try:
                    with conn.begin_nested():
                        conn.execute(
                            S.insert().values(
                                topic=topic,
                                version=1,
                                epoch=1,
                                owner=owner,
                                lease_ms=lease_ms,
                                lease_until_ms=db_now() + lease_ms,
                                claimed_ms=db_now(),
                                created_ms=db_now(),
                            )
                        )
                except IntegrityError:
                    raise StreamBusyError(
                        f"topic {topic!r}: another pass claimed the stream at the same time"
                    ) from None
                return StreamClaim(topic=topic, epoch=1, owner=owner, lease_ms=lease_ms)
            free = sa.or_(S.c.lease_until_ms.is_(None), S.c.lease_until_ms <= db_now())
            result = conn.execute(
                S.update()
                .where(S.c.topic == topic, S.c.version == row["version"], free)
                .values(
                    version=S.c.version + 1,
                    epoch=S.c.epoch + 1,
                    owner=owner,
                    lease_ms=lease_ms,
                    lease_until_ms=db_now() + lease_ms,
                    claimed_ms=db_now(),
                )
            )
            if result.rowcount != 1:
                raise StreamBusyError(
                    f"topic {topic!r}: a streaming pass ({row['owner']}, epoch {row['epoch']}) "
                    f"holds the stream until {row['lease_until_ms']} ms (database clock); "
                    "this pass does nothing"
                )
            previous = row["claimed_ms"]
            now = conn.execute(sa.select(S.c.claimed_ms).where(S.c.topic == topic)).scalar_one()
            return StreamClaim(
                topic=topic,
                epoch=int(row["epoch"]) + 1,
                owner=owner,
                lease_ms=lease_ms,
                pass_interval_ms=None if previous is None else max(0, int(now) - int(previous)),
            )

    def renew(self, claim: StreamClaim) -> None:
        """Extend the lease; StreamFencedError once a newer pass took the stream."""
        with self.metadata.transaction() as conn:
            _fence(conn, claim)

    def release(self, claim: StreamClaim) -> bool:
        """Let the next pass start at once; False if the claim was already fenced."""
        with self.metadata.transaction() as conn:
            result = conn.execute(
                S.update()
                .where(S.c.topic == claim.topic, S.c.epoch == claim.epoch)
                .values(version=S.c.version + 1, lease_until_ms=None)
            )
            return result.rowcount == 1

    # --- reads ---------------------------------------------------------------------------
    def get(self, segment_id: str) -> Segment:
        with self.metadata.engine.connect() as conn:
            return _segment(conn, segment_id)

    def of_topic(self, topic: str, states: Iterable[SegmentState] | None = None) -> list[Segment]:
        """The segments of ``topic`` (only those in ``states`` if given), in sequence order."""
        query = sa.select(G).where(G.c.topic == topic)
        if states is not None:
            query = query.where(G.c.state.in_(list(states)))
        with self.metadata.engine.connect() as conn:
            rows = conn.execute(query.order_by(G.c.seq)).mappings()
            return [Segment.model_validate(dict(r)) for r in rows]

    def topics_with_open_segments(self) -> list[str]:
        """Topics whose newest segment is open: a pass must complete it even when the
        topic's policy no longer streams."""
        with self.metadata.engine.connect() as conn:
            rows = conn.execute(
                sa.select(G.c.topic).where(G.c.state.in_(OPEN_STATES), STREAM).distinct()
            ).scalars()
            return sorted(rows)

    def current(self, topic: str) -> Segment | None:
        """The stream's newest segment if it is not offloaded (open, or failed and waiting
        to be replaced); None when the next pass assigns a fresh one."""
        with self.metadata.engine.connect() as conn:
            newest = _newest(conn, topic)
        if newest is None or newest.state in (SegmentState.OFFLOADED, SegmentState.DELETED):
            return None
        return newest

    def last_offloaded_end(self, topic: str) -> Position | None:
        """Where the stream's newest committed segment ends: it continues after it."""
        with self.metadata.engine.connect() as conn:
            return _last_committed_end(conn, topic)

    def parts(self, segment: Segment) -> list[SegmentPart]:
        with self.metadata.engine.connect() as conn:
            rows = conn.execute(
                sa.select(P).where(P.c.segment_id == segment.segment_id).order_by(P.c.part_number)
            ).mappings()
            return [SegmentPart.model_validate(dict(r)) for r in rows]

    def pieces(self, topic: str, ledger_id: int) -> list[LedgerPieceRecord]:
        """Where a streamed ledger's entries are: its ranges in offloaded segments, in
        entry order."""
        query = (
            sa.select(G, SL.c.first_entry_id, SL.c.last_entry_id)
            .join(SL, SL.c.segment_id == G.c.segment_id)
            .where(
                SL.c.topic == topic,
                SL.c.ledger_id == ledger_id,
                G.c.state == SegmentState.OFFLOADED,
            )
            .order_by(SL.c.first_entry_id)
        )
        with self.metadata.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        segment_columns = set(G.c.keys())
        return [
            LedgerPieceRecord(
                segment=Segment.model_validate({k: r[k] for k in segment_columns}),
                ledger_id=ledger_id,
                first_entry_id=r["first_entry_id"],
                last_entry_id=r["last_entry_id"],
            )
            for r in rows
        ]

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
        with self.metadata.transaction() as conn:
            _fence(conn, claim)
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
            return _segment(conn, segment_id)

    def record_upload(self, claim: StreamClaim, segment: Segment, upload_id: str) -> Segment:
        """The multipart upload the segment's parts go to (created after assign)."""
        with self.metadata.transaction() as conn:
            _fence(conn, claim)
            _cas_segment(conn, segment, SegmentState.ASSIGNED, upload_id=upload_id)
            return _segment(conn, segment.segment_id)

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
        with self.metadata.transaction() as conn:
            _fence(conn, claim)
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
            return _segment(conn, segment.segment_id)

    def begin_close(self, claim: StreamClaim, segment: Segment) -> Segment:
        """No more parts: the recorded ones are what the upload is completed with."""
        if segment.end is None:
            raise ValueError(f"segment {segment.segment_id} has no part: nothing to close")
        with self.metadata.transaction() as conn:
            _fence(conn, claim)
            _cas_segment(conn, segment, SegmentState.ASSIGNED, state=SegmentState.CLOSING)
            return _segment(conn, segment.segment_id)

    def commit(self, claim: StreamClaim, segment: Segment, pieces: Sequence[PieceRange]) -> Segment:
        """Closing -> Offloaded once the data object and index exist; records which
        entries of which ledgers it holds and settles the ledgers it completes."""
        if not pieces:
            raise ValueError(f"segment {segment.segment_id}: a committed segment holds entries")
        with self.metadata.transaction() as conn:
            _fence(conn, claim)
            _cas_segment(
                conn,
                segment,
                SegmentState.CLOSING,
                state=SegmentState.OFFLOADED,
                offloaded_ms=db_now(),
            )
            conn.execute(
                SL.insert(),
                [
                    dict(
                        segment_id=segment.segment_id,
                        topic=segment.topic,
                        ledger_id=p.ledger_id,
                        first_entry_id=p.first,
                        last_entry_id=p.last,
                    )
                    for p in pieces
                ],
            )
            _settle(conn, segment.topic, [p.ledger_id for p in pieces])
            return _segment(conn, segment.segment_id)

    def fail(self, claim: StreamClaim, segment: Segment, detail: str) -> Segment:
        """An open segment whose upload cannot be completed: its keys are queued for
        deletion (a data object may exist) and the next segment replaces it from its
        begin; its multipart upload is no longer referenced, so the sweep aborts it."""
        with self.metadata.transaction() as conn:
            _fence(conn, claim)
            current = _segment(conn, segment.segment_id)
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
            self.metadata._enqueue(
                conn,
                [segment.data_key, segment.index_key],
                "failed segment",
                None,
                segment.store_id,
            )
            return _segment(conn, segment.segment_id)

    def settle_ledgers(self, topic: str) -> list[int]:
        """Mark offloaded (stream mode) the ledgers sealed since their last segment was
        committed whose every entry is in offloaded segments; returns their ids."""
        with self.metadata.transaction() as conn:
            candidates = conn.execute(
                sa.select(L.c.ledger_id).where(
                    L.c.topic == topic,
                    L.c.state == LedgerState.SEALED,
                    L.c.offload_state == OffloadState.NONE,
                    L.c.deletion_state == DeletionState.NONE,
                    sa.or_(
                        L.c.entry_count == 0,
                        sa.select(SL.c.ledger_id)
                        .where(SL.c.topic == L.c.topic, SL.c.ledger_id == L.c.ledger_id)
                        .exists(),
                    ),
                )
            ).scalars()
            settled = _settle(conn, topic, list(candidates))
            self.release_deleted(conn, [topic])  # a segment committed after its ledgers went
            return settled

    def release_deleted(
        self,
        conn: Connection,
        topics: Iterable[str],
        grace_ms: int = 0,
        changed: Sequence[tuple[str, int]] = (),
    ) -> int:
        """Release the offloaded segments of ``topics`` that no ledger needs any more (see
        :func:`needs_segment`); how many. Runs inside the transaction that marks ledgers
        deleted (invariant 4: retention deletes ledgers first, then their segments).

        A segment whose every ledger is deleted is retention's: its keys are queued at
        once. One that some ledger left by moving to its own v1 objects may still have a
        reader inside (one that found its pieces before the move): its keys are queued
        ``grace_ms`` later. ``changed``: the (topic, ledger id) this transaction deleted,
        whose segments are locked first (:func:`_lock_holding`)."""
        _lock_holding(conn, changed)
        where = G.c.topic.in_(sorted(set(topics)))
        undeleted = L.c.deletion_state != DeletionState.DELETED
        released = self._release(
            conn, where, _held_by(undeleted), DELETED_DETAIL, "segment deleted"
        )
        return released + self._release(
            conn, where, _held_by(needs_segment()), RELEASED_DETAIL, RELEASED_REASON, grace_ms
        )

    def release_moved(
        self, conn: Connection, topic: str, ledger_id: int, reason: str, grace_ms: int
    ) -> int:
        """Release the segments holding ``ledger_id`` that no ledger needs now that it has
        its own objects (inside :meth:`MetadataStore.commit_replacement`'s transaction);
        their keys are queued ``grace_ms`` later with ``reason``."""
        _lock_holding(conn, [(topic, ledger_id)])
        holds = sa.select(SL.c.segment_id).where(SL.c.topic == topic, SL.c.ledger_id == ledger_id)
        where = sa.and_(G.c.topic == topic, G.c.segment_id.in_(holds))
        reason = f"segment released: {reason}"
        return self._release(
            conn, where, _held_by(needs_segment()), RELEASED_DETAIL, reason, grace_ms
        )

    def _release(
        self,
        conn: Connection,
        where: sa.ColumnElement[bool],
        held: sa.Exists,
        detail: str,
        reason: str,
        grace_ms: int = 0,
    ) -> int:
        """Mark deleted the offloaded segments ``where`` selects that hold ledgers, none of
        them ``held`` and each of them recorded, and queue their two keys ``grace_ms`` from
        now; how many.

        A piece whose ledger has no row keeps its segment: ledger rows are never removed,
        so it comes from a rebuild that found a ledger held only in part and kept the only
        copy of its entries without recording the ledger (``backup._stream_rows``). Nothing
        can tell whether those entries are wanted, so they are not deleted."""
        pieces = sa.select(SL.c.ledger_id).where(SL.c.segment_id == G.c.segment_id)
        recorded = (
            sa.select(L.c.ledger_id)
            .where(L.c.topic == SL.c.topic, L.c.ledger_id == SL.c.ledger_id)
            .exists()
        )
        released = conn.execute(
            G.update()
            .where(
                where,
                G.c.state == SegmentState.OFFLOADED,
                pieces.exists(),
                ~pieces.where(~recorded).exists(),
                ~held,
            )
            .values(
                version=G.c.version + 1,
                state=SegmentState.DELETED,
                finished_ms=db_now(),
                detail=detail,
            )
            .returning(G.c.data_key, G.c.index_key, G.c.store_id)
        ).all()
        for data_key, index_key, store_id in released:
            self.metadata._enqueue(conn, [data_key, index_key], reason, None, store_id, grace_ms)
        return len(released)


DELETED_DETAIL = "every ledger it holds was deleted"
RELEASED_DETAIL = (
    "no ledger it holds needs it: each was deleted or offloaded again as its own (v1) objects"
)
RELEASED_REASON = "segment released: its ledgers have their own objects"


def needs_segment() -> sa.ColumnElement[bool]:
    """The release rule: a ledger (row of ``ledgers``) needs the segments holding its
    entries unless it is deleted or offloaded in mode ``ledger`` (its own objects). A
    ledger still being streamed (not offloaded), open, offloading or offloaded in mode
    ``stream`` (a replacement in flight included) needs them."""
    own_objects = sa.and_(
        L.c.offload_state == OffloadState.OFFLOADED, L.c.offload_mode == OffloadMode.LEDGER
    )
    return sa.and_(L.c.deletion_state != DeletionState.DELETED, sa.not_(own_objects))


def _lock_holding(conn: Connection, ledgers: Sequence[tuple[str, int]]) -> None:
    """Lock the offloaded segments holding ``ledgers`` (in id order) before the release
    rule is evaluated for them. Two transactions that each let go of one ledger of a
    shared segment then take turns, and the second one's release sees the first's change
    (PostgreSQL's read committed takes a new snapshot per statement; SQLite runs one
    writer at a time anyway): without the lock each could find the other's ledger still
    needing the segment, and neither would release it."""
    if not ledgers:
        return
    holding = sa.select(SL.c.segment_id).where(
        sa.tuple_(SL.c.topic, SL.c.ledger_id).in_(sorted(set(ledgers)))
    )
    conn.execute(
        sa.select(G.c.segment_id)
        .where(G.c.segment_id.in_(holding), G.c.state == SegmentState.OFFLOADED)
        .order_by(G.c.segment_id)
        .with_for_update()
    ).all()


def _held_by(condition: sa.ColumnElement[bool]) -> sa.Exists:
    """Some ledger of the segment (``G``) meets ``condition``."""
    return (
        sa.select(SL.c.ledger_id)
        .join(L, sa.and_(L.c.topic == SL.c.topic, L.c.ledger_id == SL.c.ledger_id))
        .where(SL.c.segment_id == G.c.segment_id, condition)
        .exists()
    )


_COMMITTED = (SegmentState.OFFLOADED, SegmentState.DELETED)


def _fence(conn: Connection, claim: StreamClaim) -> None:
    """Renew the claim's lease if its epoch is still the stream's (PDP-34 fencing)."""
    result = conn.execute(
        S.update()
        .where(S.c.topic == claim.topic, S.c.epoch == claim.epoch)
        .values(version=S.c.version + 1, lease_until_ms=db_now() + claim.lease_ms)
    )
    if result.rowcount != 1:
        current = conn.execute(sa.select(S.c.epoch, S.c.owner).where(S.c.topic == claim.topic))
        row = current.first()
        holder = "nobody" if row is None else f"{row[1]} (epoch {row[0]})"
        raise StreamFencedError(
            f"topic {claim.topic!r}: this pass (epoch {claim.epoch}) lost the stream to "
            f"{holder}; it commits nothing more"
        )


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


def _segment(conn: Connection, segment_id: str) -> Segment:
    row = conn.execute(sa.select(G).where(G.c.segment_id == segment_id)).mappings().first()
    if row is None:
        raise NotFoundError(f"segment {segment_id} does not exist")
    return Segment.model_validate(dict(row))


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


def next_seq(conn: Connection, topic: str) -> int:
    """The next segment number of ``topic`` (stream and rewrite segments share the
    sequence). The topic's row is locked first, so a pass assigning a segment and a
    rewrite beginning one at the same time queue instead of taking the same number."""
    conn.execute(
        sa.select(schema.topics.c.name).where(schema.topics.c.name == topic).with_for_update()
    )
    seq = conn.execute(
        sa.select(sa.func.coalesce(sa.func.max(G.c.seq), 0)).where(G.c.topic == topic)
    ).scalar_one()
    return int(seq) + 1


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


def _settle(conn: Connection, topic: str, ledger_ids: Sequence[int]) -> list[int]:
    """Of ``ledger_ids``, mark offloaded (stream mode) the sealed, live ledgers not yet
    offloaded whose entries 0..entry_count-1 are all in offloaded segments.

    The hot copy must still be there, except for an empty ledger: it holds nothing to
    lose, and hot deletion may let its copy go at once (``mark_hot_deleting``).

    Entries past a ledger's sealed count (read from an open ledger before a crash cut its
    torn tail) are in a segment but not in the ledger, and count for nothing."""
    if not ledger_ids:
        return []
    ledgers = conn.execute(
        sa.select(L.c.ledger_id, L.c.version, L.c.entry_count).where(
            L.c.topic == topic,
            L.c.ledger_id.in_(sorted(set(ledger_ids))),
            L.c.state == LedgerState.SEALED,
            L.c.offload_state == OffloadState.NONE,
            L.c.deletion_state == DeletionState.NONE,
            sa.or_(L.c.hot_state == HotState.PRESENT, L.c.entry_count == 0),
        )
    ).all()
    settled = []
    for ledger_id, version, entry_count in ledgers:
        ranges = conn.execute(
            sa.select(SL.c.first_entry_id, SL.c.last_entry_id)
            .join(G, G.c.segment_id == SL.c.segment_id)
            .where(
                SL.c.topic == topic,
                SL.c.ledger_id == ledger_id,
                G.c.state == SegmentState.OFFLOADED,
            )
            .order_by(SL.c.first_entry_id)
        ).all()
        if not covers(ranges, entry_count):
            continue
        result = conn.execute(
            L.update()
            .where(L.c.topic == topic, L.c.ledger_id == ledger_id, L.c.version == version)
            .values(
                version=L.c.version + 1,
                offload_state=OffloadState.OFFLOADED,
                offload_mode=OffloadMode.STREAM,
                offloaded_ms=db_now(),
            )
        )
        if result.rowcount == 1:
            settled.append(ledger_id)
    return settled


def covers(ranges: Sequence[tuple[int, int]], entry_count: int) -> bool:
    """Whether sorted ``ranges`` (first, last) cover 0..entry_count-1 with no gap."""
    expected = 0
    for first, last in ranges:
        if first > expected:
            return False
        expected = max(expected, last + 1)
        if expected >= entry_count:
            return True
    return expected >= entry_count
