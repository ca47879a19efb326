"""Property tests of the v1 format: whatever the entries, block size and chunk target,
encoding round-trips; whatever the damage (truncation, a flipped byte, garbage), decoding
raises FormatError, never another exception, never a hang, never wrong data. The same for
the batch path (``chunk_offsets``/``block_offsets``: payload offsets, no copies).

Profiles ("ci" derandomized, "dev" larger) live in tests/fixtures/hypothesis_profiles.py.
"""

from __future__ import annotations

import itertools
import random
import struct
from array import array
from dataclasses import dataclass
from functools import cached_property

import crc32c
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from fixtures.damage import at_fraction, flipped, masks, positions
from fixtures.encoding import EncodedLedger, encode_ledger
from fixtures.pulsar_v1 import pulsar_read_ledger
from offloader.exceptions import EntryTooLargeError, FormatError
from offloader.format import (
    ENTRY_FRAME,
    HEADER_LEN,
    MIN_BLOCK_SIZE,
    PADDING,
    ChunkRef,
    EncodedBlock,
    LedgerIndex,
    block_offsets,
    chunk_offsets,
    decode_block,
    decode_chunk,
    decode_index,
    encode_blocks,
    parse_chunk,
)

KiB = 1024
Entries = list[tuple[int, bytes]]


@dataclass
class Ledger:
    """Entries encoded with one block size and chunk target."""

    entries: Entries
    max_block_size: int
    chunk_target: int

    @cached_property
    def encoded(self) -> EncodedLedger:
        return encode_ledger(
            self.entries,
            self.max_block_size,
            self.chunk_target,
            topic="t/ü",
            ledger_id=9,
            created_ms=1,
            sealed_ms=2,
        )

    @property
    def blocks(self) -> list[EncodedBlock]:
        return self.encoded.blocks

    @property
    def data(self) -> bytes:
        return self.encoded.data

    def index(self, *, extension: bool = True) -> bytes:
        return self.encoded.index(extension=extension)

    @cached_property
    def payload_bytes(self) -> set[int]:
        """Offsets of payload bytes in the data object: the only bytes Pulsar v1 cannot check."""
        out: set[int] = set()
        it = iter(self.entries)
        for block in self.blocks:
            pos = block.ref.offset + HEADER_LEN
            framed_end = block.ref.offset + max(c.end - block.ref.offset for c in block.chunks)
            while pos < framed_end:
                _, payload = next(it)
                out.update(range(pos + ENTRY_FRAME, pos + ENTRY_FRAME + len(payload)))
                pos += ENTRY_FRAME + len(payload)
        return out


