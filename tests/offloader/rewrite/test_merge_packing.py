"""How a merge packs blocks into multipart parts, at the edges of S3's rules: each
downloaded part is filled up to the part size (clamped to the store's limits) but not
past it, and never past the largest part; where copied sources are split, each cut falls
on the block boundary nearest to its share; sources of exactly the smallest or the
largest part are copied whole; a short run takes a copied source's leading blocks up to
exactly the smallest part; blocks that fit no part are refused before any request. Also:
a truncated downloaded source or a damaged source index is refused naming where, and
parts go up ``concurrency`` at a time from the merge's own threads."""

from __future__ import annotations

import itertools
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.counting import CountingStore
from fixtures.damage import flip, overwrite_object
from fixtures.faults import _Delegating
from fixtures.merges import files_store, read_back, run_merge, store_segment, store_segments
from fixtures.segments import SegmentEntries
from offloader.exceptions import DamagedObjectError, FormatError
from offloader.format import decode_segment_index
from offloader.objectstore import PartInfo
from offloader.rewrite.merge import load_source, merge_segments
from offloader.rewrite.merge_parts import _nearest

KiB = 1024
BLOCK = 1 * KiB  # four 200-byte entries fill a block; blocks are padded to 1 KiB
EXACT = 212  # four entries of 212 bytes make a block of exactly 1 KiB, the last one too


def _entries(count: int, size: int = 200) -> SegmentEntries:
    rng = random.Random(count)
    return [(1, i, rng.randbytes(size)) for i in range(count)]


def _moves(store: CountingStore) -> list[tuple[str, tuple[Any, ...]]]:
    """The reads and part uploads, in order; a part's upload without its upload handle."""
    return [
        (verb, args if verb == "read_range" else args[1:])
        for verb, args in store.calls
        if verb in ("read_range", "upload_part", "upload_part_copy")
    ]


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


def test_a_short_run_takes_blocks_up_to_the_minimum_and_the_last_source_s_rest_is_copied(
    tmp_path: Path,
) -> None:
    """A run of downloaded blocks below the smallest part takes the copied source's leading
    blocks until it reaches exactly the minimum, not a block more. The rest (3 KiB) is
    below the minimum but is the merge's last part, which S3 lets be short: still copied."""
    target = CountingStore(files_store(tmp_path / "o", min_part_size=4 * KiB))
    entries = _entries(28, EXACT)
    small, big = store_segments(target, entries, [8], block=BLOCK)
    assert (small.data_len, big.data_len) == (2 * KiB, 5 * KiB)
    target.calls.clear()

    key, merged = run_merge(target, [small.source(), big.source()])

    assert _moves(target) == [
        ("read_range", (small.data_key, 0, 2 * KiB)),
        ("read_range", (big.data_key, 0, 2 * KiB)),
        ("upload_part", (1, 4 * KiB)),
        ("upload_part_copy", (2, big.data_key, 2 * KiB, 3 * KiB)),
    ]
    assert read_back(target.inner, key, merged) == entries


def test_sources_of_exactly_the_smallest_and_the_largest_part_are_copied_whole(
    tmp_path: Path,
) -> None:
    """S3's limits are inclusive: a 4 KiB source (the minimum) is copied as it is, though
    more follows, and a 6 KiB one (the maximum) is one part, not split."""
    target = CountingStore(
        files_store(tmp_path / "o", min_part_size=4 * KiB, max_part_size=6 * KiB)
    )
    entries = _entries(44, EXACT)
    smallest, largest, last = store_segments(target, entries, [16, 40], block=BLOCK)
    assert [x.data_len for x in (smallest, largest, last)] == [4 * KiB, 6 * KiB, KiB]
    target.calls.clear()

    key, merged = run_merge(target, [x.source() for x in (smallest, largest, last)])

    assert _moves(target) == [
        ("upload_part_copy", (1, smallest.data_key, 0, 4 * KiB)),
        ("upload_part_copy", (2, largest.data_key, 0, 6 * KiB)),
        ("read_range", (last.data_key, 0, KiB)),
        ("upload_part", (3, KiB)),
    ]
    assert read_back(target.inner, key, merged) == entries


