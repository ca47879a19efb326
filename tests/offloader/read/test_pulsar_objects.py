"""Plain Pulsar v1 objects (no chunk table, no CRCs), written by the independent reference
writer over an offloaded ledger's keys, read back through the tiered and topic readers; and
the damage Pulsar v1 can reveal without CRCs (headers, framing, padding, length) is caught."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from fixtures.batches import flattened
from fixtures.damage import flip, offloaded_ledger, overwrite_object, pack_at
from fixtures.pulsar_v1 import pulsar_write_blocks, pulsar_write_index
from offloader.exceptions import DamagedObjectError
from offloader.format import BlockRef, LedgerMetadata, decode_index, encode_metadata
from offloader.metadata import Ledger
from offloader.read.tiered import IndexCache, TieredLedgerReader
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime

KiB = 1024
BLOCK = 64 * KiB
FOREIGN_METADATA = bytes.fromhex("0801100218c8012203666f6f")  # protobuf-ish, not ours

Entries = list[tuple[int, bytes]]


def as_pulsar_object(
    rt: Runtime, ours: bool, fixed: bool = False
) -> tuple[Ledger, Entries, list[BlockRef]]:
    """An offloaded ledger whose objects are replaced by the reference writer's: its
    blocks, and a v1 index holding our metadata record or foreign (BookKeeper) bytes.
    Entries of any size up to 3000 bytes, or all of 3000 (``fixed``: the parser's fast
    path takes whole blocks of equal frames)."""
    ledger = offloaded_ledger(rt, count=300, max_size=3000, fixed=fixed)
    entries = list(rt.hot.read(ledger.topic, ledger.ledger_id))
    blocks = pulsar_write_blocks(entries, BLOCK)
    assert len(blocks) >= 4
    size = sum(len(p) for _, p in entries)
    meta = LedgerMetadata(
        ledger.topic, ledger.ledger_id, len(entries), len(entries) - 1, size, 0, 0
    )
    index = pulsar_write_index(blocks, encode_metadata(meta) if ours else FOREIGN_METADATA)
    assert ledger.data_key is not None and ledger.index_key is not None
    overwrite_object(rt.objects, ledger.data_key, lambda _: b"".join(raw for _, raw in blocks))
    overwrite_object(rt.objects, ledger.index_key, lambda _: index)
    decoded = decode_index(index)
    assert decoded.chunks is None and (decoded.metadata is None) is not ours
    return ledger, entries, list(decoded.blocks)


def tiered(rt: Runtime, ledger: Ledger, **kwargs: object) -> TieredLedgerReader:
    assert ledger.data_key is not None and ledger.index_key is not None
    return TieredLedgerReader(
        rt.objects, ledger.data_key, ledger.index_key, index_cache=IndexCache(), **kwargs
    )


@pytest.mark.parametrize("fixed", [False, True], ids=["any-sizes", "fixed-sizes"])
@pytest.mark.parametrize("ours", [False, True], ids=["foreign-metadata", "our-metadata"])
def test_pulsar_objects_read_back_identical(runtime: Runtime, ours: bool, fixed: bool) -> None:
    ledger, entries, blocks = as_pulsar_object(runtime, ours, fixed)
    # without the metadata store's entry count, the last block is scanned the Pulsar way
    reader = tiered(runtime, ledger)
    assert reader.last_entry_id == len(entries) - 1
    assert list(reader.read()) == entries
    assert list(reader.read(37, 251)) == entries[37:252]  # across several blocks
    for entry_id in (0, 150, len(entries) - 1):
        assert reader.read_entry(entry_id) == entries[entry_id][1]
    hinted = tiered(runtime, ledger, last_entry_id=len(entries) - 1)
    assert list(hinted.read(len(entries) - 5)) == entries[-5:]

    # the batch API: one batch per block, payloads viewed in the block's bytes
    batched = tiered(runtime, ledger)
    batches = list(batched.read_batches())
    assert [b.first_entry_id for b in batches] == [b.first_entry_id for b in blocks]
    assert flattened(batches) == entries
    assert all(p.obj is b.buffer for b in batches for p in b.payloads())
    # foreign metadata: one more GET, the last block scanned for its entry count
    assert batched.stats.requests == len(blocks) + (0 if ours else 1)
    partial = list(tiered(runtime, ledger).read_batches(37, 251))
    assert flattened(partial) == entries[37:252]

    topic_reader = TopicReader(runtime)
    read = topic_reader.read(ledger.topic, ledger.ledger_id, source=Source.TIERED)
    assert list(read) == entries
    hot = topic_reader.checksum(ledger.topic, Source.HOT)
    assert topic_reader.checksum(ledger.topic, Source.TIERED) == hot


Edit = Callable[[bytes], bytes]


def _frames_end(blocks: list[BlockRef], entries: Entries, i: int) -> int:
    """Where block i's frames end (its padding starts)."""
    last = blocks[i + 1].first_entry_id if i + 1 < len(blocks) else len(entries)
    framed = sum(12 + len(p) for _, p in entries[blocks[i].first_entry_id : last])
    return blocks[i].offset + 128 + framed


