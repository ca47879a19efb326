"""Pulsar compatibility, checked against a minimal v1 reader and writer written from
/work/shared/FORMAT.md alone (tests/fixtures/pulsar_v1.py, no code from the codec): what a
Pulsar reader would see."""

from __future__ import annotations

import random
import struct

import pytest

from fixtures.encoding import encode_ledger
from fixtures.pulsar_v1 import (
    Entries,
    pulsar_read_index,
    pulsar_read_ledger,
    pulsar_write_blocks,
    pulsar_write_index,
    sample,
)
from offloader.format import (
    LedgerMetadata,
    decode_block,
    decode_chunk,
    decode_index,
    encode_blocks,
    encode_index,
)


# --- tests -------------------------------------------------------------------------------
def test_independent_magics_match() -> None:
    assert struct.pack(">i", -0x04245435) == bytes.fromhex("FBDBABCB")
    assert struct.pack(">i", -0x21B821B9) == bytes.fromhex("DE47DE47")


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("block_size", [1024, 4096, 20000])
def test_pulsar_reader_reads_our_objects(seed: int, block_size: int) -> None:
    entries = [(i, p[: block_size - 140]) for i, p in sample(seed)]
    ledger = encode_ledger(entries, block_size, chunk_target=1500)
    index = ledger.index()  # with our extension after the v1 entries
    data = ledger.data
    assert pulsar_read_ledger(data, index) == entries
    _, _, v1 = pulsar_read_index(index)
    assert [(f, p, o) for f, p, o in v1] == [
        (r.first_entry_id, r.part_id, r.offset) for r in ledger.refs
    ]


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
    assert (index.data_object_len, index.header_len) == (sum(r.length for r in refs), 128)
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
    with pytest.raises(LookupError, match=r"^index has no chunk table \(pure Pulsar index\): use"):
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
    ledger = encode_ledger(entries, 1 << 16, chunk_target=4096)
    index = decode_index(ledger.index())
    data = ledger.data
    for entry_id, payload in random.Random(1).sample(entries, 100):
        c = index.chunk_for(entry_id)
        assert c.length <= 4096 + 128
        assert dict(decode_chunk(data[c.offset : c.offset + c.length], c))[entry_id] == payload
