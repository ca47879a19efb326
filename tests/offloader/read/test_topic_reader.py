"""The topic reader in process: range checks, which copy a read uses (read priority, an
explicit source), falling back mid-read without repeating or losing an entry, and the
checksum's exact definition. Both backend pairings."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import struct
import threading
from collections.abc import Iterator

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.counting import CountingStore
from fixtures.damage import flip, overwrite_object
from fixtures.faults import OnlyStore
from fixtures.rewrites import gc
from fixtures.streamed import streamed_topic
from offloader.exceptions import (
    DamagedObjectError,
    HotLedgerMissingError,
    ObjectNotFoundError,
    StoreUnavailableError,
    TopicDeletedError,
    TrimmedError,
)
from offloader.hottier import HotLedgerStore
from offloader.metadata import OffloadMode, Position, schema
from offloader.objectstore import ObjectStore
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.read.topic_reader import (
    Checksum,
    Source,
    TopicReader,
    ledger_object_reader,
    tiered_ledger_reader,
)
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.retention.trim import delete_topic, trim_topic
from offloader.rewrite.to_v1 import migrate_to_v1
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader

Entries = list[tuple[int, bytes]]


def offloaded_topic(rt: Runtime, read_priority: str, mode: str = "ledger") -> tuple[int, Entries]:
    """One offloaded ledger of 12 entries whose hot copy is still there: in objects of its
    own, or (mode "stream") in a segment of the smallest parts the store allows."""
    part = max(4096, rt.objects.capabilities.min_part_size)
    streaming = dict(streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    policy = streaming if mode == "stream" else {}
    make_topic(rt, read_priority=read_priority, deletion_lag_seconds=3600, **policy)
    (ledger_id,) = produce_ledgers(rt, "orders", [(12, 500)])
    if mode == "stream":
        StreamingOffloader(rt).run_pass("orders", close_now=True)
    else:
        LedgerOffloader(rt).offload_ledger("orders", ledger_id)
    assert rt.metadata.get_ledger("orders", ledger_id).offload_mode == mode
    return ledger_id, list(rt.hot.read("orders", ledger_id))


class VanishingHot:
    """The hot tier, but a read stops with HotLedgerMissingError after ``after`` entries:
    the hot copy went while it was being read (a file cannot be made to vanish between two
    entries of an open reader on demand)."""

    def __init__(self, hot: HotLedgerStore, after: int) -> None:
        self._hot = hot
        self._after = after
        self.started_at: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._hot, name)

    def read(
        self, topic: str, ledger_id: int, first: int = 0, last: int | None = None
    ) -> Iterator[tuple[int, bytes]]:
        self.started_at.append(first)
        for n, entry in enumerate(self._hot.read(topic, ledger_id, first, last)):
            if n == self._after:
                raise HotLedgerMissingError(f"hot copy of {topic}/{ledger_id} vanished")
            yield entry


class ClosedStores:
    """A store registry that cannot open any store (its credentials are gone)."""

    def get(self, store_id: int | None, what: str) -> ObjectStore:
        raise StoreUnavailableError(f"store {store_id} for {what}: no credentials")


def counting_stores(rt: Runtime, ledger_id: int) -> tuple[Runtime, CountingStore]:
    """The runtime with the ledger's store counted."""
    store_id = rt.metadata.get_ledger("orders", ledger_id).store_id
    counting = CountingStore(rt.stores.get(store_id, "test"))
    return dataclasses.replace(rt, stores=OnlyStore(counting)), counting  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("first", "last"),
    [(-1, 3), (4, 3), (0, 12), (12, None)],
    ids=["negative-first", "first-after-last", "last-past-the-end", "first-past-the-end"],
)
def test_a_range_outside_the_ledger_is_refused_with_both_ranges(
    runtime: Runtime, first: int, last: int | None
) -> None:
    make_topic(runtime)
    (ledger_id,) = produce_ledgers(runtime, "orders", [(12, 10)])
    shown = 11 if last is None else last
    message = f"entries {first}..{shown} are outside 0..11 of ledger orders/{ledger_id}"
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        list(TopicReader(runtime).read("orders", ledger_id, first, last))


