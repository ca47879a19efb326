"""Reading one ledger whose entries streaming offload spread over several segments.

Each segment (v2: data object ``<uuid>``, index ``<uuid>-index``) holds a contiguous run
of the ledger's entries; the metadata store lists them as pieces in entry order. Every
piece is read by a TieredLedgerReader in segment mode, so the index of each segment is
fetched once (and shared, through the index cache, with the other ledgers of the
segment), one entry costs one ranged GET of its chunk, and damage is reported with the
same address as for a ledger object. This module only routes entry ranges to pieces.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from offloader.objectstore import ObjectStore
from offloader.read.batch import EntryBatch
from offloader.read.tiered import (
    DEFAULT_SEQUENTIAL_RANGE,
    INDEX_CACHE,
    IndexCache,
    ReadStats,
    TieredLedgerReader,
)


@dataclass(frozen=True)
class PieceSource:
    """A ledger's piece and where to read it: one segment's share of a ledger, the store and
    keys of the segment and which entries (inclusive) the metadata store says it serves.
    The segment may hold more of the ledger than that (a later segment took over the
    rest); only this range is read from it."""

    store: ObjectStore
    data_key: str
    index_key: str
    first_entry_id: int
    last_entry_id: int


class SegmentedLedgerReader:
    """Reads one ledger out of the segments holding it; the read methods TopicReader uses
    (``read``, ``read_entry``, ``read_batches``, ``last_entry_id``) behave as
    TieredLedgerReader's. Thread-safe; cheap to create (no I/O until the first read).

    ``pieces`` must cover the ledger's entries contiguously, in entry order: a gap, an
    overlap or a piece out of order is a ValueError naming the ledger and the positions.
    """

    def __init__(
        self,
        pieces: Sequence[PieceSource],
        *,
        ledger_id: int,
        topic: str | None = None,
        prefetch: int = 4,
        sequential_range: int = DEFAULT_SEQUENTIAL_RANGE,
        index_cache: IndexCache = INDEX_CACHE,
    ) -> None:
        _check_pieces(ledger_id, pieces)
        self.ledger_id = ledger_id
        self.topic = topic
        self.pieces = tuple(pieces)
        self.readers = tuple(
            TieredLedgerReader(
                p.store,
                p.data_key,
                p.index_key,
                topic=topic,
                ledger_id=ledger_id,
                first_entry_id=p.first_entry_id,
                last_entry_id=p.last_entry_id,
                prefetch=prefetch,
                sequential_range=sequential_range,
                index_cache=index_cache,
                segment=True,
            )
            for p in self.pieces
        )
        self._firsts = [p.first_entry_id for p in self.pieces]

    @property
    def first_entry_id(self) -> int:
        return self.pieces[0].first_entry_id

    @property
    def last_entry_id(self) -> int:
        """From the pieces (the metadata store); each piece's index is checked to hold its
        entries when that piece is first read."""
        return self.pieces[-1].last_entry_id

    @property
    def stats(self) -> ReadStats:
        """GETs of data bytes over all pieces so far (a snapshot; index GETs excluded)."""
        return ReadStats(
            requests=sum(r.stats.requests for r in self.readers),
            bytes_fetched=sum(r.stats.bytes_fetched for r in self.readers),
        )

    def read_entry(self, entry_id: int) -> bytes:
        self._check_range(entry_id, entry_id)
        return self.readers[self._piece_of(entry_id)].read_entry(entry_id)

    def read(
        self, first: int | None = None, last: int | None = None
    ) -> Iterator[tuple[int, bytes]]:
        """Entries ``first..last`` inclusive, in order, each payload a copy."""
        for batch in self.read_batches(first, last):
            yield from batch.entries()

    def read_batches(
        self, first: int | None = None, last: int | None = None
    ) -> Iterator[EntryBatch]:
        """Entries ``first..last`` inclusive (default: the whole ledger) as batches in
        order, piece after piece: a batch never spans two segments. The range is checked
        before anything is fetched."""
        first = self.first_entry_id if first is None else first
        last = self.last_entry_id if last is None else last
        self._check_range(first, last)
        return self._batches(first, last)

    def _batches(self, first: int, last: int) -> Iterator[EntryBatch]:
        for i in range(self._piece_of(first), len(self.pieces)):
            piece = self.pieces[i]
            if piece.first_entry_id > last:
                return
            lo, hi = max(first, piece.first_entry_id), min(last, piece.last_entry_id)
            yield from self.readers[i].read_batches(lo, hi)

    def _check_range(self, first: int, last: int) -> None:
        if first < self.first_entry_id or last > self.last_entry_id or first > last:
            raise ValueError(
                f"entries {first}..{last} are outside {self.first_entry_id}.."
                f"{self.last_entry_id} of ledger {self.ledger_id}"
            )

    def _piece_of(self, entry_id: int) -> int:
        return bisect.bisect_right(self._firsts, entry_id) - 1


def _check_pieces(ledger_id: int, pieces: Sequence[PieceSource]) -> None:
    """Pieces must tile the ledger's entries: a reader that silently skipped or repeated
    entries would hand out a ledger that never existed."""
    if not pieces:
        raise ValueError(f"ledger {ledger_id}: no pieces to read")
    for i, piece in enumerate(pieces):
        where = f"ledger {ledger_id}: piece {i} ({piece.data_key})"
        if not 0 <= piece.first_entry_id <= piece.last_entry_id:
            raise ValueError(
                f"{where} holds entries {piece.first_entry_id}..{piece.last_entry_id}: "
                "not a range of entry ids"
            )
        if i == 0:
            continue
        prev = pieces[i - 1]
        span = (
            f"{where} holds {ledger_id}:{piece.first_entry_id}..{ledger_id}:"
            f"{piece.last_entry_id}, piece {i - 1} ({prev.data_key}) "
            f"{ledger_id}:{prev.first_entry_id}..{ledger_id}:{prev.last_entry_id}"
        )
        if piece.first_entry_id < prev.first_entry_id:
            raise ValueError(f"{span}: pieces out of entry order")
        if piece.first_entry_id <= prev.last_entry_id:
            raise ValueError(
                f"{span}: they overlap on entries {piece.first_entry_id}.."
                f"{min(piece.last_entry_id, prev.last_entry_id)}"
            )
        if piece.first_entry_id > prev.last_entry_id + 1:
            raise ValueError(
                f"{span}: entries {prev.last_entry_id + 1}..{piece.first_entry_id - 1} "
                "are in no piece"
            )
