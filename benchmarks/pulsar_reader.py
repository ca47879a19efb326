"""A reference Pulsar-style v1 random-entry reader, written from shared/FORMAT.md alone (no
code from our codec), to measure what Pulsar's layout costs against the same objects.

It knows only what a v1 reader knows: the index's block table. To read entry E it takes the
floor block of E, then scans that block from its start in ``buffer``-sized ranged reads
(Pulsar's read buffer, 1 MiB by default), parsing the header and the entry frames, until it
meets E. Every byte it fetches is counted.
"""

from __future__ import annotations

import bisect
import struct
from typing import Any

_INDEX_HEAD = struct.Struct(">iiqqii")  # magic, index_len, data_len, header_len, count, meta_len
_INDEX_ENTRY = struct.Struct(">qiq")  # first_entry_id, part_id, block_offset
_BLOCK_HEAD = struct.Struct(">iqqq")  # magic, header_len, block_len, first_entry_id
_FRAME = struct.Struct(">iq")  # entry_len, entry_id
INDEX_MAGIC = struct.unpack(">i", bytes.fromhex("DE47DE47"))[0]
BLOCK_MAGIC = struct.unpack(">i", bytes.fromhex("FBDBABCB"))[0]


class PulsarV1Reader:
    def __init__(self, store: Any, data_key: str, index_key: str, buffer: int = 1 << 20) -> None:
        self.store = store
        self.data_key = data_key
        self.buffer = buffer
        index = store.get(index_key)
        magic, index_len, self.data_len, self.header_len, count, meta_len = _INDEX_HEAD.unpack_from(
            index
        )
        if magic != INDEX_MAGIC or index_len != len(index):
            raise ValueError("not a v1 index")
        at = _INDEX_HEAD.size + meta_len
        entries = [
            _INDEX_ENTRY.unpack_from(index, at + i * _INDEX_ENTRY.size) for i in range(count)
        ]
        self.firsts = [first for first, _, _ in entries]
        self.offsets = [offset for _, _, offset in entries]
        self.bytes_fetched = 0

    def read_entry(self, entry_id: int) -> bytes:
        block = bisect.bisect_right(self.firsts, entry_id) - 1
        start = self.offsets[block]
        end = self.offsets[block + 1] if block + 1 < len(self.offsets) else self.data_len
        buf = bytearray()

        def need(upto: int) -> None:  # fetch whole buffers until ``upto`` bytes are held
            while len(buf) < upto and start + len(buf) < end:
                offset = start + len(buf)
                chunk = self.store.read_range(self.data_key, offset, min(self.buffer, end - offset))
                self.bytes_fetched += len(chunk)
                buf.extend(chunk)

        need(_BLOCK_HEAD.size)
        magic, header_len, _, first = _BLOCK_HEAD.unpack_from(buf)
        if magic != BLOCK_MAGIC or first != self.firsts[block]:
            raise ValueError(f"bad block header at {start}")
        pos = header_len
        while True:
            need(pos + _FRAME.size)
            length, found = _FRAME.unpack_from(buf, pos)
            if length < 0:
                raise KeyError(f"entry {entry_id} not in its block")
            need(pos + _FRAME.size + length)
            if found == entry_id:
                return bytes(buf[pos + _FRAME.size : pos + _FRAME.size + length])
            pos += _FRAME.size + length
