"""Reading a ledger out of streaming (v2) segments: a ledger spread over several segments
and segments holding several ledgers read back identical, a piece list that does not tile
the ledger is refused, damage is reported with its whole address by every read method, and
once a piece's index is in hand one entry costs one ranged GET."""

from __future__ import annotations

import dataclasses
import itertools
import random
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.batches import flattened
from fixtures.counting import CountingStore
from fixtures.damage import flip, overwrite_object
from fixtures.segments import Segment, SegmentEntries
from offloader.exceptions import DamagedObjectError
from offloader.format import encode_segment_index
from offloader.objectstore import ObjectStore
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.read.segmented import PieceSource, SegmentedLedgerReader
from offloader.read.tiered import IndexCache, TieredLedgerReader

KiB = 1024
BLOCK = 64 * KiB
CHUNK = 4 * KiB
TOPIC = "orders"
LEDGER = 7  # the ledger spread over segments A, B and C
SPLITS = (250, 600)  # ledger 7's first entries in segments B and C

Entries = list[tuple[int, bytes]]


def ledger(ledger_id: int, count: int, seed: int, max_size: int = 600) -> SegmentEntries:
    rng = random.Random(seed)
    return [(ledger_id, i, rng.randbytes(rng.randint(0, max_size))) for i in range(count)]


def put_segment(
    store: ObjectStore, entries: SegmentEntries, *, block: int = BLOCK, chunk: int = CHUNK
) -> tuple[str, str]:
    """Encode a segment (every block its own part) and store it; its data and index keys."""
    segment = Segment(entries, block, min_part_size=1, chunk_target=chunk)
    key = str(uuid.uuid4())
    store.put(key, segment.data)
    store.put(f"{key}-index", segment.index(topic=TOPIC))
    return key, f"{key}-index"


@dataclasses.dataclass
class Layout:
    """Segment A: ledgers 3, 5 and the start of 7; B: the middle of 7; C: the rest of 7 and
    ledger 9. ``pieces`` are ledger 7's; ``keys`` each segment's (data, index) keys."""

    store: ObjectStore
    entries: dict[int, Entries]
    keys: dict[str, tuple[str, str]]
    pieces: list[PieceSource]


def layout(store: ObjectStore) -> Layout:
    by_ledger = {3: ledger(3, 120, 1), 5: ledger(5, 80, 2), LEDGER: ledger(LEDGER, 900, 3)}
    by_ledger[9] = ledger(9, 40, 4)
    seven = by_ledger[LEDGER]
    a, b = SPLITS
    streams = {
        "A": by_ledger[3] + by_ledger[5] + seven[:a],
        "B": seven[a:b],
        "C": seven[b:] + by_ledger[9],
    }
    keys = {name: put_segment(store, s) for name, s in streams.items()}
    bounds = [(0, a - 1), (a, b - 1), (b, len(seven) - 1)]
    pieces = [
        PieceSource(store, *keys[name], first, last)
        for name, (first, last) in zip("ABC", bounds, strict=True)
    ]
    entries = {lid: [(e, p) for _, e, p in run] for lid, run in by_ledger.items()}
    return Layout(store, entries, keys, pieces)


def reader(
    pieces: list[PieceSource], ledger_id: int = LEDGER, **kwargs: object
) -> SegmentedLedgerReader:
    kwargs.setdefault("index_cache", IndexCache())
    return SegmentedLedgerReader(pieces, ledger_id=ledger_id, topic=TOPIC, **kwargs)  # type: ignore[arg-type]


def test_a_ledger_split_over_three_segments_reads_back_identical(
    object_store: ObjectStore,
) -> None:
    lay = layout(object_store)
    entries = lay.entries[LEDGER]
    r = reader(lay.pieces)
    assert (r.first_entry_id, r.last_entry_id) == (0, len(entries) - 1)
    assert list(r.read()) == entries
    for piece in lay.pieces:
        for entry_id in (piece.first_entry_id, piece.last_entry_id):
            assert r.read_entry(entry_id) == entries[entry_id][1]
    batches = list(reader(lay.pieces).read_batches())
    assert flattened(batches) == entries
    # a batch is one ranged GET of one segment: none spans a piece boundary
    for batch in batches:
        piece = [p for p in lay.pieces if p.first_entry_id <= batch.first_entry_id][-1]
        assert batch.last_entry_id <= piece.last_entry_id


