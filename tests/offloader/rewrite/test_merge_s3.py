"""merge_segments on SeaweedFS with S3's real part rules (5 MiB, EntityTooSmall on
complete): big sources go by UploadPartCopy and are never downloaded, a big source in
another bucket is downloaded, random layouts read back identical, damage read is refused."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from fixtures.counting import CountingStore
from fixtures.damage import flip, overwrite_object
from fixtures.merges import Stored, read_back, run_merge, store_segment
from fixtures.seaweedfs import SeaweedS3
from fixtures.segments import SegmentEntries
from offloader.exceptions import DamagedObjectError
from offloader.objectstore.s3 import S3ObjectStore
from offloader.rewrite.merge import merge_segments

pytestmark = pytest.mark.s3

KiB = 1024
MiB = 1024 * KiB
BLOCK = 1 * MiB


def ledger(ledger_id: int, first: int, nbytes: int, seed: int = 0) -> SegmentEntries:
    """Entries of 0-64 KiB adding up to about ``nbytes`` of payload."""
    rng = random.Random(ledger_id * 7919 + first + seed)
    out: SegmentEntries = []
    while sum(len(p) for _, _, p in out) < nbytes:
        out.append((ledger_id, first + len(out), rng.randbytes(rng.randint(0, 64 * KiB))))
    return out


@pytest.fixture
def target(s3_store: S3ObjectStore) -> CountingStore:
    return CountingStore(s3_store)


@pytest.fixture
def other_bucket(s3_server: SeaweedS3) -> Iterator[S3ObjectStore]:
    settings = s3_server.make_settings("merge-other")
    assert settings.object_store_url is not None
    store = S3ObjectStore.from_url(settings.object_store_url, settings)
    yield store
    store.close()


def _put(store: object, entries: SegmentEntries) -> Stored:
    return store_segment(store, entries, block=BLOCK, chunk=256 * KiB, part=5 * MiB)  # type: ignore[arg-type]


def _calls(store: CountingStore, verb: str) -> list[tuple]:
    return [args for name, args in store.calls if name == verb]


def test_big_sources_are_copied_server_side_never_downloaded(
    target: CountingStore, other_bucket: S3ObjectStore
) -> None:
    """big1 is copied; a, b (short) take big2's leading blocks to make a 5 MiB part and
    big2's rest is copied; big3 lives in another bucket: downloaded; c is the last part."""
    seven = ledger(7, 0, 20 * MiB)
    cut = len(seven) * 13 // 20
    s = {
        "big1": _put(target, ledger(5, 0, 6 * MiB)),
        "a": _put(target, ledger(6, 0, 300 * KiB)),
        "b": _put(target, seven[:4]),
        "big2": _put(target, seven[4:cut]),
        "big3": _put(other_bucket, seven[cut:]),
        "c": _put(target, ledger(8, 0, 200 * KiB)),
    }
    assert s["big2"].data_len > 10 * MiB and s["b"].data_len < 5 * MiB
    target.calls.clear()

    key, merged = run_merge(target, [x.source() for x in s.values()], concurrency=3)

    copies = _calls(target, "upload_part_copy")
    reads = _calls(target, "read_range")
    assert [c[2] for c in copies] == [s["big1"].data_key, s["big2"].data_key]
    assert [r[0] for r in reads] == [s[n].data_key for n in ("a", "b", "big2", "c")]
    lead = reads[2][2]
    assert reads[2][1] == 0 and 0 < lead <= 5 * MiB
    assert copies[1][3:] == (lead, s["big2"].data_len - lead)
    assert not target.keys("get")
    assert all(p.size >= 5 * MiB for p in merged.parts[:-1])  # SeaweedFS enforced it too
    expected = [e for x in s.values() for e in x.entries]
    assert read_back(target.inner, key, merged) == expected
    assert target.inner.get(key) == b"".join(x.store.get(x.data_key) for x in s.values())


@pytest.mark.parametrize("seed", [4, 5])  # layouts with copies, downloads, a dropped ledger
def test_random_layouts_read_back_identical(target: CountingStore, seed: int) -> None:
    rng = random.Random(seed)
    stored, first = [], 0
    for ledger_id in range(10, 10 + rng.randint(4, 6)):
        size = rng.choice([64 * KiB, 700 * KiB, 2 * MiB, 6 * MiB, 9 * MiB])
        entries = ledger(ledger_id, first, size, seed)
        if rng.random() < 0.4 and len(entries) > 2:  # the ledger goes on in the next segment
            stored.append(_put(target, entries[: len(entries) // 2]))
            entries = entries[len(entries) // 2 :]
        stored.append(_put(target, entries))
    unwanted = {rng.randrange(10, 12)}
    target.calls.clear()

    key, merged = run_merge(target, [x.source(unwanted) for x in stored], concurrency=2)

    copies = {c[2] for c in _calls(target, "upload_part_copy")}
    read = {}
    for r in _calls(target, "read_range"):
        read[r[0]] = read.get(r[0], 0) + r[2]
    for x in stored:
        if x.data_len >= 5 * MiB:
            assert x.data_key in copies or read.get(x.data_key) == x.data_len
            assert read.get(x.data_key, 0) <= 10 * MiB + 2 * BLOCK
        else:
            assert x.data_key not in copies
    assert copies and read  # both paths taken
    dropped = {p.ledger_id for p in merged.dropped}
    assert dropped <= unwanted
    expected = [e for x in stored for e in x.entries if e[0] not in dropped]
    assert read_back(target.inner, key, merged) == expected


def test_a_damaged_downloaded_source_is_refused(target: CountingStore) -> None:
    big = _put(target, ledger(5, 0, 6 * MiB))
    small = _put(target, ledger(6, 0, 300 * KiB))
    block = small.index.ledgers[0].blocks[0]
    overwrite_object(target.inner, small.data_key, flip(block.offset + 4000))
    upload = target.create_multipart("merged")

    with pytest.raises(DamagedObjectError, match=f"object {small.data_key} offset 0: CRC"):
        merge_segments(target, upload, [big.source(), small.source()])
    target.abort_multipart(upload)
    assert not target.inner.exists("merged")
