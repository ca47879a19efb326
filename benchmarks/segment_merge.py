"""Compaction of streamed segments on SeaweedFS, next to downloading and re-uploading the
same bytes from the client (issue 10: "compaction time against downloading and
re-uploading the same bytes").

Two cases, each a run of adjacent v2 segments (one ledger each, 1 MiB blocks) put into
one bucket beforehand, untimed:

- big: ``big_segments`` segments of about ``big_mib`` MiB (16 x 8 MiB): every one is at
  least S3's 5 MiB part, so ours copies each server side (UploadPartCopy);
- small: ``small_segments`` segments of 64 KiB (256): ours downloads them, checks every
  block's CRC and uploads parts of ``part_mib`` MiB.

Ours = ``load_source`` of every source (one GET of its index), ``merge_segments`` into a
fresh multipart upload, complete, PUT of the new index. Raw = a boto3 client (the
library's ``build_client``, same botocore configuration) that GETs the same source
objects whole and uploads them as a multipart upload with the same part sizes (each part
the same run of whole sources as ours), the same number of parts in flight, then
completes. Both paths alternate which goes first in each of ``repeats`` repetitions; the
merged objects are checked against the sources' bytes joined (nothing is dropped, so they
are equal) and deleted, untimed. Reported: medians, MB/s of merged data (10^6 bytes/s),
ratio = raw seconds / our seconds (above 1: ours is faster), requests by verb.

Run alone: ``python -m benchmarks.segment_merge [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import use_test_fixtures
from offloader.format import SegmentEncoder, encode_segment_index
from offloader.keys import segment_object_keys
from offloader.metadata.records import PieceRange
from offloader.objectstore.s3 import S3ObjectStore, build_client
from offloader.rewrite.merge import load_source, merge_segments
from offloader.settings import Settings

KiB = 1024
MiB = 1024 * KiB
BLOCK = 1 * MiB
TOPIC = "bench-merge"


@dataclass(frozen=True)
class Config:
    big_segments: int = 16
    big_mib: int = 8
    small_segments: int = 256
    small_kib: int = 64
    part_mib: int = 8
    concurrency: int = 4
    repeats: int = 5


QUICK = Config(big_segments=4, big_mib=6, small_segments=64, repeats=2)


@dataclass(frozen=True)
class Source:
    data_key: str
    index_key: str
    data_len: int
    piece: PieceRange


def _segment(ledger_id: int, count: int, entry: int, pool: bytes) -> tuple[bytes, bytes]:
    """One segment of one ledger: ``count`` entries of ``entry`` bytes."""
    encoder = SegmentEncoder(max_block_size=BLOCK, min_part_size=BLOCK)
    entries = [
        (ledger_id, i, pool[(i * 7919) % (len(pool) - entry) :][:entry]) for i in range(count)
    ]
    parts = encoder.append(entries) + encoder.close()
    blocks = [b for p in parts for b in p.blocks]
    return b"".join(bytes(p.data) for p in parts), encode_segment_index(blocks, topic=TOPIC)


def _put_sources(
    store: S3ObjectStore, count: int, nbytes: int, entry: int, first_ledger: int
) -> list[Source]:
    pool = random.Random(first_ledger).randbytes(4 * MiB)
    out = []
    for i in range(count):
        data, index = _segment(first_ledger + i, nbytes, entry, pool)
        key, index_key = segment_object_keys(str(uuid.uuid4()))
        store.put(key, data)
        store.put(index_key, index)
        last = load_source(store, key, index_key, len(data), []).index.last_position
        out.append(Source(key, index_key, len(data), PieceRange(first_ledger + i, 0, last[1])))
    return out


def _ours(store: Any, sources: list[Source], cfg: Config) -> tuple[str, list[int], float]:
    """The merge as compaction runs it: the sources' indexes (``concurrency`` GETs in
    flight), the merge, complete, the index PUT. Returns the key, the part sizes and the
    seconds spent loading indexes."""
    start = time.perf_counter()
    with ThreadPoolExecutor(cfg.concurrency) as pool:
        loaded = list(
            pool.map(
                lambda s: load_source(store, s.data_key, s.index_key, s.data_len, [s.piece]),
                sources,
            )
        )
    index_s = time.perf_counter() - start
    key, index_key = segment_object_keys(str(uuid.uuid4()))
    upload = store.create_multipart(key)
    merged = merge_segments(
        store, upload, loaded, part_size=cfg.part_mib * MiB, concurrency=cfg.concurrency
    )
    store.complete_multipart(upload, merged.parts, if_none_match=True)
    store.put(index_key, merged.index)
    return key, [p.size for p in merged.parts], index_s


def _groups(sources: list[Source], part_sizes: list[int]) -> list[list[Source]]:
    """The runs of whole sources that make parts of the given sizes."""
    groups: list[list[Source]] = []
    it = iter(sources)
    for size in part_sizes:
        group, filled = [], 0
        while filled < size:
            source = next(it)
            group.append(source)
            filled += source.data_len
        assert filled == size, "a part of ours does not hold whole sources"
        groups.append(group)
    return groups


def _raw(client: Any, bucket: str, prefix: str, groups: list[list[Source]], cfg: Config) -> str:
    key = str(uuid.uuid4())
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=prefix + key)["UploadId"]

    def part(number: int, group: list[Source]) -> dict:
        body = b"".join(
            client.get_object(Bucket=bucket, Key=prefix + s.data_key)["Body"].read() for s in group
        )
        reply = client.upload_part(
            Bucket=bucket, Key=prefix + key, UploadId=upload_id, PartNumber=number, Body=body
        )
        return {"PartNumber": number, "ETag": reply["ETag"]}

    with ThreadPoolExecutor(cfg.concurrency) as pool:
        done = list(pool.map(part, range(1, len(groups) + 1), groups))
    client.complete_multipart_upload(
        Bucket=bucket, Key=prefix + key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )
    return key


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _case(store: S3ObjectStore, settings: Settings, sources: list[Source], cfg: Config) -> dict:
    use_test_fixtures()
    from fixtures.counting import CountingStore

    expected = hashlib.sha256()
    for s in sources:
        expected.update(store.get(s.data_key))
    counted = CountingStore(store)
    client = build_client(settings)
    ours_s: list[float] = []
    raw_s: list[float] = []
    requests: dict[str, int] = {}
    part_sizes: list[int] = []
    index_s: list[float] = []
    for i in range(cfg.repeats):
        paths = ["ours", "raw"] if i % 2 == 0 else ["raw", "ours"]
        for path in paths:
            if path == "ours":
                counted.requests.clear()
                seconds, (key, part_sizes, loading) = _timed(lambda: _ours(counted, sources, cfg))
                ours_s.append(seconds)
                index_s.append(loading)
                requests = dict(counted.requests)
            else:
                groups = _groups(sources, part_sizes or _first_sizes(store, sources, cfg))
                seconds, key = _timed(
                    lambda g=groups: _raw(client, store.bucket, store.prefix, g, cfg)
                )
                raw_s.append(seconds)
            assert hashlib.sha256(store.get(key)).digest() == expected.digest(), path
            store.delete_many(list(segment_object_keys(key)))
    client.close()
    merged = sum(s.data_len for s in sources)
    ours, raw = statistics.median(ours_s), statistics.median(raw_s)
    return {
        "segments": len(sources),
        "segment_kib": round(statistics.median(s.data_len for s in sources) / KiB, 1),
        "merged_mib": round(merged / MiB, 2),
        "parts": len(part_sizes),
        "ours_s": round(ours, 3),
        "raw_s": round(raw, 3),
        "ours_index_load_s": round(statistics.median(index_s), 3),
        "ours_all_s": [round(x, 3) for x in ours_s],
        "raw_all_s": [round(x, 3) for x in raw_s],
        "ours_mb_per_s": round(merged / ours / 1e6, 1),
        "raw_mb_per_s": round(merged / raw / 1e6, 1),
        "ratio": round(raw / ours, 3),
        "ours_requests": dict(sorted(requests.items())),
        "raw_requests": {
            "get": len(sources),
            "create_multipart": 1,
            "upload_part": len(part_sizes),
            "complete_multipart": 1,
        },
    }


def _first_sizes(store: S3ObjectStore, sources: list[Source], cfg: Config) -> list[int]:
    """Our part sizes, from an untimed merge (when raw runs before ours has)."""
    key, sizes, _ = _ours(store, sources, cfg)
    store.delete_many(list(segment_object_keys(key)))
    return sizes


def measure(store: S3ObjectStore, settings: Settings, cfg: Config) -> dict:
    """Put both cases' sources into ``store`` (untimed) and measure them."""
    # 15 entries fill a 1 MiB block; 16 entries make a 64 KiB segment
    big = _put_sources(store, cfg.big_segments, 15 * cfg.big_mib, 64 * KiB - 20, 1000)
    small_entry = (cfg.small_kib * KiB - 128) // 16 - 12
    small = _put_sources(store, cfg.small_segments, 16, small_entry, 2000)
    return {
        "config": asdict(cfg),
        "big": _case(store, settings, big, cfg),
        "small": _case(store, settings, small, cfg),
    }


def run(quick: bool = False, work_dir: Path | None = None, cfg: Config | None = None) -> dict:
    """Start SeaweedFS, measure both cases, stop it; one dict of results."""
    use_test_fixtures()
    from fixtures.seaweedfs_server import SeaweedS3

    with (
        tempfile.TemporaryDirectory(prefix="bench-merge-", dir=work_dir) as tmp,
        SeaweedS3.start(Path(tmp) / "seaweedfs") as server,
    ):
        settings = server.make_settings("bench-merge", prefix="segments")
        assert settings.object_store_url is not None
        store = S3ObjectStore.from_url(settings.object_store_url, settings)
        try:
            return measure(store, settings, cfg or (QUICK if quick else Config()))
        finally:
            store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
