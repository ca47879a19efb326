"""A damaged v2 index or block fails loudly: each FormatError says what is wrong and where
(its offset in the index or the data object)."""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass

import crc32c
import pytest

from fixtures.segments import Segment, stream
from offloader.exceptions import FormatError
from offloader.format import (
    decode_segment_block,
    decode_segment_index,
    encode_blocks,
    verify_block,
)

SEGMENT = Segment(stream(21, (3, 4, 9), count=30, max_size=300), 600, 1, chunk_target=300)
RAW = SEGMENT.index()


@dataclass(frozen=True)
class Layout:
    """Where the parts of RAW sit: ledger records (offset, ledger, count, metadata_len), then
    our extension record and its tables."""

    records: list[tuple[int, int, int, int]]
    ext: int

    @property
    def blocks_at(self) -> int:
        return self.ext + 28

    @property
    def block_count(self) -> int:
        return sum(r[2] for r in self.records)

    @property
    def chunks_at(self) -> int:  # the chunk_count field
        return self.blocks_at + 32 * self.block_count


def layout(raw: bytes) -> Layout:
    pos, records = 24, []
    while True:
        ledger_id, count, meta_len = struct.unpack_from(">qii", raw, pos)
        if ledger_id == -1:
            return Layout(records, pos)
        records.append((pos, ledger_id, count, meta_len))
        pos += 16 + meta_len + 20 * count


L = layout(RAW)


def reseal(body: bytes) -> bytes:
    """An edited index (CRC excluded) with a valid CRC, so a later check must catch it."""
    return body + struct.pack(">I", crc32c.crc32c(body))


def patched(fmt: str, at: int, *values: int, raw: bytes = RAW) -> bytes:
    body = bytearray(raw[:-4])
    struct.pack_into(fmt, body, at, *values)
    return reseal(bytes(body))


def with_lengths(body: bytes, ext_len_delta: int) -> bytes:
    """Fix index_len and the extension record's length after bytes were cut or added."""
    out = bytearray(body)
    struct.pack_into(">i", out, 4, len(out) + 4)
    (ext_len,) = struct.unpack_from(">i", out, L.ext + 12)
    struct.pack_into(">i", out, L.ext + 12, ext_len + ext_len_delta)
    return reseal(bytes(out))


def refused(raw: bytes, message: str) -> FormatError:
    with pytest.raises(FormatError, match=message) as err:
        decode_segment_index(raw)
    return err.value


def test_the_fixture_is_sane() -> None:
    assert [r[1] for r in L.records] == [3, 4, 9] and L.block_count > 3
    assert decode_segment_index(RAW).ledger_ids == (3, 4, 9)


# --- head --------------------------------------------------------------------------------
def test_bad_magic() -> None:
    err = refused(b"\x3c" + RAW[1:], r"^bad segment index magic 0x3C1FB0BC, expected 0x3D1FB0BC$")
    assert err.offset == 0


def test_truncated_head() -> None:
    err = refused(RAW[:23], r"^truncated segment index: 23 bytes, the head alone is 24$")
    assert err.offset == 23


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            RAW[:-1],
            rf"^truncated segment index: index_len says {len(RAW)} bytes, got {len(RAW) - 1}$",
        ),
        (RAW + b"x", rf"^index_len mismatch: index_len says {len(RAW)} bytes, got {len(RAW) + 1}$"),
    ],
)
def test_index_len(raw: bytes, message: str) -> None:
    assert refused(raw, message).offset == 4


def test_data_header_len() -> None:
    err = refused(patched(">q", 16, 129), r"^unsupported data_header_len 129, expected 128$")
    assert err.offset == 16


def test_data_object_len() -> None:
    n = len(SEGMENT.data)
    err = refused(patched(">q", 8, n + 1), rf"^blocks cover {n} bytes, data_object_len {n + 1}$")
    assert err.offset == 8


# --- ledger records ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (">i", 1 << 20, r"ledger 3, 1048576 index entries"),
        (">i", 0, r"ledger 3, 0 index entries"),
        (">q", -2, r"ledger -2, \d+ index entries"),
    ],
)
def test_bad_ledger_record(field: str, value: int, message: str) -> None:
    at = L.records[0][0] + (8 if field == ">i" else 0)
    err = refused(patched(field, at, value), rf"^bad ledger record at index byte 24: {message}")
    assert err.offset == 24


def test_negative_metadata_len() -> None:
    err = refused(
        patched(">i", 24 + 12, -1), r"^bad ledger record at index byte 24: .* -1 metadata"
    )
    assert err.offset == 24


