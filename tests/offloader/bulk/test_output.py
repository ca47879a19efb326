"""Where an export goes (offloader/bulk/output.py): a local directory behind a symlink, or
an object store whose manifest is one PUT. The object-store output runs here on the real
filesystem binding (the same ObjectStore interface S3 implements); S3 itself is only opened,
never called, so no server is needed."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from fixtures.faults import FlakyDeletes
from fixtures.inspect import stored_keys
from offloader.bulk.manifest import ExportManifest, ManifestFile
from offloader.bulk.output import (
    DirectoryOutput,
    ExportTarget,
    ObjectStoreOutput,
    open_output,
)
from offloader.keys import EXPORT_ATTEMPTS_DIR, EXPORT_MANIFEST_NAME
from offloader.objectstore import ObjectStore
from offloader.objectstore.registry import open_object_store
from offloader.settings import Settings

#: files of one attempt: a nested Parquet path and one directly in the attempt's folder
FILES = {"topic=a/ledger_id=1/part-0.parquet": b"one", "top.parquet": b"two"}


def manifest_of(
    target: ExportTarget, root: str, files: dict[str, bytes] | None = None
) -> ExportManifest:
    """A manifest of ``target`` listing ``files`` (path: bytes)."""
    entries = [
        ManifestFile(
            path=path,
            topic="a",
            ledger_id=1,
            first_entry_id=0,
            last_entry_id=0,
            rows=1,
            bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
        )
        for path, data in sorted((files or {}).items())
    ]
    return ExportManifest(
        export_id=target.export_id,
        attempt=target.attempt,
        root=root,
        created_ms=1,
        params={},
        files=entries,
    )


def staged(output: DirectoryOutput | ObjectStoreOutput, files: dict[str, bytes]) -> None:
    """Stage ``files`` (path: bytes) as ``output``'s attempt."""
    for path, data in files.items():
        output.write(path, data)


@pytest.fixture
def store(tmp_path: Path) -> ObjectStore:
    """A real filesystem object store in the test's directory."""
    return open_object_store((tmp_path / "store").as_uri())