def bad_block_magic(blocks: list[BlockRef], entries: Entries) -> tuple[Edit, str, int]:
    return flip(blocks[1].offset + 2), "bad block magic 0xFBDBAACB", blocks[1].offset


def wrong_first_entry_id_in_header(
    blocks: list[BlockRef], entries: Entries
) -> tuple[Edit, str, int]:
    b = blocks[2]
    what = f"block header first_entry_id 7, index says {b.first_entry_id}"
    return pack_at(">q", b.offset + 20, 7), what, b.offset + 20


def wrong_entry_id_in_frame(blocks: list[BlockRef], entries: Entries) -> tuple[Edit, str, int]:
    b = blocks[1]
    what = f"entry id 99999 in block starting at entry {b.first_entry_id}"
    return pack_at(">q", b.offset + 128 + 4, 99999), what, b.offset + 128


def longer_entry_length(blocks: list[BlockRef], entries: Entries) -> tuple[Edit, str, int]:
    """The frames after a wrong length no longer line up: some check downstream fails."""
    b = blocks[1]
    length = len(entries[b.first_entry_id][1])
    return pack_at(">i", b.offset + 128, length + 1), "", -1


def damaged_padding(blocks: list[BlockRef], entries: Entries) -> tuple[Edit, str, int]:
    start = _frames_end(blocks, entries, 0)
    assert start < blocks[1].offset, "block 0 has no padding to damage"
    return flip(blocks[1].offset - 1), "are not padding", start


def truncated_data_object(blocks: list[BlockRef], entries: Entries) -> tuple[Edit, str, int]:
    last = blocks[-1]
    cut = last.offset + last.length // 2
    return (lambda data: data[:cut]), "truncated block", cut


def overrunning_frame_in_last_block(
    blocks: list[BlockRef], entries: Entries
) -> tuple[Edit, str, int]:
    at = blocks[-1].offset + 128
    return pack_at(">i", at, 1 << 20), "overruns", at


