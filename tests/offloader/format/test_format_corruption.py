"""Damaged bytes must fail loudly: each FormatError says what is wrong and where."""

from __future__ import annotations

import random
import struct

import crc32c
import pytest

from offloader.exceptions import FormatError
from offloader.format import (
    HEADER_LEN,
    ChunkRef,
    LedgerIndex,
    decode_block,
    decode_chunk,
    decode_index,
    encode_blocks,
    encode_index,
    metadata_for,
)


def build(seed: int = 1, count: int = 200) -> tuple[bytes, bytes, LedgerIndex]:
    rng = random.Random(seed)
    entries = [(i, rng.randbytes(rng.randint(1, 400))) for i in range(count)]
    blocks = list(encode_blocks(entries, max_block_size=4096, chunk_target=1024))
    refs = [b.ref for b in blocks]
    chunks = [c for b in blocks for c in b.chunks]
    meta = metadata_for(refs, chunks, topic="t", ledger_id=3, created_ms=1, sealed_ms=2)
    raw_index = encode_index(meta, refs, chunks)
    return b"".join(bytes(b.data) for b in blocks), raw_index, decode_index(raw_index)


def flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


def with_crc(raw_index: bytes) -> bytes:
    """Re-seal an edited index so the CRC check passes and a later check must catch it."""
    return raw_index[:-4] + struct.pack(">I", crc32c.crc32c(raw_index[:-4]))


def block_bytes(data: bytes, index: LedgerIndex, i: int) -> bytes:
    b = index.blocks[i]
    return data[b.offset : b.offset + b.length]


def test_bad_block_magic() -> None:
    data, _, index = build()
    raw = flip(block_bytes(data, index, 1), 0)
    with pytest.raises(FormatError, match=r"bad block magic 0xFADBABCB.*expected 0xFBDBABCB"):
        decode_block(raw, entry_count=index.block_entry_count(index.blocks[1]))


def test_bad_block_magic_in_a_chunk_with_matching_crc() -> None:
    data, _, index = build()
    assert index.chunks is not None
    c = index.chunks[0]
    raw = flip(data[c.offset : c.end], 1)
    forged = ChunkRef(c.first_entry_id, c.offset, c.length, c.entry_count, crc32c.crc32c(raw), True)
    with pytest.raises(FormatError, match=r"bad block magic .* in chunk at offset 0"):
        decode_chunk(raw, forged)


def test_bad_header_len() -> None:
    data, _, index = build()
    raw = flip(block_bytes(data, index, 0), 11)
    with pytest.raises(FormatError, match="header_len 129"):
        decode_block(raw, entry_count=index.block_entry_count(index.blocks[0]))


@pytest.mark.parametrize("seed", range(5))
def test_bad_chunk_crc_one_flipped_byte(seed: int) -> None:
    data, _, index = build(seed)
    assert index.chunks is not None
    rng = random.Random(seed)
    for c in rng.sample(index.chunks, 10):
        raw = flip(data[c.offset : c.end], rng.randrange(c.length))
        with pytest.raises(FormatError, match=f"CRC mismatch in chunk at offset {c.offset} of"):
            decode_chunk(raw, c)


def test_bad_block_crc() -> None:
    data, _, index = build()
    b = index.blocks[2]
    raw = flip(block_bytes(data, index, 2), b.length - 1)  # in the padding
    with pytest.raises(FormatError, match="CRC mismatch in block"):
        decode_block(raw, entry_count=index.block_entry_count(b), expected_crc=b.crc32c)


def test_damaged_padding_without_crc_is_noticed() -> None:
    data, _, index = build()
    b = index.blocks[0]
    raw = flip(block_bytes(data, index, 0), b.length - 1)
    with pytest.raises(FormatError, match="not padding"):
        decode_block(raw, entry_count=index.block_entry_count(b))


def test_truncated_block() -> None:
    data, _, index = build()
    b = index.blocks[0]
    raw = block_bytes(data, index, 0)
    with pytest.raises(FormatError, match="truncated block: header says block_len 4096, got 4095"):
        decode_block(raw[:-1], entry_count=index.block_entry_count(b))
    with pytest.raises(FormatError, match="truncated block header"):
        decode_block(raw[: HEADER_LEN - 1], entry_count=1)


def test_truncated_chunk() -> None:
    data, _, index = build()
    assert index.chunks is not None
    c = index.chunks[3]
    with pytest.raises(FormatError, match=f"truncated chunk: {c.length - 5} bytes"):
        decode_chunk(data[c.offset : c.end - 5], c)


def test_entry_count_beyond_the_block_is_truncation() -> None:
    data, _, index = build()
    b = index.blocks[-1]
    raw = block_bytes(data, index, len(index.blocks) - 1)
    with pytest.raises(FormatError, match="truncated entry frame"):
        decode_block(raw, entry_count=index.block_entry_count(b) + 1)


def test_wrong_entry_id_in_frame() -> None:
    data, _, index = build()
    raw = bytearray(block_bytes(data, index, 0))
    struct.pack_into(">q", raw, HEADER_LEN + 4, 77)
    with pytest.raises(FormatError, match="entry id 77 in block starting at entry 0, expected 0"):
        decode_block(bytes(raw), entry_count=3)


