"""merge_segments on the filesystem store with S3-like part limits: which source is
copied and which downloaded, what an unwanted ledger leaves behind, damage read is
refused and damage copied is still found, and bad sources change nothing."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures.counting import CountingStore
from fixtures.damage import flip, overwrite_object
from fixtures.merges import Stored, files_store, read_back, run_merge, store_segment
from fixtures.segments import Segment, SegmentEntries
from fixtures.streams import block_entries
from offloader.exceptions import DamagedObjectError, FormatError
from offloader.format import decode_segment_index
from offloader.metadata.records import PieceRange
from offloader.objectstore import ObjectStore
from offloader.read.tiered import IndexCache, TieredLedgerReader
from offloader.rewrite.merge import SegmentSource, load_source, merge_segments

KiB = 1024
MIN_PART = 4 * KiB
BLOCK = 1 * KiB  # four 200-byte entries to a block


def ledger(ledger_id: int, first: int, count: int, size: int = 200) -> SegmentEntries:
    rng = random.Random(ledger_id * 1000 + first)
    return [(ledger_id, first + i, rng.randbytes(size)) for i in range(count)]


@pytest.fixture
def target(tmp_path: Path) -> CountingStore:
    return CountingStore(files_store(tmp_path / "objects", min_part_size=MIN_PART))


def layout(store: ObjectStore) -> dict[str, Stored]:
    """Six adjacent segments: A, B small; C big (ledger 3); D small (more of ledger 3);
    E big (ledger 4); F small, the last."""
    streams = {
        "A": ledger(1, 0, 10, 100),
        "B": ledger(2, 0, 10, 100),
        "C": ledger(3, 0, 80),
        "D": ledger(3, 80, 10),
        "E": ledger(4, 0, 50),
        "F": ledger(5, 0, 5),
    }
    return {name: store_segment(store, s, block=BLOCK, chunk=600) for name, s in streams.items()}


def _requests(store: CountingStore, verb: str) -> list[tuple]:
    return [args for name, args in store.calls if name == verb]


def test_big_sources_are_copied_small_ones_downloaded(target: CountingStore) -> None:
    """Ledger 2 is unwanted and only in a downloaded source: left out, never read. Ledger 4
    is unwanted but in a copied source: kept whole, and listed as held."""
    s = layout(target)
    assert [x.data_len >= MIN_PART for x in s.values()] == [0, 0, 1, 0, 1, 0]
    target.calls.clear()
    sources = [x.source(unwanted={2, 4}) for x in s.values()]

    key, merged = run_merge(target, sources, part_size=2 * KiB)

    verbs = [verb for verb, _ in target.calls if verb in ("upload_part", "upload_part_copy")]
    assert verbs == ["upload_part", "upload_part_copy"] * 2 + ["upload_part"]
    copies = _requests(target, "upload_part_copy")
    reads = _requests(target, "read_range")
    assert [c[2] for c in copies] == [s["C"].data_key, s["E"].data_key]
    assert [r[0] for r in reads] == [s[n].data_key for n in "ACDEF"]  # B: dropped, unread
    assert not target.keys("get")
    # the run A is short: it takes C's leading blocks up to a part; C's rest is copied
    c_lead = reads[1][2]
    assert reads[1][1] == 0 and 0 < c_lead < s["C"].data_len
    assert copies[0][3:] == (c_lead, s["C"].data_len - c_lead)
    assert sum(r[2] for r in reads[:2]) >= MIN_PART
    assert all(p.size >= MIN_PART for p in merged.parts[:-1])
    # what it holds
    assert merged.pieces == [
        PieceRange(1, 0, 9),
        PieceRange(3, 0, 89),
        PieceRange(4, 0, 49),
        PieceRange(5, 0, 4),
    ]
    assert merged.dropped == [PieceRange(2, 0, 9)]
    expected = [e for n in "ACDEF" for e in s[n].entries]
    assert read_back(target.inner, key, merged) == expected


def test_a_source_above_the_largest_part_is_copied_in_pieces(tmp_path: Path) -> None:
    store = CountingStore(
        files_store(tmp_path / "o", min_part_size=MIN_PART, max_part_size=6 * KiB)
    )
    big = store_segment(store, ledger(7, 0, 100), block=BLOCK, chunk=600)  # ~25 KiB
    store.calls.clear()

    key, merged = run_merge(store, [big.source()])

    copies = _requests(store, "upload_part_copy")
    assert len(copies) == len(merged.parts) >= 5
    assert all(MIN_PART <= p.size <= 6 * KiB for p in merged.parts)
    offsets = itertools.accumulate((p.size for p in merged.parts[:-1]), initial=0)
    assert [c[3] for c in copies] == list(offsets)
    assert not _requests(store, "read_range")
    assert store.inner.get(key) == store.inner.get(big.data_key)
    assert read_back(store.inner, key, merged) == big.entries


def test_downloaded_parts_stay_within_the_largest_part(tmp_path: Path) -> None:
    store = CountingStore(
        files_store(tmp_path / "o", min_part_size=MIN_PART, max_part_size=6 * KiB)
    )
    entries = ledger(7, 0, 120)
    small = [  # about 3 KiB each: all downloaded
        store_segment(store, entries[i : i + 12], block=BLOCK, chunk=600)
        for i in range(0, len(entries), 12)
    ]
    store.calls.clear()

    key, merged = run_merge(store, [x.source() for x in small], part_size=1 << 30)

    assert not _requests(store, "upload_part_copy")
    assert all(MIN_PART <= p.size <= 6 * KiB for p in merged.parts[:-1])
    assert merged.parts[-1].size <= 6 * KiB
    assert read_back(store.inner, key, merged) == entries


def test_each_source_is_read_from_its_own_object(target: CountingStore) -> None:
    """Y's first ledger is dropped, so its kept block starts where X's only block ends:
    the same offset, another object, another ranged GET."""
    x = store_segment(target, ledger(1, 0, 4), block=BLOCK)
    y = store_segment(target, ledger(2, 0, 4) + ledger(3, 0, 4), block=BLOCK)
    kept = y.index.ledger(3).blocks[0]
    assert kept.offset == x.data_len
    target.calls.clear()

    key, merged = run_merge(target, [x.source(), y.source(unwanted={2})])

    assert _requests(target, "read_range") == [
        (x.data_key, 0, x.data_len),
        (y.data_key, kept.offset, kept.length),
    ]
    assert read_back(target.inner, key, merged) == x.entries + ledger(3, 0, 4)


def test_a_damaged_downloaded_source_is_refused_naming_it(target: CountingStore) -> None:
    s = layout(target)
    d = s["D"]
    block = d.index.ledgers[0].blocks[1]
    overwrite_object(target.inner, d.data_key, flip(block.offset + 200))
    target.calls.clear()
    upload = target.create_multipart("merged")

    with pytest.raises(DamagedObjectError) as caught:
        merge_segments(target, upload, [x.source() for x in s.values()])

    message = str(caught.value)
    assert f"object {d.data_key} offset {block.offset}:" in message
    assert "topic orders ledger 3" in message and "CRC mismatch" in message
    assert isinstance(caught.value.__cause__, FormatError)
    # the parts before it went up, the damaged one never did
    assert len(_requests(target, "upload_part")) == 1
    assert len(_requests(target, "upload_part_copy")) == 1
    assert not target.inner.exists("merged")


def test_a_truncated_downloaded_source_is_refused(target: CountingStore) -> None:
    s = layout(target)
    overwrite_object(target.inner, s["F"].data_key, lambda data: data[:-10])
    upload = target.create_multipart("merged")

    with pytest.raises(DamagedObjectError, match=f"object {s['F'].data_key} .*truncated block"):
        merge_segments(target, upload, [x.source() for x in s.values()])


def test_damage_in_a_copied_source_is_found_by_readers_of_the_merge(
    target: CountingStore,
) -> None:
    """Copied bytes are not read, but their block CRCs move into the new index."""
    s = layout(target)
    c = s["C"]
    block = c.index.ledgers[0].blocks[-1]
    overwrite_object(target.inner, c.data_key, flip(block.offset + 300))

    key, merged = run_merge(target, [x.source() for x in s.values()])

    index = decode_segment_index(merged.index)
    moved = index.ledger(3).blocks[len(c.index.ledgers[0].blocks) - 1]
    reader = TieredLedgerReader(
        target.inner, key, f"{key}-index", ledger_id=3, segment=True, index_cache=IndexCache()
    )
    with pytest.raises(DamagedObjectError, match=f"object {key} offset {moved.offset}"):
        list(reader.read())
    with pytest.raises(FormatError, match="CRC mismatch"):
        block_entries(index, target.inner.get(key))


def test_parts_are_reported_in_order_and_times_can_be_given(target: CountingStore) -> None:
    s = layout(target)
    seen = []

    key, merged = run_merge(
        target,
        [x.source() for x in s.values()],
        on_part=seen.append,
        part_size=1,
        concurrency=3,
        ledger_times={3: (111, 222)},
    )

    assert seen == merged.parts
    assert [p.part_number for p in seen] == list(range(1, len(seen) + 1))
    meta = decode_segment_index(merged.index).ledger(3).metadata
    assert meta is not None and (meta.created_ms, meta.sealed_ms) == (111, 222)
    assert read_back(target.inner, key, merged) == [e for x in s.values() for e in x.entries]


def test_the_merged_index_keeps_the_times_its_sources_know(target: CountingStore) -> None:
    """Each ledger keeps the largest created and sealed times any of its pieces' indexes
    knows, whichever piece knows them (a segment closed while its ledger was open says
    -1); -1 only where no piece knows."""
    x = store_segment(target, ledger(3, 0, 10), block=BLOCK, times={3: (111, 222)})
    y = store_segment(
        target, ledger(3, 10, 10) + ledger(4, 0, 5), block=BLOCK, times={4: (300, -1)}
    )
    z = store_segment(target, ledger(4, 5, 5) + ledger(5, 0, 5), block=BLOCK, times={4: (300, 400)})
    unknown = y.index.ledger(3).metadata
    assert unknown is not None and (unknown.created_ms, unknown.sealed_ms) == (-1, -1)

    key, merged = run_merge(target, [x.source(), y.source(), z.source()])

    index = decode_segment_index(merged.index)
    times = {}
    for lid, view in zip(index.ledger_ids, index.ledgers, strict=True):
        assert view.metadata is not None
        times[lid] = (view.metadata.created_ms, view.metadata.sealed_ms)
    assert times == {3: (111, 222), 4: (300, 400), 5: (-1, -1)}
    assert read_back(target.inner, key, merged) == x.entries + y.entries + z.entries


def test_a_time_below_minus_one_in_a_source_is_merged_as_unknown(target: CountingStore) -> None:
    """-1 is the format's one "unknown" time: a source index carrying another negative
    time (no clock gives one) does not pass it on to the merged index."""
    odd = store_segment(target, ledger(6, 0, 5), block=BLOCK, times={6: (-2, -2)})

    key, merged = run_merge(target, [odd.source()])

    meta = decode_segment_index(merged.index).ledger(6).metadata
    assert meta is not None and (meta.created_ms, meta.sealed_ms) == (-1, -1)
    assert read_back(target.inner, key, merged) == odd.entries


def test_a_source_in_another_store_object_of_the_same_location_is_copied(
    tmp_path: Path,
) -> None:
    """Stores are the same by location, not by object: a source opened through another
    store object on the target's own directory is still copied server side."""
    root = tmp_path / "objects"
    target = CountingStore(files_store(root, min_part_size=MIN_PART))
    opened_again = files_store(root, min_part_size=MIN_PART)
    assert opened_again is not target.inner and opened_again.url == target.url
    big = store_segment(opened_again, ledger(3, 0, 80), block=BLOCK, chunk=600)
    assert big.data_len >= MIN_PART
    target.calls.clear()

    key, merged = run_merge(target, [big.source()])

    assert [c[2] for c in _requests(target, "upload_part_copy")] == [big.data_key]
    assert not _requests(target, "read_range") and not _requests(target, "upload_part")
    assert read_back(target.inner, key, merged) == big.entries


