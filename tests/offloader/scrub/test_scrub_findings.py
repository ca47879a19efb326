"""The exact findings a scrub reports for damage planted byte by byte: which object, which
offset, which kind and the reason's words, for v1 ledgers (ours and Pulsar's) and for
streaming segments. Some damage is sealed under recomputed CRCs (a writer that checksummed
what it framed wrong): then only the structure checks (header, frames, padding, the index
against the metadata store) can see it, and each must say so where it is."""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from crc32c import crc32c

from fixtures.backends import make_topic, produce_ledgers
from fixtures.damage import flip, offloaded_ledger, overwrite_object, pack_at
from fixtures.faults import ServerErrors
from fixtures.pulsar_v1 import pulsar_write_blocks
from fixtures.scrub import index_of, offloaded_topic, store_as_pulsar
from offloader.format import (
    ENTRY_FRAME,
    HEADER_LEN,
    INDEX_MAGIC,
    BlockRef,
    ChunkRef,
    LedgerMetadata,
    SegmentBlockRef,
    decode_segment_index,
    encode_index,
    encode_segment_index,
)
from offloader.metadata import Ledger, schema
from offloader.metadata.records import Segment
from offloader.runtime import Runtime
from offloader.scrub import (
    Finding,
    FindingKind,
    ScrubTarget,
    plan_scrub,
    run_scrub,
    scrub_ledger,
)
from offloader.stream.offloader import StreamingOffloader

DAMAGED = FindingKind.DAMAGED_BLOCK
MISMATCH = FindingKind.METADATA_MISMATCH
PULSAR_META = b"\x08\x01"  # Pulsar's ledger metadata, field 1 only
ONLY_FILES = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)


def target_of(rt: Runtime, topic: str, ledger_id: int) -> ScrubTarget:
    """The plan's target for one v1 ledger."""
    (target,) = [
        t
        for t in plan_scrub(rt.metadata, [topic])
        if t.segment_id is None and t.ledger_id == ledger_id
    ]
    return target


def scrubbed(rt: Runtime, ledger: Ledger) -> tuple[Finding, ...]:
    return scrub_ledger(rt.objects, target_of(rt, ledger.topic, ledger.ledger_id)).findings


def resealed(ref: BlockRef | ChunkRef, data: bytes) -> BlockRef | ChunkRef:
    """``ref`` with the CRC of the bytes ``data`` now holds where it points."""
    return replace(ref, crc32c=crc32c(data[ref.offset : ref.offset + ref.length]))


def rewrite_ledger(
    rt: Runtime,
    ledger: Ledger,
    data: bytes,
    meta: LedgerMetadata,
    blocks: tuple[BlockRef, ...],
    chunks: tuple[ChunkRef, ...],
) -> None:
    """Store ``data`` and an index of ``meta``, ``blocks`` and ``chunks`` with every CRC
    recomputed over ``data``."""
    assert ledger.data_key is not None and ledger.index_key is not None
    index = encode_index(
        meta, [resealed(b, data) for b in blocks], [resealed(c, data) for c in chunks]
    )
    overwrite_object(rt.objects, ledger.data_key, lambda _: data)
    overwrite_object(rt.objects, ledger.index_key, lambda _: index)


