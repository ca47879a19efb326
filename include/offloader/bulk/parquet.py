"""An export slice as Parquet: one row per entry. The format stores no per-entry time, so
``publish_time`` is null (docs/OPERATIONS.md says what is known: the ledger's creation time
bounds its entries' publish times from below)."""

from __future__ import annotations

import io
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from offloader.bulk.plan import ExportSlice
from offloader.read.batch import EntryBatch

SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("entry_id", pa.int64(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
        pa.field("publish_time", pa.timestamp("ms", tz="UTC"), nullable=True),
    ]
)


def slice_table(part: ExportSlice, batches: Iterable[EntryBatch]) -> pa.Table:
    """The rows of ``part``; ValueError if the entries read are not exactly its range (a
    short read must never pass for a complete export). Payloads go from the fetched buffers
    into one Arrow column with a single copy."""
    records: list[pa.RecordBatch] = []
    expected = part.first_entry_id
    for batch in batches:
        if len(batch) and batch.first_entry_id != expected:
            break
        expected += len(batch)
        records.append(batch.to_arrow())
    if expected != part.last_entry_id + 1:
        raise ValueError(
            f"ledger {part.topic}/{part.ledger_id}: read entries {part.first_entry_id}.."
            f"{expected - 1}, expected {part.first_entry_id}..{part.last_entry_id}"
        )
    rows = expected - part.first_entry_id
    return pa.table(
        [
            pa.array([part.topic] * rows, pa.string()),
            pa.array([part.ledger_id] * rows, pa.int64()),
            pa.chunked_array([r.column(0) for r in records], pa.int64()),
            pa.chunked_array([r.column(1) for r in records], pa.binary_view()).cast(pa.binary()),
            pa.nulls(rows, pa.timestamp("ms", tz="UTC")),
        ],
        schema=SCHEMA,
    )


def parquet_bytes(table: pa.Table) -> bytes:
    """One Parquet file in memory (a slice is bounded by ``slice_bytes``)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()