def test_the_edges_of_a_ledger_are_inside_it(runtime: Runtime) -> None:
    make_topic(runtime)
    (ledger_id,) = produce_ledgers(runtime, "orders", [(12, 10)])
    entries = list(runtime.hot.read("orders", ledger_id))
    reader = TopicReader(runtime)
    assert list(reader.read("orders", ledger_id, 11)) == entries[11:]
    assert list(reader.read("orders", ledger_id, 0, 0)) == entries[:1]
    assert list(reader.read("orders", ledger_id, 5, 5)) == entries[5:6]


@pytest.mark.parametrize(
    ("priority", "store_reads"), [("tiered-first", True), ("hot-first", False)]
)
def test_read_priority_picks_the_copy(runtime: Runtime, priority: str, store_reads: bool) -> None:
    ledger_id, entries = offloaded_topic(runtime, priority)
    rt, counting = counting_stores(runtime, ledger_id)
    assert list(TopicReader(rt).read("orders", ledger_id)) == entries
    assert (counting.total > 0) is store_reads
    # an explicit source overrides the priority
    before = counting.total
    assert list(TopicReader(rt).read("orders", ledger_id, source=Source.HOT)) == entries
    assert counting.total == before
    assert list(TopicReader(rt).read("orders", ledger_id, source=Source.TIERED)) == entries
    assert counting.total > before


def test_a_read_that_loses_the_hot_copy_midway_resumes_from_the_tiered_one(
    runtime: Runtime,
) -> None:
    ledger_id, entries = offloaded_topic(runtime, "hot-first")
    vanishing = VanishingHot(runtime.hot, after=4)
    rt = dataclasses.replace(runtime, hot=vanishing)  # type: ignore[arg-type]
    assert list(TopicReader(rt).read("orders", ledger_id, 2, 10)) == entries[2:11]
    assert vanishing.started_at == [2]


@pytest.mark.parametrize("mode", ["ledger", "stream"])
def test_a_store_that_cannot_be_opened_falls_back_to_the_hot_copy(
    runtime: Runtime, mode: str
) -> None:
    ledger_id, entries = offloaded_topic(runtime, "tiered-first", mode)
    pieces = runtime.metadata.segments.pieces("orders", ledger_id)  # none in mode ledger
    rt = dataclasses.replace(runtime, stores=ClosedStores())  # type: ignore[arg-type]
    assert list(TopicReader(rt).read("orders", ledger_id)) == entries
    # the registry is told which ledger (or segment) wanted the store, so its error can name it
    wanted = f"segment {pieces[0].segment.segment_id}" if pieces else f"ledger orders/{ledger_id}"
    named = rf"^store \d+ for {wanted}: no credentials$"
    with pytest.raises(StoreUnavailableError, match=named):
        list(TopicReader(rt).read("orders", ledger_id, source=Source.TIERED))


def test_when_the_last_copy_fails_too_its_error_is_raised(runtime: Runtime) -> None:
    ledger_id, _ = offloaded_topic(runtime, "tiered-first")
    ledger = runtime.metadata.get_ledger("orders", ledger_id)
    assert ledger.data_key is not None
    runtime.objects.delete_many([ledger.data_key])  # gone behind the metadata's back
    vanishing = VanishingHot(runtime.hot, after=3)
    rt = dataclasses.replace(runtime, hot=vanishing)  # type: ignore[arg-type]
    read = TopicReader(rt).read("orders", ledger_id)
    with pytest.raises(HotLedgerMissingError, match="vanished"):
        list(read)
    assert vanishing.started_at == [0]


