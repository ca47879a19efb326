"""Pulsar PIP-17 v1 ledger objects: constants, byte layouts and the records the codec
works with. See docs/FORMAT.md for the byte layout.

The data object is a run of v1 blocks exactly as Pulsar's jcloud offloader writes them, so a
Pulsar reader can read what we write. The index object is a Pulsar v1 index followed by our
versioned extension (per-block CRCs and a dense chunk table), which a Pulsar reader skips
because it reads only ``entry_count`` index entries.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from functools import cached_property

import crc32c

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

# An entry's payload as encoders take it: any bytes-like object, copied into the block.
Payload = bytes | bytearray | memoryview

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


def _crc(data: bytes | memoryview) -> int:
    return crc32c.crc32c(data)


def _as_bytes(data: bytes | bytearray | memoryview) -> bytes:
    return data if isinstance(data, bytes) else bytes(data)
