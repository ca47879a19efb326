"""A part's block table as JSON, the form the metadata keeps it in (segment_parts.blocks).

S3 gives nothing of an unfinished multipart upload back, so the blocks and chunks that the
segment's index will list are recorded with each part, and the index is built from these
records alone: a pass that completes another pass's segment writes the same index.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

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
    blocks = []
    for ledger_id, part_id, offset, length, first, crc, chunks in json.loads(text):
        blocks.append(
            SegmentBlockRef(
                ledger_id,
                BlockRef(part_id, offset, length, first, crc),
                tuple(ChunkRef(*chunk) for chunk in chunks),
            )
        )
    return blocks