def test_an_unwanted_ledger_over_two_downloaded_sources_is_dropped_per_source(
    target: CountingStore,
) -> None:
    """``dropped`` lists what each source loses: a ledger spread over two sources gives
    one range per source, not one range over both."""
    x = store_segment(target, ledger(3, 0, 10), block=BLOCK)
    y = store_segment(target, ledger(3, 10, 10) + ledger(4, 0, 5), block=BLOCK)
    assert max(x.data_len, y.data_len) < MIN_PART  # both downloaded: ledger 3 can go

    key, merged = run_merge(target, [x.source(unwanted={3}), y.source(unwanted={3})])

    assert merged.dropped == [PieceRange(3, 0, 9), PieceRange(3, 10, 19)]
    assert merged.pieces == [PieceRange(4, 0, 4)]
    assert read_back(target.inner, key, merged) == ledger(4, 0, 5)


def test_load_source_names_a_damaged_index(target: CountingStore) -> None:
    c = layout(target)["C"]
    good = load_source(target, c.data_key, c.index_key, c.data_len, [])
    assert good.index == c.index
    overwrite_object(target.inner, c.index_key, flip(40))

    with pytest.raises(DamagedObjectError, match=f"object {c.index_key} offset"):
        load_source(target, c.data_key, c.index_key, c.data_len, [])


