"""EntryBatch on its own: slicing by entry id shares the buffer, views and copies give the
encoded payloads, and the Arrow form points into the same buffer."""

from __future__ import annotations

import mmap
import random
import sys
from array import array
from pathlib import Path
from typing import cast

import pyarrow as pa
import pytest

from fixtures.batches import flattened
from offloader.format import chunk_offsets, encode_blocks
from offloader.format.parsing import offsets_arrays
from offloader.read.batch import EntryBatch

# around Arrow's 12-byte inline limit for views, empty, and large
SIZES = [0, 1, 11, 12, 13, 4096, 0, 12, 13, 700, 3000, 5]  # the last ends the buffer
FIRST_ID = 1000


@pytest.fixture
def encoded() -> tuple[EntryBatch, list[tuple[int, bytes]]]:
    """One block of SIZES entries, parsed chunk by chunk into one batch (as a ranged GET)."""
    rng = random.Random(7)
    entries = [(FIRST_ID + i, rng.randbytes(n)) for i, n in enumerate(SIZES)]
    (block,) = encode_blocks(entries, max_block_size=64 * 1024, chunk_target=2048)
    assert len(block.chunks) > 3
    data, into = bytes(block.data), offsets_arrays()
    for chunk in block.chunks:
        chunk_offsets(data, chunk, at=chunk.offset, into=into)
    return EntryBatch(data, FIRST_ID, *into), entries


def test_views_copies_and_positions(encoded: tuple[EntryBatch, list[tuple[int, bytes]]]) -> None:
    batch, entries = encoded
    assert len(batch) == len(SIZES)
    assert batch.entry_ids == range(FIRST_ID, FIRST_ID + len(SIZES))
    assert batch.last_entry_id == FIRST_ID + len(SIZES) - 1
    assert flattened([batch]) == entries
    assert list(batch.entries()) == entries
    assert all(type(p) is bytes for _, p in batch.entries())
    for i in (0, 3, 5, len(SIZES) - 1):
        view = batch.payload(i)
        assert view.obj is batch.buffer and view == entries[i][1]


@pytest.mark.parametrize(
    ("first", "last", "expected"),
    [
        (FIRST_ID, FIRST_ID + 11, range(0, 12)),  # all of it
        (0, 10**9, range(0, 12)),  # more than all of it
        (FIRST_ID + 2, FIRST_ID + 11, range(2, 12)),
        (FIRST_ID, FIRST_ID + 4, range(0, 5)),
        (FIRST_ID + 3, FIRST_ID + 3, range(3, 4)),
        (FIRST_ID + 11, FIRST_ID + 20, range(11, 12)),
        (0, FIRST_ID, range(0, 1)),
        (FIRST_ID + 12, FIRST_ID + 20, range(0)),  # after it
        (0, FIRST_ID - 1, range(0)),  # just before it
        (0, FIRST_ID - 5, range(0)),  # well before it: not a slice counted from the end
        (FIRST_ID + 30, FIRST_ID + 40, range(0)),  # well after it
    ],
)
def test_between_slices_offsets_not_payloads(
    encoded: tuple[EntryBatch, list[tuple[int, bytes]]], first: int, last: int, expected: range
) -> None:
    batch, entries = encoded
    part = batch.between(first, last)
    assert part.buffer is batch.buffer
    assert flattened([part]) == [entries[i] for i in expected]
    assert len(part) == len(expected)
    if len(expected) == len(SIZES):
        assert part is batch
    elif expected:
        assert part.first_entry_id == FIRST_ID + expected[0]
        assert part.last_entry_id == FIRST_ID + expected[-1]


def test_to_arrow_is_the_entries_over_the_same_buffer(
    encoded: tuple[EntryBatch, list[tuple[int, bytes]]],
) -> None:
    batch, entries = encoded
    for part, wanted in (
        (batch, entries),
        (batch.between(FIRST_ID + 2, FIRST_ID + 9), entries[2:10]),
    ):
        table = part.to_arrow()
        table.validate(full=True)
        assert table.schema == pa.schema([("entry_id", pa.int64()), ("payload", pa.binary_view())])
        assert table.column("entry_id").to_pylist() == [i for i, _ in wanted]
        assert table.column("payload").to_pylist() == [p for _, p in wanted]
        data = table.column("payload").buffers()[2]
        assert data.address == pa.py_buffer(batch.buffer).address  # not a copy
        assert data.size == len(batch.buffer)


@pytest.mark.parametrize("size", [2**31 - 1, 2**31], ids=["largest", "too-large"])
def test_to_arrow_takes_buffers_whose_offsets_fit_int32(tmp_path: Path, size: int) -> None:
    """Arrow views address the buffer with int32 offsets. A sparse file mapped into memory
    is a buffer of that size without the memory; its last bytes are one entry."""
    payload = b"the last entry of the buffer"
    path = tmp_path / "sparse"
    with path.open("wb") as f:
        f.truncate(size)
        f.seek(size - len(payload))
        f.write(payload)
    with path.open("rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    at, length = array("q", [size - len(payload)]), array("q", [len(payload)])
    batch = EntryBatch(cast(bytes, buffer), 5, at, length)  # bytes-like: all to_arrow needs
    if size > 2**31 - 1:
        with pytest.raises(ValueError, match=rf"^a buffer of {size} bytes is too large for Arrow"):
            batch.to_arrow()
        return
    table = batch.to_arrow()
    assert table.column("entry_id").to_pylist() == [5]
    assert table.column("payload").to_pylist() == [payload]


def test_to_arrow_without_pyarrow_names_the_extra(
    encoded: tuple[EntryBatch, list[tuple[int, bytes]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # what `import pyarrow` sees if absent
    needs = r"^EntryBatch\.to_arrow needs pyarrow and numpy \(pip install 'offloader\[arrow\]'\): "
    with pytest.raises(ImportError, match=needs + "import of pyarrow halted") as raised:
        encoded[0].to_arrow()
    assert isinstance(raised.value.__cause__, ImportError)  # the import's own error, kept
