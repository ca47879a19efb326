"""Damaged offloaded objects fail loudly with their whole address: topic, ledger, object
key and offset, through the tiered reader, the topic reader and the CLI, on both backends."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from fixtures.cli import run_cli
from fixtures.damage import flip, offloaded_ledger, overwrite_object, pack_at, small_range_reader
from offloader.exceptions import DamagedObjectError, FormatError
from offloader.format import HEADER_LEN, ChunkRef, LedgerIndex, decode_index
from offloader.metadata import Ledger
from offloader.read.tiered import IndexCache, TieredLedgerReader
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime

KiB = 1024


@dataclass(frozen=True)
class Damage:
    """What was broken: the object, the offset the error must name, what it must say, and
    an entry whose read must fail."""

    key: str
    offset: int
    what: str
    entry_id: int

    def message(self, ledger: Ledger) -> str:
        address = f"topic {ledger.topic} ledger {ledger.ledger_id} object {self.key} "
        return re.escape(f"{address}offset {self.offset}: ") + self.what


def _payload_chunk(rt: Runtime, ledger: Ledger, index: LedgerIndex) -> ChunkRef:
    """A chunk in the second half of the object whose first entry has payload bytes."""
    assert index.chunks is not None and len(index.chunks) >= 8
    sizes = {i: len(p) for i, p in rt.hot.read(ledger.topic, ledger.ledger_id)}
    return next(c for c in index.chunks[len(index.chunks) // 2 :] if sizes[c.first_entry_id])


def flipped_payload_byte(rt: Runtime, ledger: Ledger, index: LedgerIndex) -> Damage:
    chunk = _payload_chunk(rt, ledger, index)
    payload_at = chunk.offset + (HEADER_LEN if chunk.starts_block else 0) + 12
    overwrite_object(rt.objects, ledger.data_key, flip(payload_at))
    return Damage(ledger.data_key, chunk.offset, "CRC mismatch", chunk.first_entry_id)


def truncated_data_object(rt: Runtime, ledger: Ledger, index: LedgerIndex) -> Damage:
    chunk = _payload_chunk(rt, ledger, index)
    cut = chunk.offset + chunk.length // 2
    overwrite_object(rt.objects, ledger.data_key, lambda data: data[:cut])
    return Damage(ledger.data_key, cut, "truncated chunk", chunk.last_entry_id)


def bad_index_magic(rt: Runtime, ledger: Ledger, index: LedgerIndex) -> Damage:
    overwrite_object(rt.objects, ledger.index_key, flip(1))
    return Damage(ledger.index_key, 0, "bad index magic 0xDE46DE47", 0)


def bad_index_length(rt: Runtime, ledger: Ledger, index: LedgerIndex) -> Damage:
    size = rt.objects.stat(ledger.index_key).size
    overwrite_object(rt.objects, ledger.index_key, pack_at(">i", 4, size + 8))
    return Damage(ledger.index_key, size, f"truncated index: index_len says {size + 8}", 0)


def truncated_index(rt: Runtime, ledger: Ledger, index: LedgerIndex) -> Damage:
    size = rt.objects.stat(ledger.index_key).size
    overwrite_object(rt.objects, ledger.index_key, lambda data: data[:-10])
    return Damage(ledger.index_key, size - 10, f"truncated index: index_len says {size}", 0)


DAMAGES: dict[str, Callable[[Runtime, Ledger, LedgerIndex], Damage]] = {
    "flipped-payload-byte": flipped_payload_byte,
    "truncated-data-object": truncated_data_object,
    "bad-index-magic": bad_index_magic,
    "bad-index-length": bad_index_length,
    "truncated-index": truncated_index,
}


def damaged(rt: Runtime, kind: str) -> tuple[Ledger, Damage]:
    ledger = offloaded_ledger(rt)
    assert ledger.data_key is not None and ledger.index_key is not None
    # several 128 KiB ranges, so a sequential read keeps fetches in flight past the damage
    assert rt.objects.stat(ledger.data_key).size > 4 * 128 * KiB
    index = decode_index(rt.objects.get(ledger.index_key))
    return ledger, DAMAGES[kind](rt, ledger, index)


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_damage_fails_reads_with_its_address(runtime: Runtime, kind: str) -> None:
    ledger, damage = damaged(runtime, kind)
    with pytest.raises(DamagedObjectError, match=damage.message(ledger)) as raised:
        list(small_range_reader(runtime, ledger).read())
    error = raised.value
    assert (error.topic, error.ledger_id, error.key, error.offset) == (
        ledger.topic,
        ledger.ledger_id,
        damage.key,
        damage.offset,
    )
    assert type(error.__cause__) is FormatError  # the codec's own words, kept
    with pytest.raises(DamagedObjectError, match=damage.message(ledger)) as raised:
        list(small_range_reader(runtime, ledger).read_batches())
    assert (raised.value.key, raised.value.offset) == (damage.key, damage.offset)
    with pytest.raises(DamagedObjectError, match=damage.message(ledger)):
        small_range_reader(runtime, ledger).read_entry(damage.entry_id)
    with pytest.raises(DamagedObjectError, match=damage.message(ledger)):
        list(TopicReader(runtime).read(ledger.topic, ledger.ledger_id, source=Source.TIERED))


def test_damage_is_local_to_its_chunk(runtime: Runtime) -> None:
    ledger, damage = damaged(runtime, "flipped-payload-byte")
    hot = dict(runtime.hot.read(ledger.topic, ledger.ledger_id))
    reader = small_range_reader(runtime, ledger)
    assert reader.read_entry(0) == hot[0]
    assert reader.read_entry(ledger.entry_count - 1) == hot[ledger.entry_count - 1]
    with pytest.raises(DamagedObjectError, match="CRC mismatch"):
        reader.read_entry(damage.entry_id)


@pytest.mark.parametrize(
    "kind", ["flipped-payload-byte", "truncated-data-object", "bad-index-magic"]
)
@pytest.mark.parametrize("command", ["read", "checksum"])
def test_cli_reports_damage_in_one_line(runtime: Runtime, kind: str, command: str) -> None:
    ledger, damage = damaged(runtime, kind)
    args = ["--ledger", str(ledger.ledger_id)] if command == "read" else []
    done = run_cli(runtime.settings, command, ledger.topic, *args, "--source", "tiered", ok=False)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert re.fullmatch("error: " + damage.message(ledger) + ".*", lines[0]), lines[0]


def test_index_that_disagrees_with_the_metadata_store_is_refused(runtime: Runtime) -> None:
    ledger = offloaded_ledger(runtime, count=20, max_size=100)
    assert ledger.data_key is not None and ledger.index_key is not None
    reader = TieredLedgerReader(
        runtime.objects,
        ledger.data_key,
        ledger.index_key,
        topic=ledger.topic,
        ledger_id=ledger.ledger_id,
        last_entry_id=ledger.entry_count,  # one more than the index records
        index_cache=IndexCache(),
    )
    address = f"topic {ledger.topic} ledger {ledger.ledger_id} object {ledger.index_key} offset 0"
    with pytest.raises(DamagedObjectError, match=re.escape(address) + ": index says last entry 19"):
        list(reader.read())
