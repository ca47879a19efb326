"""Byte formats of offloaded objects (Pulsar PIP-17 v1 and PIP-76 v2, plus our index
extensions).

``layout`` holds the constants and records, ``blocks`` the block writer, ``index`` the
index codec, ``parsing`` the readers of data bytes; the ``segment_*`` modules are the same
for streaming segments (v2). Kept apart from I/O so the codecs can
be tested and benchmarked on bytes alone; the offloader and reader modules stream what
these functions produce and consume.
"""

from offloader.format.blocks import encode_blocks, metadata_for
from offloader.format.index import decode_index, encode_index, encode_metadata
from offloader.format.layout import (
    BLOCK_MAGIC,
    DEFAULT_CHUNK_TARGET,
    ENTRY_FRAME,
    EXT_MAGIC,
    EXT_VERSION,
    FORMAT_VERSION,
    HEADER_LEN,
    INDEX_MAGIC,
    META_VERSION,
    MIN_BLOCK_SIZE,
    PADDING,
    BlockRef,
    ChunkRef,
    EncodedBlock,
    LedgerIndex,
    LedgerMetadata,
)
from offloader.format.parsing import (
    block_offsets,
    chunk_offsets,
    decode_block,
    decode_chunk,
    parse_chunk,
    verify_block,
    verify_chunk,
)
from offloader.format.segment_blocks import SegmentEncoder
from offloader.format.segment_index import (
    decode_any_index,
    decode_segment_index,
    encode_segment_index,
)
from offloader.format.segment_layout import (
    SEGMENT_BLOCK_MAGIC,
    SEGMENT_EXT_MAGIC,
    SEGMENT_EXT_VERSION,
    SEGMENT_FORMAT_VERSION,
    SEGMENT_INDEX_MAGIC,
    EncodedPart,
    SegmentBlockRef,
    SegmentIndex,
)
from offloader.format.segment_parsing import decode_segment_block, decode_segment_chunk

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
    "SEGMENT_BLOCK_MAGIC",
    "SEGMENT_EXT_MAGIC",
    "SEGMENT_EXT_VERSION",
    "SEGMENT_FORMAT_VERSION",
    "SEGMENT_INDEX_MAGIC",
    "BlockRef",
    "ChunkRef",
    "EncodedBlock",
    "EncodedPart",
    "LedgerIndex",
    "LedgerMetadata",
    "SegmentBlockRef",
    "SegmentEncoder",
    "SegmentIndex",
    "block_offsets",
    "chunk_offsets",
    "decode_any_index",
    "decode_block",
    "decode_chunk",
    "decode_index",
    "decode_segment_block",
    "decode_segment_chunk",
    "decode_segment_index",
    "encode_blocks",
    "encode_index",
    "encode_metadata",
    "encode_segment_index",
    "metadata_for",
    "parse_chunk",
    "verify_block",
    "verify_chunk",
]
