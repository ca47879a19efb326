"""Pulsar PIP-76 streaming (v2) segment objects: constants, byte layouts and records.

A segment's data object is a run of v2 blocks, one ledger per block, grouped into
multipart parts; its index is a Pulsar v2 index whose last ledger record (ledger id -1,
no index entries) carries our extension: block CRCs and the dense chunk table. See the
"Streaming segment objects (v2)" chapter of docs/FORMAT.md.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from functools import cached_property

from offloader.format.layout import BlockRef, ChunkRef, LedgerIndex

SEGMENT_BLOCK_MAGIC = 0x26A66D32
SEGMENT_INDEX_MAGIC = 0x3D1FB0BC
SEGMENT_EXT_MAGIC = 0x5E6E0E5C
SEGMENT_EXT_VERSION = 1
EXT_LEDGER_ID = -1  # the extension's ledger record: BookKeeper ledger ids are never negative
SEGMENT_FORMAT_VERSION = 2  # the objects' `format-version` user metadata

# magic, header_len, block_len, first_entry_id, ledger_id: v1's fields, ledger id after them
_SEGMENT_BLOCK_HEADER = struct.Struct(">Iqqqq92x")
_HEADER_LEDGER_AT = 28
_SEGMENT_INDEX_HEAD = struct.Struct(">Iiqq")  # magic, index_len, data_len, header_len
_LEDGER_RECORD = struct.Struct(">qii")  # ledger_id, index entry count, metadata_len
_SEG_EXT_HEAD = struct.Struct(">Iii")  # ext_magic, ext_version, block_count
_SEG_EXT_BLOCK = struct.Struct(">qiqqI")  # ledger_id, part_id, offset, length, crc32c

_INT64_MAX = (1 << 63) - 1

assert _SEGMENT_BLOCK_HEADER.size == 128


@dataclass(frozen=True)
class SegmentBlockRef:
    """One block of a segment's data object: the ledger it holds, its place, its chunks."""

    ledger_id: int
    ref: BlockRef
    chunks: tuple[ChunkRef, ...]

    @property
    def last_entry_id(self) -> int:
        return self.chunks[-1].last_entry_id


@dataclass(frozen=True)
class EncodedPart:
    """Finished blocks forming one multipart part, ready to upload.

    A pass that dies after uploading it resumes with ``next_part_id``, ``end`` and
    ``last_position`` (see SegmentEncoder)."""

    part_id: int
    offset: int  # of the part in the data object
    blocks: tuple[SegmentBlockRef, ...]
    buffers: tuple[bytes | bytearray, ...]  # one per block: an uploader may stream them

    @cached_property
    def data(self) -> bytes | bytearray:
        """The part's bytes: one block's buffer as is, several joined (one copy)."""
        return b"".join(self.buffers)  # a join of one bytes object returns that object

    @property
    def length(self) -> int:
        return sum(len(b) for b in self.buffers)

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def next_part_id(self) -> int:
        return self.part_id + 1

    @property
    def first_position(self) -> tuple[int, int]:
        return self.blocks[0].ledger_id, self.blocks[0].ref.first_entry_id

    @property
    def last_position(self) -> tuple[int, int]:
        return self.blocks[-1].ledger_id, self.blocks[-1].last_entry_id


@dataclass(frozen=True)
class SegmentIndex:
    """A decoded v2 index: one LedgerIndex view per ledger of the segment, ids rising.

    Each view's blocks and chunks carry absolute offsets in the segment's data object and
    its metadata counts only the ledger's entries in this segment, so the ledger's lookups
    (chunk_for, chunks_between, block_for) work unchanged; decode the bytes with
    segment_parsing, which also checks the ledger id in the v2 block headers.
    """

    data_object_len: int
    header_len: int
    ledgers: tuple[LedgerIndex, ...]

    @cached_property
    def ledger_ids(self) -> tuple[int, ...]:
        return tuple(self._ledger_id(ledger) for ledger in self.ledgers)

    @staticmethod
    def _ledger_id(ledger: LedgerIndex) -> int:
        assert ledger.metadata is not None  # decode_segment_index always sets it
        return ledger.metadata.ledger_id

    @property
    def topic(self) -> str:
        assert self.ledgers[0].metadata is not None
        return self.ledgers[0].metadata.topic

    @property
    def first_position(self) -> tuple[int, int]:
        return self.ledger_ids[0], self.ledgers[0].first_entry_id

    @property
    def last_position(self) -> tuple[int, int]:
        last = self.ledgers[-1].last_entry_id
        assert last is not None
        return self.ledger_ids[-1], last

    def ledger(self, ledger_id: int) -> LedgerIndex:
        """The blocks and chunks of one ledger's entries in this segment."""
        i = bisect.bisect_left(self.ledger_ids, ledger_id)
        if i == len(self.ledger_ids) or self.ledger_ids[i] != ledger_id:
            raise LookupError(
                f"ledger {ledger_id} has no entries in this segment "
                f"(ledgers {', '.join(map(str, self.ledger_ids))})"
            )
        return self.ledgers[i]
