"""Pulsar compatibility, checked against a minimal v1 reader and writer written here from
/work/shared/FORMAT.md alone (no code from the codec): what a Pulsar reader would see."""

from __future__ import annotations

import random
import struct

import pytest

from offloader.format import (
    LedgerMetadata,
    decode_block,
    decode_chunk,
    decode_index,
    encode_blocks,
    encode_index,
    metadata_for,
)

Entries = list[tuple[int, bytes]]


# --- the independent minimal v1 implementation ------------------------------------------
def pulsar_read_index(index: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(data_object_len, data_header_len, [(first_entry_id, part_id, block_offset)]).

    Reads exactly what a v1 reader reads: the fixed head, skips metadata, entry_count
    entries; anything after them is not looked at.
    """
    magic, index_len, data_len, header_len, count, meta_len = struct.unpack_from(">iiqqii", index)
    assert magic == struct.unpack(">i", bytes.fromhex("DE47DE47"))[0]
    assert index_len == len(index)
    at = 4 + 4 + 8 + 8 + 4 + 4 + meta_len
    entries = [struct.unpack_from(">qiq", index, at + 20 * i) for i in range(count)]
    return data_len, header_len, entries


def pulsar_read_ledger(data: bytes, index: bytes) -> Entries:
    """Every entry, block by block from block_offset + header_len, stopping at padding
    (its first int32, 0xFEDCDEAD, is a negative length) or at the block end."""
    data_len, header_len, entries = pulsar_read_index(index)
    assert data_len == len(data)
    ends = [offset for _, _, offset in entries[1:]] + [data_len]
    out: Entries = []
    for (first, _part, offset), end in zip(entries, ends, strict=True):
        magic, h_len, b_len, h_first = struct.unpack_from(">iqqq", data, offset)
        assert magic == struct.unpack(">i", bytes.fromhex("FBDBABCB"))[0]
        assert (h_len, b_len, h_first) == (header_len, end - offset, first)
        pos = offset + header_len
        while pos + 4 <= end:
            (length,) = struct.unpack_from(">i", data, pos)
            if length < 0:
                assert data[pos:end] == (bytes.fromhex("FEDCDEAD") * (end - pos))[: end - pos]
                break
            (entry_id,) = struct.unpack_from(">q", data, pos + 4)
            out.append((entry_id, data[pos + 12 : pos + 12 + length]))
            pos += 12 + length
        else:
            assert data[pos:end] == (bytes.fromhex("FEDCDEAD") * 4)[: end - pos]
    return out


def pulsar_write_blocks(entries: Entries, block_size: int) -> list[tuple[int, bytes]]:
    """[(first_entry_id, block bytes)], the jcloud way: fill, pad, trim the last."""
    blocks: list[tuple[int, bytes]] = []
    i = 0
    while i < len(entries):
        first = entries[i][0]
        body = b""
        while i < len(entries) and 128 + len(body) + 12 + len(entries[i][1]) <= block_size:
            entry_id, payload = entries[i]
            body += struct.pack(">iq", len(payload), entry_id) + payload
            i += 1
        remaining = sum(12 + len(p) for _, p in entries[i:])
        size = block_size if remaining else 128 + len(body)
        header = struct.pack(">iqqq", -0x04245435, 128, size, first) + bytes(100)
        pad = size - 128 - len(body)
        blocks.append((first, header + body + (bytes.fromhex("FEDCDEAD") * (pad // 4 + 1))[:pad]))
    return blocks


def pulsar_write_index(blocks: list[tuple[int, bytes]], metadata: bytes) -> bytes:
    entries = b""
    offset = 0
    for part, (first, raw) in enumerate(blocks, start=1):
        entries += struct.pack(">qiq", first, part, offset)
        offset += len(raw)
    index_len = 32 + len(metadata) + len(entries)
    head = struct.pack(">iiqqii", -0x21B821B9, index_len, offset, 128, len(blocks), len(metadata))
    return head + metadata + entries


def sample(seed: int, count: int = 300, max_size: int = 900) -> Entries:
    rng = random.Random(seed)
    return [(i, rng.randbytes(rng.randint(0, max_size))) for i in range(count)]


# --- tests -------------------------------------------------------------------------------
def test_independent_magics_match() -> None:
    assert struct.pack(">i", -0x04245435) == bytes.fromhex("FBDBABCB")
    assert struct.pack(">i", -0x21B821B9) == bytes.fromhex("DE47DE47")


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block_size", [1024, 4096, 20000])
def test_pulsar_reader_reads_our_objects(seed: int, block_size: int) -> None:
    entries = [(i, p[: block_size - 140]) for i, p in sample(seed)]
    blocks = list(encode_blocks(entries, max_block_size=block_size, chunk_target=1500))
    refs = [b.ref for b in blocks]
    chunks = [c for b in blocks for c in b.chunks]
    meta = metadata_for(refs, chunks, topic="t", ledger_id=1, created_ms=0, sealed_ms=0)
    index = encode_index(meta, refs, chunks)  # with our extension after the v1 entries
    data = b"".join(bytes(b.data) for b in blocks)
    assert pulsar_read_ledger(data, index) == entries
    _, _, v1 = pulsar_read_index(index)
    assert [(f, p, o) for f, p, o in v1] == [(r.first_entry_id, r.part_id, r.offset) for r in refs]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block_size", [200, 1024, 5000])
def test_our_blocks_are_byte_identical_to_the_reference_writer(seed: int, block_size: int) -> None:
    entries = [(i, p[: block_size - 140]) for i, p in sample(seed, 120, 1200)]
    ours = [bytes(b.data) for b in encode_blocks(entries, max_block_size=block_size)]
    assert ours == [raw for _, raw in pulsar_write_blocks(entries, block_size)]


def test_pure_pulsar_index_from_encode_index() -> None:
    entries = sample(7)
    blocks = list(encode_blocks(entries, max_block_size=4096))
    refs = [b.ref for b in blocks]
    meta = LedgerMetadata("t", 9, len(entries), len(entries) - 1, 0, 1, 2)
    raw = encode_index(meta, refs, None)
    assert len(raw) == 32 + 52 + 1 + 20 * len(refs)
    index = decode_index(raw)
    assert index.chunks is None and index.metadata == meta
    assert [(b.part_id, b.offset, b.length) for b in index.blocks] == [
        (r.part_id, r.offset, r.length) for r in refs
    ]
    assert all(b.crc32c is None for b in index.blocks)
    data = b"".join(bytes(b.data) for b in blocks)
    out: Entries = []
    for b in index.blocks:
        out += decode_block(
            data[b.offset : b.offset + b.length], entry_count=index.block_entry_count(b)
        )
    assert out == entries
    assert index.block_for(150).first_entry_id <= 150
    with pytest.raises(LookupError, match="no chunk table"):
        index.chunk_for(0)
    assert pulsar_read_ledger(data, raw) == entries


def test_objects_written_by_the_reference_writer_decode() -> None:
    """A Pulsar-written ledger (foreign protobuf metadata): blocks decode via the index."""
    entries = sample(11, 200, 700)
    written = pulsar_write_blocks(entries, 3000)
    foreign_meta = bytes.fromhex("0801100218c8012203666f6f")  # protobuf-ish, not ours
    raw_index = pulsar_write_index(written, foreign_meta)
    index = decode_index(raw_index)
    assert index.metadata is None and index.chunks is None
    assert index.last_entry_id is None
    data = b"".join(raw for _, raw in written)
    out: Entries = []
    for b in index.blocks[:-1]:
        out += decode_block(
            data[b.offset : b.offset + b.length], entry_count=index.block_entry_count(b)
        )
    with pytest.raises(LookupError, match="unknown"):
        index.block_entry_count(index.blocks[-1])
    last = index.blocks[-1]
    out += decode_block(data[last.offset :], entry_count=len(entries) - len(out))
    assert out == entries


def test_chunk_lookup_reads_one_range_per_entry() -> None:
    """The point of the extension: any entry costs one ranged read of <= ~chunk_target bytes."""
    entries = sample(5, 2000, 300)
    blocks = list(encode_blocks(entries, max_block_size=1 << 16, chunk_target=4096))
    refs = [b.ref for b in blocks]
    chunks = [c for b in blocks for c in b.chunks]
    meta = metadata_for(refs, chunks, topic="t", ledger_id=1, created_ms=0, sealed_ms=0)
    index = decode_index(encode_index(meta, refs, chunks))
    data = b"".join(bytes(b.data) for b in blocks)
    for entry_id, payload in random.Random(1).sample(entries, 100):
        c = index.chunk_for(entry_id)
        assert c.length <= 4096 + 128
        assert dict(decode_chunk(data[c.offset : c.offset + c.length], c))[entry_id] == payload