def test_ledger_ids_must_rise() -> None:
    second = L.records[1][0]
    err = refused(patched(">q", second, 3), r"^ledger record 3 after ledger 3: ids must rise$")
    assert err.offset == second


def test_a_pulsar_only_index_has_no_extension() -> None:
    body = bytearray(RAW[: L.ext])
    struct.pack_into(">i", body, 4, len(body))
    err = refused(bytes(body), r"^segment index has no extension record \(ledger -1\)")
    assert err.offset == len(body)


def test_no_ledger_records() -> None:
    ext = RAW[L.ext :]
    body = bytearray(RAW[:24] + ext[:-4])
    struct.pack_into(">i", body, 4, len(body) + 4)
    err = refused(reseal(bytes(body)), r"^segment index has no ledger records$")
    assert err.offset == 24


@pytest.mark.parametrize(("at", "value"), [(8, 1), (12, 5), (12, 1 << 20)])
def test_the_extension_record_must_be_last_and_empty(at: int, value: int) -> None:
    err = refused(
        patched(">i", L.ext + at, value), rf"^bad extension record at index byte {L.ext}: "
    )
    assert err.offset == L.ext


def test_an_extension_record_too_short_for_its_head() -> None:
    body = bytearray(RAW[: L.ext] + struct.pack(">qii", -1, 0, 4))
    struct.pack_into(">i", body, 4, len(body) + 4)
    err = refused(
        reseal(bytes(body)),
        rf"^bad extension record at index byte {L.ext}: 0 index entries, 4 bytes",
    )
    assert err.offset == L.ext


def test_bad_crc() -> None:
    raw = bytearray(RAW)
    raw[L.records[1][0] + 20] ^= 0x10  # inside ledger 4's metadata
    err = refused(bytes(raw), r"^bad index crc: stored 0x[0-9A-F]{8}, computed 0x[0-9A-F]{8}$")
    assert err.offset == len(RAW) - 4


# --- our extension -----------------------------------------------------------------------
def test_bad_extension_magic() -> None:
    err = refused(
        patched(">I", L.ext + 16, 0x0FF1DE5C),
        r"^bad segment extension magic 0x0FF1DE5C, expected 0x5E6E0E5C$",
    )
    assert err.offset == L.ext + 16


def test_unknown_extension_version() -> None:
    err = refused(
        patched(">i", L.ext + 20, 2), r"^unknown segment extension version 2, expected 1$"
    )
    assert err.offset == L.ext + 20


def test_block_count_mismatch() -> None:
    n = L.block_count
    err = refused(
        patched(">i", L.ext + 24, n + 1),
        rf"^extension lists {n + 1} blocks, the ledger records {n}$",
    )
    assert err.offset == L.ext + 24


@pytest.mark.parametrize(("field", "at"), [(">q", 0), (">i", 8), (">q", 12)])
def test_block_record_must_repeat_the_index_entry(field: str, at: int) -> None:
    record = L.blocks_at + 32 * 2
    (value,) = struct.unpack_from(field, RAW, record + at)
    err = refused(
        patched(field, record + at, value + 1), r"^extension block .* != ledger record entry"
    )
    assert err.offset == record


def test_truncated_block_table() -> None:
    body = RAW[: L.blocks_at + 32]  # one block record left, no chunk table
    err = refused(
        with_lengths(body, len(body) + 4 - len(RAW)),
        rf"^truncated segment extension: {L.block_count} block records need",
    )
    assert err.offset == L.ext + 24


@pytest.mark.parametrize("delta", [1, -1])
def test_chunk_count_mismatch(delta: int) -> None:
    (count,) = struct.unpack_from(">i", RAW, L.chunks_at)
    err = refused(
        patched(">i", L.chunks_at, count + delta),
        rf"^segment extension size mismatch: {count + delta} chunks need",
    )
    assert err.offset == L.chunks_at


def test_no_chunks() -> None:
    body = RAW[: L.chunks_at] + struct.pack(">i", 0)
    (count,) = struct.unpack_from(">i", RAW, L.chunks_at)
    err = refused(with_lengths(body, -28 * count), r"^segment extension size mismatch: 0 chunks")
    assert err.offset == L.chunks_at


def test_blocks_must_tile_the_data_object() -> None:
    record = L.blocks_at + 32 * 1
    (length,) = struct.unpack_from(">q", RAW, record + 20)
    err = refused(
        patched(">q", record + 20, length - 1), r"^block part 3 at \d+\+\d+, expected offset"
    )
    assert err.offset == L.ext


