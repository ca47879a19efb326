"""A pure Pulsar v2 view of our segments: the independent decoder written from
docs/FORMAT.md alone (tests/fixtures/pulsar_v2.py) reads our blocks and the Pulsar part of
our index, skipping the extension record as documented."""

from __future__ import annotations

import struct

import pytest

from fixtures.pulsar_v2 import pulsar_v2_read_index, pulsar_v2_read_segment
from fixtures.segments import Segment, stream
from offloader.format import decode_segment_index


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("block_size", "part_size"), [(400, 1), (1024, 1), (1024, 5000), (20000, 30000)]
)
def test_pulsar_v2_reader_reads_our_segments(seed: int, block_size: int, part_size: int) -> None:
    entries = [(lid, eid, p[: block_size - 140]) for lid, eid, p in stream(seed)]
    segment = Segment(entries, block_size, part_size, chunk_target=700, cuts=(10, 11, 40))
    raw = segment.index()
    assert pulsar_v2_read_segment(segment.data, raw) == entries
    data_len, header_len, ledgers = pulsar_v2_read_index(raw)
    assert (data_len, header_len) == (len(segment.data), 128)
    ours = [b for p in segment.parts for b in p.blocks]
    assert sorted(ledgers) == sorted({b.ledger_id for b in ours})
    assert [(lid, *e) for lid in sorted(ledgers) for e in ledgers[lid]] == [
        (b.ledger_id, b.ref.first_entry_id, b.ref.part_id, b.ref.offset) for b in ours
    ]


def test_the_extension_is_a_skippable_ledger_record_at_the_end() -> None:
    """What the docs promise a record walker: after the real ledgers, one record of ledger
    -1 with no index entries whose metadata runs exactly to the end of the index."""
    segment = Segment(stream(5), 1024, 1)
    raw = segment.index()
    index = decode_segment_index(raw)
    pos = 24
    seen = []
    while True:
        ledger_id, count, meta_len = struct.unpack_from(">qii", raw, pos)
        if ledger_id == -1:
            break
        seen.append(ledger_id)
        pos += 16 + meta_len + 20 * count
    assert seen == list(index.ledger_ids)
    assert struct.unpack_from(">qii", raw, pos) == (-1, 0, len(raw) - pos - 16)
    assert struct.unpack_from(">I", raw, pos + 16)[0] == 0x5E6E0E5C


def test_block_headers_are_pulsar_v2_headers() -> None:
    segment = Segment(stream(2), 900, 1)
    for part in segment.parts:
        for b in part.blocks:
            head = segment.data[b.ref.offset : b.ref.offset + 128]
            assert head[:4] == bytes.fromhex("26A66D32")
            assert struct.unpack_from(">qqqq", head, 4) == (
                128,
                b.ref.length,
                b.ref.first_entry_id,
                b.ledger_id,
            )
            assert head[36:] == bytes(92)
