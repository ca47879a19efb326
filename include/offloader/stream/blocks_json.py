"""A part's block table as JSON, the form the metadata keeps it in (segment_parts.blocks).

S3 gives nothing of an unfinished multipart upload back, so the blocks and chunks that the
segment's index will list are recorded with each part, and the index is built from these
records alone: a pass that completes another pass's segment writes the same index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from offloader.exceptions import FormatError
from offloader.format.layout import BlockRef, ChunkRef
from offloader.format.segment_layout import SegmentBlockRef


def dump_blocks(blocks: Iterable[SegmentBlockRef]) -> str:
    return json.dumps(
        [
            [
                b.ledger_id,
                b.ref.part_id,
                b.ref.offset,
                b.ref.length,
                b.ref.first_entry_id,
                b.ref.crc32c,
                [
                    [c.first_entry_id, c.offset, c.length, c.entry_count, c.crc32c, c.starts_block]
                    for c in b.chunks
                ],
            ]
            for b in blocks
        ],
        separators=(",", ":"),
    )


def load_blocks(text: str) -> list[SegmentBlockRef]:
    """The block table :func:`dump_blocks` wrote; FormatError naming what is wrong if the
    text is not one (a damaged or hand-edited metadata row)."""
    try:
        rows = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"segment part block table is not JSON: {exc}") from None
    if not isinstance(rows, list):
        raise FormatError("segment part block table is not a JSON list")
    return [_block(row, n) for n, row in enumerate(rows)]


def _block(row: object, n: int) -> SegmentBlockRef:
    where = f"segment part block table, block {n}"
    if not isinstance(row, list) or len(row) != 7:
        raise FormatError(f"{where}: not a list of 7 fields")
    ledger_id, part_id, offset, length, first, crc, chunks = row
    _int64(where, ledger_id=ledger_id, offset=offset, length=length, first_entry_id=first)
    _int32(where, part_id=part_id)
    if crc is not None:
        _uint32(where, crc32c=crc)
    if not isinstance(chunks, list):
        raise FormatError(f"{where}: chunks is not a list")
    return SegmentBlockRef(
        ledger_id,
        BlockRef(part_id, offset, length, first, crc),
        tuple(_chunk(chunk, f"{where} chunk {i}") for i, chunk in enumerate(chunks)),
    )


def _chunk(chunk: object, where: str) -> ChunkRef:
    if not isinstance(chunk, list) or len(chunk) != 6:
        raise FormatError(f"{where}: not a list of 6 fields")
    first, offset, length, count, crc, starts_block = chunk
    _int64(where, first_entry_id=first, offset=offset)
    _int32(where, length=length, entry_count=count)
    _uint32(where, crc32c=crc)
    if not isinstance(starts_block, bool):
        raise FormatError(f"{where}: starts_block is not true or false")
    return ChunkRef(first, offset, length, count, crc, starts_block)


def _check(where: str, low: int, high: int, fields: dict[str, object]) -> None:
    for name, value in fields.items():
        if type(value) is not int or not low <= value <= high:
            raise FormatError(f"{where}: {name} {value!r} is not an integer in {low}..{high}")


def _int64(where: str, **fields: object) -> None:
    _check(where, 0, 2**63 - 1, fields)


def _int32(where: str, **fields: object) -> None:
    _check(where, 0, 2**31 - 1, fields)


def _uint32(where: str, **fields: object) -> None:
    _check(where, 0, 2**32 - 1, fields)
