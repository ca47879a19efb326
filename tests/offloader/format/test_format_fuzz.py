"""Fuzzing the object readers (v1 ledger and v2 segment data and index objects) with
arbitrary bytes and with valid objects damaged: flipped, truncated, extended, a field set
to an extreme value. Every reader returns exactly the original data or raises FormatError
(with a message), within its deadline and in memory bounded by the bytes it was given
(``fixtures/fuzzing.py``). A pure Pulsar v1 index carries no CRC: with it a flipped payload
byte cannot be seen, so there only "no other exception" is asserted; our extension's CRCs
make every other flip visible or harmless.

Each property runs in a short form (CI) and a ``long`` one (docs/TESTING.md, "Fuzzing").
"""

from __future__ import annotations

import struct
from functools import partial
from typing import Any

from hypothesis import example
from hypothesis import strategies as st

from fixtures.encoding import EncodedLedger, encode_ledger
from fixtures.fuzzing import damaged, damages, extremes, fuzz_forms, outcome
from fixtures.segments import Segment, SegmentEntries
from fixtures.streams import block_entries
from offloader.exceptions import FormatError
from offloader.format import (
    INDEX_MAGIC,
    MIN_BLOCK_SIZE,
    SEGMENT_INDEX_MAGIC,
    LedgerIndex,
    SegmentIndex,
    block_offsets,
    chunk_offsets,
    decode_any_index,
    decode_block,
    decode_chunk,
    decode_index,
    decode_segment_block,
    decode_segment_chunk,
    decode_segment_index,
)

Entries = list[tuple[int, bytes]]
FORMAT = (FormatError,)
LOOKUP = (FormatError, LookupError)


# --- inputs -------------------------------------------------------------------------------
@st.composite
def ledgers(draw: st.DrawFn) -> tuple[Entries, EncodedLedger]:
    """A small ledger (1-12 entries from any id, ids up to near 2**63) in small blocks."""
    first = draw(st.one_of(st.just(0), st.integers(0, 2**40), st.just(2**63 - 20)))
    sizes = draw(st.lists(st.integers(0, 300), min_size=1, max_size=12))
    entries = [(first + i, bytes([i % 251]) * n) for i, n in enumerate(sizes)]
    block = draw(st.integers(max(sizes) + MIN_BLOCK_SIZE, 1200))
    chunk = draw(st.integers(1, 600))
    return entries, encode_ledger(entries, block, chunk, topic="t/ü", ledger_id=7)


@st.composite
def segments(draw: st.DrawFn) -> Segment:
    """A small segment: 1-3 ledgers of 1-6 entries each."""
    entries: SegmentEntries = []
    for ledger_id in sorted(draw(st.sets(st.integers(0, 2**40), min_size=1, max_size=3))):
        first = draw(st.one_of(st.just(0), st.integers(0, 2**40)))
        for i, n in enumerate(draw(st.lists(st.integers(0, 200), min_size=1, max_size=6))):
            entries.append((ledger_id, first + i, bytes([i % 251]) * n))
    block = draw(st.integers(200 + MIN_BLOCK_SIZE, 1000))
    return Segment(entries, block, chunk_target=draw(st.integers(1, 500)))


def framed_garbage(magic: int) -> st.SearchStrategy[bytes]:
    """Bytes that pass an index's first two checks (its magic, index_len = its length), so
    the fuzzing reaches the fields behind them."""

    def frame(body: bytes) -> bytes:
        return struct.pack(">Ii", magic, 8 + len(body)) + body

    head = st.tuples(extremes, extremes, st.sampled_from([128, 0, -1])).map(
        lambda t: struct.pack(">qq", t[0] % 2**63, t[2]) if t[2] == 128 else b""
    )
    return st.tuples(head, st.binary(max_size=300)).map(lambda hb: frame(hb[0] + hb[1]))


any_index_bytes = st.one_of(
    st.binary(max_size=400), framed_garbage(INDEX_MAGIC), framed_garbage(SEGMENT_INDEX_MAGIC)
)


