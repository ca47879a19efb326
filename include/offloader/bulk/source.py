"""Where an export reads entries: in batches (one buffer and offsets per ranged GET), so
Parquet columns are built from the fetched bytes, not from a Python object per entry."""

from __future__ import annotations

from collections.abc import Iterator

from offloader.bulk.plan import ExportSlice
from offloader.objectstore import ObjectStore
from offloader.read.batch import EntryBatch
from offloader.read.tiered import TieredLedgerReader


def read_slice(store: ObjectStore, part: ExportSlice, prefetch: int) -> Iterator[EntryBatch]:
    """The entries of ``part`` from its recorded store, CRC-checked by the reader: a ledger
    object, or the ledger's piece of a segment."""
    reader = TieredLedgerReader(
        store,
        part.data_key,
        part.index_key,
        topic=part.topic,
        ledger_id=part.ledger_id,
        last_entry_id=part.ledger_last_entry_id,
        prefetch=prefetch,
        segment=part.in_segment,
        first_entry_id=part.piece_first_entry_id,
    )
    return reader.read_batches(part.first_entry_id, part.last_entry_id)