Bad = Callable[[dict[str, Stored], list[SegmentSource]], list[SegmentSource]]


def _with(source: SegmentSource, **changes: object) -> SegmentSource:
    return dataclasses.replace(source, **changes)


BAD_SOURCES: dict[str, tuple[Bad, str]] = {
    "none": (lambda s, src: [], "at least one source"),
    "out of order": (lambda s, src: [src[3], src[2]], "do not follow 3:89"),
    "twice": (lambda s, src: [src[2], src[2]], "3:0.. of segment .* do not follow 3:79"),
    "keep not in the index": (
        lambda s, src: [_with(src[2], keep=[PieceRange(3, 0, 100)])],
        r"keep 3:0..100 is not one of its index's ledger ranges \(3:0..79\)",
    ),
    "kept here, not there": (
        lambda s, src: [src[2], _with(src[3], keep=[])],
        "ledger 3 is kept in segment .* but not in segment",
    ),
    "data length": (
        lambda s, src: [_with(src[0], data_len=src[0].data_len + 1)],
        "its index says .* bytes, the metadata store",
    ),
    "nothing wanted": (
        lambda s, src: [_with(src[0], keep=[]), _with(src[1], keep=[])],
        "nothing to merge",
    ),
}


@pytest.mark.parametrize("name", list(BAD_SOURCES))
def test_bad_sources_are_refused_before_any_request(target: CountingStore, name: str) -> None:
    s = layout(target)
    make, message = BAD_SOURCES[name]
    sources = make(s, [x.source() for x in s.values()])
    upload = target.create_multipart("merged")
    target.calls.clear()

    with pytest.raises(ValueError, match=message):
        merge_segments(target, upload, sources)

    assert target.calls == []


