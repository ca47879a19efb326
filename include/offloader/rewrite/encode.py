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
from offloader.metadata.segments import PieceRange
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo
from offloader.read.tiered import TieredLedgerReader
from offloader.read.topic_reader import tiered_ledger_reader
from offloader.runtime import Runtime


@dataclass(frozen=True)
class RewrittenData:
    """A segment's data uploaded as parts (not completed yet) and its index, to write."""

    parts: list[PartInfo]  # to complete the upload with, in part order
    data_len: int
    index: bytes
    pieces: list[PieceRange]  # the ledger ranges it holds, for segment_ledgers


def encode_ledgers(
    runtime: Runtime,
    topic: str,
    ledgers: Sequence[Ledger],
    store: ObjectStore,
    upload: MultipartUpload,
    *,
    on_part: Callable[[PartInfo], None],
) -> RewrittenData:
    """Read ``ledgers`` (v1 objects, in id order) and upload them as the parts of
    ``upload``, a v2 segment of ``topic``; ``on_part`` runs after each part is uploaded
    (and may raise to stop: a lost lease)."""
    policy = runtime.metadata.get_topic(topic).policy
    readers = [_reader(runtime, ledger) for ledger in ledgers]
    # an entry that fitted a v1 block fits a v2 block of the same size (same header and
    # framing), even if the policy's block size shrank since
    block_size = max([policy.max_block_size, *(b.length for r in readers for b in r.index.blocks)])
    total = sum(ledger.data_len or 0 for ledger in ledgers)
    encoder = SegmentEncoder(
        max_block_size=block_size,
        min_part_size=part_size(store, total, policy.min_part_bytes),
        chunk_target=policy.read_buffer_size,
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


def _reader(runtime: Runtime, ledger: Ledger) -> TieredLedgerReader:
    """The ledger's v1 objects, in the store its offload recorded (invariant 7)."""
    reader = tiered_ledger_reader(runtime, ledger)
    assert isinstance(reader, TieredLedgerReader)  # a v1 source has objects of its own
    return reader
