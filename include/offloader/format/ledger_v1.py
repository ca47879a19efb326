"""Pulsar PIP-17 v1 ledger objects: block writer/reader and index codec with our chunk table.

The data object is a run of v1 blocks exactly as Pulsar's jcloud offloader writes them, so a
Pulsar reader can read what we write. The index object is a Pulsar v1 index followed by our
versioned extension (per-block CRCs and a dense chunk table), which a Pulsar reader skips
because it reads only ``entry_count`` index entries. See docs/FORMAT.md for the byte layout.
"""

from __future__ import annotations

import bisect
import io
import itertools
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import crc32c

from offloader.exceptions import EmptyLedgerError, EntryTooLargeError, FormatError

HEADER_LEN = 128
BLOCK_MAGIC = 0xFBDBABCB
INDEX_MAGIC = 0xDE47DE47
EXT_MAGIC = 0x0FF1DE5C
EXT_VERSION = 1
META_VERSION = 1
PADDING = bytes.fromhex("FEDCDEAD")
ENTRY_FRAME = 12
DEFAULT_CHUNK_TARGET = 1 << 20
MIN_BLOCK_SIZE = HEADER_LEN + ENTRY_FRAME + 1
FORMAT_VERSION = 1

# Magics are packed unsigned: the bytes are the same as Java's signed int32.
_BLOCK_HEADER = struct.Struct(">Iqqq100x")  # magic, header_len, block_len, first_entry_id
_FRAME = struct.Struct(">iq")  # entry_len, entry_id
_INDEX_HEAD = struct.Struct(">Iiqqii")  # magic, index_len, data_len, header_len, count, meta_len
_INDEX_ENTRY = struct.Struct(">qiq")  # first_entry_id, part_id, block_offset
_EXT_HEAD = struct.Struct(">Iii")  # ext_magic, ext_version, block_count
_EXT_BLOCK = struct.Struct(">iqqI")  # part_id, offset, length, crc32c
_EXT_CHUNK = struct.Struct(">qqiiI")  # first_entry_id, offset, length, entry_count, crc32c
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_META_HEAD = struct.Struct(">hqqqqqqh")  # version, ids/counts/times, topic_len

_INT32_MAX = (1 << 31) - 1

assert _BLOCK_HEADER.size == HEADER_LEN
assert _FRAME.size == ENTRY_FRAME


# --- data classes ------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerMetadata:
    """What the index says about the ledger; our own encoding inside the v1 metadata field."""

    topic: str
    ledger_id: int
    entry_count: int
    last_entry_id: int
    length: int  # sum of payload bytes, frames and headers excluded
    created_ms: int
    sealed_ms: int

    @property
    def first_entry_id(self) -> int:
        return self.last_entry_id - self.entry_count + 1


@dataclass(frozen=True)
class BlockRef:
    """One block of the data object (= one multipart part)."""

    part_id: int
    offset: int
    length: int
    first_entry_id: int
    crc32c: int | None  # None when read from a pure-Pulsar index


@dataclass(frozen=True)
class ChunkRef:
    """A byte range of one block holding whole entries: the unit of a ranged GET."""

    first_entry_id: int
    offset: int  # absolute, in the data object
    length: int
    entry_count: int
    crc32c: int
    starts_block: bool = False  # the chunk begins with the 128-byte block header

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + self.entry_count - 1

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class EncodedBlock:
    """A finished block, ready to upload as one part."""

    ref: BlockRef
    chunks: tuple[ChunkRef, ...]
    data: bytes | bytearray  # exactly ref.length bytes (bytes from encode_blocks)


