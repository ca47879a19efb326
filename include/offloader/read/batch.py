"""Entries of a ledger as one buffer plus offsets: what bulk consumers read.

A batch is one ranged GET (or one whole block of a pure Pulsar object), CRC-verified and
parsed, holding the fetched bytes as they arrived and, per entry, where its payload starts
and how long it is. Payloads are handed out as memoryview slices of that buffer: nothing
is copied per entry. Entry ids are consecutive (the format guarantees it and the parser
checks it), so they are a ``range``.

Lifetime: the buffer is an immutable ``bytes`` object that the reader never reuses. A
payload view keeps the whole buffer (a few MiB) alive for as long as the view lives, so
a consumer that keeps a few payloads long after the batch copies them (``bytes(view)``).
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from offloader.format.parsing import entries_at


@dataclass(frozen=True, slots=True)
class EntryBatch:
    """Entries ``first_entry_id ..`` whose payloads are ``buffer[starts[i]:starts[i] +
    lengths[i]]``."""

    buffer: bytes
    first_entry_id: int
    starts: array[int]  # 'q': payload offsets into buffer
    lengths: array[int]  # 'q': payload lengths

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def entry_ids(self) -> range:
        return range(self.first_entry_id, self.first_entry_id + len(self.starts))

    @property
    def last_entry_id(self) -> int:
        """The id of the last entry (``first_entry_id - 1`` for an empty batch)."""
        return self.first_entry_id + len(self.starts) - 1

    def payload(self, i: int) -> memoryview:
        """The payload of the ``i``-th entry of the batch (not entry id ``i``), as a view."""
        start = self.starts[i]
        return memoryview(self.buffer)[start : start + self.lengths[i]]

    def payloads(self) -> Iterator[memoryview]:
        """Every payload in order, as views into the buffer."""
        ends = map(operator.add, self.starts, self.lengths)
        return map(memoryview(self.buffer).__getitem__, map(slice, self.starts, ends))

    def entries(self) -> Iterator[tuple[int, bytes]]:
        """(entry id, payload) with each payload copied: ``TieredLedgerReader.read()``."""
        return entries_at(self.buffer, self.first_entry_id, self.starts, self.lengths)

    def between(self, first: int, last: int) -> EntryBatch:
        """The entries with ids in ``first..last``: the same buffer, sliced offsets."""
        lo = max(first - self.first_entry_id, 0)
        # never below lo: a negative bound would count from the end of the arrays
        hi = max(lo, min(last - self.first_entry_id + 1, len(self.starts)))
        if lo == 0 and hi == len(self.starts):
            return self
        return EntryBatch(
            self.buffer, self.first_entry_id + lo, self.starts[lo:hi], self.lengths[lo:hi]
        )

    def to_arrow(self) -> Any:
        """A pyarrow RecordBatch (``entry_id`` int64, ``payload`` binary_view) whose payload
        column points into this batch's buffer: only the 16-byte views are built (payloads of
        12 bytes or less are inlined in them, as Arrow's format demands). Needs pyarrow and
        numpy (the ``arrow`` extra)."""
        try:
            import numpy as np
            import pyarrow as pa
        except ImportError as err:  # optional: the library itself does not need them
            raise ImportError(
                f"EntryBatch.to_arrow needs pyarrow and numpy (pip install 'offloader[arrow]'): "
                f"{err}"
            ) from err
        if len(self.buffer) > 2**31 - 1:
            raise ValueError(f"a buffer of {len(self.buffer)} bytes is too large for Arrow views")
        n = len(self.starts)
        starts = np.frombuffer(self.starts, dtype=np.int64).astype(np.int32)
        lengths = np.frombuffer(self.lengths, dtype=np.int64).astype(np.int32)
        data = np.frombuffer(self.buffer, dtype=np.uint8)
        views = np.zeros((n, 16), dtype=np.uint8)
        views[:, 0:4] = lengths.astype("<i4").view(np.uint8).reshape(n, 4)
        inline = lengths <= 12
        if inline.any():  # copy the short payloads into their views, zero-padded
            at = starts[inline, None] + np.arange(12)
            wanted = np.arange(12) < lengths[inline, None]
            views[inline, 4:16] = np.where(wanted, data[np.minimum(at, len(data) - 1)], 0)
        long = ~inline
        if long.any():  # 4-byte prefix, buffer 0, offset into the buffer
            views[long, 4:8] = data[starts[long, None] + np.arange(4)]
            views[long, 12:16] = starts[long].astype("<i4").view(np.uint8).reshape(-1, 4)
        payload = pa.Array.from_buffers(
            pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(self.buffer)]
        )
        ids = pa.array(np.arange(self.first_entry_id, self.first_entry_id + n, dtype=np.int64))
        return pa.RecordBatch.from_arrays([ids, payload], names=["entry_id", "payload"])
