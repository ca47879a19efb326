"""Encode/decode throughput of the v1 ledger codec against raw copies of the same payloads.

The codec should cost little next to moving the bytes at all: the baselines are a plain
``b"".join`` of the payloads (what a raw upload has to build) and slicing them back out of
one buffer at known offsets (the least a reader must do per entry). Run:
``python benchmarks/format_codec.py [total_MiB]``; prints JSON, one record per measurement.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections.abc import Callable

from offloader.format import (
    DEFAULT_CHUNK_TARGET,
    ENTRY_FRAME,
    HEADER_LEN,
    ChunkRef,
    decode_block,
    decode_chunk,
    decode_index,
    encode_blocks,
    encode_index,
    metadata_for,
)

BLOCK_SIZE = 64 << 20
ENTRY_SIZES = (1 << 10, 64 << 10)
REPEATS = 5


def _best(fn: Callable[[], object]) -> float:
    """Best wall time of a few runs: the codec's cost, not the machine's noise."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _payloads(total_bytes: int, entry_size: int) -> list[bytes]:
    pool = os.urandom(entry_size * 16)
    count = max(1, total_bytes // entry_size)
    return [pool[(i % 16) * entry_size : (i % 16 + 1) * entry_size] for i in range(count)]


def _record(name: str, entry_size: int, payload_bytes: int, seconds: float, raw: float) -> dict:
    mbps = payload_bytes / seconds / 1e6
    raw_mbps = payload_bytes / raw / 1e6
    return {
        "op": name,
        "entry_size": entry_size,
        "payload_mb": round(payload_bytes / 1e6, 1),
        "mb_per_s": round(mbps, 1),
        "raw_mb_per_s": round(raw_mbps, 1),
        "ratio_to_raw": round(mbps / raw_mbps, 3),
    }


def _bench_size(total_bytes: int, entry_size: int) -> list[dict]:
    payloads = _payloads(total_bytes, entry_size)
    entries = list(enumerate(payloads))
    payload_bytes = sum(len(p) for p in payloads)

    raw_join = _best(lambda: b"".join(payloads))

    def encode() -> list:
        return list(
            encode_blocks(entries, max_block_size=BLOCK_SIZE, chunk_target=DEFAULT_CHUNK_TARGET)
        )

    t_encode = _best(encode)
    blocks = encode()
    refs = [b.ref for b in blocks]
    chunks = [c for b in blocks for c in b.chunks]
    meta = metadata_for(refs, chunks, topic="bench", ledger_id=1, created_ms=0, sealed_ms=0)
    index = decode_index(encode_index(meta, refs, chunks))
    data = b"".join(bytes(b.data) for b in blocks)

    # what ranged GETs would return, sliced beforehand so only decoding is timed
    chunk_bytes = [(data[c.offset : c.end], c) for c in index.chunks or ()]
    block_bytes = [
        (data[b.offset : b.offset + b.length], index.block_entry_count(b), b.crc32c)
        for b in index.blocks
    ]
    chunk_spans = [_payload_spans(raw, c) for raw, c in chunk_bytes]
    block_spans: list[list[tuple[int, int]]] = [[] for _ in index.blocks]
    for (_, c), spans in zip(chunk_bytes, chunk_spans, strict=True):
        i = index.blocks.index(index.block_for(c.first_entry_id))
        base = c.offset - index.blocks[i].offset
        block_spans[i] += [(base + a, base + z) for a, z in spans]

    def raw_split_chunks() -> None:
        for (raw, _), spans in zip(chunk_bytes, chunk_spans, strict=True):
            [raw[a:z] for a, z in spans]

    def raw_split_blocks() -> None:
        for (raw, _, _), spans in zip(block_bytes, block_spans, strict=True):
            [raw[a:z] for a, z in spans]

    def decode_chunks() -> None:
        for raw, c in chunk_bytes:
            decode_chunk(raw, c)

    def decode_blocks() -> None:
        for raw, count, crc in block_bytes:
            decode_block(raw, entry_count=count, expected_crc=crc)

    return [
        _record("encode_blocks", entry_size, payload_bytes, t_encode, raw_join),
        _record(
            "decode_chunk", entry_size, payload_bytes, _best(decode_chunks), _best(raw_split_chunks)
        ),
        _record(
            "decode_block", entry_size, payload_bytes, _best(decode_blocks), _best(raw_split_blocks)
        ),
    ]


def _payload_spans(raw: bytes, chunk: ChunkRef) -> list[tuple[int, int]]:
    """(start, end) of each payload inside the chunk bytes: what a raw reader would slice."""
    spans = []
    pos = HEADER_LEN if chunk.starts_block else 0
    for _ in range(chunk.entry_count):
        (size,) = struct.unpack_from(">i", raw, pos)
        spans.append((pos + ENTRY_FRAME, pos + ENTRY_FRAME + size))
        pos += ENTRY_FRAME + size
    return spans


def run(total_bytes: int = 64 << 20) -> list[dict]:
    """One record per (operation, entry size): codec MB/s, raw MB/s and their ratio.

    encode_blocks is compared with ``b"".join`` of the payloads; each decoder with slicing
    the payloads out of the same chunk/block bytes at precomputed offsets (no parsing, no
    CRC). MB are 10**6 payload bytes.
    """
    results: list[dict] = []
    for entry_size in ENTRY_SIZES:
        results += _bench_size(total_bytes, entry_size)
    return results


if __name__ == "__main__":
    total = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 64 << 20
    print(json.dumps(run(total), indent=2))