@dataclass(frozen=True)
class LedgerIndex:
    """A decoded index object; lookups bisect the block and chunk tables."""

    data_object_len: int
    header_len: int
    metadata: LedgerMetadata | None
    blocks: tuple[BlockRef, ...]
    chunks: tuple[ChunkRef, ...] | None  # None: no extension (pure Pulsar)

    @cached_property
    def _block_firsts(self) -> list[int]:
        return [b.first_entry_id for b in self.blocks]

    @cached_property
    def _chunk_firsts(self) -> list[int]:
        return [c.first_entry_id for c in self.chunks or ()]

    @property
    def first_entry_id(self) -> int:
        return self.blocks[0].first_entry_id

    @property
    def last_entry_id(self) -> int | None:
        """Known from our metadata or chunk table; None for a foreign index."""
        if self.metadata is not None:
            return self.metadata.last_entry_id
        if self.chunks:
            return self.chunks[-1].last_entry_id
        return None

    def _check_entry(self, entry_id: int) -> None:
        last = self.last_entry_id
        if entry_id < self.first_entry_id or (last is not None and entry_id > last):
            raise LookupError(
                f"entry {entry_id} is outside the ledger's entries "
                f"{self.first_entry_id}..{last if last is not None else '?'}"
            )

    def chunk_for(self, entry_id: int) -> ChunkRef:
        """The chunk holding the entry: one ranged GET of chunk.length bytes reads it."""
        if self.chunks is None:
            raise LookupError("index has no chunk table (pure Pulsar index): use block_for")
        self._check_entry(entry_id)
        return self.chunks[bisect.bisect_right(self._chunk_firsts, entry_id) - 1]

    def block_for(self, entry_id: int) -> BlockRef:
        """The block holding the entry: the floor entry of the v1 index, as Pulsar does."""
        self._check_entry(entry_id)
        return self.blocks[bisect.bisect_right(self._block_firsts, entry_id) - 1]

    def block_entry_count(self, block: BlockRef) -> int:
        """Entries in the block: next block's first id (or last id + 1) minus its first id."""
        i = self._block_index(block)
        if i + 1 < len(self.blocks):
            return self.blocks[i + 1].first_entry_id - block.first_entry_id
        last = self.last_entry_id
        if last is None:
            raise LookupError("the last block's entry count is unknown: foreign index metadata")
        return last + 1 - block.first_entry_id

    def chunks_for_block(self, block: BlockRef) -> list[ChunkRef]:
        """The chunks tiling one block (empty for a pure Pulsar index)."""
        if not self.chunks:
            return []
        end = block.offset + block.length
        return [c for c in self.chunks if block.offset <= c.offset < end]

    def chunks_between(self, first: int, last: int) -> list[ChunkRef]:
        """The chunks covering entries first..last (inclusive), in order."""
        if first > last:
            raise ValueError(f"empty entry range {first}..{last}")
        lo = self.chunk_for(first)
        self._check_entry(last)
        i = bisect.bisect_right(self._chunk_firsts, lo.first_entry_id) - 1
        j = bisect.bisect_right(self._chunk_firsts, last)
        assert self.chunks is not None
        return list(self.chunks[i:j])

    def _block_index(self, block: BlockRef) -> int:
        i = bisect.bisect_right(self._block_firsts, block.first_entry_id) - 1
        if i < 0 or self.blocks[i].offset != block.offset:
            raise LookupError(f"block at offset {block.offset} is not in this index")
        return i


# --- writer ------------------------------------------------------------------------------
class _BlockBuilder:
    """Fills one block by appending frames to a BytesIO, noting chunk boundaries as it goes.

    Appending (rather than slice-assigning into a preallocated max_block_size bytearray)
    touches each page once and keeps a small ledger's last block small, and BytesIO hands
    its buffer over as ``bytes`` without a copy, so uploaders need not copy a 64 MiB block
    again; measured faster, see benchmarks/format_codec.py.
    """

    def __init__(
        self, max_block_size: int, chunk_target: int, part_id: int, offset: int, first_id: int
    ) -> None:
        self.max_block_size = max_block_size
        self.chunk_target = chunk_target
        self.part_id = part_id
        self.offset = offset
        self.first_id = first_id
        self.out = io.BytesIO()
        self.out.write(bytes(HEADER_LEN))  # the real header is written by finish()
        self.pos = HEADER_LEN
        self.next_id = first_id
        # closed chunks as (start, end, first_id, entry_count), offsets within the block
        self.closed: list[tuple[int, int, int, int]] = []
        self.chunk_start = 0
        self.chunk_first = first_id

    def fill(self, entries: Iterator[tuple[int, bytes]]) -> tuple[int, bytes] | None:
        """Append entries until one does not fit; return that one, or None when exhausted.

        One tight loop with locals: per-entry Python overhead is what limits small entries.
        """
        write, pack = self.out.write, _FRAME.pack
        limit, target, closed = self.max_block_size, self.chunk_target, self.closed
        pos, next_id = self.pos, self.next_id
        chunk_start, chunk_first = self.chunk_start, self.chunk_first
        max_payload = limit - HEADER_LEN - ENTRY_FRAME
        leftover = None
        for entry_id, payload in entries:
            data = payload if type(payload) is bytes else _payload_bytes(payload)
            size = len(data)
            if entry_id != next_id:
                raise ValueError(
                    f"entry ids must be consecutive: got {entry_id} after {next_id - 1}"
                )
            if size > max_payload:
                _check_fits(entry_id, size, limit)
            end = pos + ENTRY_FRAME + size
            if end > limit:  # never the block's first entry: _check_fits passed
                leftover = (entry_id, data)
                break
            if end - chunk_start > target and entry_id > chunk_first:
                closed.append((chunk_start, pos, chunk_first, entry_id - chunk_first))
                chunk_start, chunk_first = pos, entry_id
            write(pack(size, entry_id))
            write(data)
            pos, next_id = end, entry_id + 1
        self.pos, self.next_id = pos, next_id
        self.chunk_start, self.chunk_first = chunk_start, chunk_first
        return leftover

    def finish(self, last: bool) -> EncodedBlock:
        """Pad (unless last: that one is trimmed), write the header, checksum chunks and block."""
        out, framed = self.out, self.pos
        length = framed if last else self.max_block_size
        out.write(_padding(length - framed))
        out.seek(0)
        out.write(_BLOCK_HEADER.pack(BLOCK_MAGIC, HEADER_LEN, length, self.first_id))
        data = out.getvalue()  # no copy: BytesIO gives up its buffer
        self.out = io.BytesIO()
        chunk_ids = self.next_id - self.chunk_first
        self.closed.append((self.chunk_start, framed, self.chunk_first, chunk_ids))
        chunks = tuple(self._chunk_ref(data, *c) for c in self.closed)
        ref = BlockRef(self.part_id, self.offset, length, self.first_id, _crc(data))
        return EncodedBlock(ref, chunks, data)

    def _chunk_ref(self, data: bytes, start: int, end: int, first: int, count: int) -> ChunkRef:
        crc = _crc(data if end - start == len(data) else memoryview(data)[start:end])
        return ChunkRef(first, self.offset + start, end - start, count, crc, start == 0)