def test_an_object_store_export_is_its_manifest_and_the_files_it_lists(
    store: ObjectStore,
) -> None:
    """Files go under ``<export id>/<attempt>/``, the manifest to
    ``<export id>/_manifest.json``; a reader that follows the manifest finds every file."""
    target = ExportTarget.new_attempt("s3://unused/out", "e1")
    output = ObjectStoreOutput(target, store)
    assert output.published() is None  # nothing published yet
    staged(output, FILES)
    assert stored_keys(store) == {f"e1/{target.attempt}/{p}" for p in FILES}  # staged, unpublished
    assert output.published() is None
    manifest = manifest_of(target, output.root, FILES)
    output.publish(manifest)
    assert ExportManifest.model_validate_json(store.get(f"e1/{EXPORT_MANIFEST_NAME}")) == manifest
    assert output.published() == manifest
    # the reader's contract: each file at the manifest's root + its path, relative to the
    # manifest's folder, with the bytes and digest the manifest gives
    read = {p: store.get(f"e1/{p}") for p in manifest.file_paths()}
    assert read == {f"{target.attempt}/{p}": data for p, data in FILES.items()}
    for entry in manifest.files:
        data = read[manifest.root + entry.path]
        assert (entry.bytes, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_new_attempt_removes_only_the_export_s_other_attempts(store: ObjectStore) -> None:
    """Published and dead attempts go; the new attempt, its manifest, objects in the
    export's folder that are not attempt folders and other exports stay."""
    foreign = {
        "e1/ledgers/orders/1-data": b"a ledger of the store the output overlaps",
        f"e1/{'g' * 32}/not-an-attempt": b"x",  # 32 characters, but not hex
        f"e2/{'a' * 32}/part.parquet": b"another export's attempt",
    }
    for key, data in foreign.items():
        store.put(key, data)
    old = ObjectStoreOutput(ExportTarget.new_attempt("s3://unused/out", "e1"), store)
    staged(old, FILES)
    old.publish(manifest_of(old.target, old.root))
    dead = ObjectStoreOutput(ExportTarget.new_attempt("s3://unused/out", "e1"), store)
    staged(dead, {"only-dead.parquet": b"3", **FILES})
    new = ObjectStoreOutput(ExportTarget.new_attempt("s3://unused/out", "e1"), store)
    staged(new, FILES)
    manifest = manifest_of(new.target, new.root)
    new.publish(manifest)
    stale = stored_keys(store, f"e1/{old.target.attempt}/") | stored_keys(
        store, f"e1/{dead.target.attempt}/"
    )
    assert len(stale) == 2 * len(FILES) + 1

    assert new.discard_others() == len(stale)
    kept = {f"e1/{new.target.attempt}/{p}" for p in FILES} | {f"e1/{EXPORT_MANIFEST_NAME}"}
    assert stored_keys(store) == kept | set(foreign)
    assert new.published() == manifest
    assert new.discard_others() == 0  # nothing left to remove


def test_an_attempt_that_cannot_be_removed_fails_the_publish(store: ObjectStore) -> None:
    old = ObjectStoreOutput(ExportTarget.new_attempt("s3://unused/out", "e1"), store)
    staged(old, FILES)
    refused = f"e1/{old.target.attempt}/top.parquet"
    target = ExportTarget.new_attempt("s3://unused/out", "e1")
    new = ObjectStoreOutput(target, FlakyDeletes(store, refuse=[refused]))  # type: ignore[arg-type]
    staged(new, FILES)
    new.publish(manifest_of(target, new.root))
    with pytest.raises(OSError, match="could not remove 1 files of earlier attempts"):
        new.discard_others()
    assert stored_keys(store, f"e1/{old.target.attempt}/") == {refused}


def test_a_damaged_manifest_is_named_by_its_address(store: ObjectStore, tmp_path: Path) -> None:
    output = ObjectStoreOutput(ExportTarget.new_attempt("s3://unused/out", "e1"), store)
    store.put(f"e1/{EXPORT_MANIFEST_NAME}", b'{"format": "offloader-export"')
    where = f"{store.url}/e1/{EXPORT_MANIFEST_NAME}"
    with pytest.raises(ValueError, match=re.escape(f"{where} is not an export manifest")):
        output.published()

    directory = DirectoryOutput(ExportTarget.new_attempt(tmp_path.as_uri(), "e2"), tmp_path)
    directory.publish(manifest_of(directory.target, ""))
    path = tmp_path / "e2" / EXPORT_MANIFEST_NAME
    path.write_bytes(b"[]")
    with pytest.raises(ValueError, match=re.escape(f"{path} is not an export manifest")):
        directory.published()


def test_an_s3_output_is_opened_with_the_settings_endpoint() -> None:
    """open_output builds the S3 client from the settings it is given (no request is made:
    building a client does not connect)."""
    settings = Settings.from_values(s3_endpoint_url="http://127.0.0.1:9")
    target = ExportTarget.new_attempt("s3://bucket/exports", "e1")
    with open_output(target, settings) as output:
        assert isinstance(output, ObjectStoreOutput)
        assert output.target == target
        assert output.store.url == "s3://bucket/exports at http://127.0.0.1:9"
        assert output.root == f"{target.attempt}/"


def test_a_directory_output_counts_the_files_it_removes(tmp_path: Path) -> None:
    """discard_others reports how many files the other attempts held (nested ones too)."""
    fresh = DirectoryOutput(ExportTarget.new_attempt(tmp_path.as_uri(), "e1"), tmp_path)
    assert fresh.discard_others() == 0  # no attempt yet: nothing to remove
    outputs = []
    for files in ({"a.parquet": b"1"}, {**FILES, "topic=b/ledger_id=2/x.parquet": b"3"}):
        output = DirectoryOutput(ExportTarget.new_attempt(tmp_path.as_uri(), "e1"), tmp_path)
        staged(output, files)
        outputs.append(output)
    new = DirectoryOutput(ExportTarget.new_attempt(tmp_path.as_uri(), "e1"), tmp_path)
    staged(new, FILES)
    new.publish(manifest_of(new.target, new.root))
    others = [p for o in outputs for p in o.folder.rglob("*") if p.is_file()]
    assert len(others) == 4

    assert new.discard_others() == len(others)
    assert [p.name for p in (tmp_path / EXPORT_ATTEMPTS_DIR / "e1").iterdir()] == [
        new.target.attempt
    ]
    assert new.published() == manifest_of(new.target, "")


def test_publish_refuses_a_directory_naming_it_and_the_way_out(tmp_path: Path) -> None:
    (tmp_path / "e3").mkdir()
    output = DirectoryOutput(ExportTarget.new_attempt(tmp_path.as_uri(), "e3"), tmp_path)
    message = f"{tmp_path / 'e3'} exists and is not an export this job published"
    with pytest.raises(FileExistsError, match=re.escape(message)) as raised:
        output.publish(manifest_of(output.target, ""))
    assert "choose another export id or output" in str(raised.value)
