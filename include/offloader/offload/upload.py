"""Uploading an encoded data object: one block per multipart part, parts in parallel, bounded."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from offloader import failpoints
from offloader.format import BlockRef, ChunkRef, EncodedBlock
from offloader.objectstore import MultipartUpload, ObjectStore, PartInfo


@dataclass(frozen=True)
class UploadedObject:
    blocks: tuple[BlockRef, ...]
    chunks: tuple[ChunkRef, ...]
    length: int


def upload_blocks(
    store: ObjectStore,
    key: str,
    blocks: Iterator[EncodedBlock],
    *,
    metadata: Mapping[str, str],
    concurrency: int,
    check: Callable[[], None] = lambda: None,
) -> UploadedObject:
    """Write ``blocks`` as the object ``key`` with a conditional create.

    Encoding runs in the calling thread while up to ``concurrency`` parts upload, so at most
    ``concurrency + 1`` blocks are in memory. ``check`` runs between parts and raises to stop
    early (a lost lease). A failed upload is aborted before the error propagates.
    """
    first = next(blocks)
    second = next(blocks, None)
    if second is None:  # one block: a single conditional PUT is cheaper than multipart
        check()
        store.put(key, first.data, metadata=metadata, if_none_match=True)
        return UploadedObject((first.ref,), first.chunks, first.ref.length)

    caps = store.capabilities
    if first.ref.length < caps.min_part_size:
        raise ValueError(
            f"max_block_size ({first.ref.length}) is below the object store's minimum part "
            f"size ({caps.min_part_size}); raise the topic policy's max_block_size"
        )
    upload = store.create_multipart(key, metadata=metadata)
    try:
        refs, chunks, parts = _upload_parts(
            store, upload, _chain(first, second, blocks), concurrency, check, caps.max_parts
        )
        check()
        failpoints.reach("before-complete")
        store.complete_multipart(upload, parts, if_none_match=True)
    except BaseException:
        store.abort_multipart(upload)
        raise
    length = refs[-1].offset + refs[-1].length
    return UploadedObject(tuple(refs), tuple(chunks), length)


def _chain(
    first: EncodedBlock, second: EncodedBlock, rest: Iterator[EncodedBlock]
) -> Iterator[EncodedBlock]:
    yield first
    yield second
    yield from rest


def _upload_parts(
    store: ObjectStore,
    upload: MultipartUpload,
    blocks: Iterator[EncodedBlock],
    concurrency: int,
    check: Callable[[], None],
    max_parts: int,
) -> tuple[list[BlockRef], list[ChunkRef], list[PartInfo]]:
    refs: list[BlockRef] = []
    chunks: list[ChunkRef] = []
    parts: list[PartInfo] = []
    in_flight: set[Future[PartInfo]] = set()

    def collect(wanted_in_flight: int) -> None:
        nonlocal in_flight
        while len(in_flight) > wanted_in_flight:
            done, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
            parts.extend(f.result() for f in done)
            if len(parts) == len(done):
                failpoints.reach("after-first-part")

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="upload-part") as pool:
        try:
            for block in blocks:
                if block.ref.part_id > max_parts:
                    raise ValueError(
                        f"the ledger needs more than {max_parts} parts; raise max_block_size"
                    )
                check()
                collect(concurrency - 1)
                refs.append(block.ref)
                chunks.extend(block.chunks)
                in_flight.add(pool.submit(store.upload_part, upload, block.ref.part_id, block.data))
            collect(0)
        finally:
            for future in in_flight:
                future.cancel()
    parts.sort(key=lambda p: p.part_number)
    return refs, chunks, parts
