"""A read handle over one offloaded ledger: index fetched once, ranged GETs, read-ahead.

With our chunk table (docs/FORMAT.md) a single entry costs one ranged GET of its chunk
(about one read buffer); sequential reads merge neighbouring chunks into larger GETs and
keep ``prefetch`` of them in flight. A pure Pulsar index (no chunk table) is read block by
block, as Pulsar does.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from offloader.format import (
    ChunkRef,
    LedgerIndex,
    decode_block,
    decode_index,
    parse_chunk,
    verify_chunk,
)
from offloader.objectstore import ObjectStore

MiB = 1024 * 1024
DEFAULT_SEQUENTIAL_RANGE = 8 * MiB
MAX_SKIPPED_GAP = 256 * 1024  # padding a sequential range may fetch rather than split on


class IndexCache:
    """Decoded indexes by key. Keys are unique per attempt, so an entry never goes stale."""

    def __init__(self, capacity: int = 256) -> None:
        self._capacity = capacity
        self._items: OrderedDict[tuple[str, str], LedgerIndex] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: ObjectStore, key: str) -> LedgerIndex:
        cache_key = (store.url, key)
        with self._lock:
            if cache_key in self._items:
                self._items.move_to_end(cache_key)
                return self._items[cache_key]
        index = decode_index(store.get(key))
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


@dataclass(frozen=True)
class _Range:
    offset: int
    length: int
    chunks: tuple[ChunkRef, ...]


class TieredLedgerReader:
    """Reads entries of one offloaded ledger. Thread-safe; cheap to create."""

    def __init__(
        self,
        store: ObjectStore,
        data_key: str,
        index_key: str,
        *,
        prefetch: int = 4,
        sequential_range: int = DEFAULT_SEQUENTIAL_RANGE,
        index_cache: IndexCache = INDEX_CACHE,
    ) -> None:
        self.store = store
        self.data_key = data_key
        self.index_key = index_key
        self.prefetch = prefetch
        self.sequential_range = sequential_range
        self.stats = ReadStats()
        self._index_cache = index_cache
        self._index: LedgerIndex | None = None

    @property
    def index(self) -> LedgerIndex:
        if self._index is None:
            self._index = self._index_cache.get(self.store, self.index_key)
        return self._index

    @property
    def last_entry_id(self) -> int:
        meta = self.index.metadata
        if meta is not None:
            return meta.last_entry_id
        last = self.index.blocks[-1]
        return last.first_entry_id + self.index.block_entry_count(last) - 1

    def read_entry(self, entry_id: int) -> bytes:
        for _, payload in self.read(entry_id, entry_id):
            return payload
        raise LookupError(f"entry {entry_id} not found in {self.data_key}")

    def read(self, first: int = 0, last: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Entries ``first..last`` inclusive, in order."""
        last = self.last_entry_id if last is None else last
        if first < 0 or last > self.last_entry_id or first > last:
            raise ValueError(
                f"entries {first}..{last} are outside 0..{self.last_entry_id} of {self.data_key}"
            )
        if self.index.chunks is None:
            yield from self._read_blocks(first, last)
            return
        for entries in self._fetch_ahead(self._plan(first, last)):
            if entries[0][0] >= first and entries[-1][0] <= last:
                yield from entries  # the common case: a range inside the wanted entries
            else:
                yield from (e for e in entries if first <= e[0] <= last)

    def _plan(self, first: int, last: int) -> list[_Range]:
        """Merge neighbouring chunks into ranges of about ``sequential_range`` bytes.

        A range may step over a block's padding when it is small (fetching a few unused
        bytes is cheaper than another request), so ranges match raw GETs of that size.
        """
        ranges: list[_Range] = []
        group: list[ChunkRef] = []
        for chunk in self.index.chunks_between(first, last):
            if group:
                end = group[-1].offset + group[-1].length
                full = end - group[0].offset >= self.sequential_range
                if full or chunk.offset - end > MAX_SKIPPED_GAP:
                    ranges.append(_range_of(group))
                    group = []
            group.append(chunk)
        if group:
            ranges.append(_range_of(group))
        return ranges

    def _fetch(self, rng: _Range) -> bytes:
        """GET a range and verify its chunks' CRCs (in the fetching thread, without the GIL)."""
        data = self.store.read_range(self.data_key, rng.offset, rng.length)
        self.stats.add(len(data))
        for chunk in rng.chunks:
            verify_chunk(data, chunk, at=chunk.offset - rng.offset)
        return data

    @staticmethod
    def _decode(rng: _Range, data: bytes) -> list[tuple[int, bytes]]:
        entries: list[tuple[int, bytes]] = []
        for chunk in rng.chunks:
            entries.extend(parse_chunk(data, chunk, at=chunk.offset - rng.offset))
        return entries

    def _fetch_ahead(self, ranges: list[_Range]) -> Iterator[list[tuple[int, bytes]]]:
        """Decoded ranges in order. Workers only fetch, so ``prefetch`` GETs stay in flight
        while this thread decodes; up to twice that many ranges are fetched ahead."""
        if len(ranges) <= 1 or self.prefetch <= 0:
            for rng in ranges:
                yield self._decode(rng, self._fetch(rng))
            return
        window = 2 * self.prefetch
        with ThreadPoolExecutor(max_workers=self.prefetch, thread_name_prefix="read-ahead") as pool:
            pending: deque[tuple[_Range, Future[bytes]]] = deque()
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

    def _read_blocks(self, first: int, last: int) -> Iterator[tuple[int, bytes]]:
        index = self.index
        for block in index.blocks:
            count = index.block_entry_count(block)
            if block.first_entry_id + count - 1 < first or block.first_entry_id > last:
                continue
            data = self.store.read_range(self.data_key, block.offset, block.length)
            self.stats.add(len(data))
            for entry_id, payload in decode_block(
                data, entry_count=count, expected_crc=block.crc32c
            ):
                if first <= entry_id <= last:
                    yield entry_id, payload


def _range_of(chunks: list[ChunkRef]) -> _Range:
    end = chunks[-1].offset + chunks[-1].length
    return _Range(chunks[0].offset, end - chunks[0].offset, tuple(chunks))
