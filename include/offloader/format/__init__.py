"""Byte formats of offloaded objects (Pulsar PIP-17 v1 plus our index extension).

``layout`` holds the constants and records, ``blocks`` the block writer, ``index`` the
index codec, ``parsing`` the readers of data bytes. Kept apart from I/O so the codecs can
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
    verify_chunk,
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
    "block_offsets",
    "chunk_offsets",
    "decode_block",
    "decode_chunk",
    "decode_index",
    "encode_blocks",
    "encode_index",
    "encode_metadata",
    "metadata_for",
    "parse_chunk",
    "verify_chunk",
]