# --- readers as a caller uses them --------------------------------------------------------
def read_ledger(index: LedgerIndex, data: bytes) -> Entries:
    """Every entry through the chunk table (a GET per chunk and one larger GET read in
    place), else block by block as Pulsar reads; all three must agree."""
    if index.chunks is None:
        out: Entries = []
        for b in index.blocks:
            out += decode_block(
                data[b.offset : b.offset + b.length],
                entry_count=index.block_entry_count(b) if b is not index.blocks[-1] else None,
                first_entry_id=b.first_entry_id,
                offset=b.offset,
            )
        return out
    by_chunk = [e for c in index.chunks for e in decode_chunk(data[c.offset : c.end], c)]
    in_place = [e for c in index.chunks for e in decode_chunk(data, c, at=c.offset)]
    by_block: Entries = []
    for b in index.blocks:
        by_block += decode_block(
            data[b.offset : b.offset + b.length],
            entry_count=index.block_entry_count(b),
            expected_crc=b.crc32c,
            first_entry_id=b.first_entry_id,
            offset=b.offset,
        )
    assert by_chunk == in_place == by_block
    return by_chunk


def read_segment(index: SegmentIndex, data: bytes) -> SegmentEntries:
    """Every entry of a segment by chunks and by blocks; both must agree."""
    by_chunk: SegmentEntries = []
    for ledger_id in index.ledger_ids:
        view = index.ledger(ledger_id)
        for c in view.chunks or ():
            got = decode_segment_chunk(data[c.offset : c.end], c, ledger_id=ledger_id)
            by_chunk += [(ledger_id, e, p) for e, p in got]
    assert by_chunk == block_entries(index, data)
    return by_chunk


def right_or_refused(got: Any, expected: Any) -> None:
    """A reader's outcome: FormatError, or exactly the original data."""
    if not isinstance(got, BaseException):
        assert got == expected, "damage went unnoticed and the reader returned wrong data"


# --- any bytes ----------------------------------------------------------------------------
def any_index_is_parsed_or_refused(raw: bytes) -> None:
    """Whatever bytes an index object holds, the index decoders and the lookups on what
    they return raise FormatError/LookupError or nothing else."""
    for decode in (decode_any_index, decode_index, decode_segment_index):
        index = outcome(lambda d=decode: d(raw), FORMAT, size=len(raw))
        if isinstance(index, LedgerIndex):
            for entry_id in (0, index.first_entry_id, 2**63 - 1, -(2**63)):
                outcome(partial(index.block_for, entry_id), LOOKUP, size=len(raw))


test_any_index_bytes, test_any_index_bytes_long = fuzz_forms(any_index_bytes)(
    example(struct.pack(">Iiqqii", INDEX_MAGIC, 32, 0, 128, 2**31 - 1, 2**31 - 1))(
        any_index_is_parsed_or_refused
    )
)


def any_block_is_parsed_or_refused(raw: bytes, count: int | None, first: int | None) -> None:
    """Whatever bytes a ranged GET returns for a block, both block parsers and the v2 one
    refuse them or return entries; never another exception."""
    outcome(
        lambda: decode_block(raw, entry_count=count, first_entry_id=first), FORMAT, size=len(raw)
    )
    outcome(lambda: block_offsets(raw, entry_count=count), FORMAT, size=len(raw))
    outcome(
        lambda: decode_segment_block(raw, ledger_id=3, entry_count=count, first_entry_id=first),
        FORMAT,
        size=len(raw),
    )


block_bytes = st.one_of(
    st.binary(max_size=600),
    st.tuples(extremes, extremes, st.binary(max_size=400)).map(
        lambda t: struct.pack(">Iqqq100x", 0xFBDBABCB, 128, t[0] % 2**63, t[1] % 2**63) + t[2]
    ),
)
test_any_block_bytes, test_any_block_bytes_long = fuzz_forms(
    block_bytes,
    st.one_of(st.none(), st.integers(0, 50), st.just(2**31)),
    st.one_of(st.none(), extremes.filter(lambda v: -(2**63) <= v < 2**63)),
)(any_block_is_parsed_or_refused)


