"""The filesystem store's temp files that a killed writer left (``.tmp/``, a rewrite killed
while completing its upload): the scan reports them, the sweep removes those last written
longer ago than ``multipart_max_age_seconds`` and reports them, never a younger one nor
one a live writer wrote to since it was listed. Files + SQLite: S3 has no temp files (an
unfinished write is a multipart upload there, swept as such)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from offloader.gc.sweep import sweep
from offloader.objectstore.filesystem import FilesystemObjectStore
from offloader.runtime import Runtime

FS_SQLITE = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
HOUR = 3600.0


def leftover(store: FilesystemObjectStore, size: int, age_seconds: float) -> Path:
    """A temp file as the store writes it (header and data, fsynced) and a killed writer
    leaves it: never published, last written ``age_seconds`` ago."""
    path = store._write_temp({"offloader-kind": "data"}, os.urandom(size))
    stamp = time.time() - age_seconds
    os.utime(path, (stamp, stamp))
    return path


@FS_SQLITE
def test_the_sweep_removes_a_dead_writers_old_temp_files(runtime: Runtime) -> None:
    rt = runtime
    store = rt.objects
    assert isinstance(store, FilesystemObjectStore)
    old = leftover(store, 4 * 1024 * 1024, 2 * HOUR)
    young = leftover(store, 1000, 60)
    settings = rt.settings.model_copy(update={"multipart_max_age_seconds": HOUR})

    scan = sweep(rt.metadata, rt.stores, settings, dry_run=True)
    (scanned,) = scan.stores
    assert (scanned.stale_temp_files, scanned.removed_temp_files) == (1, 0)
    assert scanned.stale_temp_bytes == old.stat().st_size > 4 * 1024 * 1024
    assert "stale temp files 1 (" in str(scan) and "would remove 1" in str(scan)
    assert old.exists() and young.exists()

    swept = sweep(rt.metadata, rt.stores, settings)
    (done,) = swept.stores
    assert (done.stale_temp_files, done.removed_temp_files, done.error) == (1, 1, None)
    assert "removed 1" in str(swept) and swept.to_json()["stores"][0]["removed_temp_files"] == 1
    assert not old.exists() and young.exists()
    assert [t.name for t in store.list_temp_files()] == [young.name]
    assert sweep(rt.metadata, rt.stores, settings).stores[0].stale_temp_files == 0


def test_a_temp_file_written_to_since_it_was_listed_is_kept(tmp_path: Path) -> None:
    store = FilesystemObjectStore(tmp_path / "store")
    path = leftover(store, 100, 2 * HOUR)
    (listed,) = store.list_temp_files()
    older_than = datetime.now(UTC) - timedelta(seconds=HOUR)
    with open(path, "ab") as writer:  # the writer is alive after all: it writes on
        writer.write(b"more")
    assert store.remove_temp_file(listed, older_than) is False
    assert path.exists()
    stamp = time.time() - 2 * HOUR
    os.utime(path, (stamp, stamp))
    assert store.remove_temp_file(listed, older_than) is True
    assert not path.exists()
    assert store.remove_temp_file(listed, older_than) is False  # already gone: no error
