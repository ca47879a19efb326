"""Which blocks of which source segment go into which part of a merged segment.

A pure plan (no I/O): a merge is checked whole before its first request, and the same
sources, store rules and part size always give the same parts, so a merge redone after a
crash uploads the same bytes under the same part numbers. The rules (docs/FORMAT.md,
"Merged segments"):

* a source of at least ``min_part_size`` bytes in the target's own store is copied server
  side (one part, or several at block boundaries if it exceeds ``max_part_size``);
* smaller sources, and sources the store cannot copy, are downloaded and uploaded in
  parts of about ``part_size``; a short run of them just before a big source takes the
  big source's leading blocks until it reaches ``min_part_size``, and the big source's
  rest is copied if it still reaches ``min_part_size`` (else it is downloaded too);
* every part holds whole blocks, and every part but the last reaches ``min_part_size``;
* a ledger no longer wanted (no ``keep`` range names it) is left out where all of its
  pieces are downloaded anyway; where one piece is copied, its bytes stay everywhere (a
  ledger is in the merged index whole or not at all).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from offloader.format import SegmentBlockRef, SegmentIndex
from offloader.metadata.records import PieceRange
from offloader.objectstore import ObjectStore
from offloader.rewrite.merge_parts import Cutter, PlannedPart, SourceBlock, runs

MiB = 1024 * 1024
DEFAULT_PART_SIZE = 8 * MiB


@dataclass(frozen=True)
class SegmentSource:
    """One segment to merge: its data object in ``store``, its decoded v2 index, and the
    ledger ranges to keep (the metadata's ``segment_ledgers`` rows of ledgers still wanted;
    each must be one of the index's ledger ranges)."""

    store: ObjectStore
    data_key: str
    data_len: int
    index: SegmentIndex
    keep: Sequence[PieceRange]


@dataclass(frozen=True)
class MergePlan:
    topic: str
    parts: tuple[PlannedPart, ...]
    pieces: tuple[PieceRange, ...]  # what the merged segment holds, ledger by ledger
    dropped: tuple[PieceRange, ...]  # unwanted pieces left out, per source
    times: dict[int, tuple[int, int]]  # ledger -> (created_ms, sealed_ms) the sources know

    @property
    def data_len(self) -> int:
        last = self.parts[-1]
        return last.offset + last.length

    def blocks(self) -> list[SegmentBlockRef]:
        """The merged object's blocks: same bytes and CRCs, new offsets and part ids."""
        out = []
        for part in self.parts:
            offset = part.offset
            for b in part.blocks:
                shift = offset - b.ref.offset
                ref = dataclasses.replace(b.ref, part_id=part.number, offset=offset)
                chunks = tuple(dataclasses.replace(c, offset=c.offset + shift) for c in b.chunks)
                out.append(SegmentBlockRef(b.ledger_id, ref, chunks))
                offset += b.ref.length
        return out


def same_store(a: ObjectStore, b: ObjectStore) -> bool:
    """A part copy reads from the target's own bucket and prefix (or root)."""
    return a is b or a.url == b.url


def plan_merge(
    target: ObjectStore, sources: Sequence[SegmentSource], *, part_size: int = DEFAULT_PART_SIZE
) -> MergePlan:
    """Check the sources (one topic, position order, keep ranges that are the index's)
    and cut them into parts; ValueError naming what is wrong, before any request."""
    caps = target.capabilities
    if not sources:
        raise ValueError("a merge needs at least one source segment")
    if part_size < 1:
        raise ValueError(f"part_size {part_size}: must be >= 1")
    topic = _one_topic(sources)
    copyable = [
        caps.part_copy and same_store(s.store, target) and s.data_len >= caps.min_part_size
        for s in sources
    ]
    blocks = [_source_blocks(i, s) for i, s in enumerate(sources)]
    unwanted = _unwanted_ledgers(sources)
    pinned = {b.ledger_id for i, bs in enumerate(blocks) if copyable[i] for b in bs}
    dropping = unwanted - pinned
    kept = [[b for b in bs if b.ledger_id not in dropping] for bs in blocks]
    if not any(kept):
        raise ValueError("nothing to merge: every ledger of the sources is unwanted")
    flat = [b for bs in kept for b in bs]
    _check_order(flat, sources)
    download_part = min(max(part_size, caps.min_part_size), caps.max_part_size)
    parts = Cutter(caps, download_part).cut(kept, copyable)
    if len(parts) > caps.max_parts:
        raise ValueError(f"the merge needs {len(parts)} parts, the store allows {caps.max_parts}")
    for part in parts:
        if part.length > caps.max_part_size:
            raise ValueError(
                f"part {part.number} would hold {part.length} bytes, the store allows "
                f"{caps.max_part_size}: blocks too large for its part size limits"
            )
    gone = [b for bs in blocks for b in bs if b.ledger_id in dropping]
    return MergePlan(
        topic,
        tuple(parts),
        pieces=tuple(_range(run) for run in _by_ledger(flat, across=True)),
        dropped=tuple(_range(run) for run in _by_ledger(gone)),
        times=_times(sources),
    )


def _one_topic(sources: Sequence[SegmentSource]) -> str:
    """The sources' topic; each source's index also agrees with its recorded length."""
    topic = sources[0].index.topic
    for s in sources:
        if s.index.topic != topic:
            raise ValueError(
                f"segment {s.data_key} is of topic {s.index.topic!r}, the first of {topic!r}: "
                "a merged segment holds one topic"
            )
        if s.index.data_object_len != s.data_len:
            raise ValueError(
                f"segment {s.data_key}: its index says {s.index.data_object_len} bytes, "
                f"the metadata store {s.data_len}"
            )
    return topic


def _source_blocks(i: int, source: SegmentSource) -> list[SourceBlock]:
    """The source's blocks in data-object order, each with the chunks it holds."""
    out = []
    for ledger_id, view in zip(source.index.ledger_ids, source.index.ledgers, strict=True):
        chunks = list(view.chunks or ())
        at = 0
        for ref in view.blocks:
            end = ref.offset + ref.length
            first = at
            while at < len(chunks) and chunks[at].offset < end:
                at += 1
            out.append(SourceBlock(ledger_id, ref, tuple(chunks[first:at]), source=i))
    return sorted(out, key=lambda b: b.ref.offset)


def _unwanted_ledgers(sources: Sequence[SegmentSource]) -> set[int]:
    """Ledgers no source keeps. A keep range must be one of its index's ledger ranges, and
    a ledger kept in one source must be kept in every source that holds it."""
    wanted: dict[int, tuple[bool, str]] = {}
    for s in sources:
        held = {p.ledger_id: p for p in held_ranges(s.index)}
        for piece in s.keep:
            if held.get(piece.ledger_id) != piece:
                raise ValueError(
                    f"segment {s.data_key}: keep {_text(piece)} is not one of its index's "
                    f"ledger ranges ({', '.join(_text(p) for p in held.values())})"
                )
        keep = {p.ledger_id for p in s.keep}
        for lid in held:
            was = wanted.setdefault(lid, (lid in keep, s.data_key))
            if was[0] != (lid in keep):
                kept, other = (s.data_key, was[1]) if lid in keep else (was[1], s.data_key)
                raise ValueError(
                    f"ledger {lid} is kept in segment {kept} but not in segment {other}: "
                    "a ledger is wanted or not"
                )
    return {lid for lid, (keep, _) in wanted.items() if not keep}


def held_ranges(index: SegmentIndex) -> list[PieceRange]:
    """Each ledger's entries in a segment, as its index states them."""
    out = []
    for ledger_id, view in zip(index.ledger_ids, index.ledgers, strict=True):
        assert view.last_entry_id is not None  # a decoded v2 index always knows it
        out.append(PieceRange(ledger_id, view.first_entry_id, view.last_entry_id))
    return out


def _check_order(blocks: list[SourceBlock], sources: Sequence[SegmentSource]) -> None:
    """Positions rise and a ledger's entries run on without a gap across the sources."""
    for prev, b in itertools.pairwise(blocks):
        if b.ledger_id == prev.ledger_id and b.ref.first_entry_id == prev.last_entry_id + 1:
            continue
        if b.ledger_id > prev.ledger_id:
            continue
        raise ValueError(
            f"entries {b.ledger_id}:{b.ref.first_entry_id}.. of segment "
            f"{sources[b.source].data_key} do not follow {prev.ledger_id}:{prev.last_entry_id} "
            f"of segment {sources[prev.source].data_key}: merge adjacent segments in "
            "position order"
        )


def _by_ledger(blocks: list[SourceBlock], *, across: bool = False) -> list[list[SourceBlock]]:
    """Runs of one ledger's blocks (of one source, unless ``across`` sources)."""
    return runs(
        blocks, lambda a, b: a.ledger_id == b.ledger_id and (across or a.source == b.source)
    )


def _range(run: list[SourceBlock]) -> PieceRange:
    return PieceRange(run[0].ledger_id, run[0].ref.first_entry_id, run[-1].last_entry_id)


def _times(sources: Sequence[SegmentSource]) -> dict[int, tuple[int, int]]:
    """Per ledger the creation and seal times any piece knows (-1: unknown)."""
    times: dict[int, tuple[int, int]] = {}
    for s in sources:
        for lid, view in zip(s.index.ledger_ids, s.index.ledgers, strict=True):
            assert view.metadata is not None  # a decoded v2 index always has it
            created, sealed = times.get(lid, (-1, -1))
            times[lid] = (
                max(created, view.metadata.created_ms),
                max(sealed, view.metadata.sealed_ms),
            )
    return times


def _text(piece: PieceRange) -> str:
    return f"{piece.ledger_id}:{piece.first}..{piece.last}"
