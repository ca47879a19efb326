"""Offload and read throughput against one SeaweedFS on loopback, next to raw boto3.

All measurements share one ``weed mini`` (tests/fixtures/seaweedfs_server.py) and run side
by side, interleaved, a few repetitions each; medians are reported, with ours/raw ratios.

1. offload: ``LedgerOffloader.offload_ledger`` of one ledger (4 KiB entries, 16 MiB blocks,
   ``upload_concurrency`` parts in flight) versus a raw boto3 multipart upload of the very
   same encoded block bytes, same part size, same concurrency (ThreadPoolExecutor). Ours
   includes reading the hot tier, encoding, CRCs, the index PUT and the metadata
   transactions; the split (hot read alone, read + encode alone) is reported too.
2. sequential read: ``TieredLedgerReader.read_batches()`` of every entry (each payload
   touched as a view: the sum of their lengths is checked), and ``read()`` of every entry
   (one (id, bytes) tuple each), versus raw ranged GETs of the same data object in
   ``sequential_range`` (8 MiB) ranges, ``prefetch`` in flight.
3. random single-entry reads with 64 MiB blocks and a 1 MiB read buffer: bytes fetched
   from the data object per read (``reader.stats``), and, measured against the same
   objects, what a Pulsar-style v1 reader fetches for the first 50 of the same entries
   (benchmarks/pulsar_reader.py: floor block, then a scan from the block start in 1 MiB
   ranged reads).

Run alone: ``python -m benchmarks.offload_s3 [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks import use_test_fixtures
from benchmarks.pulsar_reader import PulsarV1Reader
from offloader.format import encode_blocks
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.objectstore.s3 import build_client
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome
from offloader.policy import OffloadPolicy
from offloader.read.tiered import DEFAULT_SEQUENTIAL_RANGE, IndexCache, TieredLedgerReader
from offloader.runtime import Runtime, upgrade_database

MiB = 1 << 20
ENTRY_SIZE = 4 << 10
UPLOAD_BLOCK = 16 * MiB
RANDOM_BLOCK = 64 * MiB
READ_BUFFER = 1 * MiB
TARGET_RATIO = 0.8
TARGET_BATCH_RATIO = 0.85  # issue 10: the batch read API against raw ranged GETs
READ_REPEATS_PER_LEDGER = 3  # reads take a fraction of a second: more samples, steadier medians
TARGET_RANDOM_MIB = 1.1
PULSAR_READS = 50  # each costs half a block on average: tens of MiB


def _policy(max_block_size: int) -> OffloadPolicy:
    return OffloadPolicy(
        max_block_size=max_block_size,
        read_buffer_size=READ_BUFFER,
        ledger_max_entries=10_000_000,
        ledger_max_bytes=1 << 40,
        ledger_max_age_seconds=None,
        deletion_lag_seconds=86_400,
    )


def _produce(rt: Runtime, topic: str, ledgers: int, entries: int, seed: int) -> list[int]:
    """``ledgers`` sealed ledgers of ``entries`` random 4 KiB entries each."""
    rng = random.Random(seed)
    pool = rng.randbytes(ENTRY_SIZE * 257)
    ids = []
    with ManagedLedgerWriter(rt.metadata, rt.hot, topic) as writer:
        for _ in range(ledgers):
            for i in range(entries):
                start = (i * 4099) % (len(pool) - ENTRY_SIZE)
                writer.append(pool[start : start + ENTRY_SIZE])
            sealed = writer.roll_over()
            assert sealed is not None
            ids.append(sealed.ledger_id)
    return ids


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _comparison(
    ours_s: list[float], raw_s: list[float], nbytes: int, target: float = TARGET_RATIO
) -> dict:
    """Both sides' timings, medians as MB/s, raw/ours (>= 1 means ours is faster), and
    whether that ratio meets ``target``."""
    ours, raw = _median(ours_s), _median(raw_s)
    ratio = round(raw / ours, 3)
    return {
        "ours_s": [round(x, 3) for x in ours_s],
        "raw_s": [round(x, 3) for x in raw_s],
        "ours_mb_per_s": round(nbytes / ours / 1e6, 1),
        "raw_mb_per_s": round(nbytes / raw / 1e6, 1),
        "ratio": ratio,
        "target": target,
        "met": ratio >= target,
    }


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _raw_multipart(
    client: Any, bucket: str, key: str, parts: list[bytes], concurrency: int
) -> None:
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)
    upload_id = upload["UploadId"]

    def send(number: int, body: bytes) -> dict:
        reply = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
        )
        return {"PartNumber": number, "ETag": reply["ETag"]}

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(send, range(1, len(parts) + 1), parts))
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )


def _raw_ranged_read(client: Any, bucket: str, key: str, size: int, rng: int, inflight: int) -> int:
    def get(offset: int) -> int:
        end = min(offset + rng, size) - 1
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={offset}-{end}")["Body"]
        return len(body.read())

    with ThreadPoolExecutor(max_workers=inflight) as pool:
        return sum(pool.map(get, range(0, size, rng)))


def _read_tuples(reader: TieredLedgerReader) -> tuple[int, int]:
    """Entries and payload bytes through read(): one (id, bytes) tuple per entry."""
    entries = nbytes = 0
    for _, payload in reader.read():
        entries += 1
        nbytes += len(payload)
    return entries, nbytes


def _read_batches(reader: TieredLedgerReader) -> tuple[int, int]:
    """Entries and payload bytes through read_batches(), every payload touched as a view."""
    entries = nbytes = 0
    for batch in reader.read_batches():
        entries += len(batch)
        nbytes += sum(map(len, batch.payloads()))
    return entries, nbytes


def _full_key(store: Any, key: str) -> str:
    return store.prefix + key


def _bench_offload_and_read(
    rt: Runtime, entries: int, repeats: int, concurrency: int
) -> tuple[dict, dict]:
    settings = rt.settings
    store = rt.objects
    client = build_client(settings)  # same client configuration as the library's
    rt.metadata.create_topic("tput", _policy(UPLOAD_BLOCK))
    ids = _produce(rt, "tput", repeats, entries, seed=1)

    # the encoded bytes of one ledger: the raw baseline uploads exactly these parts
    hot_read_s, _ = _timed(lambda: sum(len(p) for _, p in rt.hot.read("tput", ids[0])))
    encode_s, blocks = _timed(
        lambda: list(
            encode_blocks(
                rt.hot.read("tput", ids[0]), max_block_size=UPLOAD_BLOCK, chunk_target=READ_BUFFER
            )
        )
    )
    parts = [bytes(b.data) for b in blocks]
    del blocks
    object_bytes = sum(len(p) for p in parts)
    payload_bytes = entries * ENTRY_SIZE

    offloader = LedgerOffloader(rt)
    ours_s, raw_s = [], []
    ours_read_s, raw_read_s = [], []
    for i, ledger_id in enumerate(ids):
        seconds, result = _timed(lambda lid=ledger_id: offloader.offload_ledger("tput", lid))
        assert result.outcome is Outcome.OFFLOADED, result
        assert result.bytes == object_bytes, (result.bytes, object_bytes)
        ours_s.append(seconds)
        raw_key = _full_key(store, f"raw/upload-{i}")
        raw_s.append(
            _timed(lambda k=raw_key: _raw_multipart(client, store.bucket, k, parts, concurrency))[0]
        )

    ledger = rt.metadata.get_ledger("tput", ids[0])
    data_key = _full_key(store, ledger.data_key)

    readers: list[TieredLedgerReader] = []

    def reader() -> TieredLedgerReader:
        readers.append(
            TieredLedgerReader(
                store,
                ledger.data_key,
                ledger.index_key,
                prefetch=settings.read_prefetch,
                index_cache=IndexCache(),
            )
        )
        return readers[-1]

    def raw_read() -> tuple[int, int]:
        got = _raw_ranged_read(
            client,
            store.bucket,
            data_key,
            object_bytes,
            DEFAULT_SEQUENTIAL_RANGE,
            settings.read_prefetch,
        )
        return got, got

    batch_read_s: list[float] = []
    paths = [
        (lambda: _read_tuples(reader()), ours_read_s, (entries, payload_bytes)),
        (lambda: _read_batches(reader()), batch_read_s, (entries, payload_bytes)),
        (raw_read, raw_read_s, (object_bytes, object_bytes)),
    ]
    read_repeats = READ_REPEATS_PER_LEDGER * repeats
    for i in range(read_repeats):  # interleaved, each repetition starting with the next path
        for read, times, expected in paths[i % 3 :] + paths[: i % 3]:
            seconds, counted = _timed(read)
            assert counted == expected, (counted, expected)
            times.append(seconds)
    client.close()

    ours_med, raw_med = _median(ours_s), _median(raw_s)
    offload = {
        "ledger_mib": round(payload_bytes / MiB, 1),
        "object_mib": round(object_bytes / MiB, 1),
        "entry_size": ENTRY_SIZE,
        "entries": entries,
        "block_mib": UPLOAD_BLOCK // MiB,
        "parts": len(parts),
        "concurrency": concurrency,
        "repeats": repeats,
        **_comparison(ours_s, raw_s, object_bytes),
        "split": {
            "hot_read_s": round(hot_read_s, 3),
            "hot_read_plus_encode_s": round(encode_s, 3),
            "encode_only_s": round(encode_s - hot_read_s, 3),
            "raw_upload_s": round(raw_med, 3),
            "rest_s": round(ours_med - raw_med, 3),
        },
    }
    sequential = {
        "object_mib": round(object_bytes / MiB, 1),
        "entries": entries,
        "range_mib": DEFAULT_SEQUENTIAL_RANGE // MiB,
        "in_flight": settings.read_prefetch,
        "repeats": read_repeats,
        "gets": {
            "ours": readers[-1].stats.requests,
            "raw": -(-object_bytes // DEFAULT_SEQUENTIAL_RANGE),
        },
        # the batch API is the sequential path bulk consumers use: its ratio is the row's
        **_comparison(batch_read_s, raw_read_s, object_bytes, TARGET_BATCH_RATIO),
        "read_tuples": _comparison(ours_read_s, raw_read_s, object_bytes),
    }
    return offload, sequential


def _bench_random(rt: Runtime, entries: int, reads: int) -> dict:
    rt.metadata.create_topic("random", _policy(RANDOM_BLOCK))
    (ledger_id,) = _produce(rt, "random", 1, entries, seed=2)
    offload_s, result = _timed(lambda: LedgerOffloader(rt).offload_ledger("random", ledger_id))
    assert result.outcome is Outcome.OFFLOADED, result
    ledger = rt.metadata.get_ledger("random", ledger_id)
    reader = TieredLedgerReader(
        rt.objects, ledger.data_key, ledger.index_key, index_cache=IndexCache()
    )
    index = reader.index
    rng = random.Random(3)
    picks = [rng.randrange(entries) for _ in range(reads)]
    fetched, latencies = [], []
    for entry_id in picks:
        before = reader.stats.bytes_fetched
        seconds, payload = _timed(lambda e=entry_id: reader.read_entry(e))
        assert len(payload) == ENTRY_SIZE
        fetched.append(reader.stats.bytes_fetched - before)
        latencies.append(seconds)
    # the same objects through a Pulsar-style v1 reader (block scan in 1 MiB ranged reads)
    pulsar_reader = PulsarV1Reader(rt.objects, ledger.data_key, ledger.index_key, READ_BUFFER)
    pulsar, pulsar_latencies = [], []
    for entry_id in picks[:PULSAR_READS]:
        before = pulsar_reader.bytes_fetched
        seconds, payload = _timed(lambda e=entry_id: pulsar_reader.read_entry(e))
        assert payload == reader.read_entry(entry_id)
        pulsar.append(pulsar_reader.bytes_fetched - before)
        pulsar_latencies.append(seconds)
    mean_mib = statistics.fmean(fetched) / MiB
    return {
        "ledger_mib": round(entries * ENTRY_SIZE / MiB, 1),
        "block_mib": RANDOM_BLOCK // MiB,
        "read_buffer_mib": READ_BUFFER / MiB,
        "blocks": len(index.blocks),
        "chunks": len(index.chunks or ()),
        "reads": reads,
        "mean_mib": round(mean_mib, 3),
        "max_mib": round(max(fetched) / MiB, 3),
        "pulsar_reads": len(pulsar),
        "pulsar_mean_mib": round(statistics.fmean(pulsar) / MiB, 3),
        "pulsar_max_mib": round(max(pulsar) / MiB, 3),
        "median_latency_ms": round(_median(latencies) * 1000, 2),
        "pulsar_median_latency_ms": round(_median(pulsar_latencies) * 1000, 2),
        "offload_s": round(offload_s, 3),
        "target_mib": TARGET_RANDOM_MIB,
        "met": mean_mib <= TARGET_RANDOM_MIB and max(fetched) / MiB <= TARGET_RANDOM_MIB,
    }


def run(quick: bool = False, work_dir: Path | None = None) -> dict:
    """Start SeaweedFS, run the three S3 measurements, stop it; one dict of results."""
    use_test_fixtures()
    from fixtures.seaweedfs_server import SeaweedS3

    entries = (64 if quick else 256) * MiB // ENTRY_SIZE
    repeats = 2 if quick else 5
    reads = 50 if quick else 200
    with tempfile.TemporaryDirectory(prefix="bench-s3-", dir=work_dir) as tmp:
        base = Path(tmp)
        with SeaweedS3.start(base / "seaweedfs") as server:
            settings = server.make_settings("bench-offload", data_dir=base / "data")
            upgrade_database(settings)  # `offloader db upgrade`: opening never migrates
            with Runtime.open(settings) as rt:
                offload, sequential = _bench_offload_and_read(
                    rt, entries, repeats, settings.upload_concurrency
                )
                random_reads = _bench_random(rt, entries, reads)
    return {"offload": offload, "sequential_read": sequential, "random_read": random_reads}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    print(json.dumps(run(args.quick), indent=2))
