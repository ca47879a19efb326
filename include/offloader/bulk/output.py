"""Where an export goes, and how it is published atomically.

An attempt writes its files under a fresh staging folder that no reader looks at, then
publishes them in one atomic step; only then are other attempts of the same export removed.

- Local directory ``D``: files in ``D/.attempts/<export id>/<attempt>/``; the manifest is
  written there last, then the symlink ``D/<export id>`` is swapped to that folder by one
  ``rename``. A reader opens ``D/<export id>/`` (a directory reader sees one attempt, whole).
- S3 ``s3://bucket/prefix``: files under ``prefix/<export id>/<attempt>/``, uploaded through
  the library's ObjectStore; the manifest ``prefix/<export id>/_manifest.json`` is one PUT,
  written last. A reader reads the manifest and only the files it lists, never a listing.
"""

from __future__ import annotations

import abc
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from offloader.bulk.manifest import ExportManifest
from offloader.exceptions import ObjectNotFoundError
from offloader.fsutil import fsync_dir
from offloader.keys import (
    EXPORT_ATTEMPTS_DIR,
    EXPORT_MANIFEST_NAME,
    export_attempt_folder,
    export_prefix,
    is_export_attempt_key,
)
from offloader.objectstore.location import FILE, StoreLocation
from offloader.objectstore.registry import open_object_store

if TYPE_CHECKING:
    from offloader.objectstore import ObjectStore
    from offloader.settings import Settings


@dataclass(frozen=True)
class ExportTarget:
    """One attempt of one export at ``url`` (``file:///abs/dir`` or ``s3://bucket/prefix``);
    small and picklable: the driver hands it to every executor."""

    url: str
    export_id: str
    attempt: str

    @classmethod
    def new_attempt(cls, url: str, export_id: str) -> ExportTarget:
        return cls(url, export_id, uuid.uuid4().hex)


class ExportOutput(abc.ABC):
    def __init__(self, target: ExportTarget) -> None:
        self.target = target

    @property
    @abc.abstractmethod
    def root(self) -> str:
        """The attempt's folder relative to the manifest's (the manifest's ``root``)."""

    @abc.abstractmethod
    def write(self, path: str, data: bytes) -> None:
        """Stage one file of this attempt (``path`` relative to the attempt's folder)."""

    @abc.abstractmethod
    def publish(self, manifest: ExportManifest) -> None:
        """Make this attempt the export, in one atomic step; its files must all be staged."""

    @abc.abstractmethod
    def published(self) -> ExportManifest | None:
        """The export's manifest as a reader sees it; None if never published."""

    @abc.abstractmethod
    def discard_others(self) -> int:
        """Remove every other attempt of this export (after :meth:`publish`); how many files."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

    def __enter__(self) -> ExportOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DirectoryOutput(ExportOutput):
    def __init__(self, target: ExportTarget, directory: Path) -> None:
        super().__init__(target)
        self.directory = directory
        self.attempts = directory / EXPORT_ATTEMPTS_DIR / target.export_id
        self.folder = self.attempts / target.attempt
        self.link = directory / target.export_id

    @property
    def root(self) -> str:
        return ""

    def write(self, path: str, data: bytes) -> None:
        final = self.folder / path
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        with temp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, final)
        fsync_dir(final.parent)

    def publish(self, manifest: ExportManifest) -> None:
        if self.link.exists() and not self.link.is_symlink():
            raise FileExistsError(
                f"{self.link} exists and is not an export this job published: choose another "
                "export id or output"
            )
        self.write(EXPORT_MANIFEST_NAME, manifest.to_bytes())
        temp = self.directory / f".{self.target.export_id}.{self.target.attempt}.link"
        temp.symlink_to(self.folder.relative_to(self.directory), target_is_directory=True)
        os.replace(temp, self.link)  # the one atomic step
        fsync_dir(self.directory)

    def published(self) -> ExportManifest | None:
        path = self.link / EXPORT_MANIFEST_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return ExportManifest.from_bytes(data, str(path))

    def discard_others(self) -> int:
        current = self.link.resolve() if self.link.is_symlink() else None
        removed = 0
        for folder in self.attempts.iterdir() if self.attempts.is_dir() else ():
            if folder.resolve() != current:
                removed += sum(1 for p in folder.rglob("*") if p.is_file())
                shutil.rmtree(folder)
        return removed


class ObjectStoreOutput(ExportOutput):
    def __init__(self, target: ExportTarget, store: ObjectStore) -> None:
        super().__init__(target)
        self.store = store
        self.prefix = export_prefix(target.export_id)

    @property
    def root(self) -> str:
        return export_attempt_folder(self.target.attempt)

    def write(self, path: str, data: bytes) -> None:
        self.store.put(self.prefix + self.root + path, data)

    def publish(self, manifest: ExportManifest) -> None:
        self.store.put(self.prefix + EXPORT_MANIFEST_NAME, manifest.to_bytes())  # the atomic step

    def published(self) -> ExportManifest | None:
        key = self.prefix + EXPORT_MANIFEST_NAME
        try:
            data = self.store.get(key)
        except ObjectNotFoundError:
            return None
        return ExportManifest.from_bytes(data, f"{self.store.url}/{key}")

    def discard_others(self) -> int:
        """Only keys in attempt folders go: the export's folder may hold objects this job
        never wrote (another store's ledgers, if the output overlaps it)."""
        keep = self.prefix + self.root
        stale = [
            info.key
            for info in self.store.list(self.prefix)
            if not info.key.startswith(keep)
            and is_export_attempt_key(info.key, self.target.export_id)
        ]
        result = self.store.delete_many(stale)
        if result.failed:
            raise OSError(f"could not remove {len(result.failed)} files of earlier attempts")
        return len(result.deleted)

    def close(self) -> None:
        self.store.close()


def open_output(target: ExportTarget, settings: Settings) -> ExportOutput:
    """The output ``target`` names; S3 clients from ``settings`` (endpoint, keys)."""
    location = StoreLocation.from_url(target.url)
    if location.kind == FILE:
        return DirectoryOutput(target, Path(location.location))
    return ObjectStoreOutput(target, open_object_store(target.url, settings))
