"""Merging v2 segments into one, server side where the store allows it (compaction).

``merge_segments`` fills a multipart upload the caller created: big sources in the
target's own store are copied part by part with ``upload_part_copy`` (S3's
UploadPartCopy; no byte passes through this process), small ones are downloaded, checked
block by block against their index's CRCs (damage read is never written again) and
uploaded in parts of about ``part_size``. It returns the parts, the merged segment's v2
index (same blocks and CRCs at new offsets and part ids; so scrub and readers still check
copied bytes) and the ledger ranges it holds. It neither completes the upload nor writes
the index: the caller does, recording its state between the steps (invariant 1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from offloader.exceptions import DamagedObjectError, FormatError
from offloader.format import decode_segment_index, encode_segment_index, verify_block
from offloader.metadata.records import PieceRange
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo
from offloader.rewrite.merge_parts import PlannedPart, SourceBlock, runs
from offloader.rewrite.merge_plan import DEFAULT_PART_SIZE, MergePlan, SegmentSource, plan_merge

__all__ = ["DEFAULT_PART_SIZE", "MergedSegment", "SegmentSource", "load_source", "merge_segments"]


@dataclass(frozen=True)
class MergedSegment:
    """What the caller completes and records: ``parts`` in part order, the data object's
    length, its index object, and ``pieces``, every ledger range it holds (the new
    segment's ``segment_ledgers`` rows; unwanted ledgers whose bytes had to stay included).
    ``dropped`` are the unwanted pieces that were left out."""

    parts: list[PartInfo]
    data_len: int
    index: bytes
    pieces: list[PieceRange]
    dropped: list[PieceRange]


def load_source(
    store: ObjectStore, data_key: str, index_key: str, data_len: int, keep: Sequence[PieceRange]
) -> SegmentSource:
    """A source from its objects: one GET of the index, decoded and checked (a damaged
    index is DamagedObjectError naming its key)."""
    try:
        index = decode_segment_index(store.get(index_key))
    except FormatError as err:
        raise DamagedObjectError(
            str(err), topic=None, ledger_id=None, key=index_key, offset=err.offset or 0
        ) from err
    return SegmentSource(store, data_key, data_len, index, tuple(keep))


def merge_segments(
    target: ObjectStore,
    upload: MultipartUpload,
    sources: Sequence[SegmentSource],
    *,
    on_part: Callable[[PartInfo], None] = lambda p: None,
    part_size: int = DEFAULT_PART_SIZE,
    concurrency: int = 1,
    ledger_times: Mapping[int, tuple[int, int]] | None = None,
) -> MergedSegment:
    """Upload the merge of ``sources`` (adjacent segments of one topic, in position order)
    as the parts of ``upload``, a multipart upload of ``target``.

    ``on_part`` is called with each part once it is uploaded, in part order, from this
    thread; up to ``concurrency`` parts are in flight. ``ledger_times`` (ledger id ->
    created_ms, sealed_ms, e.g. from the metadata store) overrides what the sources'
    indexes know. Bad sources raise ValueError before any request; a downloaded block that
    fails its CRC raises DamagedObjectError naming the source object and offset. Parts
    uploaded before an error stay in the upload: the caller aborts it or redoes the merge
    (the same sources give the same parts).
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    plan = plan_merge(target, sources, part_size=part_size)
    times = {**plan.times, **(ledger_times or {})}
    index = encode_segment_index(plan.blocks(), topic=plan.topic, ledger_times=times)
    parts = list(_upload(target, upload, sources, plan, on_part, concurrency))
    return MergedSegment(parts, plan.data_len, index, list(plan.pieces), list(plan.dropped))


def _upload(
    target: ObjectStore,
    upload: MultipartUpload,
    sources: Sequence[SegmentSource],
    plan: MergePlan,
    on_part: Callable[[PartInfo], None],
    concurrency: int,
) -> Iterator[PartInfo]:
    """Each planned part, at most ``concurrency`` at once; yielded (and reported) in order."""

    def one(part: PlannedPart) -> PartInfo:
        if part.copy:
            first = part.blocks[0]
            key = sources[first.source].data_key
            return target.upload_part_copy(upload, part.number, key, first.ref.offset, part.length)
        return target.upload_part(upload, part.number, _download(sources, part, plan.topic))

    with ThreadPoolExecutor(concurrency, thread_name_prefix="merge") as pool:
        running: deque[Future[PartInfo]] = deque()
        try:
            for part in plan.parts:
                if len(running) == concurrency:
                    yield _done(running.popleft(), on_part)
                running.append(pool.submit(one, part))
            while running:
                yield _done(running.popleft(), on_part)
        finally:
            for future in running:
                future.cancel()


def _done(future: Future[PartInfo], on_part: Callable[[PartInfo], None]) -> PartInfo:
    info = future.result()
    on_part(info)
    return info


def _download(sources: Sequence[SegmentSource], part: PlannedPart, topic: str) -> bytes:
    """The part's bytes: one ranged GET per run of adjacent blocks of one source, every
    block checked against its index CRC before it goes anywhere."""
    out = []
    for blocks in runs(part.blocks, _adjacent):
        source = sources[blocks[0].source]
        start = blocks[0].ref.offset
        length = blocks[-1].end - start
        data = source.store.read_range(source.data_key, start, length)
        view = memoryview(data)
        for b in blocks:
            at = b.ref.offset - start
            try:
                verify_block(view[at : at + b.ref.length], b.ref)
            except FormatError as err:
                raise DamagedObjectError(
                    f"{err} (refused for a merge)",
                    topic=topic,
                    ledger_id=b.ledger_id,
                    key=source.data_key,
                    offset=err.offset if err.offset is not None else b.ref.offset,
                ) from err
        out.append(data)
    return b"".join(out)


def _adjacent(a: SourceBlock, b: SourceBlock) -> bool:
    """``b`` follows ``a`` in the same source object: one ranged GET reads both."""
    return a.source == b.source and a.end == b.ref.offset