def test_findings_read_as_ledger_key_offset_and_reason_in_the_operators_warning(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning of a damaged ledger left unrepaired lists its findings: ``topic/ledger
    key offset N: reason``, without ``offset`` when the finding has none."""
    gone, cut_short = offloaded_topic(runtime, "orders", [(20, 500), (20, 500)])
    assert gone.data_key is not None and cut_short.data_key is not None
    runtime.objects.delete_many([gone.data_key])
    length = runtime.objects.stat(cut_short.data_key).size
    overwrite_object(runtime.objects, cut_short.data_key, lambda data: data[:100])
    with caplog.at_level(logging.WARNING, logger="offloader.scrub.run"):
        report = run_scrub(runtime, ["orders"], repair=False)
    assert report.failed
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.name == "offloader.scrub.run" and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 2, warnings
    assert warnings[0].endswith(f"; orders/{gone.ledger_id} {gone.data_key}: missing data object")
    assert warnings[1].endswith(
        f"; orders/{cut_short.ledger_id} {cut_short.data_key} offset 100: data object is 100 "
        f"bytes, its index says {length}: truncated"
    )


def test_an_overlong_data_object_is_reported_where_its_index_ends(runtime: Runtime) -> None:
    """Bytes after the last block are not truncation: ``overlong``, at the indexed end; the
    blocks are still read and are clean."""
    ledger = offloaded_ledger(runtime, 20, 500)
    assert ledger.data_key is not None
    length = runtime.objects.stat(ledger.data_key).size
    overwrite_object(runtime.objects, ledger.data_key, lambda data: data + bytes(100))
    result = scrub_ledger(runtime.objects, target_of(runtime, "orders", ledger.ledger_id))
    assert result.findings == (
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.data_key,
            length,
            FindingKind.OVERLONG,
            f"data object is {length + 100} bytes, its index says {length}",
        ),
    )
    assert (result.blocks, result.entries) == (1, 20)


def test_an_index_with_a_bad_magic_is_damaged_from_offset_0(runtime: Runtime) -> None:
    ledger = offloaded_ledger(runtime, 20, 500)
    assert ledger.index_key is not None
    overwrite_object(runtime.objects, ledger.index_key, flip(0))
    assert scrubbed(runtime, ledger) == (
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.index_key,
            0,
            FindingKind.DAMAGED_INDEX,
            f"bad index magic 0x{INDEX_MAGIC ^ 0x01000000:08X}, expected 0x{INDEX_MAGIC:08X}",
        ),
    )


def test_an_index_failing_on_the_stores_side_is_unreadable(runtime: Runtime) -> None:
    """A GET of the index that fails (not a 404) is ``unreadable`` with the store's words;
    only the data object's HEAD was read."""
    ledger = offloaded_ledger(runtime, 20, 500)
    assert ledger.index_key is not None
    store = ServerErrors(runtime.objects, ["get"])
    result = scrub_ledger(store, target_of(runtime, "orders", ledger.ledger_id))  # type: ignore[arg-type]
    assert result.findings == (
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.index_key,
            None,
            FindingKind.UNREADABLE,
            "index object unreadable: S3 get failed: An error occurred (InternalError) when "
            "calling the get operation (reached max retries: 9): We encountered an internal "
            "error.",
        ),
    )
    assert (result.objects, result.blocks, result.bytes) == (1, 0, 0)


def test_an_index_naming_another_ledger_is_a_metadata_mismatch(runtime: Runtime) -> None:
    """A well-formed index written for the next ledger: only its metadata says so."""
    ledger = offloaded_ledger(runtime, 20, 500)
    assert ledger.index_key is not None and ledger.data_key is not None
    index = index_of(runtime, ledger)
    assert index.metadata is not None and index.chunks is not None
    meta = replace(index.metadata, ledger_id=ledger.ledger_id + 1)
    data = runtime.objects.get(ledger.data_key)
    rewrite_ledger(runtime, ledger, data, meta, index.blocks, index.chunks)
    assert scrubbed(runtime, ledger) == (
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.index_key,
            0,
            MISMATCH,
            f"index is of ledger orders/{ledger.ledger_id + 1}",
        ),
    )


def test_a_pulsar_object_without_its_first_entry(runtime: Runtime) -> None:
    """Pulsar's objects of entries 1..: the index starts past entry 0, and the (clean)
    blocks hold one entry fewer than the metadata store recorded."""
    ledger = offloaded_ledger(runtime, 300, 2000, fixed=True)
    assert ledger.index_key is not None and ledger.data_key is not None
    entries = list(runtime.hot.read("orders", ledger.ledger_id))
    store_as_pulsar(runtime, ledger, pulsar_write_blocks(entries[1:], 64 * 1024), PULSAR_META)
    assert scrubbed(runtime, ledger) == (
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.index_key,
            0,
            MISMATCH,
            "index starts at entry 1, not 0",
        ),
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.data_key,
            None,
            MISMATCH,
            "data object holds 299 entries, the metadata store says 300",
        ),
    )


