"""Streaming offload (PIP-76, issue 9) on SeaweedFS + PostgreSQL: lag, objects, requests.

1. sustained streaming: a writer thread appends entries of ``entry_size`` bytes at a fixed
   rate for a fixed time, each payload starting with its write time (``time.time_ns()``,
   8 bytes big-endian); meanwhile ``StreamingOffloader.run_pass`` runs every
   ``pass_interval_s`` (start to start) with ``segment_max_age_seconds`` =
   ``rollover_age_s``, ``segment_max_bytes`` and ``min_part_bytes``. The writer confirms
   (``sync``) what it appended every ``sync_every_s``, as a producer's acknowledgements
   would; a pass streams confirmed entries only. When the writer stops it seals its ledger
   and one last pass runs with ``close_now``.
   Lag of an entry, from the write time in its payload:
   - committed lag: to the return of the pass that committed the segment holding it (the
     entry is readable from the tier from then on); the target applies to this one;
   - durable lag: to the return of the pass that recorded the part holding it (bytes in
     the store and recorded, not readable before the segment commits);
   - by the database: to the segment's ``offloaded_ms`` (PostgreSQL's clock, same host).
   Objects: per committed segment its data object size, parts and age at commit.
2. requests per GiB of payload: object-store requests of the streaming phase (a counting
   wrapper on the runtime's store and the registry's copy of it) against ledger-based
   offload (``LedgerOffloader.offload_topic``) of the very same payloads (the first
   ``compare_mib`` of them: a request count per GiB does not depend on how many GiB)
   written again into two topics with 64 KiB and 64 MiB ledgers (small_ledgers.Tally).
   PUT-class = PutObject, CreateMultipartUpload, UploadPart, CompleteMultipartUpload.
3. pass throughput on a backlog: ``backlog_mib`` written beforehand (sealed ledgers), one
   pass with ``close_now``; bytes uploaded per second of pass wall time, against a raw
   multipart upload of the very same part bytes (read back from the committed segments,
   untimed) with the store's own boto3 client, one multipart upload per segment, parts
   one at a time like the pass; and, for information, the same with
   ``upload_concurrency`` parts in flight. Repetitions interleaved, medians.

Run alone: ``python -m benchmarks.streaming [--quick]``; prints JSON.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import statistics
import struct
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import use_test_fixtures
from benchmarks.airflow_overhead import s3_postgres_runtime
from benchmarks.small_ledgers import Tally
from offloader.hottier.writer import ManagedLedgerWriter
from offloader.metadata.records import Position, Segment, SegmentState
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
STAMP = struct.Struct(">q")  # the write time at the start of every payload
PUT_CLASS = ("put", "create_multipart", "upload_part", "complete_multipart")
TARGET_REQUESTS_PER_GIB = 20
TARGET_THROUGHPUT_RATIO = 0.8
LEDGER_SIZES = (64 * KiB, 64 * MiB)  # the ledger-based comparison


@dataclass(frozen=True)
class Config:
    rate_mib_s: float  # the writer's rate
    seconds: float  # how long the writer writes
    backlog_mib: int  # per repetition of the throughput measurement
    repeats: int  # of the throughput measurement
    entry_size: int = 16 * KiB
    pass_interval_s: float = 2.0
    rollover_age_s: float = 10.0
    segment_max_mib: int = 32
    min_part_mib: int = 5
    stream_ledger_mib: int = 64  # ledger size of the streamed topic
    sync_every_s: float = 0.05  # the writer confirms its entries this often
    compare_mib: int = 256  # payload offloaded ledger-based for the request comparison

    @property
    def lag_target_s(self) -> float:
        return self.rollover_age_s + self.pass_interval_s


# The full run is sized for the request target: 128 MiB parts in segments of up to 1 GiB
# (a segment is CreateMultipartUpload + 8 UploadParts + CompleteMultipartUpload + the
# index's PutObject), with a rollover age long enough for a segment to fill at the rate.
FULL = Config(
    rate_mib_s=16,
    seconds=150,
    backlog_mib=512,
    repeats=3,
    entry_size=64 * KiB,
    pass_interval_s=5.0,
    rollover_age_s=120.0,
    segment_max_mib=1024,
    min_part_mib=128,
)
# a smoke run: small parts, so it misses the request target by construction
QUICK = Config(rate_mib_s=2, seconds=30, backlog_mib=32, repeats=3, compare_mib=60)


def stream_policy(cfg: Config) -> OffloadPolicy:
    return OffloadPolicy(
        streaming=True,
        segment_max_bytes=cfg.segment_max_mib * MiB,
        segment_max_age_seconds=cfg.rollover_age_s,
        min_part_bytes=cfg.min_part_mib * MiB,
        ledger_max_bytes=cfg.stream_ledger_mib * MiB,
        ledger_max_entries=10_000_000,
        ledger_max_age_seconds=None,
    )


def ledger_policy(ledger_bytes: int) -> OffloadPolicy:
    """Ledger-based offload with the default block size; ledgers of ``ledger_bytes``."""
    return OffloadPolicy(
        ledger_max_bytes=ledger_bytes, ledger_max_entries=10_000_000, ledger_max_age_seconds=None
    )


# --- counting --------------------------------------------------------------------------
@contextmanager
def counted_stores(rt: Runtime) -> Iterator[Any]:
    """Every request to the runtime's default store counted, whether it is reached as
    ``rt.objects`` or through the store registry (the streaming pass's way)."""
    use_test_fixtures()
    from fixtures.counting import CountingStore

    store_id = rt.stores.default_id()  # records the default and caches it in the registry
    inner = rt.objects
    counting = CountingStore(inner)
    opened = rt.stores._opened
    rt.objects = rt.stores.default = opened[store_id] = counting  # type: ignore[assignment]
    try:
        yield counting
    finally:
        rt.objects = rt.stores.default = opened[store_id] = inner


def _per_gib(requests: Counter[str] | dict[str, int], payload_bytes: int) -> dict:
    put_class = sum(requests.get(v, 0) for v in PUT_CLASS)
    total = sum(requests.values())
    return {
        "requests_by_verb": dict(requests),
        "put_class": put_class,
        "put_class_per_gib": round(put_class * GiB / payload_bytes, 1),
        "all_requests_per_gib": round(total * GiB / payload_bytes, 1),
    }


# --- sustained streaming -------------------------------------------------------------
class Writer(threading.Thread):
    """Appends stamped entries at a fixed rate for a fixed time, then seals its ledger."""

    def __init__(self, rt: Runtime, topic: str, cfg: Config) -> None:
        super().__init__(name="bench-writer", daemon=True)
        self.rt, self.topic, self.cfg = rt, topic, cfg
        self.entries = 0
        self.max_behind_s = 0.0
        self.seconds = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._write()
        except BaseException as err:  # re-raised by the main thread
            self.error = err

    def _write(self) -> None:
        size = self.cfg.entry_size
        pool = random.Random(9).randbytes(size * 64)
        interval = size / (self.cfg.rate_mib_s * MiB)
        count = int(self.cfg.seconds / interval)
        with ManagedLedgerWriter(self.rt.metadata, self.rt.hot, self.topic) as writer:
            start = synced = time.perf_counter()
            for k in range(count):
                due = start + k * interval
                now = time.perf_counter()
                if due > now:
                    time.sleep(due - now)
                else:
                    self.max_behind_s = max(self.max_behind_s, now - due)
                at = (k * 4099) % (len(pool) - size)
                writer.append(STAMP.pack(time.time_ns()) + pool[at + STAMP.size : at + size])
                self.entries += 1
                if time.perf_counter() - synced >= self.cfg.sync_every_s:
                    writer.sync()
                    synced = time.perf_counter()
            self.seconds = time.perf_counter() - start


@dataclass
class PassRecord:
    started_ns: int
    returned_ns: int
    close_now: bool
    parts_uploaded: int
    bytes_uploaded: int
    committed: list[str]
    offloaded_to: str | None
    waiting_bytes: int


def _run_pass(streamer: StreamingOffloader, topic: str, close_now: bool) -> PassRecord:
    started = time.time_ns()
    result = streamer.run_pass(topic, close_now=close_now)
    if result.failed:
        raise RuntimeError(f"streaming pass failed segments {result.failed}")
    return PassRecord(
        started_ns=started,
        returned_ns=time.time_ns(),
        close_now=close_now,
        parts_uploaded=result.parts_uploaded,
        bytes_uploaded=result.bytes_uploaded,
        committed=list(result.committed),
        offloaded_to=result.offloaded_to,
        waiting_bytes=result.waiting_bytes,
    )


def _stream(rt: Runtime, topic: str, cfg: Config) -> tuple[Writer, list[PassRecord]]:
    """The writer at its rate and a pass every ``pass_interval_s`` (start to start)."""
    streamer = StreamingOffloader(rt, owner="bench-streaming")
    writer = Writer(rt, topic, cfg)
    passes: list[PassRecord] = []
    interval_ns = int(cfg.pass_interval_s * 1e9)
    writer.start()
    next_ns = time.time_ns() + interval_ns
    while writer.is_alive():
        wait = (next_ns - time.time_ns()) / 1e9
        if wait > 0:
            writer.join(timeout=wait)
            if not writer.is_alive():
                break
        next_ns += interval_ns
        passes.append(_run_pass(streamer, topic, close_now=False))
    writer.join()
    if writer.error is not None:
        raise writer.error
    passes.append(_run_pass(streamer, topic, close_now=True))
    return writer, passes


def _stamps(rt: Runtime, topic: str) -> Iterator[tuple[tuple[int, int], int, bytes]]:
    """((ledger id, entry id), write time ns, payload) of every entry of the topic."""
    for ledger in rt.metadata.list_ledgers(topic, live=True):
        for entry_id, payload in rt.hot.read(topic, ledger.ledger_id):
            yield (ledger.ledger_id, entry_id), STAMP.unpack_from(payload)[0], payload


def _frontiers(
    passes: list[PassRecord], ends: dict[str, tuple[int, int]]
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Per pass, the last position durable (in a recorded part) and committed, after it.
    A pass's ``offloaded_to`` is its last segment's end (None when a segment it assigned
    after a commit has no part yet): what it committed is durable too."""
    durable: list[tuple[int, int]] = []
    committed: list[tuple[int, int]] = []
    low = (-1, -1)
    for p in passes:
        ends_now = [ends[s] for s in p.committed]
        committed.append(max([*ends_now, committed[-1] if committed else low]))
        at = Position.parse(p.offloaded_to).key() if p.offloaded_to else low
        durable.append(max(at, committed[-1], durable[-1] if durable else low))
    return durable, committed


def _lag_of(position: tuple[int, int], stamp: int, frontier: list, returned: list[int]) -> float:
    i = bisect.bisect_left(frontier, position)
    if i == len(frontier):
        raise RuntimeError(f"entry {position} was never offloaded")
    return (returned[i] - stamp) / 1e9


def _summary(lags: list[float]) -> dict:
    ordered = sorted(lags)
    return {
        "median_s": round(statistics.median(ordered), 2),
        "p99_s": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max_s": round(ordered[-1], 2),
    }


def _segments_report(rt: Runtime, segments: list[Segment]) -> list[dict]:
    out = []
    for s in segments:
        assert s.offloaded_ms is not None
        out.append(
            {
                "data_mib": round(s.data_len / MiB, 2),
                "parts": len(rt.metadata.segments.parts(s)),
                "age_at_commit_s": round((s.offloaded_ms - s.assigned_ms) / 1000, 1),
            }
        )
    return out


def _bench_stream(rt: Runtime, cfg: Config) -> tuple[dict, list[bytes]]:
    """The streaming phase; returns its report and the first ``compare_mib`` of the
    payloads, in order."""
    topic = "streamed"
    rt.metadata.create_topic(topic, stream_policy(cfg))
    with counted_stores(rt) as counting:
        writer, passes = _stream(rt, topic, cfg)
    segments = rt.metadata.segments.of_topic(topic)
    states = Counter(str(s.state) for s in segments)
    committed = [s for s in segments if s.state is SegmentState.OFFLOADED]
    if len(committed) != len(segments):
        raise RuntimeError(f"segments not all offloaded: {dict(states)}")
    ends = {s.segment_id: s.end.key() for s in committed if s.end is not None}
    durable, done = _frontiers(passes, ends)
    returned = [p.returned_ns for p in passes]
    spans = sorted((s.begin.key(), s.end.key(), s.offloaded_ms) for s in committed if s.end)
    lag_durable, lag_committed, lag_db = [], [], []
    payloads: list[bytes] = []
    entries = 0
    for position, stamp, payload in _stamps(rt, topic):
        entries += 1
        if len(payloads) * cfg.entry_size < cfg.compare_mib * MiB:
            payloads.append(payload)
        lag_durable.append(_lag_of(position, stamp, durable, returned))
        lag_committed.append(_lag_of(position, stamp, done, returned))
        i = bisect.bisect_right(spans, (position, (1 << 62, 0), 0)) - 1
        begin, end, offloaded_ms = spans[i]
        assert begin <= position <= end, (position, spans[i])
        lag_db.append((offloaded_ms or 0) / 1000 - stamp / 1e9)
    if entries != writer.entries:
        raise RuntimeError(f"wrote {writer.entries} entries, read back {entries}")
    payload_bytes = entries * cfg.entry_size
    durations = [(p.returned_ns - p.started_ns) / 1e9 for p in passes]
    data = sorted(s.data_len for s in committed)
    committed_lag = _summary(lag_committed)
    report = {
        "entries": entries,
        "payload_mib": round(payload_bytes / MiB, 1),
        "writer_s": round(writer.seconds, 2),
        "achieved_mib_s": round(payload_bytes / MiB / writer.seconds, 2),
        "writer_max_behind_s": round(writer.max_behind_s, 3),
        "passes": len(passes),
        "pass_s": {
            "median": round(statistics.median(durations), 3),
            "max": round(max(durations), 3),
            "final_close_now": round(durations[-1], 3),
        },
        "lag_committed": committed_lag,
        "lag_durable": _summary(lag_durable),
        "lag_by_db_offloaded_ms": _summary(lag_db),
        "lag_target_s": cfg.lag_target_s,
        "lag_met": committed_lag["max_s"] <= cfg.lag_target_s,
        "segments": len(committed),
        "objects": 2 * len(committed),  # data + index per segment
        "segment_data_mib": {
            "min": round(data[0] / MiB, 2),
            "median": round(statistics.median(data) / MiB, 2),
            "max": round(data[-1] / MiB, 2),
        },
        "by_segment": _segments_report(rt, committed),
        "requests": _per_gib(counting.requests, payload_bytes),
    }
    return report, payloads


# --- ledger-based offload of the same payloads ---------------------------------------
def _bench_ledgers(rt: Runtime, payloads: list[bytes]) -> dict:
    payload_bytes = sum(map(len, payloads))
    topics = {}
    for size in LEDGER_SIZES:
        topic = f"ledgers-{size // KiB}k"
        rt.metadata.create_topic(topic, ledger_policy(size))
        with ManagedLedgerWriter(rt.metadata, rt.hot, topic) as writer:
            for payload in payloads:
                writer.append(payload)
        topics[size] = topic
    out = {}
    for size, topic in topics.items():
        last = max(x.ledger_id for x in rt.metadata.list_ledgers(topic, live=True))
        tally = Tally()
        tally.measure(rt, lambda t=topic, u=last: LedgerOffloader(rt).offload_topic(t, up_to=u))
        label = f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"
        out[label] = {
            "ledger_bytes": size,
            "payload_mib": round(payload_bytes / MiB, 1),
            "ledgers": tally.ledgers,
            "seconds": round(tally.seconds, 2),
            "transactions": tally.transactions,
            **_per_gib(tally.requests, payload_bytes),
        }
    return out


# --- pass throughput on a backlog ----------------------------------------------------
def _produce_backlog(rt: Runtime, topic: str, cfg: Config, seed: int) -> None:
    size = cfg.entry_size
    pool = random.Random(seed).randbytes(size * 64)
    with ManagedLedgerWriter(rt.metadata, rt.hot, topic) as writer:
        for k in range(cfg.backlog_mib * MiB // size):
            at = (k * 4099) % (len(pool) - size)
            writer.append(pool[at : at + size])


def _segment_parts(rt: Runtime, topic: str) -> list[list[bytes]]:
    """The recorded part bytes of each committed segment, read back from the store."""
    out = []
    for s in rt.metadata.segments.of_topic(topic):
        assert s.state is SegmentState.OFFLOADED, s.state
        data = rt.objects.get(s.data_key)
        parts = rt.metadata.segments.parts(s)
        out.append([data[p.offset : p.offset + p.length] for p in parts])
    return out


def _raw_multipart(client: Any, bucket: str, key: str, parts: list[bytes], in_flight: int) -> None:
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    def send(number: int, body: bytes) -> dict:
        reply = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body
        )
        return {"PartNumber": number, "ETag": reply["ETag"]}

    numbers = range(1, len(parts) + 1)
    if in_flight == 1:
        done = list(map(send, numbers, parts))
    else:
        with ThreadPoolExecutor(max_workers=in_flight) as pool:
            done = list(pool.map(send, numbers, parts))
    client.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
    )


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _bench_throughput(rt: Runtime, cfg: Config) -> dict:
    topics = [f"backlog-{i}" for i in range(cfg.repeats)]
    for i, topic in enumerate(topics):
        rt.metadata.create_topic(topic, stream_policy(cfg))
        _produce_backlog(rt, topic, cfg, seed=100 + i)
    store = rt.objects
    client = store._client  # type: ignore[attr-defined]  # the store's own boto3 client
    concurrency = rt.settings.upload_concurrency
    streamer = StreamingOffloader(rt, owner="bench-backlog")
    ours_s, raw_s, raw_concurrent_s, hot_read_s = [], [], [], []
    uploaded, segments = [], []
    for i, topic in enumerate(topics):  # interleaved: ours, raw one at a time, raw in flight
        seconds, record = _timed(lambda t=topic: _run_pass(streamer, t, close_now=True))
        ours_s.append(seconds)
        uploaded.append(record.bytes_uploaded)
        # part of the pass alone: reading the backlog from the hot tier (after the pass, so
        # the page cache is as warm as the pass found it)
        hot_read_s.append(_timed(lambda t=topic: sum(len(e[2]) for e in _stamps(rt, t)))[0])
        parts = _segment_parts(rt, topic)
        segments.append(len(parts))
        if sum(map(len, (p for s in parts for p in s))) != record.bytes_uploaded:
            raise RuntimeError("the committed segments do not hold what the pass uploaded")
        for name, in_flight, times in (("seq", 1, raw_s), ("conc", concurrency, raw_concurrent_s)):
            keys = [f"{store.prefix}raw-{name}-{i}-{n}" for n in range(len(parts))]  # type: ignore[attr-defined]
            times.append(
                _timed(
                    lambda k=keys, p=parts, f=in_flight: [
                        _raw_multipart(client, store.bucket, key, ps, f)  # type: ignore[attr-defined]
                        for key, ps in zip(k, p, strict=True)
                    ]
                )[0]
            )
    nbytes = statistics.median(uploaded)
    ours, raw, raw_c = (statistics.median(x) for x in (ours_s, raw_s, raw_concurrent_s))
    ratio = round(raw / ours, 3)
    return {
        "backlog_mib": cfg.backlog_mib,
        "repeats": cfg.repeats,
        "segments_per_pass": segments,
        "uploaded_mib": round(nbytes / MiB, 1),
        "ours_s": [round(x, 3) for x in ours_s],
        "raw_s": [round(x, 3) for x in raw_s],
        "raw_concurrent_s": [round(x, 3) for x in raw_concurrent_s],
        "hot_read_s": round(statistics.median(hot_read_s), 3),
        "concurrency": concurrency,
        "ours_mb_per_s": round(nbytes / ours / 1e6, 1),
        "raw_mb_per_s": round(nbytes / raw / 1e6, 1),
        "raw_concurrent_mb_per_s": round(nbytes / raw_c / 1e6, 1),
        "ratio": ratio,
        "ratio_to_concurrent": round(raw_c / ours, 3),
        "target": TARGET_THROUGHPUT_RATIO,
        "met": ratio >= TARGET_THROUGHPUT_RATIO,
    }


def bench(rt: Runtime, cfg: Config) -> dict:
    stream, payloads = _bench_stream(rt, cfg)
    ledgers = _bench_ledgers(rt, payloads)
    del payloads
    ours = stream["requests"]["put_class_per_gib"]
    ours_all = stream["requests"]["all_requests_per_gib"]  # HEADs too: the target's count
    requests = {
        "streaming": stream.pop("requests"),
        "ledger_based": ledgers,
        "target_per_gib": TARGET_REQUESTS_PER_GIB,
        "met": ours_all <= TARGET_REQUESTS_PER_GIB,
        # arithmetic, not measured: UploadParts alone at min_part_bytes per part
        "modelled_min_upload_parts_per_gib": round(GiB / (cfg.min_part_mib * MiB), 1),
        "ratio_to_ledger_based": {
            k: float(f"{ours / v['put_class_per_gib']:.3g}") for k, v in ledgers.items()
        },
    }
    return {
        "config": asdict(cfg),
        "stream": stream,
        "requests": requests,
        "throughput": _bench_throughput(rt, cfg),
    }


def run(quick: bool = False, cfg: Config | None = None, work_dir: Path | None = None) -> dict:
    """The streaming benchmark on SeaweedFS + PostgreSQL; skipped without PostgreSQL."""
    cfg = cfg or (QUICK if quick else FULL)
    # the system's temporary directory by default: SeaweedFS's unix socket path must be short
    with (
        tempfile.TemporaryDirectory(prefix="bench-stream-", dir=work_dir) as tmp,
        s3_postgres_runtime(Path(tmp), "bench-stream") as rt,
    ):
        if rt is None:
            return {"skipped": "PostgreSQL not reachable on 127.0.0.1:5432"}
        return bench(rt, cfg)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))
