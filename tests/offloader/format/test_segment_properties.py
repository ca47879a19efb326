"""Property tests of the v2 segment format: any ledgers and entries, any block, part and
chunk size, fed in any batches over any passes, round-trip (for us and for the independent
Pulsar v2 reader); any damage to an index, chunk or block raises FormatError with an
offset, never another exception, never a hang, never wrong data.

Profiles ("ci" derandomized, "dev" larger) live in tests/fixtures/hypothesis_profiles.py.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.damage import at_fraction, flipped, masks, positions
from fixtures.pulsar_v2 import pulsar_v2_read_segment
from fixtures.segments import Segment, SegmentEntries
from fixtures.streams import block_entries
from offloader.exceptions import FormatError
from offloader.format import (
    ENTRY_FRAME,
    HEADER_LEN,
    MIN_BLOCK_SIZE,
    PADDING,
    SegmentIndex,
    decode_any_index,
    decode_segment_block,
    decode_segment_chunk,
    decode_segment_index,
)

KiB = 1024


@st.composite
def segments(draw: st.DrawFn) -> Segment:
    """1-4 ledgers with rising ids, the first from any entry id, payloads from empty to a
    whole block (or padding look-alikes), any sizes, any batches and pass boundaries."""
    block = draw(st.one_of(st.integers(MIN_BLOCK_SIZE, 3 * KiB), st.just(64 * KiB)))
    max_payload = block - HEADER_LEN - ENTRY_FRAME
    size = st.one_of(
        st.integers(0, min(max_payload, 2 * KiB)),
        st.sampled_from([0, max_payload, max_payload - 1]),
    )
    ledger_ids = sorted(draw(st.sets(st.integers(0, 1 << 40), min_size=1, max_size=4)))
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    padding_like = draw(st.booleans())
    entries: SegmentEntries = []
    for ledger_id in ledger_ids:
        first = draw(st.one_of(st.just(0), st.integers(0, 1 << 40)))
        for i, n in enumerate(draw(st.lists(size, min_size=1, max_size=15))):
            payload = (PADDING * (n // 4 + 1))[:n] if padding_like else rng.randbytes(n)
            entries.append((ledger_id, first + i, payload))
    bounds = st.lists(st.integers(0, len(entries)), max_size=4)
    return Segment(
        entries,
        block,
        min_part_size=draw(st.one_of(st.just(1), st.integers(1, 3 * block))),
        chunk_target=draw(st.integers(1, 2 * block)),
        cuts=tuple(draw(bounds)),
        passes=tuple(draw(bounds)),
    )


def read_all(index: SegmentIndex, data: bytes, *, by_block: bool = False) -> SegmentEntries:
    """Every entry, ledger by ledger, through the chunk table or block by block."""
    if by_block:
        return block_entries(index, data)
    out: SegmentEntries = []
    for ledger_id in index.ledger_ids:
        view = index.ledger(ledger_id)
        assert view.chunks is not None
        for c in view.chunks:
            entries = decode_segment_chunk(data[c.offset : c.end], c, ledger_id=ledger_id)
            out += [(ledger_id, e, p) for e, p in entries]
    return out


# --- round trips -------------------------------------------------------------------------
@given(segments())
def test_any_segment_round_trips(segment: Segment) -> None:
    raw = segment.index()
    index = decode_any_index(raw)
    assert isinstance(index, SegmentIndex)
    assert read_all(index, segment.data) == segment.entries
    assert read_all(index, segment.data, by_block=True) == segment.entries
    assert pulsar_v2_read_segment(segment.data, raw) == segment.entries
    assert index.ledger_ids == tuple(sorted({e[0] for e in segment.entries}))
    blocks = [b for p in segment.parts for b in p.blocks]
    assert [b.ref for b in blocks] == [b for view in index.ledgers for b in view.blocks]
    assert [c for b in blocks for c in b.chunks] == [
        c for v in index.ledgers for c in v.chunks or ()
    ]


@given(segments())
def test_blocks_and_parts_follow_the_rules(segment: Segment) -> None:
    """A block is full size exactly when padded (closed by an entry that did not fit),
    parts reach min_part_size before they close (the last excepted), chunks respect the
    target, and a resumed segment is byte for byte the one-pass segment."""
    parts = segment.parts
    for part in parts[:-1]:
        assert len(part.data) >= segment.min_part_size
        assert len(part.data) - part.blocks[-1].ref.length < segment.min_part_size
    blocks = [b for p in parts for b in p.blocks]
    for b, after in zip(blocks, [*blocks[1:], None], strict=True):
        framed = max(c.end for c in b.chunks) - b.ref.offset
        assert b.ref.length <= segment.max_block_size
        same_ledger_next = after is not None and after.ledger_id == b.ledger_id
        if b.ref.length != framed:  # padded: closed because the next entry did not fit
            assert b.ref.length == segment.max_block_size and same_ledger_next
        for c in b.chunks:
            assert c.length <= segment.chunk_target or c.entry_count == 1
    one_pass = Segment(
        segment.entries, segment.max_block_size, segment.min_part_size, segment.chunk_target
    )
    assert segment.data == one_pass.data and segment.index() == one_pass.index()


# --- damage ------------------------------------------------------------------------------


def refused(call: Callable[..., object], *args: object, **kwargs: object) -> FormatError:
    with pytest.raises(FormatError) as err:
        call(*args, **kwargs)
    assert err.value.offset is not None, f"no offset: {err.value}"
    return err.value


@given(segments(), positions)
def test_truncated_index_is_refused(segment: Segment, where: float) -> None:
    raw = segment.index()
    refused(decode_any_index, raw[: at_fraction(raw, where)])
    refused(decode_segment_index, raw[: at_fraction(raw, where)])


@given(segments(), positions, masks)
def test_damaged_index_is_refused(segment: Segment, where: float, mask: int) -> None:
    raw = segment.index()
    refused(decode_any_index, flipped(raw, at_fraction(raw, where), mask))


@given(segments(), positions, masks)
def test_resealed_damaged_index_never_yields_wrong_data(
    segment: Segment, where: float, mask: int
) -> None:
    """Damage behind a valid CRC (a writer bug, not a bit flip) meets the structural checks:
    refused at decode with an offset, or the reads refuse it, or the entries are right."""
    raw = segment.index()
    body = flipped(raw[:-4], at_fraction(raw[:-4], where), mask)
    try:
        index = decode_segment_index(body + struct.pack(">I", crc32c.crc32c(body)))
    except FormatError as e:
        assert e.offset is not None, f"no offset: {e}"
        return
    try:
        entries = read_all(index, segment.data)
    except (FormatError, LookupError):
        return
    assert entries == segment.entries


@given(segments(), st.binary(max_size=200), positions)
def test_garbage_index_is_refused(segment: Segment, garbage: bytes, where: float) -> None:
    raw = segment.index()
    for candidate in (garbage, raw[: at_fraction(raw, where)] + garbage, raw + garbage):
        if candidate != raw:
            refused(decode_segment_index, candidate)


@given(segments(), positions, st.one_of(masks, st.none()))
def test_damaged_chunks_are_refused(segment: Segment, where: float, mask: int | None) -> None:
    """A flipped byte or a short read anywhere in any chunk: a FormatError with an offset."""
    index = decode_segment_index(segment.index())
    for ledger_id in index.ledger_ids:
        for chunk in index.ledger(ledger_id).chunks or ():
            raw = segment.data[chunk.offset : chunk.end]
            at = at_fraction(raw, where)
            damaged = raw[:at] if mask is None else flipped(raw, at, mask)
            refused(decode_segment_chunk, damaged, chunk, ledger_id=ledger_id)
            if mask is not None:  # the same, read in place from a larger GET
                window = b"xx" + damaged + b"yy"
                refused(decode_segment_chunk, window, chunk, ledger_id=ledger_id, at=2)


@given(segments(), positions, st.one_of(masks, st.none()))
def test_damaged_blocks_are_refused(segment: Segment, where: float, mask: int | None) -> None:
    data = segment.data
    at = at_fraction(data, where)
    damaged = data[:at] if mask is None else flipped(data, at, mask)
    index = decode_segment_index(segment.index())
    refused(read_all, index, damaged, by_block=True)


@given(st.binary(max_size=600), st.one_of(st.none(), st.integers(0, 50)), st.integers(0, 9))
def test_garbage_blocks_are_refused(garbage: bytes, count: int | None, ledger_id: int) -> None:
    refused(decode_segment_block, garbage, ledger_id=ledger_id, entry_count=count)
