"""Streaming segments (v2) as their objects state them, and which of several copies of the
same entries a rebuild keeps (docs/FORMAT.md, "Streaming segment objects (v2)")."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from urllib.parse import unquote

from offloader.format import decode_segment_index
from offloader.format.object_metadata import SEGMENT_OBJECT_FORMAT_VERSION
from offloader.metadata.snapshot import SnapshotError
from offloader.objectstore import ObjectStore
from offloader.recovery._objects import whole_data_object


@dataclass(frozen=True)
class IndexedPiece:
    """One ledger's entries in a segment, as the segment's index states them."""

    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    length: int  # payload bytes
    created_ms: int  # -1: the ledger was open when the segment was closed
    sealed_ms: int


@dataclass(frozen=True)
class FoundSegment:
    """One segment's objects, whole and agreeing with its index."""

    topic: str
    segment_id: str
    data_key: str
    index_key: str
    data_len: int
    pieces: tuple[IndexedPiece, ...]  # ledger ids rising
    offloaded_ms: int

    @property
    def begin(self) -> tuple[int, int]:
        return self.pieces[0].ledger_id, self.pieces[0].first_entry_id

    @property
    def end(self) -> tuple[int, int]:
        return self.pieces[-1].ledger_id, self.pieces[-1].last_entry_id


def read_segment(
    store: ObjectStore, index_key: str, segment_id: str, modified: int
) -> FoundSegment:
    """A segment from its v2 index, checked against its user metadata and data object."""
    user = store.stat(index_key).metadata
    index = decode_segment_index(store.get(index_key))
    version = user.get("format-version", SEGMENT_OBJECT_FORMAT_VERSION)
    if version != SEGMENT_OBJECT_FORMAT_VERSION:
        raise SnapshotError(f"unknown segment object format-version {version!r}")
    from_user = (
        unquote(user.get("managed-ledger", index.topic)),
        user.get("segment-id", segment_id),
    )
    if from_user != (index.topic, segment_id):
        raise SnapshotError(
            f"the index is of topic {index.topic!r}, segment {segment_id} by its key; its user "
            f"metadata says topic {from_user[0]!r}, segment {from_user[1]}"
        )
    data_key, data_len = whole_data_object(store, index_key, index.data_object_len)
    pieces = []
    for ledger in index.ledgers:
        meta = ledger.metadata
        assert meta is not None  # decode_segment_index always sets it
        pieces.append(
            IndexedPiece(
                meta.ledger_id,
                meta.first_entry_id,
                meta.last_entry_id,
                meta.length,
                meta.created_ms,
                meta.sealed_ms,
            )
        )
    return FoundSegment(
        index.topic, segment_id, data_key, index_key, data_len, tuple(pieces), modified
    )


def without_overlaps(segments: list[FoundSegment], skipped: list[str]) -> list[FoundSegment]:
    """Per topic, newest first, the segments that overlap no segment already kept (an entry
    has one committed copy); the others are reported as skipped. The kept ones come back
    in stream order."""
    kept: dict[str, list[FoundSegment]] = {}  # per topic, by begin: disjoint ranges
    for segment in sorted(segments, key=lambda s: (-s.offloaded_ms, s.topic, s.begin)):
        taken = kept.setdefault(segment.topic, [])
        at = bisect.bisect_left([k.begin for k in taken], segment.begin)
        neighbours = taken[max(at - 1, 0) : at + 1]
        clash = next(
            (k for k in neighbours if k.begin <= segment.end and segment.begin <= k.end), None
        )
        if clash is not None:
            skipped.append(
                f"{segment.index_key}: segment of {segment.topic!r} from "
                f"{segment.begin[0]}:{segment.begin[1]} overlaps newer segment "
                f"{clash.segment_id} ({clash.begin[0]}:{clash.begin[1]} to "
                f"{clash.end[0]}:{clash.end[1]})"
            )
            continue
        taken.insert(at, segment)
    return [s for topic in sorted(kept) for s in kept[topic]]
