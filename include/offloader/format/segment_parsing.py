"""Reading a segment's data bytes: v2 chunks and blocks through the v1 parsers, plus the
one v2 check, the ledger id in the block header against the index."""

from __future__ import annotations

import struct

from offloader.exceptions import FormatError
from offloader.format.layout import BlockRef, ChunkRef
from offloader.format.parsing import decode_block, decode_chunk
from offloader.format.segment_layout import _HEADER_LEDGER_AT, SEGMENT_BLOCK_MAGIC

_LEDGER = struct.Struct(">q")


def decode_segment_chunk(
    data: bytes | memoryview,
    chunk: ChunkRef,
    *,
    ledger_id: int,
    block: BlockRef | None = None,
    at: int | None = None,
) -> list[tuple[int, bytes]]:
    """Verify and parse one chunk of ledger ``ledger_id`` (a ranged GET, or ``data[at:]``
    of a larger one); a chunk that starts a block also has its header's ledger checked."""
    entries = decode_chunk(data, chunk, block=block, at=at, magic=SEGMENT_BLOCK_MAGIC)
    starts = chunk.starts_block if block is None else chunk.offset == block.offset
    if starts:
        check_block_ledger(data, at or 0, ledger_id, chunk.offset)
    return entries


def decode_segment_block(
    data: bytes,
    *,
    ledger_id: int,
    entry_count: int | None,
    expected_crc: int | None = None,
    first_entry_id: int | None = None,
    offset: int = 0,
) -> list[tuple[int, bytes]]:
    """Parse a whole v2 block (header, frames, padding) of ledger ``ledger_id``; the
    arguments are decode_block's, ``offset`` the block's place in the data object."""
    entries = decode_block(
        data,
        entry_count=entry_count,
        expected_crc=expected_crc,
        first_entry_id=first_entry_id,
        offset=offset,
        magic=SEGMENT_BLOCK_MAGIC,
    )
    check_block_ledger(data, 0, ledger_id, offset)
    return entries


def check_block_ledger(
    data: bytes | memoryview, block_at: int, ledger_id: int, origin: int
) -> None:
    """The ledger id in the v2 block header starting at ``data[block_at:]`` (the block's
    ``origin`` in the data object) is ``ledger_id``, as the index says; FormatError else."""
    (found,) = _LEDGER.unpack_from(data, block_at + _HEADER_LEDGER_AT)
    if found != ledger_id:
        raise FormatError(
            f"block header ledger_id {found} in block at offset {origin} of the data object, "
            f"index says {ledger_id}",
            offset=origin + _HEADER_LEDGER_AT,
        )
