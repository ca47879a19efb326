"""upload_blocks: a data object as one conditional PUT or as multipart parts in parallel,
bounded in requests and memory, aborted on failure; on the files store (S3's rules that
the files store does not enforce, part order, are checked by a strict wrapper)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.faults import _Delegating
from offloader import failpoints
from offloader.exceptions import ObjectExistsError, ObjectStoreError
from offloader.format import EncodedBlock, encode_blocks
from offloader.objectstore import Capabilities, ObjectStore, PartInfo
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.offload.upload import upload_blocks

META = {"role": "data", "ledger-id": "7"}
ENTRIES = [(i, bytes([i]) * 700) for i in range(12)]
BLOCK = 2048  # two entries a block: six blocks


def blocks(max_block_size: int = BLOCK) -> list[EncodedBlock]:
    return list(encode_blocks(ENTRIES, max_block_size=max_block_size, chunk_target=1024))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[FilesystemObjectStore]:
    store = FilesystemObjectStore(tmp_path / "objects")
    yield store
    store.close()


class S3Rules(_Delegating):
    """The files store, with S3's limits: ``capabilities`` as given, and parts handed to
    complete_multipart in ascending order (S3 answers InvalidPartOrder otherwise). Records
    the threads parts upload from."""

    def __init__(self, store: ObjectStore, **limits: int) -> None:
        super().__init__(store)
        self.capabilities = Capabilities(**{**vars(store.capabilities), **limits})
        self.part_threads: list[str] = []

    def upload_part(self, upload: Any, part_number: int, data: bytes) -> PartInfo:
        self.part_threads.append(threading.current_thread().name)
        return self._inner.upload_part(upload, part_number, data)

    def complete_multipart(self, upload: Any, parts: list[PartInfo], **kwargs: Any) -> None:
        numbers = [p.part_number for p in parts]
        if numbers != sorted(numbers):
            raise ObjectStoreError(f"InvalidPartOrder: {numbers}")
        self._inner.complete_multipart(upload, parts, **kwargs)


def test_one_block_is_one_conditional_put_with_its_metadata(store: ObjectStore) -> None:
    (block,) = blocks(max_block_size=1 << 20)
    checks: list[str] = []
    uploaded = upload_blocks(
        store, "k", iter([block]), metadata=META, concurrency=2, check=lambda: checks.append("c")
    )
    assert (uploaded.blocks, uploaded.chunks, uploaded.length) == (
        (block.ref,),
        block.chunks,
        block.ref.length,
    )
    assert store.get("k") == bytes(block.data)
    assert dict(store.stat("k").metadata) == META
    assert checks == ["c"]  # once, before the PUT
    with pytest.raises(ObjectExistsError):  # never over an existing object
        upload_blocks(store, "k", iter([block]), metadata={}, concurrency=2)
    assert dict(store.stat("k").metadata) == META


def test_blocks_upload_as_ordered_parts_from_the_part_pool(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    strict = S3Rules(store)
    reached: list[str] = []
    monkeypatch.setattr(failpoints, "reach", reached.append)
    encoded = blocks()
    assert len(encoded) == 6
    uploaded = upload_blocks(strict, "k", iter(encoded), metadata=META, concurrency=1)  # type: ignore[arg-type]
    assert uploaded.blocks == tuple(b.ref for b in encoded)
    assert uploaded.chunks == tuple(c for b in encoded for c in b.chunks)
    assert uploaded.length == sum(b.ref.length for b in encoded) == store.stat("k").size
    assert store.get("k") == b"".join(bytes(b.data) for b in encoded)
    assert dict(store.stat("k").metadata) == META
    assert reached == ["after-first-part", "before-complete"]  # the crash points, once each
    assert len(strict.part_threads) == 6
    assert all(name.startswith("upload-part") for name in strict.part_threads)
    with pytest.raises(ObjectExistsError):  # the completion is conditional too
        upload_blocks(store, "k", iter(blocks()), metadata=META, concurrency=2)
    assert list(store.list_multipart_uploads()) == []  # and the refused upload aborted


class Gated(S3Rules):
    """Part uploads wait until released; part 1 finishes last."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store)
        self.entered = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def upload_part(self, upload: Any, part_number: int, data: bytes) -> PartInfo:
        with self._lock:
            self.entered += 1
        self.release.wait(30)
        if part_number == 1:
            time.sleep(0.2)  # the others complete first: the parts come back out of order
        return super().upload_part(upload, part_number, data)


