"""One behaviour suite, run against every binding: what callers may rely on everywhere."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from offloader.exceptions import (
    InvalidRangeError,
    ObjectExistsError,
    ObjectNotFoundError,
    PartTooSmallError,
)
from offloader.objectstore import ObjectStore


def _part_size(store: ObjectStore) -> int:
    """Parts as small as the binding allows, but never tiny: the smallest real workload."""
    return max(store.capabilities.min_part_size, 64 * 1024)


def _put_many(store: ObjectStore, keys: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: store.put(key, key.encode()), keys))


def test_put_get_stat_round_trip_metadata(object_store: ObjectStore) -> None:
    object_store.put("ledgers/1/data", b"hello world", metadata={"ledger-id": "1", "crc": "abc"})

    assert object_store.get("ledgers/1/data") == b"hello world"
    info = object_store.stat("ledgers/1/data")
    assert info.key == "ledgers/1/data"
    assert info.size == 11
    assert dict(info.metadata) == {"ledger-id": "1", "crc": "abc"}
    assert info.last_modified is not None


def test_put_overwrites_without_condition(object_store: ObjectStore) -> None:
    object_store.put("k", b"first", metadata={"v": "1"})
    object_store.put("k", b"second!", metadata={"v": "2"})

    assert object_store.get("k") == b"second!"
    assert object_store.stat("k").metadata == {"v": "2"}


def test_empty_object(object_store: ObjectStore) -> None:
    object_store.put("empty", b"")

    assert object_store.get("empty") == b""
    assert object_store.stat("empty").size == 0
    assert object_store.read_range("empty", 0, 10) == b""


def test_conditional_put_refuses_existing_key(object_store: ObjectStore) -> None:
    object_store.put("once", b"winner", if_none_match=True)

    with pytest.raises(ObjectExistsError):
        object_store.put("once", b"loser", if_none_match=True)
    assert object_store.get("once") == b"winner"


def test_conditional_put_race_has_one_winner(object_store: ObjectStore) -> None:
    def attempt(number: int) -> bool:
        try:
            object_store.put("contested", b"%d" % number, if_none_match=True)
        except ObjectExistsError:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(attempt, range(8)))

    assert results.count(True) == 1


@pytest.mark.parametrize(
    ("offset", "length", "expected"),
    [
        (0, 4, b"0123"),
        (3, 4, b"3456"),
        (8, 10, b"89"),
        (10, 5, b""),
        (50, 5, b""),
        (2, 0, b""),
    ],
    ids=["start", "middle", "end", "at-end", "past-end", "zero-length"],
)
def test_read_range(object_store: ObjectStore, offset: int, length: int, expected: bytes) -> None:
    object_store.put("digits", b"0123456789")

    assert object_store.read_range("digits", offset, length) == expected


def test_read_range_of_missing_key(object_store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        object_store.read_range("missing", 0, 10)


def test_multipart_parts_uploaded_from_threads_complete_in_order(
    object_store: ObjectStore,
) -> None:
    size = _part_size(object_store)
    payloads = [bytes([number]) * size for number in range(1, 4)] + [b"tail"]
    upload = object_store.create_multipart("big/object", metadata={"parts": "4"})
    numbered = list(enumerate(payloads, start=1))
    random.Random(7).shuffle(numbered)

    with ThreadPoolExecutor(4) as pool:
        parts = list(pool.map(lambda item: object_store.upload_part(upload, *item), numbered))
    object_store.complete_multipart(upload, parts)

    assert object_store.get("big/object") == b"".join(payloads)
    info = object_store.stat("big/object")
    assert info.size == 3 * size + 4
    assert info.metadata == {"parts": "4"}
    assert object_store.read_range("big/object", size - 2, 4) == b"\x01\x01\x02\x02"
    assert list(object_store.list_multipart_uploads()) == []


def test_conditional_complete_refuses_existing_key(object_store: ObjectStore) -> None:
    object_store.put("taken", b"original")
    upload = object_store.create_multipart("taken")
    part = object_store.upload_part(upload, 1, b"replacement")

    with pytest.raises(ObjectExistsError):
        object_store.complete_multipart(upload, [part], if_none_match=True)

    assert object_store.get("taken") == b"original"
    object_store.abort_multipart(upload)


def test_conditional_complete_on_free_key(object_store: ObjectStore) -> None:
    upload = object_store.create_multipart("free")
    part = object_store.upload_part(upload, 1, b"content")

    object_store.complete_multipart(upload, [part], if_none_match=True)

    assert object_store.get("free") == b"content"


def test_conditional_complete_race_has_one_winner(object_store: ObjectStore) -> None:
    uploads = [object_store.create_multipart("raced") for _ in range(6)]
    parts = [object_store.upload_part(u, 1, b"%d" % i) for i, u in enumerate(uploads)]

    def attempt(index: int) -> bool:
        try:
            object_store.complete_multipart(uploads[index], [parts[index]], if_none_match=True)
        except ObjectExistsError:
            object_store.abort_multipart(uploads[index])
            return False
        return True

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(attempt, range(6)))

    assert results.count(True) == 1
    assert object_store.get("raced") == b"%d" % results.index(True)


def test_abort_and_list_multipart_uploads(object_store: ObjectStore) -> None:
    first = object_store.create_multipart("up/a")
    second = object_store.create_multipart("up/b")
    other = object_store.create_multipart("elsewhere")
    object_store.upload_part(first, 1, b"x")

    listed = {(u.key, u.upload_id) for u in object_store.list_multipart_uploads("up/")}
    assert listed == {("up/a", first.upload_id), ("up/b", second.upload_id)}
    assert len(list(object_store.list_multipart_uploads())) == 3

    object_store.abort_multipart(first)
    object_store.abort_multipart(first)  # an unknown upload is not an error
    object_store.abort_multipart(second)
    object_store.abort_multipart(other)

    assert list(object_store.list_multipart_uploads()) == []
    assert not object_store.exists("up/a")


def test_part_numbers_are_checked(object_store: ObjectStore) -> None:
    upload = object_store.create_multipart("parts")
    try:
        with pytest.raises(ValueError):
            object_store.upload_part(upload, 0, b"x")
        with pytest.raises(ValueError):
            object_store.upload_part(upload, object_store.capabilities.max_parts + 1, b"x")
    finally:
        object_store.abort_multipart(upload)


def test_list_with_prefix(object_store: ObjectStore) -> None:
    for key in ["a/1", "a/2", "a/sub/3", "ab", "b/1"]:
        object_store.put(key, b"xy")

    assert [info.key for info in object_store.list("a/")] == ["a/1", "a/2", "a/sub/3"]
    assert [info.key for info in object_store.list("a")] == ["a/1", "a/2", "a/sub/3", "ab"]
    assert [info.key for info in object_store.list("a/s")] == ["a/sub/3"]
    assert [info.size for info in object_store.list("b/")] == [2]
    assert list(object_store.list("nothing/")) == []
    assert len(list(object_store.list())) == 5


def test_list_and_delete_more_than_a_page(object_store: ObjectStore) -> None:
    keys = [f"many/{number:05d}" for number in range(1050)]
    _put_many(object_store, keys)
    object_store.put("other", b"stays")

    assert [info.key for info in object_store.list("many/")] == keys

    result = object_store.delete_many([*keys, "many/missing-1", "many/missing-2"])

    assert result.failed == {}
    assert set(result.deleted) == {*keys, "many/missing-1", "many/missing-2"}
    assert list(object_store.list("many/")) == []
    assert object_store.get("other") == b"stays"


def test_delete_many_counts_missing_keys_as_deleted(object_store: ObjectStore) -> None:
    object_store.put("x/1", b"1")
    object_store.put("x/2", b"2")

    result = object_store.delete_many(["x/1", "never-there", "x/2"])

    assert sorted(result.deleted) == ["never-there", "x/1", "x/2"]
    assert result.failed == {}
    assert not object_store.exists("x/1")
    assert object_store.delete_many([]).deleted == []


def test_stat_get_of_missing_key(object_store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFoundError):
        object_store.stat("missing")
    with pytest.raises(ObjectNotFoundError):
        object_store.get("missing")


def test_exists(object_store: ObjectStore) -> None:
    object_store.put("here", b"1")

    assert object_store.exists("here")
    assert not object_store.exists("not-here")


def test_copied_parts_complete_into_the_expected_bytes(object_store: ObjectStore) -> None:
    size = _part_size(object_store)
    first = bytes(random.Random(1).randbytes(2 * size))
    second = b"second object, copied from the middle"
    object_store.put("src/1", first, metadata={"role": "source"})
    object_store.put("src/2", second)
    upload = object_store.create_multipart("merged", metadata={"role": "merged"})

    copied = object_store.upload_part_copy(upload, 1, "src/1", 3, size)
    uploaded = object_store.upload_part(upload, 2, b"u" * size)
    tail = object_store.upload_part_copy(upload, 3, "src/2", 7, 6)
    object_store.complete_multipart(upload, [tail, copied, uploaded])

    assert (copied.size, tail.size) == (size, 6)
    assert object_store.get("merged") == first[3 : 3 + size] + b"u" * size + second[7:13]
    assert object_store.stat("merged").metadata == {"role": "merged"}
    assert object_store.get("src/1") == first  # the source is left as it was
    assert list(object_store.list_multipart_uploads()) == []


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, 11), (5, 6), (10, 1), (20, 5)],
    ids=["long", "tail", "at-end", "past"],
)
def test_part_copy_of_a_range_beyond_the_source(
    object_store: ObjectStore, offset: int, length: int
) -> None:
    object_store.put("ten", b"0123456789")
    upload = object_store.create_multipart("copy")
    try:
        with pytest.raises(InvalidRangeError, match="ten"):
            object_store.upload_part_copy(upload, 1, "ten", offset, length)
        part = object_store.upload_part_copy(upload, 1, "ten", 4, 6)  # the upload is usable
        object_store.complete_multipart(upload, [part])
    finally:
        object_store.abort_multipart(upload)
    assert object_store.get("copy") == b"456789"


def test_part_copy_of_a_missing_source(object_store: ObjectStore) -> None:
    upload = object_store.create_multipart("copy")
    try:
        with pytest.raises(ObjectNotFoundError, match="missing"):
            object_store.upload_part_copy(upload, 1, "missing", 0, 1)
    finally:
        object_store.abort_multipart(upload)
    assert not object_store.exists("copy")


def test_part_copy_arguments_are_checked(object_store: ObjectStore) -> None:
    object_store.put("src", b"x" * 10)
    upload = object_store.create_multipart("copy")
    caps = object_store.capabilities
    bad = [
        (0, 0, 1),
        (caps.max_parts + 1, 0, 1),
        (1, -1, 1),
        (1, 0, 0),
        (1, 0, caps.max_part_size + 1),
    ]
    try:
        for number, offset, length in bad:
            with pytest.raises(ValueError, match=r"part number|offset"):
                object_store.upload_part_copy(upload, number, "src", offset, length)
    finally:
        object_store.abort_multipart(upload)


def test_complete_refuses_a_small_part_before_the_last(object_store: ObjectStore) -> None:
    """S3's part rule, as SeaweedFS enforces it (EntityTooSmall); the files store applies
    its own minimum (1 byte by default: an empty part)."""
    small = object_store.capabilities.min_part_size - 1
    object_store.put("src", b"s" * max(small, 1))
    upload = object_store.create_multipart("parts")
    try:
        parts = [
            object_store.upload_part(upload, 1, b"s" * small),
            object_store.upload_part_copy(upload, 2, "src", 0, 1),
        ]
        with pytest.raises(PartTooSmallError, match="EntityTooSmall"):
            object_store.complete_multipart(upload, parts)
    finally:
        object_store.abort_multipart(upload)
    assert not object_store.exists("parts")


def test_url_is_printable(object_store: ObjectStore) -> None:
    assert object_store.url.startswith(("file:///", "s3://"))
