"""The tiered reader's range planning (few large GETs for sequential reads, one small GET
for a single entry, the same entries either way), its index cache, the share of a v2
segment it serves, and the address its errors carry."""

from __future__ import annotations

import dataclasses
import random
import struct
import threading
import time
from pathlib import Path

import crc32c
import pytest

from fixtures.counting import CountingStore
from fixtures.damage import flip, overwrite_object
from fixtures.encoding import encode_ledger
from fixtures.pulsar_v1 import pulsar_write_blocks, pulsar_write_index
from fixtures.segments import Segment
from offloader.exceptions import DamagedObjectError
from offloader.format import (
    HEADER_LEN,
    decode_index,
    encode_index,
)
from offloader.objectstore import ObjectStore
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.read.ranges import MAX_SKIPPED_GAP
from offloader.read.tiered import IndexCache, TieredLedgerReader

KiB = 1024


def offloaded(tmp_path: Path, sizes: list[int], block: int, chunk: int):  # type: ignore[no-untyped-def]
    rng = random.Random(5)
    entries = [(i, rng.randbytes(n)) for i, n in enumerate(sizes)]
    ledger = encode_ledger(entries, block, chunk)
    store = FilesystemObjectStore(tmp_path / "objects")
    store.put("data", ledger.data)
    store.put("index", ledger.index())
    return store, entries


def reader(store, **kwargs) -> TieredLedgerReader:  # type: ignore[no-untyped-def]
    return TieredLedgerReader(store, "data", "index", index_cache=IndexCache(), **kwargs)


def test_sequential_ranges_step_over_small_padding(tmp_path: Path) -> None:
    store, entries = offloaded(tmp_path, [1000] * 2000, block=64 * KiB, chunk=16 * KiB)
    r = reader(store, sequential_range=256 * KiB, prefetch=2)
    assert list(r.read()) == entries
    size = store.stat("data").size
    # ranges of ~256 KiB over the whole object: padding inside a range is fetched, not
    # split on, so the request count is what raw 256 KiB GETs would need (+1)
    assert r.stats.requests <= size // (256 * KiB) + 2
    assert size - 64 * KiB <= r.stats.bytes_fetched <= size


def test_large_gaps_split_ranges(tmp_path: Path) -> None:
    # one 600 KiB entry per 1 MiB block: each block ends in ~424 KiB of padding, more than
    # a sequential range steps over, so every block is its own GET and no padding is read
    assert 424 * KiB > MAX_SKIPPED_GAP
    store, entries = offloaded(tmp_path, [600 * KiB] * 12, block=1024 * KiB, chunk=64 * KiB)
    r = reader(store, sequential_range=8 * 1024 * KiB)
    assert list(r.read()) == entries
    assert r.stats.requests == len(r.index.blocks) == 12
    assert r.stats.bytes_fetched == 12 * (128 + 12 + 600 * KiB)


def test_sequential_gets_follow_the_blocks(tmp_path: Path) -> None:
    # two blocks of four 16-entry chunks (the first of each holds the 128-byte header),
    # read in ranges of two chunks: two GETs per block, from its start and its middle,
    # none straddling the blocks' boundary (each block is one multipart part)
    block = HEADER_LEN + 64 * 1012 + 1004  # 64 entries and a little padding
    store, entries = offloaded(tmp_path, [1000] * 128, block=block, chunk=16 * KiB)
    counting = CountingStore(store)
    # a byte over two chunks: "at least sequential_range" would take a third chunk here
    r = reader(counting, sequential_range=2 * 16 * 1012 + 1, prefetch=0)
    chunks = r.index.chunks
    assert chunks is not None and [c.entry_count for c in chunks] == [16] * 8
    assert list(r.read()) == entries
    gets = [(args[1], args[2]) for verb, args in counting.calls if verb == "read_range"]
    starts = [b.offset for b in r.index.blocks]
    assert gets == [
        (starts[0], chunks[1].end - starts[0]),
        (chunks[2].offset, chunks[3].end - chunks[2].offset),
        (starts[1], chunks[5].end - starts[1]),
        (chunks[6].offset, chunks[7].end - chunks[6].offset),
    ]


