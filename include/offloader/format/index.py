"""The index object codec: a Pulsar v1 index, then (ours) the versioned extension with
block CRCs and the chunk table; a pure Pulsar index decodes too."""

from __future__ import annotations

from collections.abc import Sequence

import crc32c

from offloader.exceptions import FormatError
from offloader.format.layout import (
    _EXT_BLOCK,
    _EXT_CHUNK,
    _EXT_HEAD,
    _INDEX_ENTRY,
    _INDEX_HEAD,
    _INT32,
    _INT32_MAX,
    _META_HEAD,
    _UINT32,
    ENTRY_FRAME,
    EXT_MAGIC,
    EXT_VERSION,
    HEADER_LEN,
    INDEX_MAGIC,
    META_VERSION,
    BlockRef,
    ChunkRef,
    LedgerIndex,
    LedgerMetadata,
    _as_bytes,
)


def encode_metadata(metadata: LedgerMetadata) -> bytes:
    """Our versioned metadata record (the v1 index's metadata field)."""
    topic = metadata.topic.encode("utf-8")
    if len(topic) > 0x7FFF:
        raise ValueError(f"topic name of {len(topic)} utf-8 bytes exceeds int16")
    m = metadata
    head = _META_HEAD.pack(
        META_VERSION,
        m.ledger_id,
        m.entry_count,
        m.last_entry_id,
        m.length,
        m.created_ms,
        m.sealed_ms,
        len(topic),
    )
    return head + topic


def encode_index(
    metadata: LedgerMetadata, blocks: Sequence[BlockRef], chunks: Sequence[ChunkRef] | None
) -> bytes:
    """The index object: Pulsar v1 index, then (unless chunks is None) our extension."""
    if not blocks:
        raise ValueError("an index needs at least one block")
    _check_blocks_contiguous(blocks)
    meta = encode_metadata(metadata)
    parts = [b"", meta]
    parts += [_INDEX_ENTRY.pack(b.first_entry_id, b.part_id, b.offset) for b in blocks]
    if chunks is not None:
        parts.append(_encode_extension(blocks, chunks))
    data_len = blocks[-1].offset + blocks[-1].length
    index_len = _INDEX_HEAD.size + sum(len(p) for p in parts) + (4 if chunks is not None else 0)
    if index_len > _INT32_MAX:
        raise ValueError(f"index of {index_len} bytes exceeds int32")
    parts[0] = _INDEX_HEAD.pack(
        INDEX_MAGIC, index_len, data_len, HEADER_LEN, len(blocks), len(meta)
    )
    body = b"".join(parts)
    if chunks is None:
        return body
    return body + _UINT32.pack(crc32c.crc32c(body))


def _check_blocks_contiguous(blocks: Sequence[BlockRef]) -> None:
    offset = 0
    for b in blocks:
        if b.offset != offset:
            raise ValueError(f"block part {b.part_id} at offset {b.offset}, expected {offset}")
        offset += b.length


def _encode_extension(blocks: Sequence[BlockRef], chunks: Sequence[ChunkRef]) -> bytes:
    if any(b.crc32c is None for b in blocks):
        raise ValueError("the extension needs every block's crc32c")
    parts = [_EXT_HEAD.pack(EXT_MAGIC, EXT_VERSION, len(blocks))]
    parts += [_EXT_BLOCK.pack(b.part_id, b.offset, b.length, b.crc32c) for b in blocks]
    parts.append(_INT32.pack(len(chunks)))
    parts += [
        _EXT_CHUNK.pack(c.first_entry_id, c.offset, c.length, c.entry_count, c.crc32c)
        for c in chunks
    ]
    return b"".join(parts)