def test_an_explicit_source_that_is_missing_is_named(runtime: Runtime) -> None:
    make_topic(runtime, deletion_lag_seconds=0)
    one, two = produce_ledgers(runtime, "orders", [(3, 10), (3, 10)])
    reader = TopicReader(runtime)
    with pytest.raises(ObjectNotFoundError, match=f"^ledger orders/{one} is not offloaded$"):
        list(reader.read("orders", one, source=Source.TIERED))
    LedgerOffloader(runtime).offload_ledger("orders", two)
    delete_hot_copies(runtime.metadata, runtime.hot, "orders")
    missing = f"^ledger orders/{two} has no hot copy \\(hot state deleted\\)$"
    with pytest.raises(HotLedgerMissingError, match=missing):
        list(reader.read("orders", two, source=Source.HOT))
    assert list(reader.read("orders", two, source="tiered")) == list(reader.read("orders", two))


def expected_checksum(ledgers: dict[int, Entries]) -> Checksum:
    """The documented definition, computed independently: SHA-256 over (ledger id int64,
    entry id int64, length int32, payload) of every entry, ledgers and entries in order."""
    digest = hashlib.sha256()
    for ledger_id in sorted(ledgers):
        for entry_id, payload in ledgers[ledger_id]:
            digest.update(struct.pack(">qqi", ledger_id, entry_id, len(payload)) + payload)
    entries = [p for e in ledgers.values() for _, p in e]
    return Checksum(digest.hexdigest(), len(entries), sum(len(p) for p in entries))


def sealed_empty_ledger(rt: Runtime) -> int:
    epoch = rt.metadata.claim_writer("orders").writer_epoch
    ledger = rt.metadata.allocate_ledger("orders", epoch)
    return rt.metadata.seal_ledger(ledger, 0, 0, epoch).ledger_id


def test_the_checksum_covers_every_entry_by_its_definition(runtime: Runtime) -> None:
    """A one-entry ledger counts, an empty one is skipped, the ledgers after it count."""
    rt = runtime
    make_topic(rt)
    first = produce_ledgers(rt, "orders", [(7, 300), (1, 50)])
    empty = sealed_empty_ledger(rt)
    (last,) = produce_ledgers(rt, "orders", [(4, 200)], seed=8)
    LedgerOffloader(rt).offload_ledger("orders", first[0])
    ledgers = {i: list(rt.hot.read("orders", i)) for i in [*first, last]}
    assert len(ledgers[first[1]]) == 1 and empty < last
    expected = expected_checksum(ledgers)
    assert expected.entries == 12 and expected.bytes > 0
    reader = TopicReader(rt)
    assert reader.checksum("orders") == expected
    assert reader.checksum("orders", Source.HOT) == expected
    with pytest.raises(ObjectNotFoundError, match="is not offloaded"):
        reader.checksum("orders", Source.TIERED)


@pytest.mark.parametrize("source", list(Source), ids=lambda s: s.value)
def test_read_entry_returns_that_entry_from_the_asked_copy(
    runtime: Runtime, source: Source
) -> None:
    ledger_id, entries = offloaded_topic(runtime, "tiered-first")
    rt, counting = counting_stores(runtime, ledger_id)
    reader = TopicReader(rt)
    for entry_id in (0, 5, 11):
        assert reader.read_entry("orders", ledger_id, entry_id, source) == entries[entry_id][1]
    assert (counting.total > 0) is (source is not Source.HOT)
    with pytest.raises(
        ValueError, match=rf"^entries 12\.\.12 are outside 0\.\.11 of ledger orders/{ledger_id}$"
    ):
        reader.read_entry("orders", ledger_id, 12, source)


