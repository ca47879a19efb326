"""The tiered reader's range planning: few large GETs for sequential reads, one small GET
for a single entry, and the same entries either way."""

from __future__ import annotations

import random
from pathlib import Path

from offloader.format import LedgerMetadata, encode_blocks, encode_index
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.read.tiered import MAX_SKIPPED_GAP, IndexCache, TieredLedgerReader

KiB = 1024


def offloaded(tmp_path: Path, sizes: list[int], block: int, chunk: int):  # type: ignore[no-untyped-def]
    rng = random.Random(5)
    entries = [(i, rng.randbytes(n)) for i, n in enumerate(sizes)]
    blocks = list(encode_blocks(iter(entries), max_block_size=block, chunk_target=chunk))
    store = FilesystemObjectStore(tmp_path / "objects")
    store.put("data", b"".join(bytes(b.data) for b in blocks))
    meta = LedgerMetadata(
        topic="t",
        ledger_id=1,
        entry_count=len(entries),
        last_entry_id=len(entries) - 1,
        length=sum(sizes),
        created_ms=0,
        sealed_ms=0,
    )
    chunks = [c for b in blocks for c in b.chunks]
    store.put("index", encode_index(meta, [b.ref for b in blocks], chunks))
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


def test_single_entries_fetch_one_chunk(tmp_path: Path) -> None:
    store, entries = offloaded(tmp_path, [3000] * 3000, block=1024 * KiB, chunk=64 * KiB)
    r = reader(store)
    for entry_id in random.Random(1).sample(range(3000), 30):
        before = r.stats.bytes_fetched
        assert r.read_entry(entry_id) == entries[entry_id][1]
        assert r.stats.bytes_fetched - before <= 64 * KiB + 128 + 3012
    assert list(r.read(10, 20)) == entries[10:21]