def test_a_pulsar_index_that_moves_a_block_boundary_back_one_entry(runtime: Runtime) -> None:
    """The index says block 1 starts one entry early: block 0 then holds an entry more than
    the index allows (not padding where its count ends), block 1's header disagrees."""
    size = 2000
    ledger = offloaded_ledger(runtime, 300, size, fixed=True)
    assert ledger.data_key is not None
    entries = list(runtime.hot.read("orders", ledger.ledger_id))
    blocks = pulsar_write_blocks(entries, 64 * 1024)
    assert len(blocks) >= 3
    second = blocks[1][0]
    store_as_pulsar(
        runtime, ledger, [blocks[0], (second - 1, blocks[1][1]), *blocks[2:]], PULSAR_META
    )
    counted_end = HEADER_LEN + (second - 1) * (ENTRY_FRAME + size)
    assert scrubbed(runtime, ledger) == (
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.data_key,
            counted_end,
            DAMAGED,
            f"{64 * 1024 - counted_end} bytes after the last entry in block starting at "
            "entry 0 are not padding",
        ),
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.data_key,
            64 * 1024 + 20,
            DAMAGED,
            f"block header first_entry_id {second}, index says {second - 1}",
        ),
    )


def test_an_entry_framed_after_those_the_index_lists_is_not_padding(runtime: Runtime) -> None:
    """The index (chunk table and metadata, under valid CRCs) leaves the block's last entry
    out: the index disagrees with the metadata store, and the block holds bytes after the
    entries its index counts that are not padding."""
    size = 500
    ledger = offloaded_ledger(runtime, 20, size, fixed=True)
    assert ledger.index_key is not None and ledger.data_key is not None
    index = index_of(runtime, ledger)
    assert index.metadata is not None and index.chunks is not None
    *chunks, last = index.chunks
    frame = ENTRY_FRAME + size
    shorter = replace(last, length=last.length - frame, entry_count=last.entry_count - 1)
    meta = replace(index.metadata, entry_count=19, last_entry_id=18, length=19 * size)
    data = runtime.objects.get(ledger.data_key)
    rewrite_ledger(runtime, ledger, data, meta, index.blocks, (*chunks, shorter))
    key, n = ledger.index_key, ledger.ledger_id
    assert scrubbed(runtime, ledger) == (
        Finding(
            "orders",
            n,
            key,
            0,
            MISMATCH,
            "index says 19 entries ending at 18, the metadata store 20 ending at 19",
        ),
        Finding(
            "orders",
            n,
            key,
            0,
            MISMATCH,
            f"index says {19 * size} payload bytes, the metadata store {20 * size}",
        ),
        Finding(
            "orders",
            n,
            ledger.data_key,
            len(data) - frame,
            DAMAGED,
            f"{frame} bytes after the last entry in block starting at entry 0 are not padding",
        ),
    )


def test_a_block_header_length_the_index_disagrees_with(runtime: Runtime) -> None:
    """A header whose block_len is not the index's block length (CRCs recomputed): the
    chunk that starts the block names both, at the header's block_len field."""
    ledger = offloaded_ledger(runtime, 20, 500)
    assert ledger.data_key is not None
    index = index_of(runtime, ledger)
    assert index.metadata is not None and index.chunks is not None
    (block,) = index.blocks
    data = pack_at(">q", 12, block.length + 8)(runtime.objects.get(ledger.data_key))
    rewrite_ledger(runtime, ledger, data, index.metadata, index.blocks, index.chunks)
    assert scrubbed(runtime, ledger) == (
        Finding(
            "orders",
            ledger.ledger_id,
            ledger.data_key,
            12,
            DAMAGED,
            f"block_len {block.length + 8} in chunk at offset 0 of the data object, index "
            f"says {block.length}",
        ),
    )


# A streamed topic of two ledgers of 8 entries in one segment of 64 KiB blocks; two entries
# fill a block, so each ledger is 4 blocks: 3 padded, its last trimmed.
T = "events"
SIZE = 64 * 1024 // 3


def one_segment(rt: Runtime) -> tuple[Segment, ScrubTarget, list[int]]:
    """The segment, its target and its two ledgers."""
    make_topic(rt, T, streaming=True, min_part_bytes=64 * 1024, segment_max_bytes=1 << 24)
    ids = produce_ledgers(rt, T, [(8, SIZE)] * 2, fixed=True)
    StreamingOffloader(rt).run_pass(T, close_now=True)
    (segment,) = rt.metadata.segments.of_topic(T)
    (target,) = plan_scrub(rt.metadata, [T])
    assert target.segment_id == segment.segment_id
    assert target.pieces == ((ids[0], 0, 7), (ids[1], 0, 7))
    return segment, target, ids


