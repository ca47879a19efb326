"""v1 sources re-encoded as one v2 segment, part by part into an open multipart upload.

A v1 block header differs from a v2 one (the v2 header names its ledger), and S3 takes no
part under 5 MiB but the last, so small ledger objects cannot be copied server side: each
source is read back through the tiered reader's batches (every chunk CRC-checked before
its entries are used) and framed again by :class:`SegmentEncoder`, blocks of one ledger
each, grouped into parts. What comes back has the shape of the segment merge's result
(``parts``, ``data_len``, ``index``, ``pieces``): the run completes, indexes and commits
either the same way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from offloader.format import SegmentEncoder, encode_segment_index
from offloader.format.segment_layout import EncodedPart, SegmentBlockRef
from offloader.metadata import Ledger
from offloader.metadata.records import PieceRange
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo
from offloader.read.tiered import TieredLedgerReader


@dataclass(frozen=True)
class RewrittenData:
    """A segment's data uploaded as parts (not completed yet) and its index, to write."""

    parts: list[PartInfo]  # to complete the upload with, in part order
    data_len: int
    index: bytes
    pieces: list[PieceRange]  # the ledger ranges it holds, for segment_ledgers


@dataclass(frozen=True)
class OutputLayout:
    """How an output segment is cut, fixed by whoever planned it (the topic's policy and
    the settings), so a Spark executor cuts it as this process would."""

    max_block_size: int
    min_part_bytes: int  # the smallest part but the last (and the merge's part size)
    read_buffer_size: int  # the v2 index's chunk target
    read_prefetch: int  # chunks a source reader fetches ahead
    concurrency: int  # parts in flight while merging segments


def encode_ledgers(
    topic: str,
    ledgers: Sequence[Ledger],
    readers: Sequence[TieredLedgerReader],
    store: ObjectStore,
    upload: MultipartUpload,
    *,
    layout: OutputLayout,
    on_part: Callable[[PartInfo], None],
) -> RewrittenData:
    """Read ``ledgers`` (v1 objects, in id order, each through its reader) and upload them
    as the parts of ``upload``, a v2 segment of ``topic``; ``on_part`` runs after each part
    is uploaded (and may raise to stop: a lost lease)."""
    # an entry that fitted a v1 block fits a v2 block of the same size (same header and
    # framing), even if the policy's block size shrank since
    block_size = max([layout.max_block_size, *(b.length for r in readers for b in r.index.blocks)])
    total = sum(ledger.data_len or 0 for ledger in ledgers)
    encoder = SegmentEncoder(
        max_block_size=block_size,
        min_part_size=part_size(store, total, layout.min_part_bytes),
        chunk_target=layout.read_buffer_size,
    )
    parts: list[PartInfo] = []
    blocks: list[SegmentBlockRef] = []

    def send(encoded: list[EncodedPart]) -> None:
        for part in encoded:
            if part.part_id > store.capabilities.max_parts:
                raise ValueError(
                    f"the segment needs more than {store.capabilities.max_parts} parts; "
                    "lower target_bytes"
                )
            info = store.upload_part(upload, part.part_id, part.data)
            parts.append(info)
            blocks.extend(part.blocks)
            on_part(info)

    for ledger, reader in zip(ledgers, readers, strict=True):
        for batch in reader.read_batches():
            send(
                encoder.append(
                    zip(itertools.repeat(ledger.ledger_id), batch.entry_ids, batch.payloads())
                )
            )
    send(encoder.close())
    times = {x.ledger_id: (x.created_ms, x.sealed_ms or x.created_ms) for x in ledgers}
    return RewrittenData(
        parts=parts,
        data_len=blocks[-1].ref.offset + blocks[-1].ref.length,
        index=encode_segment_index(blocks, topic=topic, ledger_times=times),
        pieces=[PieceRange(x.ledger_id, 0, x.entry_count - 1) for x in ledgers],
    )


def part_size(store: ObjectStore, total: int, wanted: int) -> int:
    """The smallest part the encoder may emit but the last: ``wanted`` (the topic's
    ``min_part_bytes``: a request per part, and small parts are small files on the
    filesystem store), at least the store's minimum, raised so ``total`` bytes fit the
    store's part count with room to spare (parts hold whole blocks, so most are a little
    over the minimum)."""
    caps = store.capabilities
    return max(caps.min_part_size, wanted, math.ceil(2 * total / caps.max_parts))