# --- v1: a valid ledger, damaged ------------------------------------------------------------
def damaged_ledger_index(ledger: tuple[Entries, EncodedLedger], damage: Any, ext: bool) -> None:
    """An index damaged in any way decodes to FormatError, or to an index that reads the
    original data object back exactly (or is refused while reading)."""
    entries, encoded = ledger
    raw = damaged(encoded.index(extension=ext), damage)
    index = outcome(lambda: decode_index(raw), FORMAT, size=len(raw))
    if isinstance(index, LedgerIndex):
        got = outcome(lambda: read_ledger(index, encoded.data), LOOKUP, size=len(encoded.data))
        if ext:
            right_or_refused(got, entries)


test_damaged_ledger_index, test_damaged_ledger_index_long = fuzz_forms(
    ledgers(), damages, st.booleans()
)(damaged_ledger_index)


def damaged_ledger_data(ledger: tuple[Entries, EncodedLedger], damage: Any, ext: bool) -> None:
    """A data object damaged in any way, read with its sound index: FormatError or exactly
    the entries written (a Pulsar index has no CRC: there, only no other exception)."""
    entries, encoded = ledger
    index = decode_index(encoded.index(extension=ext))
    data = damaged(encoded.data, damage)
    got = outcome(lambda: read_ledger(index, data), FORMAT, size=len(data))
    if ext:
        right_or_refused(got, entries)


test_damaged_ledger_data, test_damaged_ledger_data_long = fuzz_forms(
    ledgers(), damages, st.booleans()
)(damaged_ledger_data)


def chunk_offsets_of_damaged_data(ledger: tuple[Entries, EncodedLedger], damage: Any) -> None:
    """The batch path (payload offsets without the CRC) on damaged data: FormatError or
    offsets the frames really hold, never another exception."""
    _, encoded = ledger
    index = decode_index(encoded.index())
    data = damaged(encoded.data, damage)
    assert index.chunks is not None
    for c in index.chunks:
        outcome(lambda c=c: chunk_offsets(data, c, at=c.offset), FORMAT, size=len(data))


test_chunk_offsets_damaged, test_chunk_offsets_damaged_long = fuzz_forms(ledgers(), damages)(
    chunk_offsets_of_damaged_data
)


def lookups_at_the_edges(ledger: tuple[Entries, EncodedLedger], entry_id: int) -> None:
    """chunk_for/block_for of any entry id (near 2**63, negative): the chunk and block that
    hold it, or LookupError."""
    entries, encoded = ledger
    index = decode_index(encoded.index())
    for find in (index.chunk_for, index.block_for):
        found = outcome(lambda f=find: f(entry_id), (LookupError,), size=0)
        if not isinstance(found, BaseException):
            assert entries[0][0] <= entry_id <= entries[-1][0]
            assert found.first_entry_id <= entry_id


test_lookups_at_the_edges, test_lookups_at_the_edges_long = fuzz_forms(
    ledgers(), st.one_of(extremes, st.integers(-5, 2**41))
)(lookups_at_the_edges)


# --- v2: a valid segment, damaged ------------------------------------------------------------
def damaged_segment_index(segment: Segment, damage: Any) -> None:
    """A segment index damaged in any way: FormatError, or an index that reads the original
    data object back exactly (or is refused while reading)."""
    raw = damaged(segment.index(), damage)
    index = outcome(lambda: decode_any_index(raw), FORMAT, size=len(raw))
    if isinstance(index, SegmentIndex):
        got = outcome(lambda: read_segment(index, segment.data), LOOKUP, size=len(segment.data))
        right_or_refused(got, segment.entries)


test_damaged_segment_index, test_damaged_segment_index_long = fuzz_forms(segments(), damages)(
    damaged_segment_index
)


def damaged_segment_data(segment: Segment, damage: Any) -> None:
    """A segment's data object damaged in any way, read with its sound index: FormatError
    or exactly the entries written."""
    index = decode_segment_index(segment.index())
    data = damaged(segment.data, damage)
    got = outcome(lambda: read_segment(index, data), FORMAT, size=len(data))
    right_or_refused(got, segment.entries)


test_damaged_segment_data, test_damaged_segment_data_long = fuzz_forms(segments(), damages)(
    damaged_segment_data
)