def _payload_bytes(payload: bytes | bytearray | memoryview) -> bytes | bytearray | memoryview:
    if isinstance(payload, bytes | bytearray):
        return payload
    return memoryview(payload).cast("B")


def _check_fits(entry_id: int, size: int, max_block_size: int) -> None:
    if HEADER_LEN + ENTRY_FRAME + size > max_block_size:
        raise EntryTooLargeError(
            f"entry {entry_id} of {size} bytes does not fit a block of max_block_size "
            f"{max_block_size} (header {HEADER_LEN} + frame {ENTRY_FRAME} + payload)"
        )


def _padding(n: int) -> bytes:
    """n bytes of the repeated FE DC DE AD filler, starting at the pattern's first byte."""
    return (PADDING * (n // 4 + 1))[:n]


def encode_blocks(
    entries: Iterable[tuple[int, bytes]],
    *,
    max_block_size: int,
    chunk_target: int = DEFAULT_CHUNK_TARGET,
) -> Iterator[EncodedBlock]:
    """Frame entries into v1 blocks lazily, holding at most one block in memory.

    Arguments are checked now; entry errors (gaps, oversize, no entries) surface while
    iterating, before the offending block is yielded.
    """
    if max_block_size < MIN_BLOCK_SIZE:
        raise ValueError(f"max_block_size {max_block_size} < {MIN_BLOCK_SIZE} (header + frame + 1)")
    if max_block_size > _INT32_MAX:
        raise ValueError(f"max_block_size {max_block_size} exceeds int32 (chunk lengths are int32)")
    if chunk_target < 1:
        raise ValueError(f"chunk_target must be positive, got {chunk_target}")
    return _encode_blocks(iter(entries), max_block_size, chunk_target)


def _encode_blocks(
    entries: Iterator[tuple[int, bytes]], max_block_size: int, chunk_target: int
) -> Iterator[EncodedBlock]:
    first = next(entries, None)
    if first is None:
        raise EmptyLedgerError("a ledger with no entries cannot be encoded: nothing to index")
    part_id, offset = 1, 0
    pending: tuple[int, bytes] | None = first
    while pending is not None:
        builder = _BlockBuilder(max_block_size, chunk_target, part_id, offset, pending[0])
        pending = builder.fill(itertools.chain((pending,), entries))
        if pending is not None and builder.next_id == builder.first_id:
            # progress guard: a fresh block must take at least one entry, or this loop
            # would emit empty blocks forever (should the size check above ever break)
            raise EntryTooLargeError(
                f"entry {pending[0]} of {len(pending[1])} bytes does not fit an empty block "
                f"of max_block_size {max_block_size}"
            )
        block = builder.finish(last=pending is None)
        part_id, offset = part_id + 1, offset + block.ref.length
        del builder
        yield block


def metadata_for(
    blocks: Sequence[BlockRef],
    chunks: Sequence[ChunkRef],
    *,
    topic: str,
    ledger_id: int,
    created_ms: int,
    sealed_ms: int,
) -> LedgerMetadata:
    """Derive entry count, last id and payload length from what encode_blocks returned."""
    entry_count = sum(c.entry_count for c in chunks)
    framed = sum(c.length for c in chunks)
    return LedgerMetadata(
        topic=topic,
        ledger_id=ledger_id,
        entry_count=entry_count,
        last_entry_id=chunks[-1].last_entry_id,
        length=framed - HEADER_LEN * len(blocks) - ENTRY_FRAME * entry_count,
        created_ms=created_ms,
        sealed_ms=sealed_ms,
    )


# --- index writer ------------------------------------------------------------------------
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


# --- index reader ------------------------------------------------------------------------
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


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    return data if isinstance(data, bytes) else bytes(data)


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


# --- data readers ------------------------------------------------------------------------
def _crc(data: bytes | memoryview) -> int:
    return crc32c.crc32c(data)


def _parse_header(
    data: bytes | memoryview, where: str, at: int = 0, origin: int = 0
) -> tuple[int, int]:
    """(block_len, first_entry_id) of a v1 block header at ``data[at:]``; ``data[0]`` is at
    ``origin`` in the object, so errors carry absolute offsets."""
    if len(data) - at < HEADER_LEN:
        raise FormatError(
            f"truncated block header {where}: {max(0, len(data) - at)} bytes of {HEADER_LEN}",
            offset=origin + max(at, len(data)),
        )
    magic, header_len, block_len, first = _BLOCK_HEADER.unpack_from(data, at)
    if magic != BLOCK_MAGIC:
        raise FormatError(
            f"bad block magic 0x{magic:08X} {where}, expected 0x{BLOCK_MAGIC:08X}",
            offset=origin + at,
        )
    if header_len != HEADER_LEN:
        raise FormatError(
            f"bad block header_len {header_len} {where}, expected {HEADER_LEN}",
            offset=origin + at + 4,
        )
    return block_len, first


def _same(value: bytes) -> bytes:
    return value


def _parse_frames(
    data: bytes | memoryview,
    pos: int,
    count: int,
    first_id: int,
    end: int,
    where: str,
    origin: int = 0,
) -> tuple[list[tuple[int, bytes]], int]:
    """count frames from pos with ids running from first_id, all within data[:end].

    ``data[0]`` is at ``origin`` in the object: errors name absolute offsets.
    """
    out: list[tuple[int, bytes]] = []
    unpack = _FRAME.unpack_from
    copy = bytes if isinstance(data, memoryview) else _same  # slicing bytes already copies
    expected = first_id
    for _ in range(count):
        if pos + ENTRY_FRAME > end:
            raise FormatError(
                f"truncated entry frame {where} at offset {origin + pos} (entry {expected})",
                offset=origin + pos,
            )
        size, entry_id = unpack(data, pos)
        start = pos + ENTRY_FRAME
        if size < 0 or start + size > end:
            raise FormatError(
                f"entry {entry_id} of {size} bytes overruns {where} at offset {origin + start}",
                offset=origin + pos,
            )
        if entry_id != expected:
            raise FormatError(
                f"entry id {entry_id} {where}, expected {expected}", offset=origin + pos
            )
        pos = start + size
        out.append((entry_id, copy(data[start:pos])))
        expected += 1
    return out, pos


def _count_frames(data: bytes | memoryview, pos: int, end: int) -> int:
    """Frames before the block end or the padding (a negative length), as Pulsar scans.

    A frame that overruns the end is counted, so parsing it reports the damage."""
    count = 0
    while pos + 4 <= end:
        (size,) = _INT32.unpack_from(data, pos)
        if size < 0:
            break
        pos += ENTRY_FRAME + size
        count += 1
    return count


def verify_chunk(data: bytes | memoryview, chunk: ChunkRef, *, at: int | None = None) -> None:
    """Check the length and CRC of one chunk: ``data`` itself, or ``data[at:at+length]``.

    The CRC runs without the GIL, so readers verify in their fetching threads.
    """
    start, end = at or 0, (at or 0) + chunk.length
    if len(data) < end or (at is None and len(data) != chunk.length):
        got = max(0, len(data) - start)
        raise FormatError(
            f"truncated chunk: {got} bytes {_where(chunk)}, expected {chunk.length}",
            offset=chunk.offset + min(got, chunk.length),
        )
    actual = _crc(data if at is None else memoryview(data)[start:end])
    if actual != chunk.crc32c:
        raise FormatError(
            f"CRC mismatch {_where(chunk)} (entries {chunk.first_entry_id}.."
            f"{chunk.last_entry_id}): expected 0x{chunk.crc32c:08X}, got 0x{actual:08X}",
            offset=chunk.offset,
        )


def parse_chunk(
    data: bytes | memoryview,
    chunk: ChunkRef,
    *,
    block: BlockRef | None = None,
    at: int | None = None,
) -> list[tuple[int, bytes]]:
    """The entries of a chunk that :func:`verify_chunk` passed (the header and frames are
    still checked: a CRC proves the bytes arrived, not that the writer framed them right)."""
    where = _where(chunk)
    start = at or 0
    end = start + chunk.length
    origin = chunk.offset - start
    starts = chunk.starts_block if block is None else chunk.offset == block.offset
    pos = start
    if starts:
        block_len, first = _parse_header(data, where, start, origin)
        if first != chunk.first_entry_id:
            raise FormatError(
                f"block header first_entry_id {first} {where}, chunk says {chunk.first_entry_id}",
                offset=chunk.offset + 20,
            )
        if block is not None and block_len != block.length:
            raise FormatError(
                f"block_len {block_len} {where}, index says {block.length}",
                offset=chunk.offset + 12,
            )
        pos += HEADER_LEN
    out, pos = _parse_frames(data, pos, chunk.entry_count, chunk.first_entry_id, end, where, origin)
    if pos != end:
        raise FormatError(
            f"{end - pos} trailing bytes after {chunk.entry_count} entries {where}",
            offset=origin + pos,
        )
    return out


def decode_chunk(
    data: bytes | memoryview,
    chunk: ChunkRef,
    *,
    block: BlockRef | None = None,
    at: int | None = None,
) -> list[tuple[int, bytes]]:
    """Verify and parse the bytes of one chunk (a ranged GET of chunk.offset..chunk.end).

    With ``at``, the chunk is ``data[at:at + chunk.length]`` of a larger GET and is read in
    place: only the payloads are copied out.
    """
    verify_chunk(data, chunk, at=at)
    return parse_chunk(data, chunk, block=block, at=at)


def _where(chunk: ChunkRef) -> str:
    return f"in chunk at offset {chunk.offset} of the data object"


def decode_block(
    data: bytes,
    *,
    entry_count: int | None,
    expected_crc: int | None = None,
    first_entry_id: int | None = None,
    offset: int = 0,
) -> list[tuple[int, bytes]]:
    """Parse a whole block, the Pulsar way: header, then frames, then padding.

    ``entry_count`` None scans frames up to the padding or the block end, as Pulsar does when
    a foreign index does not say how many entries the last block holds. ``first_entry_id``
    (from the index) is checked against the header; ``offset`` is the block's position in
    the data object, so errors name absolute offsets. Without ``expected_crc`` (a pure
    Pulsar index) payload bytes cannot be checked; headers, framing and padding still are.
    """
    data = _as_bytes(data)
    block_len, first = _parse_header(data, "in block", 0, offset)
    if block_len != len(data):
        what = "truncated block" if len(data) < block_len else "block length mismatch"
        raise FormatError(
            f"{what}: header says block_len {block_len}, got {len(data)} bytes",
            offset=offset + min(len(data), max(block_len, 0)),
        )
    if expected_crc is not None:
        actual = _crc(data)
        if actual != expected_crc:
            raise FormatError(
                f"CRC mismatch in block of entries from {first}: "
                f"expected 0x{expected_crc:08X}, got 0x{actual:08X}",
                offset=offset,
            )
    if first_entry_id is not None and first != first_entry_id:
        raise FormatError(
            f"block header first_entry_id {first}, index says {first_entry_id}",
            offset=offset + 20,
        )
    where = f"in block starting at entry {first}"
    if entry_count is None:
        entry_count = _count_frames(data, HEADER_LEN, len(data))
    out, pos = _parse_frames(data, HEADER_LEN, entry_count, first, len(data), where, offset)
    if data[pos:] != _padding(len(data) - pos):
        raise FormatError(
            f"{len(data) - pos} bytes after the last entry {where} are not padding",
            offset=offset + pos,
        )
    return out


__all__ = [
    "BLOCK_MAGIC",
    "DEFAULT_CHUNK_TARGET",
    "ENTRY_FRAME",
    "EXT_MAGIC",
    "EXT_VERSION",
    "FORMAT_VERSION",
    "HEADER_LEN",
    "INDEX_MAGIC",
    "META_VERSION",
    "MIN_BLOCK_SIZE",
    "PADDING",
    "BlockRef",
    "ChunkRef",
    "EncodedBlock",
    "LedgerIndex",
    "LedgerMetadata",
    "decode_block",
    "decode_chunk",
    "decode_index",
    "encode_blocks",
    "encode_index",
    "encode_metadata",
    "metadata_for",
]
