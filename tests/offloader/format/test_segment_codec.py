"""The v2 segment codec's behaviour: how the encoder cuts blocks and parts, resumes across
passes and refuses bad input (changing nothing); what the index tells a reader."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.encoding import encode_ledger
from fixtures.pulsar_v1 import sample
from fixtures.segments import Segment, SegmentEntries, stream
from offloader.exceptions import EntryTooLargeError, FormatError
from offloader.format import (
    PADDING,
    LedgerIndex,
    SegmentEncoder,
    SegmentIndex,
    decode_any_index,
    decode_chunk,
    decode_segment_block,
    decode_segment_chunk,
    decode_segment_index,
    encode_segment_index,
)


def read_ledger(index: SegmentIndex, data: bytes, ledger_id: int) -> SegmentEntries:
    view = index.ledger(ledger_id)
    assert view.chunks is not None
    return [
        (ledger_id, e, p)
        for c in view.chunks
        for e, p in decode_segment_chunk(data[c.offset : c.end], c, ledger_id=ledger_id)
    ]


# --- blocks and parts --------------------------------------------------------------------
def test_full_blocks_are_padded_a_ledger_change_or_close_trims() -> None:
    entries = [(1, i, bytes([i]) * 100) for i in range(7)] + [(2, 0, b"z" * 50)]
    segment = Segment(entries, 400, 1)  # 128 + 2 frames of 112 = 352: a third does not fit
    blocks = [b for p in segment.parts for b in p.blocks]
    assert [(b.ledger_id, b.ref.first_entry_id, b.ref.length) for b in blocks] == [
        (1, 0, 400),
        (1, 2, 400),
        (1, 4, 400),
        (1, 6, 128 + 112),  # the ledger's last block: trimmed
        (2, 0, 128 + 62),  # closed by close(): trimmed
    ]
    first = segment.data[:400]
    assert first[352:] == (PADDING * 12)[:48]


def test_blocks_group_into_parts_of_at_least_min_part_size() -> None:
    segment = Segment(stream(1, (5, 6, 7, 8)), 700, 1500, chunk_target=300)
    parts = segment.parts
    assert [p.part_id for p in parts] == list(range(1, len(parts) + 1))
    offset = 0
    for p in parts:
        assert p.offset == offset
        assert all(b.ref.part_id == p.part_id for b in p.blocks)
        assert p.data == segment.data[p.offset : p.end] == b"".join(p.buffers)
        assert p.length == len(p.data) == sum(b.ref.length for b in p.blocks)
        offset = p.end
    for p in parts[:-1]:
        assert len(p.data) >= 1500 > len(p.data) - p.blocks[-1].ref.length
    assert any(len(p.blocks) > 1 for p in parts)
    assert len({b.ledger_id for p in parts for b in p.blocks}) == 4


def test_min_part_size_one_makes_every_block_a_part() -> None:
    segment = Segment(stream(2), 600, 1)
    assert all(len(p.blocks) == 1 and p.data is p.buffers[0] for p in segment.parts)  # no copy
    assert len(segment.parts) == len({b.ref.offset for p in segment.parts for b in p.blocks})


@pytest.mark.parametrize("passes", [(1,), (17,), (5, 30, 31), (60,)])
@pytest.mark.parametrize("part_size", [1, 2000])
def test_resumed_passes_write_what_one_pass_writes(passes: tuple[int, ...], part_size: int) -> None:
    entries = stream(3)
    one = Segment(entries, 800, part_size, chunk_target=500)
    many = Segment(entries, 800, part_size, chunk_target=500, passes=passes)
    assert many.data == one.data
    assert many.index() == one.index()
    assert [(p.part_id, p.offset) for p in many.parts] == [(p.part_id, p.offset) for p in one.parts]


def test_a_later_ledger_may_start_at_any_entry() -> None:
    entries = [(4, 10, b"a"), (4, 11, b"b"), (8, 17, b"c"), (9, 0, b"d"), (10, 1, b"e")]
    segment = Segment(entries, 300, 1)
    index = decode_segment_index(segment.index())
    assert index.first_position == (4, 10) and index.last_position == (10, 1)
    assert index.ledger(8).first_entry_id == 17
    assert index.ledger(10).first_entry_id == 1  # the id that would follow ledger 9's
    assert [e for lid in index.ledger_ids for e in read_ledger(index, segment.data, lid)] == entries


def test_memoryview_and_bytearray_payloads() -> None:
    encoder = SegmentEncoder(max_block_size=500)
    encoder.append([(1, 0, memoryview(b"abc")), (1, 1, bytearray(b"de"))])
    parts = encoder.close()
    index = decode_segment_index(encode_segment_index(parts[0].blocks, topic="t"))
    assert read_ledger(index, bytes(parts[0].data), 1) == [(1, 0, b"abc"), (1, 1, b"de")]


# --- refusals change nothing -------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        ((2, 6, b"x"), ValueError, r"^position 2:6 does not follow 2:4: a segment takes"),
        ((2, 4, b"x"), ValueError, r"position 2:4 does not follow 2:4"),
        ((1, 9, b"x"), ValueError, r"position 1:9 does not follow 2:4"),
        ((-1, 0, b"x"), ValueError, r"^position -1:0: ids must be 0..2\^63-1$"),
        ((3, -2, b"x"), ValueError, r"^position 3:-2: ids must be"),
        ((3, 1 << 63, b"x"), ValueError, r"ids must be 0..2\^63-1"),
        (
            (2, 5, bytes(261)),
            EntryTooLargeError,
            r"^ledger 2: entry 5 of 261 bytes does not fit a block of max_block_size 400 ",
        ),
    ],
)
def test_a_refused_batch_changes_nothing(
    bad: tuple[int, int, bytes], error: type[Exception], message: str
) -> None:
    good = [(2, i, bytes([i]) * 40) for i in range(4)]
    encoder = SegmentEncoder(max_block_size=400, min_part_size=1000, chunk_target=100)
    encoder.append(good)
    before = (encoder.position, encoder.pending_bytes)
    with pytest.raises(error, match=message):
        encoder.append([(2, 4, b"fine"), bad])
    assert (encoder.position, encoder.pending_bytes) == before == ((2, 3), 128 + 4 * 52)
    rest = [(2, 4, b"fine"), (3, 0, b"y")]
    reference = Segment(good + rest, 400, 1000, chunk_target=100)
    assert b"".join(bytes(p.data) for p in encoder.append(rest) + encoder.close()) == (
        reference.data
    )


def test_entry_ids_beyond_int64_are_refused() -> None:
    top = (1 << 63) - 1
    encoder = SegmentEncoder(max_block_size=400)
    batch = [(1, top - 1, b"a"), (1, top, b"b"), (1, top + 1, b"c"), (2, 0, b"d")]
    with pytest.raises(ValueError, match=rf"^position 1:{top + 1}: ids must be 0..2\^63-1$"):
        encoder.append(batch)
    assert (encoder.position, encoder.pending_bytes) == (None, 0)
    encoder.append([batch[0], batch[1], batch[3]])
    assert encoder.position == (2, 0)


def test_pending_bytes_and_position_follow_the_stream() -> None:
    encoder = SegmentEncoder(max_block_size=400, min_part_size=480)
    assert (encoder.position, encoder.pending_bytes) == (None, 0)
    assert encoder.append([]) == []
    assert encoder.append([(1, 0, bytes(100))]) == []
    assert (encoder.position, encoder.pending_bytes) == ((1, 0), 240)
    assert encoder.append([(2, 0, bytes(100))]) == []  # ledger 1's block closed: 240 < 480
    assert (encoder.position, encoder.pending_bytes) == ((2, 0), 480)
    parts = encoder.append([(3, 0, b"")])  # ledger 2's block closes: 480 >= 480
    assert [(p.part_id, p.offset, len(p.data), len(p.blocks)) for p in parts] == [(1, 0, 480, 2)]
    assert parts[0].last_position == (2, 0) and parts[0].first_position == (1, 0)
    assert (encoder.position, encoder.pending_bytes) == ((3, 0), 140)
    last = encoder.close()
    assert [(p.part_id, p.offset, len(p.data)) for p in last] == [(2, 480, 140)]


def test_close_ends_the_segment() -> None:
    encoder = SegmentEncoder(max_block_size=400)
    assert encoder.close() == []
    with pytest.raises(ValueError, match=r"^the segment encoder is already closed$"):
        encoder.close()
    with pytest.raises(ValueError, match=r"^the segment encoder is closed: start a new segment$"):
        encoder.append([(1, 0, b"x")])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_block_size": 140}, r"max_block_size 140 < 141"),
        ({"max_block_size": 400, "chunk_target": 0}, "chunk_target must be positive"),
        ({"max_block_size": 400, "min_part_size": 0}, r"min_part_size must be 1..2147483647"),
        ({"max_block_size": 400, "min_part_size": 1 << 31}, "min_part_size must be"),
        ({"max_block_size": 400, "next_part_id": 0}, r"next_part_id must be 1..2147483647"),
        ({"max_block_size": 400, "next_part_id": 1 << 31, "offset": 5}, "next_part_id must be"),
        ({"max_block_size": 400, "offset": 10}, "a new segment has all three at their defaults"),
        ({"max_block_size": 400, "next_part_id": 2}, "resume state offset=0 next_part_id=2"),
        ({"max_block_size": 400, "after": (1, 2)}, r"after=\(1, 2\)"),
        ({"max_block_size": 400, "offset": -1, "next_part_id": 2, "after": (1, 2)}, "offset=-1"),
        ({"max_block_size": 400, "offset": 9, "next_part_id": 2}, "after=None"),
        ({"max_block_size": 400, "offset": 9, "next_part_id": 2, "after": (1, -1)}, "ids must"),
    ],
)
def test_bad_encoder_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SegmentEncoder(**kwargs)  # type: ignore[arg-type]


# --- the index ---------------------------------------------------------------------------
def test_each_ledger_reads_through_its_own_view() -> None:
    entries = stream(4, (3, 4, 9), count=80)
    segment = Segment(entries, 1200, 3000, chunk_target=400)
    index = decode_segment_index(segment.index(times={4: (10, 20)}))
    assert (index.data_object_len, index.header_len) == (len(segment.data), 128)
    assert index.ledger_ids == (3, 4, 9) and index.topic == "t/ü"
    assert index.first_position == entries[0][:2] and index.last_position == entries[-1][:2]
    for ledger_id in index.ledger_ids:
        mine = [e for e in entries if e[0] == ledger_id]
        view = index.ledger(ledger_id)
        assert isinstance(view, LedgerIndex) and view.metadata is not None
        assert (view.first_entry_id, view.last_entry_id) == (mine[0][1], mine[-1][1])
        assert view.metadata.entry_count == len(mine)
        assert view.metadata.length == sum(len(p) for _, _, p in mine)
        times = (10, 20) if ledger_id == 4 else (-1, -1)
        assert (view.metadata.created_ms, view.metadata.sealed_ms) == times
        assert read_ledger(index, segment.data, ledger_id) == mine
        assert view.chunks_between(mine[0][1], mine[-1][1]) == list(view.chunks or ())
        _, entry_id, payload = mine[len(mine) // 2]
        c = view.chunk_for(entry_id)
        got = dict(decode_segment_chunk(segment.data[c.offset : c.end], c, ledger_id=ledger_id))
        assert got[entry_id] == payload
        out = []
        for b in view.blocks:
            out += decode_segment_block(
                segment.data[b.offset : b.offset + b.length],
                ledger_id=ledger_id,
                entry_count=view.block_entry_count(b),
                expected_crc=b.crc32c,
                first_entry_id=b.first_entry_id,
                offset=b.offset,
            )
        assert [(ledger_id, e, p) for e, p in out] == mine
    with pytest.raises(
        LookupError, match=r"^ledger 5 has no entries in this segment \(ledgers 3, 4, 9\)$"
    ):
        index.ledger(5)
    with pytest.raises(LookupError, match="ledger 10 has no entries"):
        index.ledger(10)
    with pytest.raises(LookupError, match="is outside the ledger's entries"):
        index.ledger(4).chunk_for(entries[-1][1] + 1000)


def test_a_ledger_spread_over_two_segments_reads_whole() -> None:
    entries = stream(6, (7, 8, 11), count=50)
    cut = next(i for i, e in enumerate(entries) if e[0] == 8) + 10
    first, second = Segment(entries[:cut], 900, 1), Segment(entries[cut:], 900, 1)
    indexes = [decode_segment_index(s.index()) for s in (first, second)]
    assert indexes[0].last_position == entries[cut - 1][:2]
    assert indexes[1].first_position == entries[cut][:2]
    got = [
        e for s, i in zip((first, second), indexes, strict=True) for e in read_ledger(i, s.data, 8)
    ]
    assert got == [e for e in entries if e[0] == 8]


def test_decode_any_index_picks_the_format_by_magic() -> None:
    segment = Segment(stream(7), 900, 1)
    assert isinstance(decode_any_index(segment.index()), SegmentIndex)
    entries = sample(1, 30, 200)
    ledger = encode_ledger(entries, 1000)
    v1 = decode_any_index(ledger.index())
    assert isinstance(v1, LedgerIndex) and v1.metadata == ledger.metadata
    with pytest.raises(
        FormatError,
        match=r"^bad index magic 0x00000000, expected 0xDE47DE47 \(v1\) or 0x3D1FB0BC \(v2\)$",
    ) as err:
        decode_any_index(bytes(40))
    assert err.value.offset == 0
    with pytest.raises(FormatError, match=r"^truncated index: 3 bytes, not even a magic$") as err:
        decode_any_index(segment.index()[:3])
    assert err.value.offset == 3


def test_v2_chunks_and_blocks_are_not_v1_and_name_their_ledger() -> None:
    segment = Segment(stream(8), 900, 1)
    index = decode_segment_index(segment.index())
    view = index.ledger(4)
    assert view.chunks is not None
    c = view.chunks[0]
    raw = segment.data[c.offset : c.end]
    with pytest.raises(FormatError, match=r"bad block magic 0x26A66D32 .*expected 0xFBDBABCB"):
        decode_chunk(raw, c)
    with pytest.raises(
        FormatError,
        match=rf"^block header ledger_id 4 in block at offset {c.offset} of the data object, "
        r"index says 3$",
    ) as err:
        decode_segment_chunk(raw, c, ledger_id=3)
    assert err.value.offset == c.offset + 28
    with pytest.raises(FormatError, match=r"ledger_id 4 .* index says 5") as err:
        decode_segment_chunk(b"ab" + raw, c, ledger_id=5, at=2, block=view.blocks[0])
    assert err.value.offset == c.offset + 28
    b = view.blocks[0]
    with pytest.raises(FormatError, match=r"ledger_id 4 .* index says 9") as err:
        decode_segment_block(
            segment.data[b.offset : b.offset + b.length],
            ledger_id=9,
            entry_count=None,
            offset=b.offset,
        )
    assert err.value.offset == b.offset + 28


def test_a_magic_of_exactly_four_bytes_is_read() -> None:
    # four bytes hold a magic: a wrong one is named, a v1 one goes on to decode_index
    with pytest.raises(FormatError, match=r"^bad index magic 0x00000000, expected"):
        decode_any_index(bytes(4))
    with pytest.raises(FormatError) as err:
        decode_any_index(bytes.fromhex("DE47DE47"))
    assert "not even a magic" not in str(err.value)


def test_decode_segment_block_checks_what_the_index_says() -> None:
    segment = Segment(stream(8), 900, 1)
    view = decode_segment_index(segment.index()).ledger(4)
    b = view.blocks[0]
    data = segment.data[b.offset : b.offset + b.length]
    count = view.blocks[1].first_entry_id - b.first_entry_id
    entries = decode_segment_block(data, ledger_id=4, entry_count=count, first_entry_id=0)
    assert [e for e, _ in entries] == list(range(count))
    with pytest.raises(FormatError, match=r"bytes after the last entry .* are not padding$"):
        decode_segment_block(data, ledger_id=4, entry_count=count - 1)
    with pytest.raises(FormatError, match=r"^block header first_entry_id 0, index says 1$"):
        decode_segment_block(data, ledger_id=4, entry_count=count, first_entry_id=1)
    with pytest.raises(FormatError, match=r"ledger_id 4 in block at offset 0 ") as err:
        decode_segment_block(data, ledger_id=5, entry_count=count)  # offset: 0 by default
    assert err.value.offset == 28


def test_decode_segment_chunk_with_its_block_checks_the_block() -> None:
    segment = Segment(stream(8), 900, 1)
    view = decode_segment_index(segment.index()).ledger(4)
    assert view.chunks is not None
    c, b = view.chunks[0], view.blocks[0]
    raw = segment.data[c.offset : c.end]
    with pytest.raises(FormatError, match=rf"^block_len {b.length} .*, index says {b.length + 1}$"):
        decode_segment_chunk(raw, c, ledger_id=4, block=replace(b, length=b.length + 1))
    # with the block given, where the block starts decides, not the chunk's own flag
    unflagged = replace(c, starts_block=False)
    with pytest.raises(FormatError, match=r"ledger_id 4 .* index says 5$"):
        decode_segment_chunk(raw, unflagged, ledger_id=5, block=b)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("empty", "^a segment index needs at least one block$"),
        ("gap", r"^block part 2 at offset \d+, expected \d+$"),
        ("ledgers_fall", r"^block at offset \d+: ledger 3 after ledger 4$"),
        ("part_skips", r"^block at offset \d+: part 3, expected one of \(1, 2\)$"),
        ("first_part", r"^block at offset 0: part 2, expected one of \(1,\)$"),
        ("no_crc", r"^block at offset \d+ lacks its crc32c or chunks$"),
        ("no_chunks", r"lacks its crc32c or chunks$"),
    ],
)
def test_encode_segment_index_refuses_inconsistent_blocks(edit: str, message: str) -> None:
    blocks = [b for p in Segment(stream(9, max_size=300), 500, 1).parts for b in p.blocks]
    if edit == "empty":
        blocks = []
    elif edit == "gap":
        blocks[1] = replace(blocks[1], ref=replace(blocks[1].ref, offset=blocks[1].ref.offset + 1))
    elif edit == "ledgers_fall":
        i = next(i for i, b in enumerate(blocks) if b.ledger_id == 4)
        blocks[i + 1] = replace(blocks[i + 1], ledger_id=3)
    elif edit == "part_skips":
        blocks[1] = replace(blocks[1], ref=replace(blocks[1].ref, part_id=3))
    elif edit == "first_part":
        blocks[0] = replace(blocks[0], ref=replace(blocks[0].ref, part_id=2))
    elif edit == "no_crc":
        blocks[2] = replace(blocks[2], ref=replace(blocks[2].ref, crc32c=None))
    else:
        blocks[2] = replace(blocks[2], chunks=())
    with pytest.raises(ValueError, match=message):
        encode_segment_index(blocks, topic="t")