def test_blocks_that_fit_no_part_are_refused_before_any_request(tmp_path: Path) -> None:
    """Blocks of about 4 KiB and parts of 5..7 KiB: no two blocks fit a part and no block
    alone reaches the minimum, so the copied source cannot be cut; the operator is told
    how many bytes from where, and the limits."""
    store = CountingStore(files_store(tmp_path / "o", min_part_size=5 * KiB, max_part_size=7 * KiB))
    big = store_segment(store, _entries(12, 900), block=4 * KiB)
    assert [b.length for b in big.index.ledgers[0].blocks] == [4 * KiB, 4 * KiB, 3776]
    upload = store.create_multipart("merged")
    store.calls.clear()

    with pytest.raises(ValueError) as caught:
        merge_segments(store, upload, [big.source()])

    assert str(caught.value) == (
        f"cannot cut {big.data_len} bytes of blocks from offset 0 into parts of "
        f"{5 * KiB}..{7 * KiB} bytes at block boundaries"
    )
    assert store.calls == []


@pytest.mark.parametrize(
    ("damage", "offset", "what"),
    [
        (flip(0), 0, "bad segment index magic"),
        (lambda data: data[:-10], 4, "truncated segment index: index_len says"),
    ],
    ids=["magic", "truncated"],
)
def test_a_damaged_source_index_is_refused_naming_it_and_the_offset(
    tmp_path: Path, damage: Any, offset: int, what: str
) -> None:
    """The operator is told the index object, the codec's offset (0 included) and what is
    wrong; topic and ledger are unknown, since the index could not be read."""
    store = files_store(tmp_path / "o")
    source = store_segment(store, _entries(8), block=BLOCK)
    overwrite_object(store, source.index_key, damage)
    with pytest.raises(FormatError) as codec:
        decode_segment_index(store.get(source.index_key))
    assert str(codec.value).startswith(what)

    with pytest.raises(DamagedObjectError) as caught:
        load_source(store, source.data_key, source.index_key, source.data_len, [])

    assert str(caught.value) == (
        f"topic ? ledger ? object {source.index_key} offset {offset}: {codec.value}"
    )
    assert (caught.value.key, caught.value.offset) == (source.index_key, offset)
    assert isinstance(caught.value.__cause__, FormatError)


class HeldParts(_Delegating):
    """Part uploads wait until the test lets them go: how many start at once can be seen."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.started: list[int] = []
        self.go = threading.Event()

    def upload_part(self, upload: Any, part_number: int, data: bytes) -> PartInfo:
        self.started.append(part_number)
        self.go.wait(30)
        return self._inner.upload_part(upload, part_number, data)


def test_parts_go_up_concurrency_at_a_time_from_the_merge_s_own_threads(tmp_path: Path) -> None:
    """With concurrency 2, two parts are in flight and a third waits; each part is read and
    uploaded by a worker named merge_N (what thread dumps and log lines show), and the
    parts are reported in order."""
    inner = files_store(tmp_path / "o", min_part_size=4 * KiB, part_copy=False)
    held = HeldParts(inner)
    target = CountingStore(held)
    entries = _entries(100, EXACT)  # 25 KiB, downloaded in parts of 4 KiB
    source = store_segment(target, entries, block=BLOCK)
    seen: list[PartInfo] = []

    with ThreadPoolExecutor(1) as runner:
        merging = runner.submit(
            run_merge,
            target,
            [source.source()],
            part_size=4 * KiB,
            concurrency=2,
            on_part=seen.append,
        )
        try:
            deadline = time.monotonic() + 30
            while len(held.started) < 2:
                assert time.monotonic() < deadline, f"only parts {held.started} started"
                time.sleep(0.01)
            time.sleep(0.3)  # a third part would start here if it could
            assert sorted(held.started) == [1, 2]
        finally:
            held.go.set()
        key, merged = merging.result(30)

    assert len(merged.parts) == 7 and seen == merged.parts
    assert target.threads["read_range"] == {"merge_0", "merge_1"}
    assert target.threads["upload_part"] == {"merge_0", "merge_1"}
    assert read_back(inner, key, merged) == entries
