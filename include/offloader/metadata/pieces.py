"""A ledger's pieces in segments: which entries of which ledger an offloaded segment holds
(``schema.pieces``, SQL table ``segment_ledgers``), written when the segment is committed,
by the stream (metadata/segments.py) or a rewrite (metadata/rewrites.py); and what follows
from them, in the transaction that changes them.

A ledger becomes offloaded in ``stream`` mode once it is sealed and every entry of it sits
in offloaded segments (:func:`settle`); only then may its hot copy go (invariant 3). A
segment's objects are queued for deletion once no ledger it holds needs it
(:func:`needs_segment`): every one is deleted (invariant 4, PIP-76) or has its own v1
objects (offloaded again from the hot copy by scrub's repair, or migrated back by
``offloader/rewrite/to_v1.py``). Settling and release look at every offloaded segment,
whoever wrote it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from offloader.metadata import schema
from offloader.metadata.clock import db_now
from offloader.metadata.deletions import queue_keys
from offloader.metadata.records import (
    DeletionState,
    HotState,
    LedgerState,
    OffloadMode,
    OffloadState,
    PieceRange,
    Segment,
    SegmentState,
)

G, SL, L = schema.segments, schema.pieces, schema.ledgers


def record_pieces(conn: Connection, segment: Segment, pieces: Sequence[PieceRange]) -> None:
    """Record the ledger ranges a segment holds, as it is committed."""
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


def pieces_query(
    topic: str, ledger_id: int, *columns: sa.ColumnElement[object] | sa.Table
) -> sa.Select[Any]:
    """``columns`` of a ledger's pieces in offloaded segments, in entry order: where a
    streamed ledger's entries are, and what settling checks covers it."""
    return (
        sa.select(*columns)
        .join_from(SL, G, G.c.segment_id == SL.c.segment_id)
        .where(
            SL.c.topic == topic,
            SL.c.ledger_id == ledger_id,
            G.c.state == SegmentState.OFFLOADED,
        )
        .order_by(SL.c.first_entry_id)
    )


# --- settling: a streamed ledger is offloaded once its pieces cover it -------------------
def settle_topic(conn: Connection, topic: str) -> list[int]:
    """Mark offloaded (stream mode) the ledgers of ``topic`` sealed since their last segment
    was committed whose every entry is in offloaded segments; returns their ids."""
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
    settled = settle(conn, topic, list(candidates))
    release_deleted(conn, [topic])  # a segment committed after its ledgers went
    return settled


def settle(conn: Connection, topic: str, ledger_ids: Sequence[int]) -> list[int]:
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
            pieces_query(topic, ledger_id, SL.c.first_entry_id, SL.c.last_entry_id)
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


# --- release: a segment goes once no ledger needs it ----------------------------------------
def release_deleted(
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
    released = _release(conn, where, _held_by(undeleted), DELETED_DETAIL, "segment deleted")
    return released + _release(
        conn, where, _held_by(needs_segment()), RELEASED_DETAIL, RELEASED_REASON, grace_ms
    )


def release_moved(conn: Connection, topic: str, ledger_id: int, reason: str, grace_ms: int) -> int:
    """Release the segments holding ``ledger_id`` that no ledger needs now that it has
    its own objects (inside ``metadata.attempts.commit_replacement``'s transaction);
    their keys are queued ``grace_ms`` later with ``reason``."""
    _lock_holding(conn, [(topic, ledger_id)])
    holds = sa.select(SL.c.segment_id).where(SL.c.topic == topic, SL.c.ledger_id == ledger_id)
    where = sa.and_(G.c.topic == topic, G.c.segment_id.in_(holds))
    reason = f"segment released: {reason}"
    return _release(conn, where, _held_by(needs_segment()), RELEASED_DETAIL, reason, grace_ms)


def _release(
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
    copy of its entries without recording the ledger (``recovery.rows.stream_rows``). Nothing
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
        queue_keys(conn, [data_key, index_key], reason, None, store_id, grace_ms)
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
