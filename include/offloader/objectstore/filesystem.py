"""Object store on a local directory: the embedded setup and the tests' reference binding.

On-disk layout under ``root``:

``<key>``
    One file per object; ``/`` in a key makes subfolders. The file starts with a small
    header that keeps the user metadata atomic with the data::

        b"OFSO" | version (1 byte, 1) | metadata length (4 bytes, big-endian) | metadata JSON

    and the object's bytes follow. ``size`` is the file size minus the header.
``.tmp/<random>``
    Files being written. Every object is written here, fsynced, then published by
    ``os.replace`` (plain put) or ``os.link`` (``if_none_match``: the link fails if the
    name is taken, which makes the conditional create atomic against other writers). A
    writer killed half-way leaves its file here: the orphan sweep removes those last
    written longer ago than ``multipart_max_age_seconds`` (``list_temp_files``).
``.uploads/<upload_id>/manifest.json`` and ``part-00001`` ...
    Unfinished multipart uploads. The manifest holds key, metadata and initiated time;
    completing concatenates the parts into a temp file and publishes it like ``put``. A
    part copy (``upload_part_copy``) copies the source's range file to file into its part.

Internal folders are never listed, and keys whose first segment names one are refused.
Because keys map to paths, ``a`` and ``a/b`` cannot both exist (S3 allows it); the second
write fails with ObjectStoreError.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import json
import os
import shutil
import struct
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlparse

from offloader.exceptions import (
    CorruptObjectError,
    InvalidRangeError,
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStoreError,
    PartTooSmallError,
)
from offloader.fsutil import fsync_dir
from offloader.objectstore import (
    Capabilities,
    DeleteResult,
    GiB,
    MultipartUpload,
    ObjectInfo,
    ObjectStore,
    PartInfo,
    TempFile,
    check_part_copy,
    check_part_number,
)

_MAGIC = b"OFSO\x01"
_HEADER = struct.Struct(">5sI")
_TMP_DIR = ".tmp"
_UPLOADS_DIR = ".uploads"
_INTERNAL = frozenset({_TMP_DIR, _UPLOADS_DIR})
_MANIFEST = "manifest.json"
_COPY_CHUNK = 1024 * 1024
_PUBLISH_ATTEMPTS = 5


def validate_key(key: str) -> None:
    """Refuse keys that could escape the root, collide with internal folders or mean a dir."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key {key!r}: must be a non-empty string")
    if key.startswith("/") or "\0" in key:
        raise ValueError(f"object key {key!r}: no leading '/' and no NUL allowed")
    segments = key.split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        raise ValueError(f"object key {key!r}: empty, '.' and '..' segments are not allowed")
    if segments[0] in _INTERNAL:
        raise ValueError(f"object key {key!r}: {segments[0]!r} is reserved for the store")


def normalise_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """Lower-case names and ASCII text only, as S3 would return them."""
    result: dict[str, str] = {}
    for name, value in (metadata or {}).items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"metadata {name!r}: names and values must be str")
        if not name or not (name + value).isascii():
            raise ValueError(f"metadata {name!r}: names must be non-empty and text ASCII")
        result[name.lower()] = value
    return result


def _encode_header(metadata: Mapping[str, str]) -> bytes:
    body = json.dumps(dict(metadata), sort_keys=True).encode()
    return _HEADER.pack(_MAGIC, len(body)) + body


def _read_header(handle: BinaryIO, key: str) -> tuple[int, dict[str, str]]:
    """Return (header length, metadata) and leave the handle at the first data byte."""
    fixed = handle.read(_HEADER.size)
    if len(fixed) != _HEADER.size:
        raise CorruptObjectError(f"object {key!r}: truncated header")
    magic, length = _HEADER.unpack(fixed)
    if magic != _MAGIC:
        raise CorruptObjectError(f"object {key!r}: not written by this store (bad magic)")
    available = os.fstat(handle.fileno()).st_size - _HEADER.size
    if length > available:  # read nothing a damaged length claims beyond the file's end
        raise CorruptObjectError(
            f"object {key!r}: truncated header: metadata of {length} bytes claimed, "
            f"{available} in the file"
        )
    body = handle.read(length)
    if len(body) != length:
        raise CorruptObjectError(
            f"object {key!r}: truncated header: metadata of {len(body)} bytes, header says {length}"
        )
    return _HEADER.size + length, _parse_metadata(body, key)


def _parse_metadata(body: bytes, key: str) -> dict[str, str]:
    """The header's metadata: a JSON object of strings, or CorruptObjectError."""
    try:
        metadata = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise CorruptObjectError(f"object {key!r}: damaged header metadata ({err})") from None
    if not isinstance(metadata, dict) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in metadata.items()
    ):
        raise CorruptObjectError(
            f"object {key!r}: damaged header metadata (not an object of strings)"
        )
    return metadata


