"""Byte formats of offloaded objects.

Kept apart from I/O so the codecs can be tested and benchmarked on bytes alone; the
offloader and reader modules stream what these functions produce and consume.
"""

from offloader.format.ledger_v1 import (
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
    decode_block,
    decode_chunk,
    decode_index,
    encode_blocks,
    encode_index,
    encode_metadata,
    metadata_for,
)

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