def test_truncated_index() -> None:
    _, raw, _ = build()
    with pytest.raises(FormatError, match=f"truncated index: index_len says {len(raw)} bytes"):
        decode_index(raw[:-1])
    with pytest.raises(FormatError, match="truncated index: 20 bytes"):
        decode_index(raw[:20])


def test_index_len_mismatch() -> None:
    _, raw, _ = build()
    with pytest.raises(FormatError, match="index_len mismatch"):
        decode_index(raw + b"\0")


def test_bad_index_magic() -> None:
    _, raw, _ = build()
    with pytest.raises(FormatError, match="bad index magic 0xDE47DE46"):
        decode_index(flip(raw, 3))


@pytest.mark.parametrize("where", [40, 100, -30, -5])
def test_bad_index_crc(where: int) -> None:
    _, raw, _ = build()
    with pytest.raises(FormatError, match="bad index crc"):
        decode_index(flip(raw, where % len(raw)))


def test_unknown_extension_version() -> None:
    _, raw, index = build()
    meta_len = struct.unpack_from(">i", raw, 28)[0]
    ext_at = 32 + meta_len + 20 * len(index.blocks)
    edited = bytearray(raw)
    struct.pack_into(">i", edited, ext_at + 4, 2)
    with pytest.raises(FormatError, match="unknown index extension version 2"):
        decode_index(with_crc(bytes(edited)))


def test_bad_extension_magic() -> None:
    _, raw, index = build()
    meta_len = struct.unpack_from(">i", raw, 28)[0]
    ext_at = 32 + meta_len + 20 * len(index.blocks)
    with pytest.raises(FormatError, match="bad index extension magic"):
        decode_index(flip(raw, ext_at))


def test_chunk_table_that_does_not_tile_is_refused() -> None:
    _, raw, index = build()
    assert index.chunks is not None
    # shift the second chunk's offset by one and re-seal the index
    pos = len(raw) - 4 - 28 * (len(index.chunks) - 1)
    edited = bytearray(raw)
    struct.pack_into(">q", edited, pos + 8, index.chunks[1].offset + 1)
    with pytest.raises(FormatError, match="does not follow"):
        decode_index(with_crc(bytes(edited)))


def test_bad_metadata_version_in_our_index() -> None:
    _, raw, _ = build()
    edited = bytearray(raw)
    struct.pack_into(">h", edited, 32, 9)
    with pytest.raises(FormatError, match="unknown metadata version 9"):
        decode_index(with_crc(bytes(edited)))


@pytest.mark.parametrize("seed", range(3))
def test_random_single_byte_damage_never_passes_silently(seed: int) -> None:
    data, _, index = build(seed)
    rng = random.Random(seed)
    for _ in range(200):
        at = rng.randrange(len(data))
        block = next(b for b in index.blocks if b.offset <= at < b.offset + b.length)
        raw = flip(data, at)[block.offset : block.offset + block.length]
        with pytest.raises(FormatError):
            decode_block(raw, entry_count=index.block_entry_count(block), expected_crc=block.crc32c)


def _pulsar_index(firsts_and_offsets: list[tuple[int, int]], data_len: int) -> bytes:
    entries = b"".join(
        struct.pack(">qiq", first, part, offset)
        for part, (first, offset) in enumerate(firsts_and_offsets, start=1)
    )
    head = struct.pack(">Iiqqii", 0xDE47DE47, 32 + len(entries), data_len, 128, 0, 0)
    head = head[:24] + struct.pack(">ii", len(firsts_and_offsets), 0)
    return head + entries


def test_pulsar_index_with_falling_entry_ids_is_refused() -> None:
    assert decode_index(_pulsar_index([(0, 0), (5, 4096)], 8192)).chunks is None
    with pytest.raises(FormatError, match="index entry 1: first_entry_id 5 after 5") as raised:
        decode_index(_pulsar_index([(5, 0), (5, 4096)], 8192))
    assert raised.value.offset == 32 + 20


def test_pulsar_index_not_starting_at_offset_0_is_refused() -> None:
    with pytest.raises(FormatError, match="index entry 0: block 0@128, expected an id >= 0 at 0"):
        decode_index(_pulsar_index([(0, 128), (5, 4096)], 8192))


def test_block_header_first_entry_id_is_checked_against_the_index() -> None:
    data, _, index = build()
    b = index.blocks[1]
    raw = block_bytes(data, index, 1)
    count = index.block_entry_count(b)
    assert decode_block(raw, entry_count=count, first_entry_id=b.first_entry_id)
    with pytest.raises(FormatError, match=f"first_entry_id {b.first_entry_id}, index says 3") as e:
        decode_block(raw, entry_count=count, first_entry_id=3, offset=b.offset)
    assert e.value.offset == b.offset + 20


def test_block_errors_name_absolute_offsets() -> None:
    data, _, index = build()
    b = index.blocks[1]
    raw = bytearray(block_bytes(data, index, 1))
    struct.pack_into(">q", raw, HEADER_LEN + 4, 77)
    with pytest.raises(FormatError, match="entry id 77") as raised:
        decode_block(bytes(raw), entry_count=3, offset=b.offset)
    assert raised.value.offset == b.offset + HEADER_LEN
