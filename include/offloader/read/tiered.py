"""A read handle over one offloaded ledger: index fetched once, ranged GETs, read-ahead.

With our chunk table (docs/FORMAT.md) a single entry costs one ranged GET of its chunk
(about one read buffer); sequential reads merge neighbouring chunks into larger GETs and
keep ``prefetch`` of them in flight. A pure Pulsar index (no chunk table) is read block by
block, as Pulsar does. Each GET becomes one EntryBatch (read/batch.py: the fetched bytes
plus payload offsets); ``read()`` copies entries out of the same batches.

The same reader reads one ledger's share of a streaming (v2) segment (``segment=True``):
the segment index is cached like a ledger index and narrowed to the ledger, and blocks
carry the v2 magic and the ledger id, which is checked. Everything else (planning,
read-ahead, CRCs, error addresses) is one code path. read/segmented.py joins the shares of
a ledger spread over several segments.

Damage found in stored bytes is raised as DamagedObjectError with its whole address (topic,
ledger, object key, offset): the format codec knows offsets, this reader knows the rest.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from offloader.exceptions import DamagedObjectError, FormatError
from offloader.format import (
    BLOCK_MAGIC,
    SEGMENT_BLOCK_MAGIC,
    BlockRef,
    LedgerIndex,
    SegmentIndex,
    block_offsets,
    chunk_offsets,
    decode_index,
    decode_segment_index,
    verify_chunk,
)
from offloader.format.parsing import offsets_arrays
from offloader.format.segment_parsing import check_block_ledger
from offloader.objectstore import ObjectStore
from offloader.read.batch import EntryBatch
from offloader.read.ranges import DEFAULT_SEQUENTIAL_RANGE, Range, plan_ranges

_Index = TypeVar("_Index", LedgerIndex, SegmentIndex)


class IndexCache:
    """Decoded indexes by key. Keys are unique per attempt (per segment for v2), so an
    entry never goes stale; a segment's index is cached whole, once for all its ledgers."""

    def __init__(self, capacity: int = 256) -> None:
        self._capacity = capacity
        self._items: OrderedDict[tuple[str, str], LedgerIndex | SegmentIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: ObjectStore, key: str) -> LedgerIndex:
        """A v1 ledger index."""
        return self._get(store, key, decode_index, LedgerIndex)

    def get_segment(self, store: ObjectStore, key: str) -> SegmentIndex:
        """A v2 segment index (every ledger of the segment: narrow it with ``.ledger``)."""
        return self._get(store, key, decode_segment_index, SegmentIndex)

    def _get(
        self, store: ObjectStore, key: str, decode: Callable[[bytes], _Index], kind: type[_Index]
    ) -> _Index:
        cache_key = (store.url, key)
        with self._lock:
            hit = self._items.get(cache_key)
            if isinstance(hit, kind):  # the other kind: decoding refuses it by its magic
                self._items.move_to_end(cache_key)
                return hit
        index = decode(store.get(key))
        with self._lock:
            self._items[cache_key] = index
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return index


INDEX_CACHE = IndexCache()


@dataclass
class ReadStats:
    requests: int = 0
    bytes_fetched: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.requests += 1
            self.bytes_fetched += nbytes


