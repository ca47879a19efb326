"""Planning sequential GETs: pieces of each block (its multipart part), small pieces
merged, every wanted chunk fetched exactly once, in order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloader.format import ChunkRef
from offloader.read.ranges import MAX_RANGE_FACTOR, MAX_SKIPPED_GAP, plan_ranges

KiB = 1024


def blocks_of(*layout: tuple[int, int, int]) -> list[ChunkRef]:
    """Chunks of consecutive blocks, each ``(chunk count, chunk length, padding)``."""
    chunks, offset, entry = [], 0, 0
    for count, length, padding in layout:
        for i in range(count):
            chunks.append(ChunkRef(entry, offset, length, 1, 0, starts_block=i == 0))
            offset, entry = offset + length, entry + 1
        offset += padding
    return chunks


def cuts(chunks: list[ChunkRef], sequential_range: int) -> list[tuple[int, int]]:
    return [(r.offset, r.length) for r in plan_ranges(chunks, sequential_range)]


def test_a_block_is_cut_into_equal_pieces_from_its_start() -> None:
    # two blocks of 16 chunks read in ranges of 8 chunks: four GETs, two per block,
    # starting at each block's start and middle (not one of 9 chunks straddling a block)
    chunks = blocks_of((16, 100, 8), (16, 100, 8))
    assert cuts(chunks, 800) == [(0, 800), (800, 800), (1608, 800), (2408, 800)]


def test_the_number_of_pieces_is_the_block_span_over_the_range_rounded() -> None:
    chunks = blocks_of((10, 100, 0))
    assert cuts(chunks, 400) == [(0, 500), (500, 500)]  # 2.5 rounds to 2
    assert cuts(chunks, 300) == [(0, 300), (300, 400), (700, 300)]  # 3.33 rounds to 3
    assert cuts(chunks, 2000) == [(0, 1000)]  # never fewer than one


def test_each_block_is_pieced_by_its_own_span() -> None:
    # the second block (offset 100, 1000 bytes) is 2.5 ranges: two pieces of 500, the
    # first of which joins the 100-byte block before it
    chunks = blocks_of((1, 100, 0), (10, 100, 0))
    assert cuts(chunks, 400) == [(0, 600), (600, 500)]


def test_a_chunk_goes_to_the_piece_its_middle_falls_in() -> None:
    # spans 0-300, 300-700 (middle 500), 700-1000: two pieces cut at 500, the middle
    # chunk's middle is exactly there and goes to the second piece
    chunks = [
        ChunkRef(0, 0, 300, 1, 0, starts_block=True),
        ChunkRef(1, 300, 400, 1, 0),
        ChunkRef(2, 700, 300, 1, 0),
    ]
    assert cuts(chunks, 500) == [(0, 300), (300, 700)]


def test_small_blocks_share_a_get_until_it_is_full() -> None:
    # blocks of 100 bytes (+28 padding) read in ranges of 300: a range takes blocks while
    # it is shorter than 300, so three blocks (356 bytes) make one GET
    chunks = blocks_of(*[(1, 100, 28)] * 7)
    assert cuts(chunks, 300) == [(0, 356), (384, 356), (768, 100)]


def test_a_range_is_full_at_exactly_sequential_range_bytes() -> None:
    chunks = blocks_of((1, 300, 0), (1, 100, 0))
    assert cuts(chunks, 300) == [(0, 300), (300, 100)]
    assert cuts(chunks, 301) == [(0, 400)]


def test_merging_stops_short_of_one_and_a_half_ranges() -> None:
    assert MAX_RANGE_FACTOR == 1.5
    # a 100-byte range still short of 200 may take a block only while it ends by 300
    assert cuts(blocks_of((1, 100, 0), (1, 200, 0)), 200) == [(0, 300)]
    assert cuts(blocks_of((1, 100, 0), (1, 201, 0)), 200) == [(0, 100), (100, 201)]


def test_padding_of_more_than_max_skipped_gap_splits() -> None:
    at_limit = blocks_of((1, 100, MAX_SKIPPED_GAP), (1, 100, 0))
    assert cuts(at_limit, 1 << 30) == [(0, 2 * 100 + MAX_SKIPPED_GAP)]
    over = blocks_of((1, 100, MAX_SKIPPED_GAP + 1), (1, 100, 0))
    assert cuts(over, 1 << 30) == [(0, 100), (100 + MAX_SKIPPED_GAP + 1, 100)]


def test_a_plan_may_start_inside_a_block() -> None:
    # the wanted chunks of a block (a read from the middle) are pieced by their own span
    chunks = blocks_of((16, 100, 0), (4, 100, 0))[6:]
    assert cuts(chunks, 500) == [(600, 500), (1100, 500), (1600, 400)]


def test_no_chunks_no_ranges_and_a_bad_range_size_is_refused() -> None:
    assert plan_ranges([], 8) == []
    with pytest.raises(ValueError, match="sequential_range must be positive, got 0"):
        plan_ranges(blocks_of((1, 10, 0)), 0)


@settings(max_examples=200, deadline=None)
@given(
    layout=st.lists(
        st.tuples(st.integers(1, 20), st.integers(1, 64 * KiB), st.sampled_from([0, 1, 300 * KiB])),
        min_size=1,
        max_size=8,
    ),
    sequential_range=st.integers(1, 1024 * KiB),
    start=st.integers(0, 200),
)
def test_every_chunk_is_fetched_once_in_order_within_bounds(
    layout: list[tuple[int, int, int]], sequential_range: int, start: int
) -> None:
    chunks = blocks_of(*layout)
    chunks = chunks[start % len(chunks) :]
    ranges = plan_ranges(chunks, sequential_range)
    assert [c for r in ranges for c in r.chunks] == chunks
    for r in ranges:
        assert (r.offset, r.end) == (r.chunks[0].offset, r.chunks[-1].end)
        gaps = [b.offset - a.end for a, b in zip(r.chunks, r.chunks[1:], strict=False)]
        assert all(0 <= gap <= MAX_SKIPPED_GAP for gap in gaps)
        # a range past 1.5 ranges is one piece of a block: it never crosses a block start
        if r.length > sequential_range * MAX_RANGE_FACTOR:
            assert not any(c.starts_block for c in r.chunks[1:])