@pytest.mark.parametrize(("mode", "prefetch"), [("ledger", 0), ("ledger", 1), ("stream", 0)])
def test_the_read_prefetch_setting_decides_which_threads_fetch(
    runtime: Runtime, mode: str, prefetch: int
) -> None:
    """read_prefetch reaches the tiered reader, of a segment too: 0 fetches in the reading
    thread, 1 in one read-ahead worker (the reader's own default is 4 workers)."""
    make_topic(runtime, streaming=mode == "stream")  # a segment of 8 MiB parts: one piece
    (ledger_id,) = produce_ledgers(runtime, "orders", [(24, 1_000_000)])  # about 12 MB
    if mode == "stream":
        StreamingOffloader(runtime).run_pass("orders", close_now=True)
    else:
        LedgerOffloader(runtime).offload_ledger("orders", ledger_id)
    assert runtime.metadata.get_ledger("orders", ledger_id).offload_mode == mode
    entries = list(runtime.hot.read("orders", ledger_id))
    counting = CountingStore(runtime.objects)  # where new offloads and segments go
    settings = runtime.settings.model_copy(update={"read_prefetch": prefetch})
    rt = dataclasses.replace(runtime, stores=OnlyStore(counting), settings=settings)  # type: ignore[arg-type]
    assert list(TopicReader(rt).read("orders", ledger_id, source=Source.TIERED)) == entries
    assert counting.requests["read_range"] >= 2  # more than one range: the read-ahead path
    expected = threading.current_thread().name if prefetch == 0 else "read-ahead_0"
    assert counting.threads["read_range"] == {expected}


def test_reads_below_the_topics_start_are_refused_naming_it(runtime: Runtime) -> None:
    """A trim inside the second ledger: the first is refused whole, the second below the
    start entry; from the start entry on it reads, and later ledgers read from entry 0.
    (The CLI's rendering of the same error is tested in retention/test_trim.py.)"""
    make_topic(runtime)
    ids = produce_ledgers(runtime, "orders", [(3, 10), (4, 10), (3, 10)])
    entries = {i: list(runtime.hot.read("orders", i)) for i in ids}
    start = Position(ledger_id=ids[1], entry_id=2)
    trim_topic(runtime, "orders", start)
    reader = TopicReader(runtime)

    def refused(what: str) -> str:
        text = f"{what} of topic 'orders' is below the topic's start {start}: trimmed"
        return f"^{re.escape(text)}$"

    with pytest.raises(TrimmedError, match=refused(f"ledger {ids[0]}")):
        list(reader.read("orders", ids[0]))
    with pytest.raises(TrimmedError, match=refused(f"ledger {ids[0]} entry 0")):
        list(reader.read("orders", ids[0], 0))
    with pytest.raises(TrimmedError, match=refused(f"ledger {ids[1]} entry 1")):
        reader.read_entry("orders", ids[1], 1)
    assert list(reader.read("orders", ids[1])) == entries[ids[1]][2:]
    assert list(reader.read("orders", ids[1], 2, 2)) == entries[ids[1]][2:3]
    assert list(reader.read("orders", ids[2])) == entries[ids[2]]
    assert list(reader.read("orders", ids[2], 0, 0)) == entries[ids[2]][:1]
    kept = {ids[1]: entries[ids[1]][2:], ids[2]: entries[ids[2]]}
    assert reader.checksum("orders") == expected_checksum(kept)


def test_a_deleted_topic_is_not_read(runtime: Runtime) -> None:
    make_topic(runtime)
    (ledger_id,) = produce_ledgers(runtime, "orders", [(3, 10)])
    delete_topic(runtime, "orders")
    reader = TopicReader(runtime)
    message = "^topic 'orders' was deleted; nothing of it is readable$"
    with pytest.raises(TopicDeletedError, match=message):
        reader.read_entry("orders", ledger_id, 0)
    with pytest.raises(TopicDeletedError, match=message):
        reader.checksum("orders")


def test_an_open_ledger_reads_what_its_hot_copy_holds(runtime: Runtime) -> None:
    """An open ledger's length is its hot copy's; one allocated but not yet created in the
    hot tier is empty: nothing for the default range, an error for an explicit one."""
    make_topic(runtime)
    epoch = runtime.metadata.claim_writer("orders").writer_epoch
    ledger_id = runtime.metadata.allocate_ledger("orders", epoch).ledger_id
    reader = TopicReader(runtime)
    assert list(reader.read("orders", ledger_id)) == []
    empty = f"^ledger {ledger_id} of topic 'orders' is empty$"
    with pytest.raises(ValueError, match=empty):
        list(reader.read("orders", ledger_id, 0))
    with pytest.raises(ValueError, match=empty):
        list(reader.read("orders", ledger_id, last=0))
    assert reader.checksum("orders") == expected_checksum({})

    writable = runtime.hot.create("orders", ledger_id)
    payloads = [b"a" * 5, b"", b"c" * 7]
    for payload in payloads:
        writable.append(payload)
    writable.sync()
    try:
        assert list(reader.read("orders", ledger_id)) == list(enumerate(payloads))
        assert reader.read_entry("orders", ledger_id, 2) == payloads[2]
        outside = rf"^entries 1\.\.3 are outside 0\.\.2 of ledger orders/{ledger_id}$"
        with pytest.raises(ValueError, match=outside):
            list(reader.read("orders", ledger_id, 1, 3))
        assert reader.checksum("orders") == expected_checksum(
            {ledger_id: list(enumerate(payloads))}
        )
    finally:
        writable.close()


