"""The rows a rebuild writes: offloaded ledgers and their committed attempts from ledger
objects; from segments, the segments still needed, their ledger ranges and the ledgers they
hold whole."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offloader.metadata.records import (
    AttemptState,
    HotState,
    LedgerState,
    OffloadMode,
    OffloadState,
    SegmentState,
)
from offloader.recovery.ledgers import FoundLedger
from offloader.recovery.segments import FoundSegment, IndexedPiece


@dataclass
class StreamRows:
    """What the segments a rebuild found add to the database."""

    segments: list[dict[str, Any]]
    pieces: list[dict[str, Any]]  # segment_ledgers
    ledgers: list[dict[str, Any]]  # the ledgers offloaded in stream mode


def stream_rows(
    segments: list[FoundSegment],
    found: dict[tuple[str, int], FoundLedger],
    store_id: int,
    now: int,
    skipped: list[str],
) -> StreamRows:
    """Rows of the segments still needed (in stream order: ``seq`` 1, 2, ... per topic),
    their ledger ranges, and the ledgers they hold whole (entries 0..N, no gap) that have
    no newer ledger objects of their own. A ledger held only in part is reported: the
    stream began after a trim inside it, or a segment is missing; its ranges are kept but
    it gets no row (and the release rules then never release its segments:
    ``SegmentStore._release``).

    A segment is needed while one of its pieces serves a ledger recorded in stream mode or
    a ledger held only in part without objects of its own (never lose data). One whose
    every ledger has newer objects of its own (a migration back to v1 released it and the
    rebuild came before the GC deleted it) is reported and not recorded: recorded, it
    would be referenced forever and its objects never swept. Dropping it cannot move the
    stream back onto data: the next pass starts after the last recorded segment (or at the
    topic's start) but streams only ledgers not offloaded, and every ledger it held is."""
    rows = StreamRows([], [], [])
    by_ledger: dict[tuple[str, int], list[tuple[IndexedPiece, FoundSegment]]] = {}
    for s in segments:
        for p in s.pieces:
            by_ledger.setdefault((s.topic, p.ledger_id), []).append((p, s))
    needs: set[tuple[str, int]] = set()  # ledgers whose entries the segments must serve
    for (topic, ledger_id), held in sorted(by_ledger.items()):
        expected = 0
        for piece, _ in held:
            if piece.first_entry_id != expected:
                break
            expected = piece.last_entry_id + 1
        else:
            own = found.get((topic, ledger_id))
            newest = max(s.offloaded_ms for _, s in held)
            if own is not None and own.offloaded_ms >= newest:
                continue  # its newer objects are its offload; kept segments keep its ranges
            if own is not None:  # an older copy: the segments are its offload now
                del found[(topic, ledger_id)]
                skipped.append(
                    f"{own.index_key}: ledger {ledger_id} of {topic!r} is in newer segment(s) "
                    f"{', '.join(sorted({s.segment_id for _, s in held}))}"
                )
            rows.ledgers.append(streamed_ledger_row(topic, ledger_id, held, now))
            needs.add((topic, ledger_id))
            continue
        if (topic, ledger_id) in found:
            continue  # its ledger objects are its offload; kept segments keep its ranges
        needs.add((topic, ledger_id))  # no other copy is known: keep what there is
        ranges = ", ".join(f"{p.first_entry_id}..{p.last_entry_id}" for p, _ in held)
        skipped.append(
            f"ledger {ledger_id} of {topic!r}: its segments hold entries {ranges}, not 0..N "
            "without a gap: not recorded as offloaded"
        )
    seq: dict[str, int] = {}
    for s in segments:
        if not any((s.topic, p.ledger_id) in needs for p in s.pieces):
            ids = ", ".join(str(p.ledger_id) for p in s.pieces)
            skipped.append(
                f"{s.index_key}: segment {s.segment_id} of {s.topic!r} is needed by no "
                f"ledger: each it holds ({ids}) has newer objects of its own; not recorded, "
                "left for the sweep"
            )
            continue
        seq[s.topic] = seq.get(s.topic, 0) + 1
        rows.segments.append(segment_row(s, seq[s.topic], store_id))
        rows.pieces += [
            dict(
                segment_id=s.segment_id,
                ledger_id=p.ledger_id,
                topic=s.topic,
                first_entry_id=p.first_entry_id,
                last_entry_id=p.last_entry_id,
            )
            for p in s.pieces
        ]
    return rows


def segment_row(s: FoundSegment, seq: int, store_id: int) -> dict[str, Any]:
    return dict(
        segment_id=s.segment_id,
        topic=s.topic,
        seq=seq,
        version=1,
        state=SegmentState.OFFLOADED,
        epoch=0,  # no pass holds the stream yet: the next claim starts at epoch 1
        assigned_ms=s.offloaded_ms,
        offloaded_ms=s.offloaded_ms,
        finished_ms=None,
        detail="rebuilt from the objects",
        begin_ledger_id=s.begin[0],
        begin_entry_id=s.begin[1],
        end_ledger_id=s.end[0],
        end_entry_id=s.end[1],
        planned_end_ledger_id=None,
        planned_end_entry_id=None,
        data_key=s.data_key,
        index_key=s.index_key,
        store_id=store_id,
        upload_id=None,
        data_len=s.data_len,
        replaces=None,
    )


def streamed_ledger_row(
    topic: str, ledger_id: int, held: list[tuple[IndexedPiece, FoundSegment]], now: int
) -> dict[str, Any]:
    offloaded = max(s.offloaded_ms for _, s in held)
    created = next((p.created_ms for p, _ in held if p.created_ms >= 0), offloaded)
    sealed = next((p.sealed_ms for p, _ in reversed(held) if p.sealed_ms >= 0), offloaded)
    return dict(
        topic=topic,
        ledger_id=ledger_id,
        version=1,
        state=LedgerState.SEALED,
        entry_count=held[-1][0].last_entry_id + 1,
        size_bytes=sum(p.length for p, _ in held),
        created_ms=created,
        sealed_ms=sealed,
        offload_state=OffloadState.OFFLOADED,
        offload_mode=OffloadMode.STREAM,
        offload_epoch=0,
        attempt_id=None,
        attempt_lease_ms=None,
        offload_uuid=None,  # stream mode: its entries are in segment_ledgers
        data_key=None,
        index_key=None,
        data_len=None,
        offloaded_ms=offloaded,
        hot_state=HotState.DELETED,  # unknown to the objects; reads go to the store
        hot_deleted_ms=now,
        store_id=None,
    )


def ledger_row(f: FoundLedger, store_id: int, now: int) -> dict[str, Any]:
    return dict(
        topic=f.topic,
        ledger_id=f.ledger_id,
        version=1,
        state=LedgerState.SEALED,
        entry_count=f.entry_count,
        size_bytes=f.size_bytes,
        created_ms=f.created_ms,
        sealed_ms=f.sealed_ms,
        offload_state=OffloadState.OFFLOADED,
        offload_epoch=1,
        attempt_id=None,
        attempt_lease_ms=None,
        offload_uuid=f.attempt_id,
        data_key=f.data_key,
        index_key=f.index_key,
        data_len=f.data_len,
        offloaded_ms=f.offloaded_ms,
        hot_state=HotState.DELETED,  # unknown to the objects; reads go to the store
        hot_deleted_ms=now,
        store_id=store_id,
    )


def attempt_row(f: FoundLedger, store_id: int) -> dict[str, Any]:
    return dict(
        attempt_id=f.attempt_id,
        topic=f.topic,
        ledger_id=f.ledger_id,
        epoch=1,
        data_key=f.data_key,
        index_key=f.index_key,
        state=AttemptState.COMMITTED,
        owner="metadata rebuild",
        created_ms=f.offloaded_ms,
        finished_ms=f.offloaded_ms,
        detail="rebuilt from the objects",
        store_id=store_id,
    )