def test_a_segment_holding_three_ledgers_serves_each(object_store: ObjectStore) -> None:
    lay = layout(object_store)
    data_key, index_key = lay.keys["A"]
    counting = CountingStore(object_store)
    cache = IndexCache()
    for ledger_id in (3, 5):
        entries = lay.entries[ledger_id]
        piece = PieceSource(counting, data_key, index_key, 0, len(entries) - 1)
        r = reader([piece], ledger_id, index_cache=cache)
        assert list(r.read()) == entries
        assert r.read_entry(len(entries) // 2) == entries[len(entries) // 2][1]
        assert flattened(r.read_batches(3, 17)) == entries[3:18]
    seven = [dataclasses.replace(lay.pieces[0], store=counting)]
    assert list(reader(seven, index_cache=cache).read()) == lay.entries[LEDGER][: SPLITS[0]]
    assert counting.requests["get"] == 1  # one index GET for the segment's three ledgers


@pytest.mark.parametrize(("first", "last"), [(249, 250), (245, 255), (240, 610), (599, 600)])
def test_a_range_across_a_piece_boundary(object_store: ObjectStore, first: int, last: int) -> None:
    lay = layout(object_store)
    entries = lay.entries[LEDGER]
    assert list(reader(lay.pieces).read(first, last)) == entries[first : last + 1]
    batches = list(reader(lay.pieces).read_batches(first, last))
    assert flattened(batches) == entries[first : last + 1]
    ends = {b.last_entry_id for b in batches}
    assert {p.last_entry_id for p in lay.pieces if first <= p.last_entry_id < last} <= ends


def test_a_piece_narrower_than_its_segment_serves_only_its_range(
    object_store: ObjectStore,
) -> None:
    lay = layout(object_store)
    entries = lay.entries[LEDGER]
    # segment D holds 400..899 as well: B serves 250..399 of its 250..599, D the rest
    d_keys = put_segment(object_store, [(LEDGER, e, p) for e, p in entries[400:]])
    pieces = [
        lay.pieces[0],
        dataclasses.replace(lay.pieces[1], last_entry_id=399),
        PieceSource(object_store, *d_keys, 400, len(entries) - 1),
    ]
    counting = CountingStore(object_store)
    pieces = [dataclasses.replace(p, store=counting) for p in pieces]
    r = reader(pieces)
    assert list(r.read()) == entries
    assert flattened(reader(pieces).read_batches(390, 410)) == entries[390:411]
    assert r.readers[1].last_entry_id == 399  # not the 599 that segment B holds
    with pytest.raises(ValueError, match=r"entries 250\.\.400 are outside 250\.\.399"):
        list(r.readers[1].read(250, 400))


def test_a_piece_the_segment_does_not_hold_is_damage_of_its_index(
    object_store: ObjectStore,
) -> None:
    lay = layout(object_store)
    index_key = lay.keys["B"][1]
    pieces = [*lay.pieces[:1], dataclasses.replace(lay.pieces[1], last_entry_id=700)]
    with pytest.raises(DamagedObjectError) as raised:
        list(reader(pieces).read(240, 260))
    err = raised.value
    assert (err.topic, err.ledger_id, err.key, err.offset) == (TOPIC, LEDGER, index_key, 0)
    assert "holds entries 250..599 of ledger 7, the metadata store says 250..700" in str(err)
    # ledger 5 is in segment A only
    elsewhere = [dataclasses.replace(lay.pieces[1], first_entry_id=0, last_entry_id=10)]
    with pytest.raises(DamagedObjectError, match="ledger 5 has no entries in this segment"):
        reader(elsewhere, 5).read_entry(3)


@pytest.mark.parametrize(
    ("bounds", "message"),
    [
        (
            [(0, 99), (101, 200)],
            r"ledger 7: piece 1 \(d1\) holds 7:101\.\.7:200, piece 0 \(d0\) 7:0\.\.7:99: "
            r"entries 100\.\.100 are in no piece",
        ),
        (
            [(0, 99), (90, 200)],
            r"ledger 7: piece 1 \(d1\) holds 7:90\.\.7:200, piece 0 \(d0\) 7:0\.\.7:99: "
            r"they overlap on entries 90\.\.99",
        ),
        (
            [(100, 200), (0, 99)],
            r"ledger 7: piece 1 \(d1\) holds 7:0\.\.7:99, piece 0 \(d0\) 7:100\.\.7:200: "
            r"pieces out of entry order",
        ),
        (
            [(0, 99), (100, 99)],
            r"ledger 7: piece 1 \(d1\) holds entries 100\.\.99: not a range of entry ids",
        ),
        ([], r"ledger 7: no pieces"),
        # the edges: the same first entry is an overlap (not out of order), and so is a
        # piece starting on the previous one's last entry
        ([(0, 99), (0, 50)], r"they overlap on entries 0\.\.50"),
        ([(0, 99), (99, 200)], r"they overlap on entries 99\.\.99"),
    ],
    ids=["gap", "overlap", "order", "empty-piece", "none", "same-first", "touching-last"],
)
def test_pieces_that_do_not_tile_the_ledger_are_refused(
    tmp_path: Path, bounds: list[tuple[int, int]], message: str
) -> None:
    store = FilesystemObjectStore(tmp_path / "objects")
    pieces = [
        PieceSource(store, f"d{i}", f"d{i}-index", first, last)
        for i, (first, last) in enumerate(bounds)
    ]
    with pytest.raises(ValueError, match=message):
        SegmentedLedgerReader(pieces, ledger_id=LEDGER)
    assert not list(store.list())  # refused at construction, before any request


def test_a_segment_reader_needs_its_ledger(tmp_path: Path) -> None:
    store = FilesystemObjectStore(tmp_path / "objects")
    with pytest.raises(ValueError, match="needs the ledger_id"):
        TieredLedgerReader(store, "d", "d-index", segment=True)
    with pytest.raises(
        ValueError, match=r"^first_entry_id narrows a segment's share of a ledger: segment=True$"
    ):
        TieredLedgerReader(store, "d", "d-index", first_entry_id=3)


READS: dict[str, Callable[[SegmentedLedgerReader, int], object]] = {
    "read": lambda r, _: list(r.read()),
    "read_entry": lambda r, entry_id: r.read_entry(entry_id),
    "read_batches": lambda r, _: list(r.read_batches()),
}


@pytest.mark.parametrize("method", list(READS))
def test_a_flipped_byte_in_a_block_is_damage_with_its_address(
    object_store: ObjectStore, method: str
) -> None:
    lay = layout(object_store)
    data_key = lay.keys["B"][0]
    probe = reader(lay.pieces)
    chunk = probe.readers[1].index.chunks_between(400, 400)[0]
    overwrite_object(object_store, data_key, flip(chunk.offset + chunk.length - 1))
    with pytest.raises(DamagedObjectError) as raised:
        READS[method](reader(lay.pieces), chunk.last_entry_id)
    err = raised.value
    assert (err.topic, err.ledger_id, err.key, err.offset) == (
        TOPIC,
        LEDGER,
        data_key,
        chunk.offset,
    )
    assert str(err).startswith(
        f"topic {TOPIC} ledger {LEDGER} object {data_key} offset {chunk.offset}: CRC mismatch"
    )


def test_a_block_of_another_ledger_is_damage(object_store: ObjectStore) -> None:
    # an index that says ledger 8 over blocks whose headers say 7 (CRCs all intact)
    segment = Segment(ledger(LEDGER, 50, 5), BLOCK, chunk_target=CHUNK)
    blocks = [dataclasses.replace(b, ledger_id=8) for p in segment.parts for b in p.blocks]
    object_store.put("seg", segment.data)
    object_store.put("seg-index", encode_segment_index(blocks, topic=TOPIC))
    piece = PieceSource(object_store, "seg", "seg-index", 0, 49)
    with pytest.raises(DamagedObjectError, match=r"block header ledger_id 7 .* index says 8") as e:
        reader([piece], 8).read_entry(0)
    assert (e.value.ledger_id, e.value.key, e.value.offset) == (8, "seg", 28)


def test_one_entry_costs_one_get_once_each_piece_was_read(object_store: ObjectStore) -> None:
    lay = layout(object_store)
    entries = lay.entries[LEDGER]
    counting = CountingStore(object_store)
    r = reader([dataclasses.replace(p, store=counting) for p in lay.pieces], prefetch=0)
    for piece in lay.pieces:
        r.read_entry(piece.first_entry_id)
    assert counting.requests["get"] == 3 and counting.requests["read_range"] == 3
    rng = random.Random(11)
    for entry_id in [0, 249, 250, 599, 600, 899, *rng.sample(range(len(entries)), 20)]:
        counting.requests.clear()
        assert r.read_entry(entry_id) == entries[entry_id][1]
        assert counting.total == counting.requests["read_range"] == 1
    assert r.stats.requests == 3 + 26


@st.composite
def split_ledgers(draw: st.DrawFn) -> tuple[Entries, list[int]]:
    """A ledger of 1-120 entries of any size up to a block, and 0-4 split points."""
    sizes = draw(st.lists(st.integers(0, 3 * KiB), min_size=1, max_size=120))
    rng = random.Random(draw(st.integers(0, 1 << 32)))
    entries = [(i, rng.randbytes(n)) for i, n in enumerate(sizes)]
    cuts = (
        draw(st.sets(st.integers(1, len(entries) - 1), max_size=4)) if len(entries) > 1 else set()
    )
    return entries, sorted(cuts)


@settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(split_ledgers(), st.integers(0, 1 << 20))
def test_any_split_of_a_ledger_over_segments_reads_back_identical(
    ledger_and_cuts: tuple[Entries, list[int]], before: int
) -> None:
    entries, cuts = ledger_and_cuts
    bounds = [0, *cuts, len(entries)]
    with tempfile.TemporaryDirectory() as tmp:
        store = FilesystemObjectStore(Path(tmp))
        pieces = []
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            # each segment also holds a ledger before this one, so offsets do not start at 0
            other = ledger(1, before % 7, i)
            run = other + [(LEDGER, e, p) for e, p in entries[lo:hi]]
            keys = put_segment(store, run, block=4 * KiB, chunk=1 * KiB)
            pieces.append(PieceSource(store, *keys, lo, hi - 1))
        r = reader(pieces, prefetch=1, sequential_range=3 * KiB)
        assert list(r.read()) == entries
        assert flattened(r.read_batches()) == entries
        for entry_id in {0, len(entries) - 1, *cuts, *(c - 1 for c in cuts)}:
            assert r.read_entry(entry_id) == entries[entry_id][1]
        mid = len(entries) // 2
        assert list(r.read(mid // 2, mid)) == entries[mid // 2 : mid + 1]


def test_a_piece_starting_inside_its_segment_and_the_readers_settings(
    object_store: ObjectStore,
) -> None:
    """A piece may start after its segment's first entry of the ledger (an earlier segment
    serves the head): its reader starts there too; each piece's reader gets the topic, the
    index cache, the prefetch and the sequential range it was given."""
    lay = layout(object_store)
    entries = lay.entries[LEDGER]
    # segment E holds 350..899, but B serves up to 599: E's piece starts at 600
    e_keys = put_segment(object_store, [(LEDGER, e, p) for e, p in entries[350:]])
    pieces = [*lay.pieces[:2], PieceSource(object_store, *e_keys, 600, len(entries) - 1)]
    cache = IndexCache()
    r = reader(pieces, index_cache=cache, sequential_range=1, prefetch=2)
    assert (r.ledger_id, r.topic) == (LEDGER, TOPIC)
    assert [x.first_entry_id for x in r.readers] == [0, 250, 600]
    assert {x.topic for x in r.readers} == {TOPIC}
    assert {(x.sequential_range, x.prefetch) for x in r.readers} == {(1, 2)}
    assert list(r.read()) == entries
    assert len(cache._items) == 3  # each segment's index fetched into the cache given
    with pytest.raises(ValueError, match=r"entries 350\.\.600 are outside 600\.\.899"):
        list(r.readers[2].read(350, 600))


@pytest.mark.parametrize(
    ("first", "last"),
    [(0, 900), (-1, 5), (10, 5), (899, 898)],
    ids=["past", "below", "10..5", "end"],
)
def test_a_range_outside_the_ledger_or_upside_down_is_refused(
    object_store: ObjectStore, first: int, last: int
) -> None:
    r = reader(layout(object_store).pieces)
    message = rf"entries {first}\.\.{last} are outside 0\.\.899 of ledger 7"
    with pytest.raises(ValueError, match=message):
        r.read_batches(first, last)