def _set_part(raw: bytes, block: int, part: int) -> bytes:
    """Set a block's part id in both its index entry and its extension record."""
    entry_at = next(
        r[0] + 16 + r[3] + 20 * (block - sum(x[2] for x in L.records[:i]))
        for i, r in enumerate(L.records)
        if block < sum(x[2] for x in L.records[: i + 1])
    )
    body = bytearray(raw[:-4])
    struct.pack_into(">i", body, entry_at + 8, part)
    struct.pack_into(">i", body, L.blocks_at + 32 * block + 8, part)
    return reseal(bytes(body))


def test_parts_start_at_one() -> None:
    err = refused(_set_part(RAW, 0, 2), r"^block part 2 at 0\+\d+, expected offset 0 in part 1$")
    assert err.offset == L.ext


def test_parts_have_no_gaps() -> None:
    err = refused(
        _set_part(RAW, 2, 5), r"^block part 5 at \d+\+\d+, expected offset \d+ in part 2 or 3"
    )
    assert err.offset == L.ext


def test_a_part_may_hold_several_blocks() -> None:
    raw = RAW
    for block in range(1, L.block_count):
        raw = _set_part(raw, block, 1)
    assert {b.part_id for v in decode_segment_index(raw).ledgers for b in v.blocks} == {1}


def test_chunks_must_tile_each_ledger() -> None:
    chunk = L.chunks_at + 4 + 28 * 1
    (offset,) = struct.unpack_from(">q", RAW, chunk + 8)
    err = refused(
        patched(">q", chunk + 8, offset + 1), r"^ledger 3: chunk at offset \d+ does not follow"
    )
    assert err.offset == 24


def test_a_chunk_beyond_the_last_ledger() -> None:
    (count,) = struct.unpack_from(">i", RAW, L.chunks_at)
    extra = struct.pack(">qqiiI", 10**6, len(SEGMENT.data) + 10, 20, 1, 0)
    body = bytearray(RAW[:-4] + extra)
    struct.pack_into(">i", body, L.chunks_at, count + 1)
    err = refused(with_lengths(bytes(body), 28), r"lies beyond the last ledger's blocks$")
    assert err.offset == L.chunks_at + 4 + 28 * count


@pytest.mark.parametrize(
    ("at", "fmt", "value", "message"),
    [
        (2, ">q", 77, r"metadata says ledger 77, \d+ entries"),
        (10, ">q", 1, r"metadata says ledger 4, 1 entries"),
        (18, ">q", 5, r"metadata says ledger 4, \d+ entries ending at 5$"),
    ],
)
def test_metadata_must_match_the_chunks(at: int, fmt: str, value: int, message: str) -> None:
    meta = L.records[1][0] + 16
    err = refused(
        patched(fmt, meta + at, value), rf"^ledger 4: chunks hold entries 0\.\.\d+, {message}"
    )
    assert err.offset == meta


def test_bad_metadata_record() -> None:
    meta = L.records[2][0] + 16
    err = refused(
        patched(">h", meta, 7), r"^ledger 9: bad index metadata: unknown metadata version 7"
    )
    assert err.offset == L.records[2][0]


def test_one_topic_per_segment() -> None:
    meta = L.records[2][0] + 16
    topic_at = meta + 52
    err = refused(
        patched(">B", topic_at, ord("x")), r"^ledger 9: topic 'x/ü', the segment's is 't/ü'$"
    )
    assert err.offset == meta


# --- blocks ------------------------------------------------------------------------------
def test_a_v1_block_is_not_a_v2_block() -> None:
    v1 = next(iter(encode_blocks([(0, b"abc")], max_block_size=500))).data
    with pytest.raises(
        FormatError, match=r"bad block magic 0xFBDBABCB .*expected 0x26A66D32"
    ) as err:
        decode_segment_block(bytes(v1), ledger_id=0, entry_count=1, offset=1000)
    assert err.value.offset == 1000


def test_verify_block_checks_length_and_crc_of_a_moved_block() -> None:
    """What a merge checks before it writes a downloaded block again (rewrite/merge.py)."""
    index = decode_segment_index(RAW)
    data = SEGMENT.data
    for block in (b for view in index.ledgers for b in view.blocks):
        raw = data[block.offset : block.offset + block.length]
        verify_block(raw, block)
        with pytest.raises(FormatError, match="truncated block") as short:
            verify_block(raw[:-1], block)
        assert short.value.offset == block.offset + block.length - 1
        for at in (0, len(raw) // 2, len(raw) - 1):
            flipped = bytearray(raw)
            flipped[at] ^= 0x10
            with pytest.raises(FormatError, match="CRC mismatch in block") as bad:
                verify_block(bytes(flipped), block)
            assert bad.value.offset == block.offset
    with pytest.raises(ValueError, match="no CRC"):
        verify_block(raw, dataclasses.replace(block, crc32c=None))