@pytest.mark.parametrize(("extra", "requests"), [(0, 1), (1, 3)], ids=["gap-at-limit", "gap-over"])
def test_padding_of_max_skipped_gap_bytes_is_still_stepped_over(
    tmp_path: Path, extra: int, requests: int
) -> None:
    # one 300 KiB entry per block, padded with exactly MAX_SKIPPED_GAP (+ extra) bytes
    entry = 300 * KiB
    block = HEADER_LEN + 12 + entry + MAX_SKIPPED_GAP + extra
    store, entries = offloaded(tmp_path, [entry] * 3, block=block, chunk=64 * KiB)
    r = reader(store)
    assert list(r.read()) == entries
    assert len(r.index.blocks) == 3
    assert r.stats.requests == requests
    padding = 0 if requests == 3 else 2 * (MAX_SKIPPED_GAP + extra)
    assert r.stats.bytes_fetched == 3 * (HEADER_LEN + 12 + entry) + padding


def test_one_range_is_fetched_by_the_reader_two_by_a_read_ahead_worker(tmp_path: Path) -> None:
    # two 1 MiB blocks with ~424 KiB of padding each: two ranges for the whole ledger
    store, entries = offloaded(tmp_path, [600 * KiB] * 2, block=1024 * KiB, chunk=64 * KiB)
    counting = CountingStore(store)
    r = reader(counting, prefetch=1)
    assert r.read_entry(1) == entries[1][1]
    assert counting.threads["read_range"] == {threading.current_thread().name}
    counting.threads.clear()
    assert list(r.read()) == entries
    assert r.stats.requests == 3
    assert counting.threads["read_range"] == {"read-ahead_0"}


class GatedStore:
    """Every ranged GET but the first waits for ``gate``: what read-ahead has started before
    the reader takes its second range can be counted."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.started = 0
        self._changed = threading.Condition()

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        with self._changed:
            self.started += 1
            first = self.started == 1
            self._changed.notify_all()
        if not first:
            assert self.gate.wait(timeout=30)
        return self.inner.read_range(key, offset, length)

    def settled_at(self, count: int) -> int:
        """``started`` once it reached ``count`` and a short while passed with no more."""
        with self._changed:
            assert self._changed.wait_for(lambda: self.started >= count, timeout=30)
        time.sleep(0.05)
        return self.started


def test_read_ahead_keeps_prefetch_gets_in_flight_and_twice_as_many_ranges_ahead(
    tmp_path: Path,
) -> None:
    # twelve blocks, one range each (as test_large_gaps_split_ranges); the default prefetch
    store, entries = offloaded(tmp_path, [600 * KiB] * 12, block=1024 * KiB, chunk=64 * KiB)
    gated = GatedStore(store)
    read = reader(gated).read()
    assert next(read) == entries[0]
    # ranges 1..8 are queued (2 x 4 ahead); four workers hold four of them
    assert gated.settled_at(5) == 5
    gated.gate.set()
    # the queued ranges finish; nothing more is fetched until the reader moves on
    assert gated.settled_at(9) == 9
    assert list(read) == entries[1:]
    assert gated.started == 12


def test_single_entries_fetch_one_chunk(tmp_path: Path) -> None:
    store, entries = offloaded(tmp_path, [3000] * 3000, block=1024 * KiB, chunk=64 * KiB)
    r = reader(store)
    for entry_id in random.Random(1).sample(range(3000), 30):
        before = r.stats.bytes_fetched
        assert r.read_entry(entry_id) == entries[entry_id][1]
        assert r.stats.bytes_fetched - before <= 64 * KiB + 128 + 3012
    assert list(r.read(10, 20)) == entries[10:21]


def test_the_index_cache_keeps_the_most_recently_used_indexes(tmp_path: Path) -> None:
    store, _ = offloaded(tmp_path, [100] * 10, block=64 * KiB, chunk=16 * KiB)
    for key in ("a", "b", "c"):
        store.put(key, store.get("index"))
    counting = CountingStore(store)
    cache = IndexCache(capacity=2)
    first = cache.get(counting, "a")
    cache.get(counting, "b")
    assert cache.get(counting, "a") is first  # a hit, and now the most recently used
    cache.get(counting, "c")  # evicts b, the least recently used
    assert counting.requests["get"] == 3
    assert cache.get(counting, "a") is first
    assert counting.requests["get"] == 3
    cache.get(counting, "b")
    assert counting.requests["get"] == 4


def test_the_shared_index_cache_holds_256_indexes(tmp_path: Path) -> None:
    store, _ = offloaded(tmp_path, [100] * 10, block=64 * KiB, chunk=16 * KiB)
    index = store.get("index")
    keys = [f"index-{i}" for i in range(257)]
    for key in keys:
        store.put(key, index)
    counting = CountingStore(store)
    cache = IndexCache()
    for key in keys[:256]:
        cache.get(counting, key)
    cache.get(counting, keys[0])  # all 256 still cached
    assert counting.requests["get"] == 256
    cache.get(counting, keys[256])  # evicts keys[1]
    cache.get(counting, keys[0])
    assert counting.requests["get"] == 257
    cache.get(counting, keys[1])
    assert counting.requests["get"] == 258


def damaged_payload(store: FilesystemObjectStore, reader: TieredLedgerReader) -> int:
    """Flip a payload byte of the third chunk; the chunk's offset."""
    assert reader.index.chunks is not None
    chunk = reader.index.chunks[2]
    overwrite_object(store, "data", flip(chunk.offset + chunk.length - 1))
    return chunk.offset