@st.composite
def ledgers(draw: st.DrawFn) -> Ledger:
    """Any block size from the codec's minimum up (and the policy's minimum, 64 KiB), entry
    sizes from 0 to what a block holds (all the same, or each its own), payloads that may
    mimic padding, any chunk target."""
    block = draw(st.one_of(st.integers(MIN_BLOCK_SIZE, 4 * KiB), st.just(64 * KiB)))
    max_payload = block - HEADER_LEN - ENTRY_FRAME
    size = st.one_of(
        st.integers(0, min(max_payload, 2 * KiB)),
        st.sampled_from([0, max_payload, max_payload - 1]),
    )
    sizes = draw(st.lists(size, min_size=1, max_size=40))
    if draw(st.booleans()):  # fixed-size records: chunks of equal frames (the fast path)
        sizes = [sizes[0]] * len(sizes)
    first_id = draw(st.one_of(st.just(0), st.integers(0, 1 << 40)))
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    padding_like = draw(st.booleans())
    entries = [
        (first_id + i, (PADDING * (n // 4 + 1))[:n] if padding_like else rng.randbytes(n))
        for i, n in enumerate(sizes)
    ]
    chunk_target = draw(st.integers(1, 2 * block))
    return Ledger(entries, block, chunk_target)


def read_all(index: LedgerIndex, data: bytes) -> Entries:
    """Every entry the way the tiered reader reads: chunks when there is a table, else
    whole blocks checked against the index (the last one scanned when its count is unknown)."""
    if index.chunks is not None:
        return [e for c in index.chunks for e in decode_chunk(data[c.offset : c.end], c)]
    out: Entries = []
    for i, b in enumerate(index.blocks):
        if i + 1 < len(index.blocks):
            count: int | None = index.blocks[i + 1].first_entry_id - b.first_entry_id
        else:
            last = index.last_entry_id
            count = None if last is None else last - b.first_entry_id + 1
        out += decode_block(
            data[b.offset : b.offset + b.length],
            entry_count=count,
            expected_crc=b.crc32c,
            first_entry_id=b.first_entry_id,
            offset=b.offset,
        )
    return out


# --- round trips -------------------------------------------------------------------------
@given(ledgers())
def test_any_ledger_round_trips(ledger: Ledger) -> None:
    blocks, entries = ledger.blocks, ledger.entries
    assert all(len(b.data) == ledger.max_block_size for b in blocks[:-1])
    assert len(blocks[-1].data) <= ledger.max_block_size
    index = decode_index(ledger.index())
    assert index.blocks == tuple(b.ref for b in blocks)
    assert index.chunks == tuple(c for b in blocks for c in b.chunks)
    assert index.metadata is not None
    assert index.metadata.entry_count == len(entries)
    assert index.metadata.length == sum(len(p) for _, p in entries)
    assert index.metadata.topic == "t/ü"
    assert read_all(index, ledger.data) == entries
    for c in index.chunks:
        assert c.length <= ledger.chunk_target or c.entry_count == 1
    for entry_id, payload in entries[:: max(1, len(entries) // 5)]:
        chunk = index.chunk_for(entry_id)
        assert dict(decode_chunk(ledger.data[chunk.offset : chunk.end], chunk))[entry_id] == payload
    # the same blocks under a pure Pulsar index, read by us and by the reference reader
    pulsar = decode_index(ledger.index(extension=False))
    assert pulsar.chunks is None
    assert read_all(pulsar, ledger.data) == entries
    assert pulsar_read_ledger(ledger.data, ledger.index()) == entries


# --- damage ------------------------------------------------------------------------------


@given(ledgers(), positions)
def test_truncated_index_is_refused(ledger: Ledger, where: float) -> None:
    for raw in (ledger.index(), ledger.index(extension=False)):
        with pytest.raises(FormatError):
            decode_index(raw[: at_fraction(raw, where)])


# An index of one block and two chunks whose entry_count 1 -> 6 makes the v1 entries
# reach exactly to the end: it parses as a pure Pulsar index (no CRC checked), whose
# extra "entries" are our extension's bytes; the Pulsar-side checks must refuse them.
COUNT_FLIP_LOOKS_PULSAR = Ledger([(0, b"a" * 1000), (1, b"b" * 1000)], 4096, 1200)


def assert_refused_or_right(index_bytes: bytes, ledger: Ledger) -> None:
    """A damaged index is refused at decode, or its reads are refused, or it reads right:
    never wrong data."""
    try:
        index = decode_index(index_bytes)
    except FormatError:
        return
    try:
        entries = read_all(index, ledger.data)
    except (FormatError, LookupError):
        return
    assert entries == ledger.entries


@given(ledgers(), positions, masks)
@example(COUNT_FLIP_LOOKS_PULSAR, 27.5 / 208, 1 ^ 6)
def test_damaged_index_never_yields_wrong_data(ledger: Ledger, where: float, mask: int) -> None:
    """Our index: its CRC (or a structural check) refuses any flip. A pure Pulsar index has
    no CRC, so a flip may decode; then reading with it fails or gives the right entries."""
    raw = ledger.index()
    with pytest.raises(FormatError):
        decode_index(flipped(raw, at_fraction(raw, where), mask))
    raw = ledger.index(extension=False)
    assert_refused_or_right(flipped(raw, at_fraction(raw, where), mask), ledger)


@given(ledgers(), positions, masks)
def test_resealed_damaged_index_never_yields_wrong_data(
    ledger: Ledger, where: float, mask: int
) -> None:
    """Damage behind a valid CRC (a writer bug, not a bit flip) meets the structural
    checks: refused at decode, or the chunks' own CRCs refuse it, or the entries are right."""
    raw = ledger.index()
    body = flipped(raw[:-4], at_fraction(raw[:-4], where), mask)
    assert_refused_or_right(body + struct.pack(">I", crc32c.crc32c(body)), ledger)


@given(ledgers(), st.binary(max_size=200), positions)
def test_garbage_index_is_refused(ledger: Ledger, garbage: bytes, where: float) -> None:
    raw = ledger.index()
    for candidate in (garbage, raw[: at_fraction(raw, where)] + garbage):
        if candidate == raw:
            continue
        with pytest.raises(FormatError):
            decode_index(candidate)


@given(ledgers(), positions, st.one_of(masks, st.none()))
def test_damaged_chunks_are_refused(ledger: Ledger, where: float, mask: int | None) -> None:
    """A flipped byte or a short read anywhere in any chunk: a FormatError, always."""
    index = decode_index(ledger.index())
    assert index.chunks is not None
    for chunk in index.chunks:
        raw = ledger.data[chunk.offset : chunk.end]
        at = at_fraction(raw, where)
        damaged = raw[:at] if mask is None else flipped(raw, at, mask)
        with pytest.raises(FormatError):
            decode_chunk(damaged, chunk)
        window = b"xx" + damaged + b"yy"  # the same, read in place from a larger GET
        if mask is not None:
            with pytest.raises(FormatError):
                decode_chunk(window, chunk, at=2)


@given(ledgers(), positions, st.one_of(masks, st.none()))
def test_damaged_blocks_are_refused(ledger: Ledger, where: float, mask: int | None) -> None:
    """With the block CRC every flip and truncation is refused. Without it (Pulsar v1) a
    flip is refused unless it hit a payload byte or the reserved header bytes, and then
    exactly that byte differs: the structure never lies."""
    data = ledger.data
    at = at_fraction(data, where)
    damaged = data[:at] if mask is None else flipped(data, at, mask)
    index = decode_index(ledger.index())
    with pytest.raises(FormatError):
        read_all(_without_chunks(index), damaged)
    pulsar = decode_index(ledger.index(extension=False))
    try:
        entries = read_all(pulsar, damaged)
    except FormatError:
        return
    assert mask is not None, "a truncated object was read"
    block = next(b for b in pulsar.blocks if b.offset <= at < b.offset + b.length)
    reserved = block.offset + 28 <= at < block.offset + HEADER_LEN
    assert at in ledger.payload_bytes or reserved, f"damage at {at} went unnoticed"
    changed = [(e, p) for e, p in zip(ledger.entries, entries, strict=True) if e != p]
    assert len(changed) == (0 if reserved else 1)


def _without_chunks(index: LedgerIndex) -> LedgerIndex:
    """Our index read block by block (block CRCs, no chunk table)."""
    return LedgerIndex(index.data_object_len, index.header_len, index.metadata, index.blocks, None)


@given(st.binary(max_size=600), st.one_of(st.none(), st.integers(0, 50)))
def test_garbage_blocks_are_refused(garbage: bytes, count: int | None) -> None:
    with pytest.raises(FormatError):
        decode_block(garbage, entry_count=count)


# --- the batch path ------------------------------------------------------------------
def at_offsets(data: bytes, starts: array[int], lengths: array[int]) -> list[bytes]:
    return [data[s : s + n] for s, n in zip(starts, lengths, strict=True)]


@given(ledgers())
def test_the_batch_path_points_at_every_payload(ledger: Ledger) -> None:
    """chunk_offsets over the whole object (each chunk in place, one pair of arrays for all
    of them, as a sequential read's range) and block_offsets of each block find exactly
    the encoded payloads: the same as parse_chunk, decode_block and the original entries."""
    data, entries = ledger.data, ledger.entries
    payloads = [p for _, p in entries]
    index = decode_index(ledger.index())
    assert index.chunks is not None
    into = (array("q"), array("q"))
    for chunk in index.chunks:
        starts, lengths = chunk_offsets(data, chunk, at=chunk.offset, into=into)
        assert starts is into[0] and lengths is into[1]  # appended to, not replaced
        alone = chunk_offsets(data[chunk.offset : chunk.end], chunk)
        assert [a.typecode for a in alone] == ["q", "q"]  # int64, as EntryBatch documents
        window = data[chunk.offset : chunk.end]
        assert at_offsets(window, *alone) == [p for _, p in parse_chunk(window, chunk)]
        # read in place from a view, parse_chunk still hands out bytes it owns
        assert all(type(p) is bytes for _, p in parse_chunk(memoryview(window), chunk))
    assert at_offsets(data, *into) == payloads
    found: list[bytes] = []
    for i, b in enumerate(index.blocks):
        raw = data[b.offset : b.offset + b.length]
        count = index.block_entry_count(b) if i % 2 else None  # counted or scanned
        first, starts, lengths = block_offsets(raw, entry_count=count, offset=b.offset)
        assert first == b.first_entry_id
        found += at_offsets(raw, starts, lengths)
    assert found == payloads


@given(ledgers(), positions, st.one_of(masks, st.none()))
def test_the_batch_path_never_points_at_wrong_bytes(
    ledger: Ledger, where: float, mask: int | None
) -> None:
    """Unverified chunk bytes (no CRC checked) with a flipped byte or cut short: a
    FormatError, or offsets of the very frames the chunk holds, so at most the payload that
    holds the flipped byte differs (a flip in the header's reserved bytes or block_len,
    which a chunk alone cannot check, changes none)."""
    index = decode_index(ledger.index())
    assert index.chunks is not None
    for chunk in index.chunks:
        raw = ledger.data[chunk.offset : chunk.end]
        at = at_fraction(raw, where)
        if mask is None:
            with pytest.raises(FormatError, match=rf"^truncated chunk: {at} bytes") as raised:
                chunk_offsets(raw[:at], chunk)
            assert raised.value.offset == chunk.offset + at  # where the bytes ran out
            continue
        damaged = flipped(raw, at, mask)
        try:
            starts, lengths = chunk_offsets(b"yy" + damaged, chunk, at=2)
        except FormatError:
            continue
        wanted = [p for i, p in ledger.entries if chunk.first_entry_id <= i <= chunk.last_entry_id]
        got = at_offsets(b"yy" + damaged, starts, lengths)
        hit = [
            i for i, (s, n) in enumerate(zip(starts, lengths, strict=True)) if s <= at + 2 < s + n
        ]
        assert [g for i, g in enumerate(got) if i not in hit] == [
            w for i, w in enumerate(wanted) if i not in hit
        ]
        assert len(got) == len(wanted) and len(hit) <= 1


chunk_refs = st.builds(
    ChunkRef,
    first_entry_id=st.integers(0, 3),
    offset=st.integers(0, 1 << 40),
    length=st.integers(0, 400),
    entry_count=st.integers(0, 20),
    crc32c=st.just(0),
    starts_block=st.booleans(),
)


@given(st.binary(max_size=500), chunk_refs, st.integers(0, 8))
def test_the_batch_path_refuses_garbage(garbage: bytes, chunk: ChunkRef, at: int) -> None:
    """Any bytes under any chunk record: a FormatError, or offsets that an independent
    reading of the frames (length and id before each payload) confirms."""
    try:
        starts, lengths = chunk_offsets(garbage, chunk, at=at)
    except FormatError as err:
        assert err.offset is not None
        # nothing is ever placed before the chunk: origin = chunk.offset - at
        assert err.offset >= chunk.offset - at
        if str(err).startswith("truncated chunk"):
            assert err.offset == chunk.offset + max(0, len(garbage) - at)
        return
    assert len(starts) == chunk.entry_count
    pos = at + (HEADER_LEN if chunk.starts_block else 0)
    for i, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        assert start == pos + ENTRY_FRAME
        assert struct.unpack_from(">iq", garbage, pos) == (length, chunk.first_entry_id + i)
        pos = start + length
    assert pos == at + chunk.length <= len(garbage)


# --- the encoder's limits ----------------------------------------------------------------
@given(
    block=st.integers(MIN_BLOCK_SIZE, 4 * KiB),
    before=st.integers(0, 5),
    excess=st.integers(1, 100),
)
@example(block=MIN_BLOCK_SIZE, before=0, excess=1)
def test_an_entry_too_large_raises_promptly(block: int, before: int, excess: int) -> None:
    """Never an endless run of empty blocks: at most the blocks before the big entry."""
    small = [(i, b"x") for i in range(before)]
    big = (before, bytes(block - HEADER_LEN - ENTRY_FRAME + excess))
    blocks = encode_blocks([*small, big, (before + 1, b"y")], max_block_size=block)
    with pytest.raises(EntryTooLargeError, match=f"entry {before} of"):
        list(itertools.islice(blocks, before + 2))
