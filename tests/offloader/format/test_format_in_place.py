"""Decoding chunks in place inside a larger ranged GET (the sequential reader's path)."""

from __future__ import annotations

import random

import pytest

from offloader.exceptions import FormatError
from offloader.format import decode_chunk, encode_blocks, parse_chunk, verify_chunk


def encoded(count: int = 300, seed: int = 3):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    entries = [(i, rng.randbytes(rng.randint(0, 3000))) for i in range(count)]
    (block,) = encode_blocks(iter(entries), max_block_size=1 << 20, chunk_target=16 << 10)
    return entries, bytes(block.data), block.chunks


def test_chunks_decode_the_same_in_place_and_sliced() -> None:
    entries, data, chunks = encoded()
    assert len(chunks) > 3
    in_place = [e for c in chunks for e in decode_chunk(data, c, at=c.offset)]
    sliced = [e for c in chunks for e in decode_chunk(data[c.offset : c.end], c)]
    assert in_place == sliced == entries
    assert all(type(p) is bytes for _, p in in_place)
    view = memoryview(data)
    assert [e for c in chunks for e in decode_chunk(view, c, at=c.offset)] == entries


def test_in_place_errors_are_caught() -> None:
    _, data, chunks = encoded()
    last = chunks[-1]
    with pytest.raises(FormatError, match="truncated chunk"):
        verify_chunk(data[: last.end - 1], last, at=last.offset)
    with pytest.raises(FormatError, match="truncated chunk"):  # exact-length form
        verify_chunk(data[last.offset : last.end] + b"x", last)
    corrupt = bytearray(data)
    corrupt[chunks[1].offset + 20] ^= 0xFF
    with pytest.raises(FormatError, match="CRC mismatch in chunk at offset"):
        decode_chunk(bytes(corrupt), chunks[1], at=chunks[1].offset)
    # the CRC does not excuse bad framing: a chunk table pointing one byte off is refused
    with pytest.raises(FormatError):
        parse_chunk(data, chunks[1], at=chunks[1].offset + 1)