def test_without_an_address_errors_name_the_ledger_the_index_records(tmp_path: Path) -> None:
    store, _ = offloaded(tmp_path, [1000] * 200, block=64 * KiB, chunk=16 * KiB)
    r = reader(store)
    at = damaged_payload(store, r)
    with pytest.raises(DamagedObjectError) as raised:
        list(r.read())
    assert (raised.value.topic, raised.value.ledger_id, raised.value.offset) == ("t", 1, at)
    assert str(raised.value).startswith(f"topic t ledger 1 object data offset {at}: ")


def test_the_callers_address_wins_over_the_one_the_index_records(tmp_path: Path) -> None:
    """An object that holds another ledger's bytes (a mixed-up key) is reported under the
    ledger that was being read: that is the one an operator looks up."""
    store, _ = offloaded(tmp_path, [1000] * 200, block=64 * KiB, chunk=16 * KiB)
    r = reader(store, topic="orders", ledger_id=7)
    at = damaged_payload(store, r)
    with pytest.raises(DamagedObjectError) as raised:
        list(r.read())
    assert (raised.value.topic, raised.value.ledger_id, raised.value.offset) == ("orders", 7, at)


def test_an_entry_before_the_first_block_is_not_found(tmp_path: Path) -> None:
    """A foreign (Pulsar) index may start at any entry id; below it there is nothing."""
    entries = [(i, bytes([i]) * 50) for i in range(5, 40)]
    blocks = pulsar_write_blocks(entries, 1024)
    store = FilesystemObjectStore(tmp_path / "objects")
    store.put("data", b"".join(raw for _, raw in blocks))
    store.put("index", pulsar_write_index(blocks, b""))
    r = reader(store, last_entry_id=39)
    assert r.read_entry(5) == entries[0][1]
    with pytest.raises(LookupError, match=r"^entry 2 not found in data$"):
        r.read_entry(2)