def test_a_gap_in_a_ledger_is_refused(target: CountingStore) -> None:
    """A segment may begin or end anywhere in a ledger, but a ledger's pieces must run on."""
    s = layout(target)
    later = store_segment(target, ledger(3, 95, 5), block=BLOCK)
    upload = target.create_multipart("merged")
    target.calls.clear()

    with pytest.raises(ValueError, match=f"3:95.. of segment {later.data_key} do not follow 3:89"):
        merge_segments(target, upload, [s["C"].source(), s["D"].source(), later.source()])
    assert target.calls == []


def _refused(store: CountingStore, sources: list[SegmentSource]) -> str:
    """The message of a merge of ``sources`` refused before any request."""
    upload = store.create_multipart("merged")
    store.calls.clear()
    with pytest.raises(ValueError) as caught:
        merge_segments(store, upload, sources)
    assert store.calls == []
    return str(caught.value)


def test_sources_out_of_order_after_a_new_ledger_are_refused_naming_both(
    target: CountingStore,
) -> None:
    """Every step is checked, not only up to the first new ledger: A (ledger 1) then C
    (ledger 3) is in order, B (ledger 2) after C is not."""
    s = layout(target)

    message = _refused(target, [s["A"].source(), s["C"].source(), s["B"].source()])

    assert message == (
        f"entries 2:0.. of segment {s['B'].data_key} do not follow 3:79 of segment "
        f"{s['C'].data_key}: merge adjacent segments in position order"
    )