def test_a_ledger_below_the_start_is_refused_before_the_trim_marks_it(runtime: Runtime) -> None:
    """A trim moves the start first and marks the ledgers below it after (in batches, or
    never if it crashes in between): the start alone refuses them."""
    make_topic(runtime)
    ids = produce_ledgers(runtime, "orders", [(3, 10), (3, 10)])
    start = Position(ledger_id=ids[1], entry_id=0)
    runtime.metadata.retention.move_start(runtime.metadata.get_topic("orders"), start)
    assert runtime.metadata.get_ledger("orders", ids[0]).is_live  # not marked yet
    text = f"ledger {ids[0]} of topic 'orders' is below the topic's start {start}: trimmed"
    with pytest.raises(TrimmedError, match=f"^{re.escape(text)}$"):
        list(TopicReader(runtime).read("orders", ids[0]))


def test_an_index_that_disagrees_with_the_ledger_row_is_refused(runtime: Runtime) -> None:
    """The reader is given the ledger row's last entry: an index (with a valid CRC) that
    records another one, here the index of the next ledger, is damage, named as such."""
    make_topic(runtime)
    ids = produce_ledgers(runtime, "orders", [(5, 100), (8, 100)])
    for ledger_id in ids:
        LedgerOffloader(runtime).offload_ledger("orders", ledger_id)
    first, second = (runtime.metadata.get_ledger("orders", i) for i in ids)
    assert first.index_key is not None and second.index_key is not None
    runtime.objects.put(first.index_key, runtime.objects.get(second.index_key))
    address = f"topic orders ledger {ids[0]} object {first.index_key} offset 0"
    message = f"^{re.escape(address)}: index says last entry 7, the metadata store 4$"
    with pytest.raises(DamagedObjectError, match=message):
        list(TopicReader(runtime).read("orders", ids[0], source=Source.TIERED))


@pytest.mark.parametrize("missing", [["data_key"], ["index_key"], ["data_key", "index_key"]])
def test_a_ledger_without_both_objects_of_its_own_gets_no_object_reader(
    runtime: Runtime, missing: list[str]
) -> None:
    """Either key missing is refused at once (both missing: a streamed ledger's row)."""
    ledger_id, _ = offloaded_topic(runtime, "tiered-first")
    ledger = runtime.metadata.get_ledger("orders", ledger_id)
    row = ledger.model_copy(update=dict.fromkeys(missing))
    store = runtime.stores.get(ledger.store_id, "test")
    message = rf"^ledger orders/{ledger_id} has no objects of its own$"
    with pytest.raises(ValueError, match=message):
        ledger_object_reader(store, row, 0)


def test_a_damaged_segment_index_is_named_with_the_topic_and_ledger(runtime: Runtime) -> None:
    """The segment's index fails its CRC before it says which topic it holds: the address
    comes from the ledger row."""
    ledger_id, _ = offloaded_topic(runtime, "tiered-first", "stream")
    (piece,) = runtime.metadata.segments.pieces("orders", ledger_id)
    key = piece.segment.index_key
    overwrite_object(runtime.objects, key, flip(40))
    address = rf"^topic orders ledger {ledger_id} object {re.escape(key)} offset \d+: "
    with pytest.raises(DamagedObjectError, match=address):
        list(TopicReader(runtime).read("orders", ledger_id, source=Source.TIERED))