def test_at_most_concurrency_parts_in_flight_and_one_block_more_in_memory(
    store: ObjectStore,
) -> None:
    gated = Gated(store)
    produced: list[int] = []

    def source() -> Iterator[EncodedBlock]:
        for block in blocks():
            produced.append(block.ref.part_id)
            yield block

    def upload() -> None:
        upload_blocks(gated, "k", source(), metadata=META, concurrency=3)  # type: ignore[arg-type]

    worker = threading.Thread(target=upload)
    worker.start()
    deadline = time.monotonic() + 30
    while gated.entered < 3:
        assert time.monotonic() < deadline, f"only {gated.entered} parts started"
        time.sleep(0.01)
    time.sleep(0.3)  # the encoder would run ahead here if it could
    assert (gated.entered, len(produced)) == (3, 4)
    gated.release.set()
    worker.join(30)
    assert store.get("k") == b"".join(bytes(b.data) for b in blocks())


class FirstWaitsForThird(_Delegating):
    """Part 1 finishes only once part 3 has started (or after 5 s, noted as not)."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store)
        self.third_started = threading.Event()
        self.first_saw_third: bool | None = None

    def upload_part(self, upload: Any, part_number: int, data: bytes) -> PartInfo:
        if part_number == 3:
            self.third_started.set()
        if part_number == 1:
            self.first_saw_third = self.third_started.wait(5)
        return self._inner.upload_part(upload, part_number, data)


def test_a_part_starts_as_soon_as_any_part_in_flight_finishes(store: ObjectStore) -> None:
    """The window slides: with two in flight and part 1 slow, part 2's end lets part 3
    start while part 1 is still uploading (not after the whole window drained)."""
    slow = FirstWaitsForThird(store)
    upload_blocks(slow, "k", iter(blocks()), metadata=META, concurrency=2)  # type: ignore[arg-type]
    assert slow.first_saw_third is True
    assert store.get("k") == b"".join(bytes(b.data) for b in blocks())


def test_a_failed_part_aborts_the_upload(store: ObjectStore) -> None:
    class FailsPart3(_Delegating):
        def upload_part(self, upload: Any, part_number: int, data: bytes) -> PartInfo:
            if part_number == 3:
                raise ObjectStoreError("injected: part 3 refused")
            return self._inner.upload_part(upload, part_number, data)

    with pytest.raises(ObjectStoreError, match="part 3 refused"):
        upload_blocks(FailsPart3(store), "k", iter(blocks()), metadata=META, concurrency=2)  # type: ignore[arg-type]
    assert list(store.list_multipart_uploads()) == []
    assert not store.exists("k")


def test_blocks_must_be_at_least_the_stores_minimum_part_size(store: ObjectStore) -> None:
    encoded = blocks()
    size = encoded[0].ref.length
    ok = S3Rules(store, min_part_size=size)
    upload_blocks(ok, "k", iter(encoded), metadata=META, concurrency=2)  # type: ignore[arg-type]
    small = S3Rules(store, min_part_size=size + 1)
    with pytest.raises(ValueError) as raised:
        upload_blocks(small, "k2", iter(blocks()), metadata=META, concurrency=2)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"max_block_size ({size}) is below the object store's minimum part size ({size + 1}); "
        "raise the topic policy's max_block_size"
    )
    assert list(store.list_multipart_uploads()) == [] and not store.exists("k2")


def test_a_ledger_needing_more_parts_than_the_store_allows_is_refused(store: ObjectStore) -> None:
    upload_blocks(S3Rules(store, max_parts=6), "k", iter(blocks()), metadata=META, concurrency=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as raised:
        upload_blocks(
            S3Rules(store, max_parts=5),  # type: ignore[arg-type]
            "k2",
            iter(blocks()),
            metadata=META,
            concurrency=2,
        )
    assert str(raised.value) == "the ledger needs more than 5 parts; raise max_block_size"
    assert list(store.list_multipart_uploads()) == [] and not store.exists("k2")


def test_a_lost_lease_stops_the_upload_between_parts(store: ObjectStore) -> None:
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise ObjectStoreError("lease lost")

    with pytest.raises(ObjectStoreError, match="lease lost"):
        upload_blocks(store, "k", iter(blocks()), metadata=META, concurrency=1, check=check)
    assert list(store.list_multipart_uploads()) == [] and not store.exists("k")