def decode_index(data: bytes) -> LedgerIndex:
    """Parse an index object, ours (with extension) or Pulsar's v1 (without)."""
    data = _as_bytes(data)
    if len(data) < _INDEX_HEAD.size:
        raise FormatError(
            f"truncated index: {len(data)} bytes, the v1 head alone is 32", offset=len(data)
        )
    magic, index_len, data_len, header_len, count, meta_len = _INDEX_HEAD.unpack_from(data, 0)
    if magic != INDEX_MAGIC:
        raise FormatError(f"bad index magic 0x{magic:08X}, expected 0x{INDEX_MAGIC:08X}", offset=0)
    if index_len != len(data):
        what = "truncated index" if len(data) < index_len else "index_len mismatch"
        raise FormatError(
            f"{what}: index_len says {index_len} bytes, got {len(data)}",
            offset=min(index_len, len(data)) if index_len >= 0 else 4,
        )
    if header_len != HEADER_LEN:
        raise FormatError(
            f"unsupported data_header_len {header_len}, expected {HEADER_LEN}", offset=16
        )
    entries_at = _INDEX_HEAD.size + meta_len
    ext_at = entries_at + count * _INDEX_ENTRY.size
    if count < 1 or meta_len < 0 or ext_at > len(data):
        raise FormatError(
            f"truncated index: {count} entries and {meta_len} metadata bytes "
            f"need {ext_at} bytes, index has {len(data)}",
            offset=24,
        )
    firsts = [
        _INDEX_ENTRY.unpack_from(data, entries_at + i * _INDEX_ENTRY.size) for i in range(count)
    ]
    raw_meta = data[_INDEX_HEAD.size : entries_at]
    if ext_at == len(data):  # no extension: a pure Pulsar v1 index
        _check_pulsar_entries(firsts, entries_at)
        meta = _decode_metadata(raw_meta, strict=False)
        return LedgerIndex(data_len, header_len, meta, _pulsar_blocks(firsts, data_len), None)
    blocks, chunks = _decode_extension(data, ext_at, firsts)  # checks index_crc first
    meta = _decode_metadata(raw_meta, strict=True)
    index = LedgerIndex(data_len, header_len, meta, blocks, chunks)
    _check_extension(index)
    return index


def _decode_metadata(raw: bytes, *, strict: bool) -> LedgerMetadata | None:
    """Our metadata record; None for foreign metadata (e.g. Pulsar's protobuf) unless strict."""
    try:
        if len(raw) < _META_HEAD.size:
            raise FormatError(f"metadata of {len(raw)} bytes is shorter than {_META_HEAD.size}")
        version, ledger, count, last, length, created, sealed, topic_len = _META_HEAD.unpack_from(
            raw, 0
        )
        if version != META_VERSION:
            raise FormatError(f"unknown metadata version {version}, expected {META_VERSION}")
        if _META_HEAD.size + topic_len != len(raw):
            raise FormatError(
                f"metadata length {len(raw)} does not match topic_len {topic_len} "
                f"(+ {_META_HEAD.size})"
            )
        topic = raw[_META_HEAD.size :].decode("utf-8")
    except (FormatError, UnicodeDecodeError) as e:
        if strict:
            raise FormatError(f"bad index metadata: {e}") from e
        return None
    return LedgerMetadata(topic, ledger, count, last, length, created, sealed)


def _check_pulsar_entries(firsts: list[tuple[int, int, int]], entries_at: int) -> None:
    """What a v1 index alone can promise: blocks from offset 0, entry ids rising, each
    block holding at least one entry (our extension checks far more, under its CRC)."""
    if firsts[0][2] != 0 or firsts[0][0] < 0:
        raise FormatError(
            f"index entry 0: block {firsts[0][0]}@{firsts[0][2]}, expected an id >= 0 at 0",
            offset=entries_at,
        )
    for i in range(1, len(firsts)):
        if firsts[i][0] <= firsts[i - 1][0]:
            raise FormatError(
                f"index entry {i}: first_entry_id {firsts[i][0]} after {firsts[i - 1][0]}",
                offset=entries_at + i * _INDEX_ENTRY.size,
            )


def _pulsar_blocks(firsts: list[tuple[int, int, int]], data_len: int) -> tuple[BlockRef, ...]:
    """Block refs from v1 index entries alone: a block ends where the next one starts."""
    ends = [offset for _, _, offset in firsts[1:]] + [data_len]
    blocks = []
    for (first, part, offset), end in zip(firsts, ends, strict=True):
        if end - offset < HEADER_LEN:
            raise FormatError(f"index entry for part {part}: block at {offset}..{end} too short")
        blocks.append(BlockRef(part, offset, end - offset, first, None))
    return tuple(blocks)


def _decode_extension(
    data: bytes, at: int, firsts: list[tuple[int, int, int]]
) -> tuple[tuple[BlockRef, ...], tuple[ChunkRef, ...]]:
    if at + _EXT_HEAD.size + 4 > len(data):
        raise FormatError(f"truncated index extension: {len(data) - at} bytes after the v1 entries")
    magic, version, block_count = _EXT_HEAD.unpack_from(data, at)
    if magic != EXT_MAGIC:
        raise FormatError(
            f"bad index extension magic 0x{magic:08X}, expected 0x{EXT_MAGIC:08X} "
            f"({len(data) - at} unexpected bytes after the v1 entries)",
            offset=at,
        )
    if version != EXT_VERSION:
        raise FormatError(
            f"unknown index extension version {version}, expected {EXT_VERSION}", offset=at + 4
        )
    stored = _UINT32.unpack_from(data, len(data) - 4)[0]
    actual = crc32c.crc32c(data[:-4])
    if stored != actual:
        raise FormatError(
            f"bad index crc: stored 0x{stored:08X}, computed 0x{actual:08X}",
            offset=len(data) - 4,
        )
    if block_count != len(firsts):
        raise FormatError(f"extension lists {block_count} blocks, v1 index {len(firsts)}")
    blocks, pos = _decode_ext_blocks(data, at + _EXT_HEAD.size, firsts)
    return blocks, _decode_ext_chunks(data, pos, {b.offset for b in blocks})