def segment_blocks(rt: Runtime, segment: Segment) -> list[SegmentBlockRef]:
    index = decode_segment_index(rt.objects.get(segment.index_key))
    return [
        SegmentBlockRef(ledger_id, block, tuple(view.chunks_for_block(block)))
        for ledger_id, view in zip(index.ledger_ids, index.ledgers, strict=True)
        for block in view.blocks
    ]


def rewrite_segment(
    rt: Runtime, segment: Segment, data: bytes, blocks: list[SegmentBlockRef]
) -> None:
    """Store ``data`` and an index of ``blocks`` (same topic and ledger times) with every
    CRC recomputed over ``data``."""
    old = decode_segment_index(rt.objects.get(segment.index_key))
    times = {
        n: (v.metadata.created_ms, v.metadata.sealed_ms)
        for n, v in zip(old.ledger_ids, old.ledgers, strict=True)
        if v.metadata is not None
    }
    sealed = [
        replace(
            b,
            ref=resealed(b.ref, data),
            chunks=tuple(resealed(c, data) for c in b.chunks),
        )
        for b in blocks
    ]
    index = encode_segment_index(sealed, topic=old.topic, ledger_times=times)
    overwrite_object(rt.objects, segment.data_key, lambda _: data)
    overwrite_object(rt.objects, segment.index_key, lambda _: index)


@ONLY_FILES
def test_a_segment_of_many_blocks_per_ledger_is_clean(runtime: Runtime) -> None:
    """Every block's entry count follows from the next block's first id (or the ledger's
    last): each of the 8 blocks is read and counted."""
    segment, target, _ = one_segment(runtime)
    assert [b.ref.first_entry_id for b in segment_blocks(runtime, segment)] == [0, 2, 4, 6] * 2
    result = scrub_ledger(runtime.objects, target)
    assert result.findings == ()
    assert (result.objects, result.blocks, result.entries) == (2, 8, 16)


@dataclass(frozen=True)
class BlockDamage:
    """Where a plant damaged a block of ledger 1, and the finding's reason for it."""

    offset: int
    reason: str  # after "segment S: ledger L: "
    one_entry_short: bool = False  # the index also holds ledger 1 without its last entry


def padding_at(block: BlockRef) -> int:
    """Where a full block's padding starts: after its header and two entries."""
    return block.offset + HEADER_LEN + 2 * (ENTRY_FRAME + SIZE)


def flipped_padding(rt: Runtime, segment: Segment) -> BlockDamage:
    """A padding byte of ledger 1's second block: only the block CRC sees it."""
    block = segment_blocks(rt, segment)[1].ref
    end = block.offset + block.length
    overwrite_object(rt.objects, segment.data_key, flip(end - 1))
    actual = crc32c(rt.objects.get(segment.data_key)[block.offset : end])
    return BlockDamage(
        block.offset,
        f"CRC mismatch in block of entries from 2: expected 0x{block.crc32c:08X}, "
        f"got 0x{actual:08X}",
    )


def entry_in_padding(rt: Runtime, segment: Segment) -> BlockDamage:
    """A frame for entry 4 in the padding of ledger 1's second block, CRCs recomputed:
    the block holds bytes after the two entries the index counts that are not padding."""
    blocks = segment_blocks(rt, segment)
    block = blocks[1].ref
    at = padding_at(block)
    frame = struct.pack(">iq", 4, 4) + b"four"
    data = bytearray(rt.objects.get(segment.data_key))
    data[at : at + len(frame)] = frame
    rewrite_segment(rt, segment, bytes(data), blocks)
    left = block.offset + block.length - at
    return BlockDamage(
        at, f"{left} bytes after the last entry in block starting at entry 2 are not padding"
    )


def unlisted_last_entry(rt: Runtime, segment: Segment) -> BlockDamage:
    """Ledger 1's index leaves out the entry its last block ends with (chunk table and
    metadata under valid CRCs): its range is one short and the block has bytes after the
    entries its index counts."""
    blocks = segment_blocks(rt, segment)
    last = blocks[3]
    *chunks, chunk = last.chunks
    frame = ENTRY_FRAME + SIZE
    shorter = replace(chunk, length=chunk.length - frame, entry_count=chunk.entry_count - 1)
    blocks[3] = replace(last, chunks=(*chunks, shorter))
    rewrite_segment(rt, segment, rt.objects.get(segment.data_key), blocks)
    end = last.ref.offset + last.ref.length
    return BlockDamage(
        end - frame,
        f"{frame} bytes after the last entry in block starting at entry 6 are not padding",
        one_entry_short=True,
    )