def _lost_last_entry(blocks: list[BlockRef], entries: Entries, i: int) -> tuple[Edit, int]:
    """Block i's last frame becomes padding: the block holds one entry fewer than the
    index (or the metadata store) says. The edit, and where the missing frame was."""
    following = blocks[i + 1].first_entry_id if i + 1 < len(blocks) else len(entries)
    at = _frames_end(blocks, entries, i) - 12 - len(entries[following - 1][1])
    end = blocks[i].offset + blocks[i].length
    padding = (bytes.fromhex("FEDCDEAD") * ((end - at) // 4 + 1))[: end - at]
    return (lambda data: data[:at] + padding + data[end:]), at


def lost_entry_in_a_middle_block(blocks: list[BlockRef], entries: Entries) -> tuple[Edit, str, int]:
    edit, at = _lost_last_entry(blocks, entries, 1)
    return edit, "overruns", at


PULSAR_DAMAGES = [
    bad_block_magic,
    wrong_first_entry_id_in_header,
    wrong_entry_id_in_frame,
    longer_entry_length,
    damaged_padding,
    truncated_data_object,
    overrunning_frame_in_last_block,
    lost_entry_in_a_middle_block,
]


@pytest.mark.parametrize("fixed", [False, True], ids=["any-sizes", "fixed-sizes"])
@pytest.mark.parametrize("damage", PULSAR_DAMAGES, ids=lambda d: d.__name__)
def test_damage_in_pulsar_blocks_is_detected(
    runtime: Runtime,
    damage: Callable[[list[BlockRef], Entries], tuple[Edit, str, int]],
    fixed: bool,
) -> None:
    """Pulsar v1 has no CRC: a flipped payload byte cannot be seen. Everything around the
    payloads can, and is: the reader never returns entries from a broken structure. The
    same damage is named at the same offset whether the frames are of any size or all of
    one (where the parser's fast path would otherwise take the whole block)."""
    ledger, entries, blocks = as_pulsar_object(runtime, ours=False, fixed=fixed)
    edit, what, offset = damage(blocks, entries)
    assert ledger.data_key is not None
    overwrite_object(runtime.objects, ledger.data_key, edit)
    address = f"topic {ledger.topic} ledger {ledger.ledger_id} object {ledger.data_key} offset "
    pattern = (
        re.escape(address) + (str(offset) if offset >= 0 else r"\d+") + ": .*" + re.escape(what)
    )
    readers = {
        "topic reader": lambda: TopicReader(runtime).read(
            ledger.topic, ledger.ledger_id, source=Source.TIERED
        ),
        "tiered reader, no entry count": lambda: tiered(
            runtime, ledger, topic=ledger.topic, ledger_id=ledger.ledger_id
        ).read(),
        "batches, no entry count": lambda: tiered(
            runtime, ledger, topic=ledger.topic, ledger_id=ledger.ledger_id
        ).read_batches(),
    }
    for name, read in readers.items():
        with pytest.raises(DamagedObjectError, match=pattern) as raised:
            list(read())
        error = raised.value
        if offset < 0:  # somewhere in the damaged block
            assert blocks[1].offset <= error.offset < blocks[2].offset, (name, str(error))


@pytest.mark.parametrize("ours", [False, True], ids=["foreign-metadata", "our-metadata"])
def test_a_last_block_short_of_the_recorded_entries_is_refused(
    runtime: Runtime, ours: bool
) -> None:
    """Where the entry count is known (the metadata store's, or our metadata record in the
    index), a last block that holds fewer entries is damage, not a shorter ledger."""
    ledger, entries, blocks = as_pulsar_object(runtime, ours)
    edit, at = _lost_last_entry(blocks, entries, len(blocks) - 1)
    assert ledger.data_key is not None
    overwrite_object(runtime.objects, ledger.data_key, edit)
    address = f"topic {ledger.topic} ledger {ledger.ledger_id} object {ledger.data_key} "
    pattern = re.escape(f"{address}offset {at}: ") + ".*overruns"
    known = None if ours else len(entries) - 1  # ours: the index itself records it
    reader = tiered(
        runtime, ledger, topic=ledger.topic, ledger_id=ledger.ledger_id, last_entry_id=known
    )
    with pytest.raises(DamagedObjectError, match=pattern):
        list(reader.read())
    with pytest.raises(DamagedObjectError, match=pattern):
        list(TopicReader(runtime).read(ledger.topic, ledger.ledger_id, source=Source.TIERED))


def test_a_range_fetches_only_the_blocks_that_hold_it(runtime: Runtime) -> None:
    ledger, entries, blocks = as_pulsar_object(runtime, ours=False)
    reader = tiered(runtime, ledger, last_entry_id=len(entries) - 1)
    first, last = blocks[1].first_entry_id, blocks[3].first_entry_id - 1  # blocks 1 and 2
    assert list(reader.read(first, last)) == entries[first : last + 1]
    assert reader.stats.requests == 2
    assert reader.stats.bytes_fetched == blocks[1].length + blocks[2].length
    assert reader.read_entry(blocks[2].first_entry_id) == entries[blocks[2].first_entry_id][1]
    assert reader.stats.requests == 3
