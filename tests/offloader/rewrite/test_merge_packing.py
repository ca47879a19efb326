"""How a merge packs downloaded blocks into multipart parts, at the edges of S3's rules:
each part is filled up to the part size (clamped to the store's limits) but not past it,
and never past the largest part; where copied sources are split, each cut falls on the
block boundary nearest to its share. Also: a truncated downloaded source is refused
naming the offset where its bytes end."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.damage import overwrite_object
from fixtures.merges import files_store, read_back, run_merge, store_segment
from fixtures.segments import SegmentEntries
from offloader.exceptions import DamagedObjectError
from offloader.format import decode_segment_index
from offloader.rewrite.merge import merge_segments
from offloader.rewrite.merge_parts import _nearest

KiB = 1024
BLOCK = 1 * KiB  # four 200-byte entries fill a block; blocks are padded to 1 KiB


def _entries(count: int) -> SegmentEntries:
    rng = random.Random(count)
    return [(1, i, rng.randbytes(200)) for i in range(count)]


@pytest.mark.parametrize(
    ("min_part", "max_part", "part_size"),
    [
        (4 * KiB, 5 << 30, 6 * KiB),  # parts of the part size, above the minimum
        (4 * KiB, 6 * KiB, 8 * KiB),  # the part size above the largest part: parts of the largest
        (4 * KiB, 4 * KiB + 512, 8 * KiB),  # a block more than the minimum does not fit
    ],
)
def test_downloaded_parts_are_filled_to_the_part_size_within_the_store_s_limits(
    tmp_path: Path, min_part: int, max_part: int, part_size: int
) -> None:
    """A part is cut once it reaches the part size (or the next block would not fit the
    largest part), not before and not a block later: few parts, none outside S3's rules."""
    store = files_store(
        tmp_path / "o", min_part_size=min_part, max_part_size=max_part, part_copy=False
    )
    entries = _entries(100)  # 25 blocks
    source = store_segment(store, entries, block=BLOCK)
    wanted = min(max(part_size, min_part), max_part)

    key, merged = run_merge(store, [source.source()], part_size=part_size)

    assert read_back(store, key, merged) == entries
    blocks = [b for view in decode_segment_index(merged.index).ledgers for b in view.blocks]
    lengths = [[b.length for b in blocks if b.part_id == p.part_number] for p in merged.parts]
    assert [sum(x) for x in lengths] == [p.size for p in merged.parts]
    for this, following in itertools.pairwise(lengths):
        size = sum(this)
        assert min_part <= size <= max_part
        assert size - this[-1] < wanted, f"a part {size} went a block past {wanted}"
        assert size >= wanted or size + following[0] > max_part, f"a part {size} cut short"
    assert sum(lengths[-1]) <= max_part


def test_a_truncated_downloaded_source_is_refused_where_its_bytes_end(tmp_path: Path) -> None:
    """The operator is told the offset at which the object stops, not the block's start."""
    store = files_store(tmp_path / "o", min_part_size=4 * KiB, part_copy=False)
    source = store_segment(store, _entries(30), block=BLOCK)  # 7.5 KiB, downloaded
    last = source.index.ledgers[0].blocks[-1]
    overwrite_object(store, source.data_key, lambda data: data[:-10])
    upload = store.create_multipart("merged")

    with pytest.raises(DamagedObjectError, match="truncated block") as caught:
        merge_segments(store, upload, [source.source()])

    ends = source.data_len - 10
    assert ends > last.offset
    assert caught.value.offset == ends and caught.value.key == source.data_key
    assert f"object {source.data_key} offset {ends}:" in str(caught.value)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.data())
def test_a_split_cuts_at_the_block_start_nearest_to_its_share(
    lengths: list[int], data: st.DataObject
) -> None:
    """A copied source bigger than the largest part is split where a block starts, the
    start nearest to the even share (any point from the source's start to its end)."""
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    at = data.draw(st.integers(0, sum(lengths)))
    chosen = _nearest(starts, at)
    assert 0 <= chosen < len(starts)
    assert abs(starts[chosen] - at) == min(abs(s - at) for s in starts)