def test_a_streamed_ledger_whose_segments_are_gone_is_not_found(runtime: Runtime) -> None:
    """A row read before the ledger was trimmed and its segment deleted: no segment holds
    the ledger now and it has no objects of its own, which is named (not looked up again
    and again)."""
    ledger_id, _ = offloaded_topic(runtime, "tiered-first", "stream")
    stale = runtime.metadata.get_ledger("orders", ledger_id)
    (after,) = produce_ledgers(runtime, "orders", [(1, 10)], seed=2)
    trim_topic(runtime, "orders", Position(ledger_id=after, entry_id=0))
    assert finish_deleted_ledgers(runtime) == 1
    message = f"^ledger orders/{ledger_id} is streamed but no offloaded segment holds it$"
    with pytest.raises(ObjectNotFoundError, match=message):
        tiered_ledger_reader(runtime, stale)


# a ledger that lies in two segments needs parts smaller than its entries: the file store
# takes 4 KiB parts, S3's 5 MiB minimum puts these small ledgers in one segment
@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
@pytest.mark.parametrize("cut", ["inside-a-piece", "where-a-piece-starts"])
def test_a_streamed_ledger_reads_only_its_sealed_entries_when_a_segment_holds_more(
    runtime: Runtime, cut: str
) -> None:
    """A ledger sealed shorter than what was streamed of it (a torn tail cut after a
    crash; here the row is edited): the entries past its count, in the segment it shares
    or in a segment of their own, count for nothing."""
    ids = streamed_topic(runtime, "orders", 3)
    ledger_id = next(i for i in ids if len(runtime.metadata.segments.pieces("orders", i)) == 2)
    second = runtime.metadata.segments.pieces("orders", ledger_id)[1]
    count = second.first_entry_id - (1 if cut == "inside-a-piece" else 0)
    L = schema.ledgers
    with runtime.metadata.transaction() as conn:
        conn.execute(
            L.update()
            .where(L.c.topic == "orders", L.c.ledger_id == ledger_id)
            .values(entry_count=count)
        )
    sealed = list(runtime.hot.read("orders", ledger_id))[:count]
    reader = tiered_ledger_reader(runtime, runtime.metadata.get_ledger("orders", ledger_id))
    assert reader.last_entry_id == count - 1
    assert list(reader.read()) == sealed
    assert list(TopicReader(runtime).read("orders", ledger_id, source=Source.TIERED)) == sealed


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)  # as above
def test_a_ledger_trimmed_while_it_is_read_is_not_followed_to_its_new_objects(
    runtime: Runtime,
) -> None:
    """Mid-read, the ledger moves to v1 objects of its own, its segments are deleted and it
    is trimmed: the read stops with the segment's ObjectNotFoundError instead of reading
    the entries of a trimmed ledger from the objects still queued for deletion."""
    ids = streamed_topic(runtime, "orders", 3)
    ledger_id = next(i for i in ids if len(runtime.metadata.segments.pieces("orders", i)) == 2)
    second = runtime.metadata.segments.pieces("orders", ledger_id)[1].segment
    hot = list(runtime.hot.read("orders", ledger_id))
    entries = TopicReader(runtime).read("orders", ledger_id, source=Source.TIERED)
    assert next(entries) == hot[0]  # the first segment's share is fetched, not the second's
    migrate_to_v1(runtime, ["orders"])
    gc(runtime)  # no grace: the segments are gone
    (after,) = produce_ledgers(runtime, "orders", [(1, 10)], seed=2)
    trim_topic(runtime, "orders", Position(ledger_id=after, entry_id=0))
    ledger = runtime.metadata.get_ledger("orders", ledger_id)
    assert ledger.offload_mode is OffloadMode.LEDGER and not ledger.is_live
    assert ledger.data_key in {info.key for info in runtime.objects.list()}
    with pytest.raises(ObjectNotFoundError, match=re.escape(second.segment_id)):
        list(entries)