class FilesystemObjectStore(ObjectStore):
    """Objects as files under one directory; atomic publish by rename or link."""

    capabilities = Capabilities(
        multipart=True,
        conditional_create=True,
        ranged_read=True,
        part_copy=True,
        min_part_size=1,
        max_part_size=5 * GiB,
        max_parts=10_000,
        max_delete_batch=1000,
    )

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        if not self.root.is_absolute():
            raise ValueError(f"filesystem object store root {str(root)!r}: must be absolute")
        for internal in _INTERNAL:
            (self.root / internal).mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_url(cls, url: str) -> FilesystemObjectStore:
        """``file:///abs/dir`` only: relative paths and hosts are refused."""
        parsed = urlparse(url)
        if parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise ValueError(f"object store URL {url!r}: expected file:///absolute/dir")
        path = unquote(parsed.path)
        if not path.startswith("/") or parsed.query or parsed.fragment:
            raise ValueError(f"object store URL {url!r}: expected file:///absolute/dir")
        return cls(Path(path))

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def check_available(self) -> None:
        if not self.root.is_dir():
            raise ObjectStoreError(f"object store root {str(self.root)!r} does not exist")

    def __repr__(self) -> str:
        return f"FilesystemObjectStore({str(self.root)!r})"

    # --- paths and publishing -------------------------------------------------------
    def _path(self, key: str) -> Path:
        validate_key(key)
        return self.root.joinpath(*key.split("/"))

    def _new_temp(self) -> Path:
        return self.root / _TMP_DIR / f"{uuid.uuid4().hex}.tmp"

    def _write_temp(self, metadata: Mapping[str, str], fill: Iterable[bytes] | bytes) -> Path:
        """Write header and data to a fresh temp file, fsynced; the caller publishes it."""
        temp = self._new_temp()
        try:
            with open(temp, "xb") as handle:
                handle.write(_encode_header(metadata))
                if isinstance(fill, bytes | bytearray | memoryview):
                    handle.write(fill)
                else:
                    for chunk in fill:
                        handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return temp

    def _publish(self, temp: Path, key: str, *, if_none_match: bool) -> None:
        """Move a finished temp file to its key; with ``if_none_match`` only if free."""
        target = self._path(key)
        try:
            for attempt in range(_PUBLISH_ATTEMPTS):
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    if if_none_match:
                        os.link(temp, target)
                    else:
                        os.replace(temp, target)
                    break
                except FileNotFoundError:
                    # A concurrent delete pruned the freshly made parent folder: retry.
                    if attempt == _PUBLISH_ATTEMPTS - 1:
                        raise
            fsync_dir(target.parent)
        except FileExistsError:
            raise ObjectExistsError(f"object {key!r} exists already") from None
        except OSError as err:
            raise ObjectStoreError(f"publishing object {key!r} failed: {err}") from err
        finally:
            temp.unlink(missing_ok=True)

    def _open(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            handle = open(path, "rb")  # noqa: SIM115 - returned to the caller
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFoundError(f"object {key!r} not found") from None
        except OSError as err:
            raise ObjectStoreError(f"opening object {key!r} failed: {err}") from err
        return handle

    # --- whole objects --------------------------------------------------------------
    def put(
        self,
        key: str,
        data: bytes | bytearray,
        *,
        metadata: Mapping[str, str] | None = None,
        if_none_match: bool = False,
    ) -> None:
        validate_key(key)
        temp = self._write_temp(normalise_metadata(metadata), bytes(data))
        self._publish(temp, key, if_none_match=if_none_match)

    def get(self, key: str) -> bytes:
        with self._open(key) as handle:
            _read_header(handle, key)
            return handle.read()

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        if offset < 0 or length < 0:
            raise ValueError(f"read_range {key!r}: offset and length must be >= 0")
        with self._open(key) as handle:
            header_size, _ = _read_header(handle, key)
            handle.seek(header_size + offset)
            return handle.read(length)

    def stat(self, key: str) -> ObjectInfo:
        with self._open(key) as handle:
            header_size, metadata = _read_header(handle, key)
            status = os.fstat(handle.fileno())
        return ObjectInfo(
            key=key,
            size=status.st_size - header_size,
            metadata=metadata,
            last_modified=datetime.fromtimestamp(status.st_mtime, UTC),
        )

    # --- listing and deleting -------------------------------------------------------
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Keys under ``prefix`` in byte order, like S3; metadata is not read."""
        if "\0" in prefix or prefix.startswith("/"):
            raise ValueError(f"list prefix {prefix!r}: no leading '/' and no NUL allowed")
        head, _, _ = prefix.rpartition("/")
        if head:
            try:
                validate_key(head)
            except ValueError:
                return  # no valid key lives under such a prefix
        start = self.root.joinpath(*head.split("/")) if head else self.root
        found: list[tuple[str, os.stat_result]] = []
        for directory, dirs, files in os.walk(start):
            relative = Path(directory).relative_to(self.root).as_posix()
            base = "" if relative == "." else f"{relative}/"
            if not base:
                dirs[:] = [d for d in dirs if d not in _INTERNAL]
            for name in files:
                key = base + name
                if key.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        found.append((key, os.stat(os.path.join(directory, name))))
        for key, status in sorted(found, key=lambda item: item[0].encode()):
            info = self._listed(key, status)
            if info is not None:
                yield info

    def _listed(self, key: str, status: os.stat_result) -> ObjectInfo | None:
        """The object's info, or None if it vanished or is not one of ours (no header)."""
        try:
            with open(self._path(key), "rb") as handle:
                header_size = _read_header(handle, key)[0]
        except (FileNotFoundError, ObjectStoreError, ValueError):
            return None
        return ObjectInfo(
            key=key,
            size=status.st_size - header_size,
            last_modified=datetime.fromtimestamp(status.st_mtime, UTC),
        )

    def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        keys = list(keys)
        for key in keys:
            validate_key(key)
        deleted: list[str] = []
        failed: dict[str, str] = {}
        for key in keys:
            try:
                self._delete(key)
            except OSError as err:
                failed[key] = f"{type(err).__name__}: {err.strerror or err}"
            else:
                deleted.append(key)
        return DeleteResult(deleted=deleted, failed=failed)

    def _delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError, IsADirectoryError):
            path.unlink()
        self._prune(path.parent)

    def _prune(self, directory: Path) -> None:
        """Remove folders the delete left empty, up to the root; stop at the first full one."""
        while directory != self.root and self.root in directory.parents:
            try:
                directory.rmdir()
            except OSError:
                return
            directory = directory.parent

    # --- multipart ------------------------------------------------------------------
    def _upload_dir(self, upload: MultipartUpload) -> Path:
        if not upload.upload_id.isalnum():
            raise ValueError(f"upload id {upload.upload_id!r}: not one of this store's")
        return self.root / _UPLOADS_DIR / upload.upload_id

    def _existing_upload_dir(self, upload: MultipartUpload) -> Path:
        directory = self._upload_dir(upload)
        if not (directory / _MANIFEST).is_file():
            raise ObjectNotFoundError(f"multipart upload {upload.upload_id} for {upload.key!r}")
        return directory

    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload:
        validate_key(key)
        initiated = _now()
        upload = MultipartUpload(key=key, upload_id=uuid.uuid4().hex, initiated=initiated)
        manifest = {
            "key": key,
            "metadata": normalise_metadata(metadata),
            "initiated": initiated.isoformat(),
        }
        directory = self._upload_dir(upload)
        directory.mkdir()
        _atomic_write(directory / _MANIFEST, [json.dumps(manifest).encode()])
        return upload

    def upload_part(
        self, upload: MultipartUpload, part_number: int, data: bytes | bytearray
    ) -> PartInfo:
        check_part_number(self, part_number)
        directory = self._existing_upload_dir(upload)
        data = bytes(data)
        etag = _atomic_write(directory / _part_name(part_number), [data])
        return PartInfo(part_number=part_number, etag=etag, size=len(data))

    def upload_part_copy(
        self, upload: MultipartUpload, part_number: int, source_key: str, offset: int, length: int
    ) -> PartInfo:
        """The source's range is copied file to file into the part, in 1 MiB chunks."""
        check_part_copy(self, part_number, source_key, offset, length)
        directory = self._existing_upload_dir(upload)
        with self._open(source_key) as source:
            header_size, _ = _read_header(source, source_key)
            size = os.fstat(source.fileno()).st_size - header_size
            if offset + length > size:
                raise InvalidRangeError(
                    f"part copy {part_number} for {upload.key!r}: bytes {offset}.."
                    f"{offset + length - 1} do not lie inside {source_key!r} ({size} bytes)"
                )
            source.seek(header_size + offset)
            etag = _atomic_write(directory / _part_name(part_number), _chunks(source, length))
        return PartInfo(part_number=part_number, etag=etag, size=length)

    def complete_multipart(
        self, upload: MultipartUpload, parts: Iterable[PartInfo], *, if_none_match: bool = False
    ) -> None:
        ordered = _ordered_parts(parts)
        directory = self._existing_upload_dir(upload)
        self._check_part_sizes(directory, upload, ordered)
        manifest = json.loads((directory / _MANIFEST).read_bytes())
        temp = self._new_temp()
        try:
            with open(temp, "xb") as target:
                target.write(_encode_header(manifest["metadata"]))
                for part in ordered:
                    self._append_part(directory, part, target)
                target.flush()
                os.fsync(target.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._publish(temp, manifest["key"], if_none_match=if_none_match)
        shutil.rmtree(directory, ignore_errors=True)

    def _check_part_sizes(
        self, directory: Path, upload: MultipartUpload, ordered: builtins.list[PartInfo]
    ) -> None:
        """S3's rule (EntityTooSmall): every part but the last holds ``min_part_size``."""
        for part in ordered[:-1]:
            try:
                size = (directory / _part_name(part.part_number)).stat().st_size
            except FileNotFoundError:
                raise ValueError(f"part {part.part_number} was never uploaded") from None
            if size < self.capabilities.min_part_size:
                raise PartTooSmallError(
                    f"completing {upload.key!r}: part {part.part_number} holds {size} bytes, "
                    f"every part but the last needs {self.capabilities.min_part_size} "
                    "(EntityTooSmall)"
                )

    def _append_part(self, directory: Path, part: PartInfo, target: BinaryIO) -> None:
        """Copy one part, checking it is the one the caller uploaded (as S3 checks ETags)."""
        digest = hashlib.md5(usedforsecurity=False)
        try:
            with open(directory / _part_name(part.part_number), "rb") as source:
                for chunk in _chunks(source):
                    target.write(chunk)
                    digest.update(chunk)
        except FileNotFoundError:
            raise ValueError(f"part {part.part_number} was never uploaded") from None
        if digest.hexdigest() != part.etag.strip('"'):
            raise ValueError(f"part {part.part_number}: ETag does not match the stored part")

    def list_temp_files(self) -> Iterator[TempFile]:
        for path in sorted((self.root / _TMP_DIR).glob("*.tmp")):
            try:
                status = path.stat()
            except FileNotFoundError:
                continue  # published or removed while we looked
            yield TempFile(
                name=path.name,
                size=status.st_size,
                modified=datetime.fromtimestamp(status.st_mtime, UTC),
            )

    def remove_temp_file(self, temp: TempFile, older_than: datetime) -> bool:
        path = self.root / _TMP_DIR / temp.name
        if path.parent != self.root / _TMP_DIR or not temp.name.endswith(".tmp"):
            raise ValueError(f"{temp.name!r} is not a temp file of {self.url}")
        try:
            if datetime.fromtimestamp(path.stat().st_mtime, UTC) >= older_than:
                return False  # written to since it was listed: a live writer
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def abort_multipart(self, upload: MultipartUpload) -> None:
        shutil.rmtree(self._upload_dir(upload), ignore_errors=True)

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[MultipartUpload]:
        uploads: list[MultipartUpload] = []
        for manifest_path in (self.root / _UPLOADS_DIR).glob(f"*/{_MANIFEST}"):
            try:
                manifest = json.loads(manifest_path.read_bytes())
            except FileNotFoundError:
                continue  # completed or aborted while we looked
            if manifest["key"].startswith(prefix):
                uploads.append(
                    MultipartUpload(
                        key=manifest["key"],
                        upload_id=manifest_path.parent.name,
                        initiated=datetime.fromisoformat(manifest["initiated"]),
                    )
                )
        yield from sorted(uploads, key=lambda u: (u.key.encode(), u.initiated))


def _now() -> datetime:
    return datetime.now(UTC)


def _part_name(part_number: int) -> str:
    return f"part-{part_number:05d}"


def _chunks(handle: BinaryIO, limit: int | None = None) -> Iterator[bytes]:
    """The handle's bytes from where it stands, in 1 MiB chunks; at most ``limit``."""
    left = limit
    while left is None or left > 0:
        chunk = handle.read(_COPY_CHUNK if left is None else min(_COPY_CHUNK, left))
        if not chunk:
            return
        if left is not None:
            left -= len(chunk)
        yield chunk


def _ordered_parts(parts: Iterable[PartInfo]) -> list[PartInfo]:
    ordered = sorted(parts, key=lambda part: part.part_number)
    if not ordered:
        raise ValueError("complete_multipart needs at least one part")
    numbers = [part.part_number for part in ordered]
    if len(set(numbers)) != len(numbers):
        raise ValueError(f"complete_multipart: duplicate part numbers in {numbers}")
    return ordered


def _atomic_write(path: Path, chunks: Iterable[bytes]) -> str:
    """Write next to ``path`` and rename, so readers never see half a file; the MD5 of
    what was written (the part's ETag)."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with open(temp, "xb") as handle:
            for chunk in chunks:
                handle.write(chunk)
                digest.update(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except FileNotFoundError:
        raise ObjectNotFoundError(f"upload folder {path.parent.name} is gone") from None
    finally:
        temp.unlink(missing_ok=True)
    return digest.hexdigest()