def test_a_keep_range_not_in_the_index_is_refused_listing_the_index_s_ranges(
    target: CountingStore,
) -> None:
    """The refusal lists the ranges the index does hold: what a keep may name."""
    both = store_segment(target, ledger(1, 0, 10, 100) + ledger(2, 0, 10, 100), block=BLOCK)
    bad = _with(both.source(), keep=[PieceRange(1, 0, 100), PieceRange(2, 0, 9)])

    message = _refused(target, [bad])

    assert message == (
        f"segment {both.data_key}: keep 1:0..100 is not one of its index's ledger ranges "
        "(1:0..9, 2:0..9)"
    )


@pytest.mark.parametrize("kept_first", [True, False])
def test_a_ledger_kept_in_one_source_only_is_refused_naming_which_keeps_it(
    target: CountingStore, kept_first: bool
) -> None:
    """Ledger 3 lies in C and D; whichever of them keeps it is named as keeping it."""
    s = layout(target)
    c, d = s["C"].source(), s["D"].source()
    keeper, other = ("C", "D") if kept_first else ("D", "C")
    sources = [c, _with(d, keep=[])] if kept_first else [_with(c, keep=[]), d]

    message = _refused(target, sources)

    assert message == (
        f"ledger 3 is kept in segment {s[keeper].data_key} but not in segment "
        f"{s[other].data_key}: a ledger is wanted or not"
    )


def test_another_topic_is_refused(target: CountingStore) -> None:
    s = layout(target)
    foreign = _foreign_topic(target, ledger(9, 0, 3))
    upload = target.create_multipart("merged")
    target.calls.clear()

    with pytest.raises(ValueError, match="is of topic 'elsewhere', the first of 'orders'"):
        merge_segments(target, upload, [s["F"].source(), foreign])
    assert target.calls == []


def _foreign_topic(store: ObjectStore, entries: SegmentEntries) -> SegmentSource:
    segment = Segment(entries, BLOCK)
    index = decode_segment_index(segment.index(topic="elsewhere"))
    store.put("foreign", segment.data)
    return SegmentSource(store, "foreign", len(segment.data), index, [])


@pytest.mark.parametrize(
    ("limits", "kwargs", "message"),
    [
        ({"max_parts": 2}, {}, "needs 5 parts, the store allows 2"),
        ({"max_part_size": 512}, {}, r"cannot cut|would hold"),
        ({}, {"part_size": 0}, "part_size 0"),
        ({}, {"concurrency": 0}, "concurrency must be >= 1"),
    ],
)
def test_limits_that_cannot_be_kept_are_refused_before_any_request(
    tmp_path: Path, limits: dict[str, int], kwargs: dict[str, int], message: str
) -> None:
    store = CountingStore(files_store(tmp_path / "o", min_part_size=MIN_PART))
    s = layout(store)
    store.inner.capabilities = dataclasses.replace(store.inner.capabilities, **limits)
    upload = store.create_multipart("merged")
    store.calls.clear()

    with pytest.raises(ValueError, match=message):
        merge_segments(store, upload, [x.source() for x in s.values()], **kwargs)
    assert store.calls == []