def _decode_ext_blocks(
    data: bytes, pos: int, firsts: list[tuple[int, int, int]]
) -> tuple[tuple[BlockRef, ...], int]:
    """The extension's block table, checked against the v1 entries; returns the next offset."""
    _need(data, pos + len(firsts) * _EXT_BLOCK.size + 4, "block table")
    blocks = []
    for first, part, offset in firsts:
        e_part, e_offset, length, crc = _EXT_BLOCK.unpack_from(data, pos)
        if (e_part, e_offset) != (part, offset):
            raise FormatError(f"extension block {e_part}@{e_offset} != v1 entry {part}@{offset}")
        blocks.append(BlockRef(part, offset, length, first, crc))
        pos += _EXT_BLOCK.size
    return tuple(blocks), pos


def _decode_ext_chunks(data: bytes, pos: int, block_starts: set[int]) -> tuple[ChunkRef, ...]:
    """The chunk table, which must end exactly where index_crc begins."""
    (count,) = _INT32.unpack_from(data, pos)
    pos += 4
    end = pos + count * _EXT_CHUNK.size
    if count < 0 or end + 4 != len(data):
        raise FormatError(
            f"index extension size mismatch: {count} chunks need {end + 4} bytes, "
            f"index has {len(data)}"
        )
    return tuple(
        ChunkRef(first, offset, length, n, crc, offset in block_starts)
        for first, offset, length, n, crc in _EXT_CHUNK.iter_unpack(data[pos:end])
    )


def _need(data: bytes, end: int, what: str) -> None:
    if end > len(data):
        raise FormatError(f"truncated index {what}: needs {end} bytes, index has {len(data)}")


def _check_extension(index: LedgerIndex) -> None:
    """Blocks tile the data object; chunks tile each block's framed bytes with running ids."""
    offset = 0
    for b in index.blocks:
        if b.offset != offset or b.length < HEADER_LEN:
            raise FormatError(f"block part {b.part_id} at {b.offset}+{b.length}, expected {offset}")
        offset += b.length
    if offset != index.data_object_len:
        raise FormatError(f"blocks cover {offset} bytes, data_object_len {index.data_object_len}")
    assert index.chunks is not None
    if not index.chunks:
        raise FormatError("index extension has no chunks")
    next_id = _check_chunks(index.blocks, index.chunks)
    meta = index.metadata
    count = next_id - index.first_entry_id
    if meta is not None and (meta.last_entry_id, meta.entry_count) != (next_id - 1, count):
        raise FormatError(
            f"chunks hold entries {index.first_entry_id}..{next_id - 1}, metadata says "
            f"{meta.entry_count} entries ending at {meta.last_entry_id}"
        )


def _check_chunks(blocks: Sequence[BlockRef], chunks: Sequence[ChunkRef]) -> int:
    """Chunks tile each block from its start, ids run on; returns the id after the last."""
    bi, block_end, expect, next_id = -1, 0, -1, blocks[0].first_entry_id
    for c in chunks:
        if bi + 1 < len(blocks) and c.offset == blocks[bi + 1].offset:
            bi += 1
            block_end = blocks[bi].offset + blocks[bi].length
            if c.first_entry_id != blocks[bi].first_entry_id:
                raise FormatError(f"chunk at offset {c.offset} does not start block {bi + 1}")
        elif c.offset != expect:
            raise FormatError(f"chunk at offset {c.offset} does not follow the one ending {expect}")
        if c.end > block_end:
            raise FormatError(f"chunk at offset {c.offset}+{c.length} overruns its block")
        if c.first_entry_id != next_id or c.entry_count < 1 or c.length < ENTRY_FRAME:
            raise FormatError(f"chunk at offset {c.offset} breaks the entry sequence at {next_id}")
        expect, next_id = c.end, next_id + c.entry_count
    if bi != len(blocks) - 1:
        raise FormatError(f"chunks cover {bi + 1} of {len(blocks)} blocks")
    return next_id