def test_frames_that_match_their_crcs_but_break_the_format_are_damage(tmp_path: Path) -> None:
    """A writer bug rather than a flipped bit: a frame names the wrong entry id, and the
    chunk and block CRCs were computed over those wrong bytes. The CRCs pass; parsing the
    chunk still fails, with the whole address."""
    store, _ = offloaded(tmp_path, [1000] * 200, block=64 * KiB, chunk=16 * KiB)
    index = decode_index(store.get("index"))
    assert index.chunks is not None and index.metadata is not None
    chunk = index.chunks[2]
    at = chunk.offset + (HEADER_LEN if chunk.starts_block else 0)  # its first frame
    data = bytearray(store.get("data"))
    struct.pack_into(">q", data, at + 4, 99_999)
    store.put("data", bytes(data))
    chunks = list(index.chunks)
    chunks[2] = dataclasses.replace(
        chunk, crc32c=crc32c.crc32c(bytes(data[chunk.offset : chunk.end]))
    )
    blocks = [
        dataclasses.replace(b, crc32c=crc32c.crc32c(bytes(data[b.offset : b.offset + b.length])))
        for b in index.blocks
    ]
    store.put("index", encode_index(index.metadata, blocks, chunks))
    r = reader(store, topic="orders", ledger_id=7)
    expected = f"topic orders ledger 7 object data offset {at}: entry id 99999 "
    with pytest.raises(DamagedObjectError, match="^" + expected.replace(".", r"\.")) as raised:
        list(r.read())
    assert raised.value.offset == at


HOLDS = "segment index holds entries 100..149 of ledger 7"


@pytest.fixture
def segment(tmp_path: Path) -> tuple[FilesystemObjectStore, list[tuple[int, bytes]]]:
    """A v2 segment holding ledger 3's entries 0..19, then ledger 7's 100..149 (returned)."""
    rng = random.Random(3)
    entries = [(3, i, rng.randbytes(100)) for i in range(20)]
    entries += [(7, i, rng.randbytes(rng.randint(0, 300))) for i in range(100, 150)]
    store = FilesystemObjectStore(tmp_path / "objects")
    encoded = Segment(entries, 4 * KiB, chunk_target=KiB)
    store.put("data", encoded.data)
    store.put("index", encoded.index(topic="t"))
    return store, [(e, p) for ledger_id, e, p in entries if ledger_id == 7]


@pytest.mark.parametrize(
    ("ledger_id", "first", "last", "refused"),
    [
        (7, None, None, None),  # all the segment holds
        (7, 110, None, None),
        (7, None, 120, None),  # narrowed at the end only
        (7, 110, 120, None),
        (7, 90, 120, f"{HOLDS}, the metadata store says 90..120"),
        (7, None, 150, f"{HOLDS}, the metadata store says 100..150"),
        (7, 130, 120, f"{HOLDS}, the metadata store says 130..120"),
        (8, None, None, "segment index: ledger 8 has no entries in this segment (ledgers 3, 7)"),
    ],
    ids=["all", "from", "to", "inside", "below", "past", "upside-down", "other-ledger"],
)
def test_a_segment_reader_serves_the_share_the_metadata_store_names(
    segment: tuple[FilesystemObjectStore, list[tuple[int, bytes]]],
    ledger_id: int,
    first: int | None,
    last: int | None,
    refused: str | None,
) -> None:
    """``first_entry_id``/``last_entry_id`` narrow the ledger's entries in the segment; a
    share the segment does not hold is damage of its index, at offset 0."""
    store, held = segment
    r = reader(
        store,
        segment=True,
        topic="orders",
        ledger_id=ledger_id,
        first_entry_id=first,
        last_entry_id=last,
    )
    if refused is not None:
        with pytest.raises(DamagedObjectError) as raised:
            list(r.read())
        assert (raised.value.key, raised.value.offset) == ("index", 0)
        assert (
            str(raised.value) == f"topic orders ledger {ledger_id} object index offset 0: {refused}"
        )
        return
    lo, hi = 100 if first is None else first, 149 if last is None else last
    assert (r.first_entry_id, r.last_entry_id) == (lo, hi)
    assert list(r.read()) == held[lo - 100 : hi - 100 + 1]
