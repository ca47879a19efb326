"""The batch read API on both backends: read_batches() gives exactly the hot tier's entries
for any range (whole ledger, partial, on and across chunk boundaries), one batch per ranged
GET whose payloads are views of the fetched bytes, never the bytes of a chunk that failed
its CRC."""

from __future__ import annotations

import pytest

from fixtures.batches import flattened
from fixtures.damage import flip, offloaded_ledger, overwrite_object, small_range_reader
from offloader.exceptions import DamagedObjectError
from offloader.format import ChunkRef
from offloader.metadata import Ledger
from offloader.read.batch import EntryBatch
from offloader.read.tiered import TieredLedgerReader
from offloader.runtime import Runtime

KiB = 1024
Entries = list[tuple[int, bytes]]


@pytest.fixture(params=[False, True], ids=["any-sizes", "fixed-sizes"])
def offloaded(runtime: Runtime, request: pytest.FixtureRequest) -> tuple[Ledger, Entries]:
    """Entries of any size, or fixed-size records (every chunk parsed by the fast path)."""
    ledger = offloaded_ledger(runtime, fixed=request.param)
    return ledger, list(runtime.hot.read(ledger.topic, ledger.ledger_id))


def test_batches_hold_the_hot_tiers_entries_as_views_of_one_get_each(
    runtime: Runtime, offloaded: tuple[Ledger, Entries]
) -> None:
    ledger, entries = offloaded
    reader = small_range_reader(runtime, ledger)
    batches = list(reader.read_batches())
    assert flattened(batches) == entries
    assert len(batches) == reader.stats.requests > 4  # one batch per ranged GET
    for batch in batches:
        views = list(batch.payloads())
        assert all(view.obj is batch.buffer for view in views)  # no payload copied
        assert len(batch) == len(views) == len(batch.starts) == len(batch.lengths)
        assert batch.last_entry_id == batch.entry_ids[-1]
    # consecutive batches continue each other's ids
    assert [b.first_entry_id for b in batches[1:]] == [b.last_entry_id + 1 for b in batches[:-1]]
    assert list(small_range_reader(runtime, ledger).read()) == entries


def chunk_edges(reader: TieredLedgerReader) -> list[ChunkRef]:
    chunks = reader.index.chunks
    assert chunks is not None and len(chunks) > 6
    return list(chunks)


def test_partial_ranges_on_and_across_chunk_boundaries(
    runtime: Runtime, offloaded: tuple[Ledger, Entries]
) -> None:
    ledger, entries = offloaded
    chunks = chunk_edges(small_range_reader(runtime, ledger))
    c2, c3, c5 = chunks[2], chunks[3], chunks[5]
    last = len(entries) - 1
    ranges = [
        (c3.first_entry_id, c3.last_entry_id),  # exactly one chunk
        (c2.last_entry_id, c3.first_entry_id),  # the two entries either side of a boundary
        (c2.first_entry_id + 1, c5.last_entry_id - 1),  # inside chunks at both ends
        (c3.first_entry_id, c3.first_entry_id),  # one entry, first of its chunk
        (c3.last_entry_id, c3.last_entry_id),  # one entry, last of its chunk
        (0, 0),
        (last, last),
        (5, last),
        (0, last - 5),
    ]
    for first, end in ranges:
        reader = small_range_reader(runtime, ledger)
        batches = list(reader.read_batches(first, end))
        assert flattened(batches) == entries[first : end + 1], (first, end)
        assert batches[0].first_entry_id == first and batches[-1].last_entry_id == end
        assert (
            list(small_range_reader(runtime, ledger).read(first, end)) == entries[first : end + 1]
        )
    payload = small_range_reader(runtime, ledger).read_entry(c3.last_entry_id)
    assert payload == entries[c3.last_entry_id][1]
    assert type(payload) is bytes  # a copy: it does not pin the fetched range


def test_a_range_outside_the_ledger_is_refused(
    runtime: Runtime, offloaded: tuple[Ledger, Entries]
) -> None:
    ledger, entries = offloaded
    reader = small_range_reader(runtime, ledger)
    last = len(entries) - 1
    for first, end in ((-1, 3), (0, last + 1), (7, 6)):
        with pytest.raises(ValueError, match=rf"^entries {first}\.\.{end} are outside 0\.\.{last}"):
            next(reader.read_batches(first, end))
    assert reader.stats.requests == 0


def test_a_flipped_byte_stops_the_batches_before_its_chunk(runtime: Runtime) -> None:
    ledger = offloaded_ledger(runtime)
    reader = small_range_reader(runtime, ledger)
    chunk = chunk_edges(reader)[len(chunk_edges(reader)) // 2]
    assert ledger.data_key is not None
    overwrite_object(runtime.objects, ledger.data_key, flip(chunk.end - 1))
    entries = list(runtime.hot.read(ledger.topic, ledger.ledger_id))
    handed_out: list[EntryBatch] = []
    address = f"topic {ledger.topic} ledger {ledger.ledger_id} object {ledger.data_key} "
    with pytest.raises(DamagedObjectError, match=f"^{address}offset {chunk.offset}: CRC mis"):
        handed_out.extend(small_range_reader(runtime, ledger).read_batches())
    # what came before the damaged chunk's range was handed out, and was right
    assert handed_out and handed_out[-1].last_entry_id < chunk.first_entry_id
    assert flattened(handed_out) == entries[: handed_out[-1].last_entry_id + 1]
