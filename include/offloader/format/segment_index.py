"""The v2 (streaming segment) index codec: Pulsar's per-ledger records, then ours, a last
record for ledger -1 holding block CRCs, the chunk table and the index CRC."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import crc32c

from offloader.exceptions import FormatError
from offloader.format.blocks import metadata_for
from offloader.format.index import (
    _check_blocks_contiguous,
    _check_chunks,
    _decode_metadata,
    decode_index,
    encode_metadata,
)
from offloader.format.layout import (
    _EXT_CHUNK,
    _INDEX_ENTRY,
    _INT32,
    _INT32_MAX,
    _UINT32,
    HEADER_LEN,
    INDEX_MAGIC,
    BlockRef,
    ChunkRef,
    LedgerIndex,
    _as_bytes,
)
from offloader.format.segment_layout import (
    _LEDGER_RECORD,
    _SEG_EXT_BLOCK,
    _SEG_EXT_HEAD,
    _SEGMENT_INDEX_HEAD,
    EXT_LEDGER_ID,
    SEGMENT_EXT_MAGIC,
    SEGMENT_EXT_VERSION,
    SEGMENT_INDEX_MAGIC,
    SegmentBlockRef,
    SegmentIndex,
)

UNKNOWN_MS = -1  # created/sealed time of a ledger the caller gave none for (still open)

# (ledger_id, metadata bytes, [(first_entry_id, part_id, block_offset)], record offset)
_Record = tuple[int, bytes, list[tuple[int, int, int]], int]


def encode_segment_index(
    blocks: Sequence[SegmentBlockRef],
    *,
    topic: str,
    ledger_times: Mapping[int, tuple[int, int]] | None = None,
) -> bytes:
    """The index object of a segment whose data object is exactly ``blocks``, in order.

    ``ledger_times`` maps a ledger id to its (created_ms, sealed_ms); missing ledgers get
    -1 for both (e.g. the ledger was still open when the segment closed).
    """
    if not blocks:
        raise ValueError("a segment index needs at least one block")
    _check_blocks_contiguous([b.ref for b in blocks])
    _check_segment_blocks(blocks)
    times = ledger_times or {}
    records = []
    for ledger_id, group in itertools.groupby(blocks, key=lambda b: b.ledger_id):
        run = list(group)
        refs = [b.ref for b in run]
        created, sealed = times.get(ledger_id, (UNKNOWN_MS, UNKNOWN_MS))
        meta = encode_metadata(
            metadata_for(
                refs,
                [c for b in run for c in b.chunks],
                topic=topic,
                ledger_id=ledger_id,
                created_ms=created,
                sealed_ms=sealed,
            )
        )
        records.append(_LEDGER_RECORD.pack(ledger_id, len(refs), len(meta)) + meta)
        records += [_INDEX_ENTRY.pack(r.first_entry_id, r.part_id, r.offset) for r in refs]
    ext = _encode_extension(blocks)
    records.append(_LEDGER_RECORD.pack(EXT_LEDGER_ID, 0, len(ext) + 4) + ext)
    index_len = _SEGMENT_INDEX_HEAD.size + sum(len(r) for r in records) + 4
    if index_len > _INT32_MAX:
        raise ValueError(f"segment index of {index_len} bytes exceeds int32")
    data_len = blocks[-1].ref.offset + blocks[-1].ref.length
    head = _SEGMENT_INDEX_HEAD.pack(SEGMENT_INDEX_MAGIC, index_len, data_len, HEADER_LEN)
    body = head + b"".join(records)
    return body + _UINT32.pack(crc32c.crc32c(body))


def _check_segment_blocks(blocks: Sequence[SegmentBlockRef]) -> None:
    """Ledger ids rise (each ledger's blocks together), part ids run 1, 2, ... with no gap."""
    prev_ledger = 0
    parts: tuple[int, ...] = (1,)  # the part ids the next block may have
    for b in blocks:
        where = f"block at offset {b.ref.offset}"
        if b.ledger_id < prev_ledger:
            raise ValueError(f"{where}: ledger {b.ledger_id} after ledger {prev_ledger}")
        if b.ref.part_id not in parts:
            raise ValueError(f"{where}: part {b.ref.part_id}, expected one of {parts}")
        if b.ref.crc32c is None or not b.chunks:
            raise ValueError(f"{where} lacks its crc32c or chunks")
        prev_ledger, parts = b.ledger_id, (b.ref.part_id, b.ref.part_id + 1)


def _encode_extension(blocks: Sequence[SegmentBlockRef]) -> bytes:
    chunks = [c for b in blocks for c in b.chunks]
    parts = [_SEG_EXT_HEAD.pack(SEGMENT_EXT_MAGIC, SEGMENT_EXT_VERSION, len(blocks))]
    parts += [
        _SEG_EXT_BLOCK.pack(b.ledger_id, b.ref.part_id, b.ref.offset, b.ref.length, b.ref.crc32c)
        for b in blocks
    ]
    parts.append(_INT32.pack(len(chunks)))
    parts += [
        _EXT_CHUNK.pack(c.first_entry_id, c.offset, c.length, c.entry_count, c.crc32c)
        for c in chunks
    ]
    return b"".join(parts)


def decode_any_index(data: bytes) -> LedgerIndex | SegmentIndex:
    """A v1 ledger index or a v2 segment index, told apart by the magic."""
    data = _as_bytes(data)
    if len(data) < 4:
        raise FormatError(f"truncated index: {len(data)} bytes, not even a magic", offset=len(data))
    magic = _UINT32.unpack_from(data, 0)[0]
    if magic == INDEX_MAGIC:
        return decode_index(data)
    if magic == SEGMENT_INDEX_MAGIC:
        return decode_segment_index(data)
    raise FormatError(
        f"bad index magic 0x{magic:08X}, expected 0x{INDEX_MAGIC:08X} (v1) "
        f"or 0x{SEGMENT_INDEX_MAGIC:08X} (v2)",
        offset=0,
    )


def decode_segment_index(data: bytes) -> SegmentIndex:
    """Parse and check a v2 index written by us (with the extension record)."""
    data = _as_bytes(data)
    head = _SEGMENT_INDEX_HEAD
    if len(data) < head.size:
        raise FormatError(
            f"truncated segment index: {len(data)} bytes, the head alone is {head.size}",
            offset=len(data),
        )
    magic, index_len, data_len, header_len = head.unpack_from(data, 0)
    if magic != SEGMENT_INDEX_MAGIC:
        raise FormatError(
            f"bad segment index magic 0x{magic:08X}, expected 0x{SEGMENT_INDEX_MAGIC:08X}",
            offset=0,
        )
    if index_len != len(data):
        what = "truncated segment index" if len(data) < index_len else "index_len mismatch"
        raise FormatError(f"{what}: index_len says {index_len} bytes, got {len(data)}", offset=4)
    if header_len != HEADER_LEN:
        raise FormatError(
            f"unsupported data_header_len {header_len}, expected {HEADER_LEN}", offset=16
        )
    records, ext_at = _read_records(data)
    blocks, chunks = _read_extension(data, ext_at, records)
    ledgers = _ledger_views(data, data_len, records, blocks, chunks, ext_at)
    return SegmentIndex(data_len, header_len, ledgers)


def _read_records(data: bytes) -> tuple[list[_Record], int]:
    """Pulsar's ledger records up to ours (ledger -1); returns them and where ours starts."""
    pos = _SEGMENT_INDEX_HEAD.size
    records: list[_Record] = []
    while pos + _LEDGER_RECORD.size <= len(data):
        ledger_id, count, meta_len = _LEDGER_RECORD.unpack_from(data, pos)
        if ledger_id == EXT_LEDGER_ID:
            return records, pos
        entries_at = pos + _LEDGER_RECORD.size + meta_len
        end = entries_at + count * _INDEX_ENTRY.size
        if ledger_id < 0 or count < 1 or meta_len < 0 or end > len(data):
            raise FormatError(
                f"bad ledger record at index byte {pos}: ledger {ledger_id}, {count} index "
                f"entries, {meta_len} metadata bytes in an index of {len(data)}",
                offset=pos,
            )
        if records and ledger_id <= records[-1][0]:
            raise FormatError(
                f"ledger record {ledger_id} after ledger {records[-1][0]}: ids must rise",
                offset=pos,
            )
        entries = list(_INDEX_ENTRY.iter_unpack(data[entries_at:end]))
        records.append((ledger_id, data[pos + _LEDGER_RECORD.size : entries_at], entries, pos))
        pos = end
    raise FormatError(
        "segment index has no extension record (ledger -1): not written by this codec, "
        "or truncated",
        offset=pos,
    )


def _read_extension(
    data: bytes, at: int, records: list[_Record]
) -> tuple[list[tuple[int, BlockRef]], list[ChunkRef]]:
    """Our record: checked against its framing and the index CRC, then its block table
    against Pulsar's entries. Returns (ledger_id, block) pairs and the chunk table."""
    _, count, ext_len = _LEDGER_RECORD.unpack_from(data, at)
    body_at = at + _LEDGER_RECORD.size
    if count != 0 or body_at + ext_len != len(data) or ext_len < _SEG_EXT_HEAD.size + 8:
        raise FormatError(
            f"bad extension record at index byte {at}: {count} index entries, {ext_len} bytes, "
            f"it must be the last record of the index ({len(data) - body_at} bytes left)",
            offset=at,
        )
    if not records:
        raise FormatError("segment index has no ledger records", offset=at)
    stored, actual = _UINT32.unpack_from(data, len(data) - 4)[0], crc32c.crc32c(data[:-4])
    if stored != actual:
        raise FormatError(
            f"bad index crc: stored 0x{stored:08X}, computed 0x{actual:08X}",
            offset=len(data) - 4,
        )
    magic, version, block_count = _SEG_EXT_HEAD.unpack_from(data, body_at)
    if magic != SEGMENT_EXT_MAGIC:
        raise FormatError(
            f"bad segment extension magic 0x{magic:08X}, expected 0x{SEGMENT_EXT_MAGIC:08X}",
            offset=body_at,
        )
    if version != SEGMENT_EXT_VERSION:
        raise FormatError(
            f"unknown segment extension version {version}, expected {SEGMENT_EXT_VERSION}",
            offset=body_at + 4,
        )
    pulsar = [(r[0], e) for r in records for e in r[2]]
    if block_count != len(pulsar):
        raise FormatError(
            f"extension lists {block_count} blocks, the ledger records {len(pulsar)}",
            offset=body_at + 8,
        )
    pos = body_at + _SEG_EXT_HEAD.size
    if pos + block_count * _SEG_EXT_BLOCK.size + 8 > len(data):
        raise FormatError(
            f"truncated segment extension: {block_count} block records need "
            f"{pos + block_count * _SEG_EXT_BLOCK.size + 8} bytes, index has {len(data)}",
            offset=body_at + 8,
        )
    blocks = []
    for ledger_id, (first, part, offset) in pulsar:
        e_ledger, e_part, e_offset, length, crc = _SEG_EXT_BLOCK.unpack_from(data, pos)
        if (e_ledger, e_part, e_offset) != (ledger_id, part, offset):
            raise FormatError(
                f"extension block {e_ledger}/{e_part}@{e_offset} != ledger record entry "
                f"{ledger_id}/{part}@{offset}",
                offset=pos,
            )
        blocks.append((ledger_id, BlockRef(part, offset, length, first, crc)))
        pos += _SEG_EXT_BLOCK.size
    return blocks, _read_chunks(data, pos, {b.offset for _, b in blocks})


def _read_chunks(data: bytes, pos: int, block_starts: set[int]) -> list[ChunkRef]:
    """The chunk table, which must end exactly where index_crc begins."""
    (count,) = _INT32.unpack_from(data, pos)
    end = pos + 4 + count * _EXT_CHUNK.size
    if count < 1 or end + 4 != len(data):
        raise FormatError(
            f"segment extension size mismatch: {count} chunks need {end + 4} bytes, "
            f"index has {len(data)}",
            offset=pos,
        )
    return [
        ChunkRef(first, offset, length, n, crc, offset in block_starts)
        for first, offset, length, n, crc in _EXT_CHUNK.iter_unpack(data[pos + 4 : end])
    ]


def _ledger_views(
    data: bytes,
    data_len: int,
    records: list[_Record],
    blocks: list[tuple[int, BlockRef]],
    chunks: list[ChunkRef],
    ext_at: int,
) -> tuple[LedgerIndex, ...]:
    """Split blocks and chunks by ledger and check each ledger as v1 checks a ledger."""
    _check_tiling([b for _, b in blocks], data_len, ext_at)
    views: list[LedgerIndex] = []
    bi, ci, topic = 0, 0, None
    chunks_at = ext_at + _LEDGER_RECORD.size + _SEG_EXT_HEAD.size + 4
    chunks_at += len(blocks) * _SEG_EXT_BLOCK.size
    for ledger_id, raw_meta, entries, record_at in records:
        mine = tuple(b for _, b in blocks[bi : bi + len(entries)])
        bi += len(entries)
        end = mine[-1].offset + mine[-1].length
        cj = ci
        while cj < len(chunks) and chunks[cj].offset < end:
            cj += 1
        try:
            meta = _decode_metadata(raw_meta, strict=True)
            assert meta is not None
            next_id = _check_chunks(mine, chunks[ci:cj])
        except FormatError as e:
            raise FormatError(f"ledger {ledger_id}: {e}", offset=record_at) from e
        count = next_id - mine[0].first_entry_id
        topic = meta.topic if topic is None else topic
        if meta.topic != topic:
            raise FormatError(
                f"ledger {ledger_id}: topic {meta.topic!r}, the segment's is {topic!r}",
                offset=record_at + _LEDGER_RECORD.size,
            )
        said = (meta.ledger_id, meta.entry_count, meta.last_entry_id)
        if said != (ledger_id, count, next_id - 1):
            raise FormatError(
                f"ledger {ledger_id}: chunks hold entries {mine[0].first_entry_id}..{next_id - 1}, "
                f"metadata says ledger {meta.ledger_id}, {meta.entry_count} entries ending at "
                f"{meta.last_entry_id}",
                offset=record_at + _LEDGER_RECORD.size,
            )
        views.append(LedgerIndex(data_len, HEADER_LEN, meta, mine, tuple(chunks[ci:cj])))
        ci = cj
    if ci != len(chunks):
        raise FormatError(
            f"chunk at offset {chunks[ci].offset} lies beyond the last ledger's blocks",
            offset=chunks_at + ci * _EXT_CHUNK.size,
        )
    return tuple(views)


def _check_tiling(blocks: list[BlockRef], data_len: int, ext_at: int) -> None:
    """Blocks tile the data object from 0; part ids run 1, 2, ... (a part may hold several)."""
    offset = 0
    parts: tuple[int, ...] = (1,)  # the part ids the next block may have
    for b in blocks:
        if b.offset != offset or b.part_id not in parts:
            raise FormatError(
                f"block part {b.part_id} at {b.offset}+{b.length}, expected offset {offset} "
                f"in part {' or '.join(map(str, parts))}",
                offset=ext_at,
            )
        offset, parts = offset + b.length, (b.part_id, b.part_id + 1)
    if offset != data_len:
        raise FormatError(f"blocks cover {offset} bytes, data_object_len {data_len}", offset=8)
