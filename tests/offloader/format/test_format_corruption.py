"""Damaged bytes must fail loudly: each FormatError says what is wrong and where."""

from __future__ import annotations

import random
import struct
from dataclasses import astuple, replace

import crc32c
import pytest

from fixtures.encoding import encode_ledger
from offloader.exceptions import FormatError
from offloader.format import (
    ENTRY_FRAME,
    HEADER_LEN,
    ChunkRef,
    LedgerIndex,
    LedgerMetadata,
    block_offsets,
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
    ledger = encode_ledger(entries, 4096, 1024, ledger_id=3, created_ms=1, sealed_ms=2)
    raw_index = ledger.index()
    return ledger.data, raw_index, decode_index(raw_index)


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


# --- every index refusal: the exact message and the index byte it names -----------------
def refusal(raw: bytes) -> FormatError:
    with pytest.raises(FormatError) as raised:
        decode_index(raw)
    return raised.value


def edit(raw: bytes, fmt: str, at: int, value: int, *, reseal: bool = True) -> bytes:
    """``raw`` with one field rewritten (and the index CRC recomputed unless told not to)."""
    out = bytearray(raw)
    struct.pack_into(fmt, out, at, value)
    return with_crc(bytes(out)) if reseal else bytes(out)


def ext_at(raw: bytes) -> int:
    """Where our extension starts: after the 32-byte head, the metadata and the v1 entries."""
    count, meta_len = struct.unpack_from(">ii", raw, 24)
    return 32 + meta_len + 20 * count


def with_tail(raw: bytes, tail: bytes) -> bytes:
    """A pure v1 index followed by ``tail``, index_len updated to match."""
    return edit(raw + tail, ">i", 4, len(raw) + len(tail), reseal=False)


def reencoded(index: LedgerIndex, **change: object) -> bytes:
    """The index encoded again with some of its blocks, chunks or metadata replaced: the
    encoder writes a valid CRC, so only the structural checks can refuse it."""
    parts: dict[str, object] = {
        "metadata": index.metadata,
        "blocks": index.blocks,
        "chunks": index.chunks,
    } | change
    return encode_index(parts["metadata"], parts["blocks"], parts["chunks"])  # type: ignore[arg-type]


def test_index_head_refusals_name_the_field() -> None:
    _, raw, _ = build()
    size = len(raw)
    cases = [
        (raw[:31], "truncated index: 31 bytes, the v1 head alone is 32", 31),
        (raw[:32], f"truncated index: index_len says {size} bytes, got 32", 32),
        (flip(raw, 3), "bad index magic 0xDE47DE46, expected 0xDE47DE47", 0),
        (raw[:-1], f"truncated index: index_len says {size} bytes, got {size - 1}", size - 1),
        (raw + b"\0", f"index_len mismatch: index_len says {size} bytes, got {size + 1}", size),
        (
            edit(raw, ">i", 4, 0, reseal=False),
            f"index_len mismatch: index_len says 0 bytes, got {size}",
            0,
        ),
        (
            edit(raw, ">i", 4, -1, reseal=False),
            f"index_len mismatch: index_len says -1 bytes, got {size}",
            4,
        ),
        (
            edit(raw, ">q", 16, 129, reseal=False),
            "unsupported data_header_len 129, expected 128",
            16,
        ),
    ]
    for damaged, message, offset in cases:
        error = refusal(damaged)
        assert (str(error), error.offset) == (message, offset)


@pytest.mark.parametrize(("count", "meta_len"), [(0, 53), (100_000, 53), (12, -1), (12, 10_000)])
def test_index_entry_count_and_metadata_length_must_fit(count: int, meta_len: int) -> None:
    _, raw, index = build()
    assert (len(index.blocks), struct.unpack_from(">i", raw, 28)[0]) == (12, 53)
    edited = edit(edit(raw, ">i", 24, count, reseal=False), ">i", 28, meta_len, reseal=False)
    need = 32 + meta_len + 20 * count
    error = refusal(edited)
    assert str(error) == (
        f"truncated index: {count} entries and {meta_len} metadata bytes need {need} bytes, "
        f"index has {len(raw)}"
    )
    assert error.offset == 24


def test_index_of_one_block_and_an_empty_topic_round_trips() -> None:
    """The smallest legal index: one block, our metadata record with no topic bytes."""
    blocks = list(encode_blocks([(0, b"x")], max_block_size=4096))
    refs = [b.ref for b in blocks]
    chunks = [c for b in blocks for c in b.chunks]
    meta = metadata_for(refs, chunks, topic="", ledger_id=1, created_ms=0, sealed_ms=0)
    for with_chunks in (chunks, None):
        raw = encode_index(meta, refs, with_chunks)
        assert struct.unpack_from(">ii", raw, 24) == (1, 52)
        index = decode_index(raw)
        assert index.metadata == meta
        assert index.blocks[0].length == HEADER_LEN + 13


def test_topic_names_up_to_int16_bytes_are_encoded() -> None:
    _, _, index = build()
    assert index.metadata is not None and index.chunks is not None
    longest = LedgerMetadata("é" * (0x7FFF // 2) + "t", *astuple(index.metadata)[1:])
    assert len(longest.topic.encode()) == 0x7FFF
    assert decode_index(reencoded(index, metadata=longest)).metadata == longest
    too_long = LedgerMetadata("t" * 0x8000, *astuple(index.metadata)[1:])
    with pytest.raises(ValueError, match=r"^topic name of 32768 utf-8 bytes exceeds int16$"):
        encode_index(too_long, index.blocks, index.chunks)


def test_encode_index_refuses_what_it_cannot_describe() -> None:
    _, _, index = build()
    with pytest.raises(ValueError, match=r"^an index needs at least one block$"):
        reencoded(index, blocks=())
    gapped = (index.blocks[0], replace(index.blocks[1], offset=index.blocks[1].offset + 1))
    with pytest.raises(ValueError, match=r"^block part 2 at offset 4097, expected 4096$"):
        reencoded(index, blocks=gapped)
    no_crc = (replace(index.blocks[0], crc32c=None), *index.blocks[1:])
    with pytest.raises(ValueError, match=r"^the extension needs every block's crc32c$"):
        reencoded(index, blocks=no_crc)
    assert decode_index(reencoded(index, blocks=no_crc, chunks=None)).blocks[0].crc32c is None


def with_metadata(raw: bytes, meta: bytes) -> bytes:
    """``raw`` with its metadata field replaced by ``meta`` (meta_len, index_len and, for
    our index, the CRC updated)."""
    meta_len = struct.unpack_from(">i", raw, 28)[0]
    out = raw[:32] + meta + raw[32 + meta_len :]
    out = edit(edit(out, ">i", 28, len(meta), reseal=False), ">i", 4, len(out), reseal=False)
    return with_crc(out) if ext_at(out) < len(out) else out


def test_metadata_we_cannot_read_is_foreign_in_a_pulsar_index_and_refused_in_ours() -> None:
    _, raw, index = build()
    assert index.metadata is not None and index.chunks is not None
    pulsar = reencoded(index, chunks=None)
    ours = raw[32 : 32 + 53]
    bad = {
        "metadata of 51 bytes is shorter than 52": ours[:51],
        "unknown metadata version 2, expected 1": b"\x00\x02" + ours[2:],
        "metadata length 54 does not match topic_len 1 (+ 52)": ours + b"u",
        "metadata length 53 does not match topic_len 2 (+ 52)": ours[:50] + b"\x00\x02t",
        "'utf-8' codec can't decode byte 0xff": ours[:-1] + b"\xff",
    }
    for reason, meta in bad.items():
        assert decode_index(with_metadata(pulsar, meta)).metadata is None
        error = refusal(with_metadata(raw, meta))
        assert str(error).startswith(f"bad index metadata: {reason}")
        assert isinstance(error.__cause__, FormatError | UnicodeDecodeError)
    assert decode_index(with_metadata(pulsar, ours)).metadata == index.metadata


def test_pulsar_index_entry_errors_name_the_entry() -> None:
    with pytest.raises(FormatError) as raised:
        decode_index(_pulsar_index([(-1, 0), (5, 4096)], 8192))
    assert str(raised.value) == "index entry 0: block -1@0, expected an id >= 0 at 0"
    assert raised.value.offset == 32
    with pytest.raises(FormatError) as raised:
        decode_index(_pulsar_index([(0, 0), (5, 4096), (4, 8192)], 9000))
    assert str(raised.value) == "index entry 2: first_entry_id 4 after 5"
    assert raised.value.offset == 32 + 2 * 20


def test_pulsar_blocks_must_hold_at_least_a_header() -> None:
    index = decode_index(_pulsar_index([(0, 0), (5, 4096)], 4096 + HEADER_LEN))
    assert [(b.part_id, b.offset, b.length, b.first_entry_id) for b in index.blocks] == [
        (1, 0, 4096, 0),
        (2, 4096, HEADER_LEN, 5),
    ]
    with pytest.raises(FormatError, match=r"^index entry for part 2: block at 4096\.\.4223 too"):
        decode_index(_pulsar_index([(0, 0), (5, 4096)], 4096 + HEADER_LEN - 1))


def test_extension_head_refusals() -> None:
    _, raw, index = build()
    pulsar = reencoded(index, chunks=None)
    error = refusal(with_tail(pulsar, bytes(15)))
    assert str(error) == "truncated index extension: 15 bytes after the v1 entries"
    error = refusal(with_tail(pulsar, bytes(16)))
    assert str(error) == (
        "bad index extension magic 0x00000000, expected 0x0FF1DE5C "
        "(16 unexpected bytes after the v1 entries)"
    )
    assert error.offset == len(pulsar)
    at = ext_at(raw)
    error = refusal(edit(raw, ">i", at + 4, 2))
    assert (str(error), error.offset) == ("unknown index extension version 2, expected 1", at + 4)
    stored = struct.unpack_from(">I", raw, len(raw) - 4)[0]
    damaged = flip(raw, at + 20)
    computed = crc32c.crc32c(damaged[:-4])
    error = refusal(damaged)
    assert str(error) == f"bad index crc: stored 0x{stored:08X}, computed 0x{computed:08X}"
    assert error.offset == len(raw) - 4
    error = refusal(edit(raw, ">i", at + 8, 11))
    assert str(error) == "extension lists 11 blocks, v1 index 12"


def test_extension_tables_must_match_the_v1_entries_and_fill_the_index() -> None:
    _, raw, index = build()
    assert index.chunks is not None
    blocks_at = ext_at(raw) + 12
    error = refusal(edit(raw, ">i", blocks_at + 24, 9))  # the second block's part id
    assert str(error) == "extension block 9@4096 != v1 entry 2@4096"
    error = refusal(edit(raw, ">q", blocks_at + 28, 4097))  # the second block's offset
    assert str(error) == "extension block 2@4097 != v1 entry 2@4096"
    count_at = blocks_at + 24 * len(index.blocks)
    size = len(raw)
    for count in (-1, len(index.chunks) - 1, len(index.chunks) + 1):
        error = refusal(edit(raw, ">i", count_at, count))
        assert str(error) == (
            f"index extension size mismatch: {count} chunks need "
            f"{count_at + 4 + 28 * count + 4} bytes, index has {size}"
        )
    # cut inside the block table: the CRC is sealed over what is left
    short = with_crc(raw[: count_at - 1] + bytes(4))
    short = edit(short, ">i", 4, len(short))
    error = refusal(short)
    assert str(error) == (
        f"truncated index block table: needs {count_at + 4} bytes, index has {len(short)}"
    )
    # cut right after the chunk count: the block table is whole, the chunk table is not
    edge = with_crc(raw[: count_at + 8])
    edge = edit(edge, ">i", 4, len(edge))
    assert str(refusal(edge)).startswith("index extension size mismatch: ")


def test_extension_must_tile_the_data_object() -> None:
    data, raw, index = build()
    assert index.chunks is not None
    error = refusal(edit(raw, ">q", 8, len(data) + 1))
    assert str(error) == f"blocks cover {len(data)} bytes, data_object_len {len(data) + 1}"
    short = (replace(index.blocks[0], length=HEADER_LEN - 1),)
    error = refusal(reencoded(index, blocks=short, chunks=index.chunks[:1]))
    assert str(error) == f"block part 1 at 0+{HEADER_LEN - 1}, expected 0"
    # a block of just a header passes the tiling check: its chunk is what refuses it
    header_only = (replace(index.blocks[0], length=HEADER_LEN),)
    error = refusal(reencoded(index, blocks=header_only, chunks=index.chunks[:1]))
    assert str(error) == f"chunk at offset 0+{index.chunks[0].length} overruns its block"
    # v1 entry and extension agree on a shifted second block: the tiling check refuses it
    blocks_at = ext_at(raw) + 12
    moved = edit(edit(raw, ">q", 85 + 20 + 12, 4100, reseal=False), ">q", blocks_at + 28, 4100)
    error = refusal(moved)
    assert str(error) == "block part 2 at 4100+4096, expected 4096"
    error = refusal(reencoded(index, chunks=()))
    assert str(error) == "index extension has no chunks"
    assert index.metadata is not None
    more = replace(index.metadata, entry_count=201)
    error = refusal(reencoded(index, metadata=more))
    assert str(error) == "chunks hold entries 0..199, metadata says 201 entries ending at 199"
    later = replace(index.metadata, last_entry_id=200)
    error = refusal(reencoded(index, metadata=later))
    assert str(error) == "chunks hold entries 0..199, metadata says 200 entries ending at 200"


def test_chunk_table_refusals_name_the_chunk() -> None:
    _, _, index = build()
    chunks = list(index.chunks or ())
    second = next(i for i, c in enumerate(chunks) if c.offset == index.blocks[1].offset)
    last_of_first = chunks[second - 1]
    overrun = 4096 - last_of_first.offset + 1

    def swapped(i: int, **change: int) -> list[ChunkRef]:
        return [*chunks[:i], replace(chunks[i], **change), *chunks[i + 1 :]]

    cases = {
        # a block's first chunk that does not start with the block's first entry
        "chunk at offset 4096 does not start block 2": swapped(
            second, first_entry_id=chunks[second].first_entry_id + 1
        ),
        f"chunk at offset {chunks[2].offset} does not follow the one ending {chunks[0].end}": [
            chunks[0],
            *chunks[2:],
        ],
        f"chunk at offset {last_of_first.offset}+{overrun} overruns its block": swapped(
            second - 1, length=overrun
        ),
        f"chunk at offset {chunks[1].offset} breaks the entry sequence at 3": swapped(
            1, first_entry_id=4
        ),
        "chunks cover 11 of 12 blocks": [c for c in chunks if c.offset < index.blocks[-1].offset],
        # a table that does not begin at the first block: nothing ended before it
        f"chunk at offset {chunks[1].offset} does not follow the one ending -1": chunks[1:],
        # a forged first chunk before the data object: it ends inside no block at all
        "chunk at offset -1+2 overruns its block": [
            replace(chunks[0], offset=-1, length=2),
            *chunks[1:],
        ],
    }
    for message, table in cases.items():
        assert str(refusal(reencoded(index, chunks=table))) == message
    # entry counts and lengths that cannot be a chunk, even where ids would still run on
    for table in (
        [chunks[0], replace(chunks[1], entry_count=0), *chunks[1:]],
        [chunks[0], replace(chunks[1], length=ENTRY_FRAME - 1), *chunks[2:]],
    ):
        message = f"chunk at offset {chunks[1].offset} breaks the entry sequence at 3"
        assert str(refusal(reencoded(index, chunks=table))) == message


# --- every data refusal: the exact message and the data-object offset it names ----------
def chunk_refusal(data: bytes | memoryview, chunk: ChunkRef, **where: object) -> FormatError:
    with pytest.raises(FormatError) as raised:
        decode_chunk(data, chunk, **where)  # type: ignore[arg-type]
    return raised.value


def forged(raw: bytes, chunk: ChunkRef) -> ChunkRef:
    """``chunk`` with the CRC of ``raw``: damage that only the parser can catch."""
    return replace(chunk, length=len(raw), crc32c=crc32c.crc32c(raw))


def test_chunk_refusals_name_absolute_offsets_sliced_and_in_place() -> None:
    data, _, index = build()
    assert index.chunks is not None
    first = index.chunks[0]  # starts block 1 at offset 0
    block2 = index.blocks[1]
    head = next(c for c in index.chunks if c.offset == block2.offset)  # starts block 2
    inner = index.chunks[index.chunks.index(head) + 1]  # frames only
    where = f"in chunk at offset {head.offset} of the data object"
    cases: list[tuple[ChunkRef, bytes, str, int]] = []
    raw = bytearray(data[head.offset : head.end])
    struct.pack_into(">q", raw, 20, head.first_entry_id + 1)
    cases.append(
        (
            head,
            bytes(raw),
            f"block header first_entry_id {head.first_entry_id + 1} {where}, chunk says "
            f"{head.first_entry_id}",
            head.offset + 20,
        )
    )
    raw = bytearray(data[head.offset : head.end])
    struct.pack_into(">I", raw, 0, 0xFBDBABCA)
    cases.append(
        (head, bytes(raw), f"bad block magic 0xFBDBABCA {where}, expected 0xFBDBABCB", head.offset)
    )
    raw = bytearray(data[head.offset : head.end])
    struct.pack_into(">q", raw, 4, 127)
    cases.append(
        (head, bytes(raw), f"bad block header_len 127 {where}, expected 128", head.offset + 4)
    )
    raw = bytearray(data[head.offset : head.end])
    struct.pack_into(">q", raw, HEADER_LEN + 4, 999)
    cases.append(
        (
            head,
            bytes(raw),
            f"entry id 999 {where}, expected {head.first_entry_id}",
            head.offset + HEADER_LEN,
        )
    )
    cases.append(  # cut right after the block header
        (
            head,
            data[head.offset : head.offset + HEADER_LEN],
            f"truncated entry frame {where} at offset {head.offset + HEADER_LEN} "
            f"(entry {head.first_entry_id})",
            head.offset + HEADER_LEN,
        )
    )
    in_inner = f"in chunk at offset {inner.offset} of the data object"
    raw = bytearray(data[inner.offset : inner.end])
    struct.pack_into(">i", raw, 0, inner.length)  # the first frame claims the whole chunk
    first_id = inner.first_entry_id
    cases.append(
        (
            inner,
            bytes(raw),
            f"entry {first_id} of {inner.length} bytes overruns {in_inner} at offset "
            f"{inner.offset + ENTRY_FRAME}",
            inner.offset,
        )
    )
    struct.pack_into(">i", raw, 0, -1)
    cases.append(
        (
            inner,
            bytes(raw),
            f"entry {first_id} of -1 bytes overruns {in_inner} at offset "
            f"{inner.offset + ENTRY_FRAME}",
            inner.offset,
        )
    )
    raw = data[inner.offset : inner.end] + b"\0\0\0"
    cases.append(
        (
            inner,
            raw,
            f"3 trailing bytes after {inner.entry_count} entries {in_inner}",
            inner.end,
        )
    )
    frames = data[inner.offset : inner.end]
    short = replace(inner, entry_count=inner.entry_count + 1)
    cases.append(
        (
            short,
            frames,
            f"truncated entry frame {in_inner} at offset {inner.end} "
            f"(entry {inner.last_entry_id + 1})",
            inner.end,
        )
    )
    for chunk, raw, message, offset in cases:
        chunk = forged(raw, chunk)
        error = chunk_refusal(raw, chunk)
        assert (str(error), error.offset) == (message, offset)
        # the same bytes at their place in a larger read name the same offset
        window = b"x" * 7 + raw + b"y" * 5
        error = chunk_refusal(memoryview(window), chunk, at=7)
        assert (str(error), error.offset) == (message, offset)
    short_head = forged(data[: HEADER_LEN - 1], first)
    message = (
        f"truncated block header in chunk at offset 0 of the data object: {HEADER_LEN - 1} "
        f"bytes of {HEADER_LEN}"
    )
    error = chunk_refusal(data[: HEADER_LEN - 1], short_head)
    assert str(error) == message
    assert error.offset == HEADER_LEN - 1
    error = chunk_refusal(b"x" * 40 + data[: HEADER_LEN - 1], short_head, at=40)  # in place
    assert (str(error), error.offset) == (message, HEADER_LEN - 1)


def test_chunk_length_and_crc_refusals() -> None:
    data, _, index = build()
    assert index.chunks is not None
    c = index.chunks[5]
    where = f"in chunk at offset {c.offset} of the data object"
    error = chunk_refusal(data[c.offset : c.end - 3], c)
    assert str(error) == f"truncated chunk: {c.length - 3} bytes {where}, expected {c.length}"
    assert error.offset == c.end - 3
    error = chunk_refusal(data[c.offset : c.end] + b"z", c)  # exact-length form: too long
    assert str(error) == f"truncated chunk: {c.length + 1} bytes {where}, expected {c.length}"
    assert error.offset == c.end
    error = chunk_refusal(data[: c.end - 1], c, at=c.offset)
    assert (str(error), error.offset) == (
        f"truncated chunk: {c.length - 1} bytes {where}, expected {c.length}",
        c.end - 1,
    )
    error = chunk_refusal(data[: c.offset - 2], c, at=c.offset)
    assert (str(error), error.offset) == (
        f"truncated chunk: 0 bytes {where}, expected {c.length}",
        c.offset,
    )
    assert decode_chunk(data[: c.end], c, at=c.offset) == decode_chunk(data[c.offset : c.end], c)
    damaged = flip(data, c.offset + 30)
    actual = crc32c.crc32c(damaged[c.offset : c.end])
    error = chunk_refusal(damaged, c, at=c.offset)
    assert str(error) == (
        f"CRC mismatch {where} (entries {c.first_entry_id}..{c.last_entry_id}): "
        f"expected 0x{c.crc32c:08X}, got 0x{actual:08X}"
    )
    assert error.offset == c.offset


def block_refusal(raw: bytes, **how: object) -> FormatError:
    with pytest.raises(FormatError) as raised:
        decode_block(raw, **how)  # type: ignore[arg-type]
    return raised.value


def test_block_refusals_name_absolute_offsets() -> None:
    data, _, index = build()
    b = index.blocks[1]
    raw = block_bytes(data, index, 1)
    count = index.block_entry_count(b)
    at = {"entry_count": count, "offset": b.offset}
    error = block_refusal(raw[:-10], **at)
    assert str(error) == f"truncated block: header says block_len 4096, got {b.length - 10} bytes"
    assert error.offset == b.offset + b.length - 10
    with pytest.raises(FormatError) as raised:  # no offset given: offsets within the block
        block_offsets(raw[:-10], entry_count=count)
    assert raised.value.offset == b.length - 10
    error = block_refusal(raw + b"\xfe", **at)
    assert (
        str(error) == f"block length mismatch: header says block_len 4096, got {b.length + 1} bytes"
    )
    assert error.offset == b.offset + b.length
    error = block_refusal(edit(raw, ">q", 12, -5, reseal=False), **at)
    assert str(error) == f"block length mismatch: header says block_len -5, got {b.length} bytes"
    assert error.offset == b.offset
    error = block_refusal(raw[: HEADER_LEN - 8], **at)
    assert str(error) == f"truncated block header in block: {HEADER_LEN - 8} bytes of {HEADER_LEN}"
    assert error.offset == b.offset + HEADER_LEN - 8
    error = block_refusal(flip(raw, 2), **at)
    assert str(error) == "bad block magic 0xFBDBAACB in block, expected 0xFBDBABCB"
    assert error.offset == b.offset
    error = block_refusal(edit(raw, ">q", 4, 64, reseal=False), **at)
    assert (str(error), error.offset) == (
        "bad block header_len 64 in block, expected 128",
        b.offset + 4,
    )
    damaged = flip(raw, 500)
    error = block_refusal(damaged, expected_crc=b.crc32c, **at)
    assert str(error) == (
        f"CRC mismatch in block of entries from {b.first_entry_id}: "
        f"expected 0x{b.crc32c:08X}, got 0x{crc32c.crc32c(damaged):08X}"
    )
    assert error.offset == b.offset
    framed = max(c.end for c in index.chunks_for_block(b)) - b.offset
    error = block_refusal(flip(raw, framed + 1), **at)
    assert str(error) == (
        f"{b.length - framed} bytes after the last entry in block starting at entry "
        f"{b.first_entry_id} are not padding"
    )
    assert error.offset == b.offset + framed


def test_an_index_beyond_int32_is_refused_not_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """index_len is an int32. A real index that long needs ~77 million chunks, so the
    limit is lowered to the size of a small index: at the limit it encodes, past it not."""
    _, raw, index = build()
    monkeypatch.setattr("offloader.format.index._INT32_MAX", len(raw))
    assert reencoded(index) == raw
    monkeypatch.setattr("offloader.format.index._INT32_MAX", len(raw) - 1)
    with pytest.raises(ValueError, match=rf"^index of {len(raw)} bytes exceeds int32$"):
        reencoded(index)