def header_block_len(rt: Runtime, segment: Segment) -> BlockDamage:
    """Ledger 1's second block's header says 8 bytes more than the index (CRCs recomputed)."""
    blocks = segment_blocks(rt, segment)
    block = blocks[1].ref
    data = pack_at(">q", block.offset + 12, block.length + 8)(rt.objects.get(segment.data_key))
    rewrite_segment(rt, segment, data, blocks)
    return BlockDamage(
        block.offset + 12,
        f"block_len {block.length + 8} in chunk at offset {block.offset} of the data object, "
        f"index says {block.length}",
    )


SEGMENT_DAMAGE: dict[str, Callable[[Runtime, Segment], BlockDamage]] = {
    "flipped-padding": flipped_padding,
    "entry-in-padding": entry_in_padding,
    "unlisted-last-entry": unlisted_last_entry,
    "header-block-len": header_block_len,
}


@ONLY_FILES
@pytest.mark.parametrize("damage", list(SEGMENT_DAMAGE))
def test_damage_in_a_segment_block_is_found_where_it_is(runtime: Runtime, damage: str) -> None:
    """One damaged block of ledger 1: the finding names the segment, the ledger, the place
    and what is wrong there (after the index's disagreement with the metadata store, if
    the plant made one)."""
    segment, target, ids = one_segment(runtime)
    planted = SEGMENT_DAMAGE[damage](runtime, segment)
    sid, first = segment.segment_id, ids[0]
    short = Finding(
        T,
        first,
        segment.index_key,
        0,
        MISMATCH,
        f"segment {sid}: index holds {first}:0..{first}:6, {ids[1]}:0..{ids[1]}:7, the "
        f"metadata store recorded {first}:0..{first}:7, {ids[1]}:0..{ids[1]}:7",
    )
    reason = f"segment {sid}: ledger {first}: {planted.reason}"
    block = Finding(T, first, segment.data_key, planted.offset, DAMAGED, reason)
    expected = (short, block) if planted.one_entry_short else (block,)
    assert scrub_ledger(runtime.objects, target).findings == expected


@ONLY_FILES
def test_a_segment_whose_recorded_ranges_are_short_holds_more_entries(runtime: Runtime) -> None:
    """The metadata store recorded ledger 1 from entry 1: the index disagrees, and the clean
    blocks hold one entry more than the recorded ranges."""
    segment, _, ids = one_segment(runtime)
    SL = schema.pieces
    with runtime.metadata.engine.begin() as conn:
        conn.execute(
            SL.update()
            .where(SL.c.segment_id == segment.segment_id, SL.c.ledger_id == ids[0])
            .values(first_entry_id=1)
        )
    (target,) = plan_scrub(runtime.metadata, [T])
    sid, first, second = segment.segment_id, ids[0], ids[1]
    assert scrub_ledger(runtime.objects, target).findings == (
        Finding(
            T,
            first,
            segment.index_key,
            0,
            MISMATCH,
            f"segment {sid}: index holds {first}:0..{first}:7, {second}:0..{second}:7, the "
            f"metadata store recorded {first}:1..{first}:7, {second}:0..{second}:7",
        ),
        Finding(
            T,
            first,
            segment.data_key,
            None,
            MISMATCH,
            f"segment {sid}: data object holds 16 entries, the metadata store's ranges 15",
        ),
    )


@ONLY_FILES
def test_a_segment_recorded_under_another_topic_and_length(runtime: Runtime) -> None:
    """The metadata store's record (the target) names another topic and a data object
    length the index does not: both are findings on the index, at offset 0."""
    segment, target, ids = one_segment(runtime)
    length = runtime.objects.stat(segment.data_key).size
    other = replace(target, topic="audit", data_len=length + 1)
    sid = segment.segment_id
    assert scrub_ledger(runtime.objects, other).findings == (
        Finding(
            "audit",
            ids[0],
            segment.index_key,
            0,
            MISMATCH,
            f"segment {sid}: index is of topic '{T}'",
        ),
        Finding(
            "audit",
            ids[0],
            segment.index_key,
            0,
            MISMATCH,
            f"segment {sid}: index says the data object is {length} bytes, the metadata "
            f"store recorded {length + 1}",
        ),
    )