class TieredLedgerReader:
    """Reads entries of one offloaded ledger. Thread-safe; cheap to create.

    ``topic`` and ``ledger_id`` address errors (the index's own metadata is used when they
    are not given). ``last_entry_id`` comes from the metadata store: a foreign (Pulsar)
    index does not record it, and where our index does, the two must agree.

    ``segment=True`` reads ledger ``ledger_id`` (required) out of a v2 segment's objects.
    ``first_entry_id`` and ``last_entry_id`` then say which of the ledger's entries in the
    segment this reader serves (default: all of them); the segment must hold them, else
    its index disagrees with the metadata store.
    """

    def __init__(
        self,
        store: ObjectStore,
        data_key: str,
        index_key: str,
        *,
        topic: str | None = None,
        ledger_id: int | None = None,
        last_entry_id: int | None = None,
        prefetch: int = 4,
        sequential_range: int = DEFAULT_SEQUENTIAL_RANGE,
        index_cache: IndexCache = INDEX_CACHE,
        segment: bool = False,
        first_entry_id: int | None = None,
    ) -> None:
        if segment and ledger_id is None:
            raise ValueError(f"reading segment {data_key} needs the ledger_id to read")
        if not segment and first_entry_id is not None:
            raise ValueError("first_entry_id narrows a segment's share of a ledger: segment=True")
        self.store = store
        self.data_key = data_key
        self.index_key = index_key
        self.topic = topic
        self.ledger_id = ledger_id
        self.segment = segment
        self._magic = SEGMENT_BLOCK_MAGIC if segment else BLOCK_MAGIC
        self._known_first = first_entry_id
        self._known_last = last_entry_id
        self._scanned_last: int | None = None
        self.prefetch = prefetch
        self.sequential_range = sequential_range
        self.stats = ReadStats()
        self._index_cache = index_cache
        self._index: LedgerIndex | None = None

    @property
    def index(self) -> LedgerIndex:
        """The ledger's index (for a segment, its view of this ledger), fetched once."""
        if self._index is None:
            try:
                index = self._fetch_index()
            except FormatError as err:
                raise self._damaged(err, self.index_key, 0) from err
            self._check_range(index)
            self._index = index
        return self._index

    def _fetch_index(self) -> LedgerIndex:
        if not self.segment:
            return self._index_cache.get(self.store, self.index_key)
        assert self.ledger_id is not None
        segment = self._index_cache.get_segment(self.store, self.index_key)
        try:
            return segment.ledger(self.ledger_id)
        except LookupError as err:  # the metadata store says it is there: they disagree
            raise FormatError(f"segment index: {err}", offset=0) from err

    @property
    def first_entry_id(self) -> int:
        """The first entry served: 0 for a ledger object; a segment's first of the ledger
        unless the metadata store narrowed it."""
        if not self.segment:
            return 0
        return self.index.first_entry_id if self._known_first is None else self._known_first

    @property
    def last_entry_id(self) -> int:
        """From the metadata store (checked against the index); else from the index; else
        by scanning the last block."""
        index = self.index
        if self._known_last is not None:
            return self._known_last
        if index.last_entry_id is not None:
            return index.last_entry_id
        if self._scanned_last is None:
            self._scanned_last = self._block_batch(index.blocks[-1], None).last_entry_id
        return self._scanned_last

    def _check_range(self, index: LedgerIndex) -> None:
        """The metadata store and the index must agree on the entries: on the last one for
        a ledger object; a segment must hold every entry the reader is to serve."""
        known, recorded = self._known_last, index.last_entry_id
        if not self.segment:
            if known is not None and recorded is not None and known != recorded:
                raise self._damaged(
                    FormatError(f"index says last entry {recorded}, the metadata store {known}"),
                    self.index_key,
                    0,
                )
            return
        assert recorded is not None  # a segment index always records it
        held = (index.first_entry_id, recorded)
        wanted = (
            held[0] if self._known_first is None else self._known_first,
            held[1] if known is None else known,
        )
        if not held[0] <= wanted[0] <= wanted[1] <= held[1]:
            raise self._damaged(
                FormatError(
                    f"segment index holds entries {held[0]}..{held[1]} of ledger "
                    f"{self.ledger_id}, the metadata store says {wanted[0]}..{wanted[1]}"
                ),
                self.index_key,
                0,
            )

    def _damaged(self, err: FormatError, key: str, offset: int) -> DamagedObjectError:
        """The codec's error with the address only the reader knows."""
        meta = self._index.metadata if self._index is not None else None
        topic = self.topic if self.topic is not None or meta is None else meta.topic
        ledger_id = self.ledger_id if self.ledger_id is not None or meta is None else meta.ledger_id
        return DamagedObjectError(
            str(err),
            topic=topic,
            ledger_id=ledger_id,
            key=key,
            offset=err.offset if err.offset is not None else offset,
        )

    def read_entry(self, entry_id: int) -> bytes:
        for batch in self.read_batches(entry_id, entry_id):
            return bytes(batch.payload(0))
        raise LookupError(f"entry {entry_id} not found in {self.data_key}")

    def read(
        self, first: int | None = None, last: int | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """Entries ``first..last`` inclusive, in order, each payload a copy: the batches of
        :meth:`read_batches`, one tuple per entry."""
        for batch in self.read_batches(first, last):
            yield from batch.entries()

    def read_batches(
        self, first: int | None = None, last: int | None = None
    ) -> Iterator[EntryBatch]:
        """Entries ``first..last`` inclusive (default: all served) as batches in order: one
        per ranged GET (one per block without a chunk table), every chunk CRC-verified and
        parsed before its batch is handed out. Payloads are views into the fetched bytes
        (read/batch.py)."""
        lowest = self.first_entry_id
        first = lowest if first is None else first
        last = self.last_entry_id if last is None else last
        if first < lowest or last > self.last_entry_id or first > last:
            raise ValueError(
                f"entries {first}..{last} are outside {lowest}..{self.last_entry_id} "
                f"of {self.data_key}"
            )
        if self.index.chunks is None:
            yield from self._read_blocks(first, last)
            return
        for batch in self._fetch_ahead(self._plan(first, last)):
            yield batch.between(first, last)  # itself when inside the wanted entries

    def _plan(self, first: int, last: int) -> list[Range]:
        """The ranged GETs for entries ``first..last`` (read/ranges.py): about
        ``sequential_range`` bytes each, following the blocks (the object's parts)."""
        return plan_ranges(self.index.chunks_between(first, last), self.sequential_range)

    def _fetch(self, rng: Range) -> bytes:
        """GET a range: all a fetching thread does, so its next GET starts at once, as in a
        raw read with as many in flight."""
        data = self.store.read_range(self.data_key, rng.offset, rng.length)
        self.stats.add(len(data))
        return data

    def _decode(self, rng: Range, data: bytes) -> EntryBatch:
        """The range's chunks, each CRC-checked (without the GIL: the fetching threads keep
        going) and parsed, as one batch over ``data`` (no payload copied)."""
        into = offsets_arrays()
        for chunk in rng.chunks:
            at = chunk.offset - rng.offset
            try:
                verify_chunk(data, chunk, at=at)
                chunk_offsets(data, chunk, at=at, into=into, magic=self._magic)
                if chunk.starts_block:
                    self._check_block_ledger(data, at, chunk.offset)
            except FormatError as err:
                raise self._damaged(err, self.data_key, chunk.offset) from err
        return EntryBatch(data, rng.chunks[0].first_entry_id, *into)

    def _fetch_ahead(self, ranges: list[Range]) -> Iterator[EntryBatch]:
        """Decoded ranges in order. Workers only fetch, so ``prefetch`` GETs stay in flight
        while this thread checks and parses; up to twice that many ranges are fetched
        ahead."""
        if len(ranges) <= 1 or self.prefetch <= 0:
            for rng in ranges:
                yield self._decode(rng, self._fetch(rng))
            return
        window = 2 * self.prefetch
        with ThreadPoolExecutor(max_workers=self.prefetch, thread_name_prefix="read-ahead") as pool:
            pending: deque[tuple[Range, Future[bytes]]] = deque()
            upcoming = iter(ranges)
            try:
                for rng in itertools.islice(upcoming, window):
                    pending.append((rng, pool.submit(self._fetch, rng)))
                while pending:
                    rng, future = pending.popleft()
                    data = future.result()
                    nxt = next(upcoming, None)
                    if nxt is not None:
                        pending.append((nxt, pool.submit(self._fetch, nxt)))
                    yield self._decode(rng, data)
            finally:
                for _, future in pending:
                    future.cancel()

    def _read_blocks(self, first: int, last: int) -> Iterator[EntryBatch]:
        """Without a chunk table: whole blocks, each checked as far as Pulsar v1 allows."""
        blocks = self.index.blocks
        for i, block in enumerate(blocks):
            is_last = i + 1 == len(blocks)
            if block.first_entry_id > last or (
                not is_last and blocks[i + 1].first_entry_id <= first
            ):
                continue
            count = None if is_last else blocks[i + 1].first_entry_id - block.first_entry_id
            if is_last and (self.index.last_entry_id is not None or self._known_last is not None):
                recorded = self.index.last_entry_id  # a segment's share may stop short of it
                last_id = self.last_entry_id if recorded is None else recorded
                count = last_id - block.first_entry_id + 1
            yield self._block_batch(block, count).between(first, last)

    def _block_batch(self, block: BlockRef, count: int | None) -> EntryBatch:
        """One GET of a whole block, parsed; ``count`` None scans to the padding."""
        data = self.store.read_range(self.data_key, block.offset, block.length)
        self.stats.add(len(data))
        try:
            if len(data) != block.length:
                raise FormatError(
                    f"truncated block: {len(data)} bytes of {block.length} at offset "
                    f"{block.offset}, the data object is shorter than its index says",
                    offset=block.offset + len(data),
                )
            first, starts, lengths = block_offsets(
                data,
                entry_count=count,
                expected_crc=block.crc32c,
                first_entry_id=block.first_entry_id,
                offset=block.offset,
                magic=self._magic,
            )
            self._check_block_ledger(data, 0, block.offset)
        except FormatError as err:
            raise self._damaged(err, self.data_key, block.offset) from err
        return EntryBatch(data, first, starts, lengths)

    def _check_block_ledger(self, data: bytes, at: int, origin: int) -> None:
        """A v2 block header at ``data[at:]`` (``origin`` in the object) names our ledger:
        a segment's index pointing into another ledger's block is damage, not data."""
        if self.segment:
            assert self.ledger_id is not None
            check_block_ledger(data, at, self.ledger_id, origin)
