"""What only the filesystem binding promises: its URL form, key rules and on-disk layout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from offloader.exceptions import ObjectExistsError, ObjectNotFoundError, ObjectStoreError
from offloader.objectstore import filesystem
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.objectstore.registry import open_object_store


@pytest.fixture
def store(tmp_path: Path) -> FilesystemObjectStore:
    return FilesystemObjectStore(tmp_path / "objects")


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_from_url_and_open_object_store(tmp_path: Path) -> None:
    url = (tmp_path / "objects").as_uri()

    store = open_object_store(url)

    assert isinstance(store, FilesystemObjectStore)
    assert store.root == tmp_path / "objects"
    assert store.url == url
    assert str(tmp_path) in repr(store)


@pytest.mark.parametrize(
    "url",
    [
        "file://relative/dir",
        "file:relative/dir",
        "file://otherhost/abs/dir",
        "s3://bucket/prefix",
        "/abs/dir",
        "file:///abs/dir?x=1",
    ],
)
def test_bad_urls_name_the_url(url: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(url))):
        FilesystemObjectStore.from_url(url)


def test_open_object_store_rejects_unknown_scheme() -> None:
    with pytest.raises(ValueError, match="gs://bucket"):
        open_object_store("gs://bucket/prefix")


def test_relative_root_is_refused() -> None:
    with pytest.raises(ValueError, match="absolute"):
        FilesystemObjectStore(Path("relative/dir"))


@pytest.mark.parametrize(
    "key",
    ["", "/abs", "a/../b", "..", ".", "a//b", "a/", "a\0b", ".tmp/x", ".uploads/x", ".tmp"],
)
def test_bad_keys_are_refused(store: FilesystemObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put(key, b"x")
    with pytest.raises(ValueError):
        store.stat(key)
    with pytest.raises(ValueError):
        store.delete_many([key])
    with pytest.raises(ValueError):
        store.create_multipart(key)


def test_keys_with_slashes_are_subfolders(store: FilesystemObjectStore) -> None:
    store.put("topic/ledger-1/data", b"payload", metadata={"Mixed-Case": "v"})

    path = store.root / "topic" / "ledger-1" / "data"
    assert path.is_file()
    assert path.read_bytes().startswith(b"OFSO\x01")
    assert path.read_bytes().endswith(b"payload")
    assert store.stat("topic/ledger-1/data").metadata == {"mixed-case": "v"}


def test_internal_files_are_hidden_from_list(store: FilesystemObjectStore) -> None:
    store.put("visible", b"1")
    upload = store.create_multipart("pending")
    store.upload_part(upload, 1, b"part")
    (store.root / ".tmp" / "crashed-writer.tmp").write_bytes(b"half")

    assert [info.key for info in store.list()] == ["visible"]
    assert list(store.list(".tmp")) == []
    assert list(store.list(".uploads/")) == []
    assert list(store.list("../")) == []
    assert [u.key for u in store.list_multipart_uploads()] == ["pending"]


def test_no_temp_files_left_behind(store: FilesystemObjectStore) -> None:
    store.put("k", b"1")
    with pytest.raises(ObjectExistsError):
        store.put("k", b"2", if_none_match=True)
    upload = store.create_multipart("m")
    part = store.upload_part(upload, 1, b"x")
    store.complete_multipart(upload, [part])

    assert _files(store.root) == ["k", "m"]


def test_complete_checks_etags_and_part_presence(store: FilesystemObjectStore) -> None:
    upload = store.create_multipart("m")
    part = store.upload_part(upload, 1, b"x")
    forged = type(part)(part_number=1, etag="0" * 32, size=1)
    never = type(part)(part_number=2, etag=part.etag, size=1)

    with pytest.raises(ValueError, match="ETag"):
        store.complete_multipart(upload, [forged])
    with pytest.raises(ValueError, match="never uploaded"):
        store.complete_multipart(upload, [part, never])
    with pytest.raises(ValueError, match="duplicate"):
        store.complete_multipart(upload, [part, part])
    assert not store.exists("m")


def test_upload_part_after_abort_is_not_found(store: FilesystemObjectStore) -> None:
    upload = store.create_multipart("m")
    store.abort_multipart(upload)

    with pytest.raises(ObjectNotFoundError):
        store.upload_part(upload, 1, b"x")
    assert not (store.root / ".uploads" / upload.upload_id).exists()


def test_delete_prunes_empty_folders(store: FilesystemObjectStore) -> None:
    store.put("a/b/c", b"1")
    store.put("a/d", b"2")

    store.delete_many(["a/b/c"])

    assert not (store.root / "a" / "b").exists()
    assert (store.root / "a" / "d").is_file()
    store.put("a/b/c", b"3")
    assert store.get("a/b/c") == b"3"


def test_file_and_folder_of_one_name_conflict(store: FilesystemObjectStore) -> None:
    store.put("a", b"1")

    with pytest.raises(ObjectStoreError):
        store.put("a/b", b"2")
    assert store.delete_many(["a/b"]).failed == {}


def test_foreign_file_is_reported(store: FilesystemObjectStore) -> None:
    (store.root / "foreign").write_bytes(b"not written by the store")

    with pytest.raises(ObjectStoreError, match="magic"):
        store.get("foreign")
    assert list(store.list()) == []


def test_read_range_seeks_instead_of_reading_everything(
    store: FilesystemObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put("big", bytes(range(256)) * 4096)
    reads: list[int] = []
    real_open = open

    class Spy:
        def __init__(self, handle) -> None:  # type: ignore[no-untyped-def]
            self._handle = handle

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self._handle, name)

        def __enter__(self) -> Spy:
            return self

        def __exit__(self, *exc: object) -> None:
            self._handle.close()

        def read(self, size: int = -1) -> bytes:
            reads.append(size)
            return self._handle.read(size)

    monkeypatch.setattr(
        filesystem, "open", lambda *a, **kw: Spy(real_open(*a, **kw)), raising=False
    )
    data = store.read_range("big", 1000, 10)

    assert data == bytes((1000 + i) % 256 for i in range(10))
    assert -1 not in reads
    assert sum(size for size in reads) < 1000
