"""The object-store interface (PDP-34's chunk storage): a small verb set with capability flags.

Bindings live in their own modules (``filesystem``, ``s3``) and are chosen by URL scheme in
``registry.open_object_store``, the one place that builds a binding (kept out of this module,
which the bindings import). Stores recorded in the metadata (invariant 7) are opened through
``registry.StoreRegistry``, which calls it.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

MiB = 1024 * 1024
GiB = 1024 * MiB


@dataclass(frozen=True)
class Capabilities:
    """What a binding can do; callers check these instead of the binding's type.

    ``part_copy``: ``upload_part_copy`` fills a multipart part from a byte range of an
    object in the same store, without the bytes passing through the caller (S3's
    UploadPartCopy; PDP-34's concat). Every part but the last of an upload must hold at
    least ``min_part_size`` bytes (else ``complete_multipart`` raises PartTooSmallError),
    and none more than ``max_part_size``.
    """

    multipart: bool
    conditional_create: bool
    ranged_read: bool
    part_copy: bool
    min_part_size: int
    max_part_size: int
    max_parts: int
    max_delete_batch: int


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    last_modified: datetime | None = None


@dataclass(frozen=True)
class MultipartUpload:
    key: str
    upload_id: str
    initiated: datetime | None = None


@dataclass(frozen=True)
class TempFile:
    """A file a store was writing when its writer died (the filesystem store's ``.tmp/``):
    never an object, only the sweep removes it once older than the multipart age limit."""

    name: str
    size: int
    modified: datetime  # last written, on the store's own clock


@dataclass(frozen=True)
class PartInfo:
    part_number: int
    etag: str
    size: int


@dataclass(frozen=True)
class DeleteResult:
    deleted: list[str]
    failed: dict[str, str]  # key -> error message


class ObjectStore(abc.ABC):
    """Keys are flat strings relative to the store's prefix; bytes in, bytes out."""

    capabilities: Capabilities

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where the store points, safe to log (never holds credentials)."""

    @abc.abstractmethod
    def put(
        self,
        key: str,
        data: bytes | bytearray,
        *,
        metadata: Mapping[str, str] | None = None,
        if_none_match: bool = False,
    ) -> None:
        """Write a whole object. With ``if_none_match`` raise ObjectExistsError if taken."""

    @abc.abstractmethod
    def create_multipart(
        self, key: str, *, metadata: Mapping[str, str] | None = None
    ) -> MultipartUpload: ...

    @abc.abstractmethod
    def upload_part(
        self, upload: MultipartUpload, part_number: int, data: bytes | bytearray
    ) -> PartInfo:
        """Part numbers start at 1. Safe to call from several threads at once."""

    @abc.abstractmethod
    def complete_multipart(
        self, upload: MultipartUpload, parts: Iterable[PartInfo], *, if_none_match: bool = False
    ) -> None:
        """Publish the parts, in part-number order, as one object."""

    @abc.abstractmethod
    def abort_multipart(self, upload: MultipartUpload) -> None:
        """Drop an unfinished upload; an unknown upload is not an error."""

    @abc.abstractmethod
    def list_multipart_uploads(self, prefix: str = "") -> Iterator[MultipartUpload]: ...

    @abc.abstractmethod
    def read_range(self, key: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes from ``offset``, or fewer at the end of the object."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo:
        """Size and user metadata; ObjectNotFoundError if absent."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object under ``prefix``. Costly on S3: only the orphan sweep uses it."""

    @abc.abstractmethod
    def delete_many(self, keys: Iterable[str]) -> DeleteResult:
        """Delete keys in batches of ``max_delete_batch``; a missing key counts as deleted."""

    def exists(self, key: str) -> bool:
        from offloader.exceptions import ObjectNotFoundError

        try:
            self.stat(key)
        except ObjectNotFoundError:
            return False
        return True

    def upload_part_copy(
        self, upload: MultipartUpload, part_number: int, source_key: str, offset: int, length: int
    ) -> PartInfo:
        """Fill part ``part_number`` with ``length`` bytes of ``source_key`` (same store)
        from ``offset``, server side; only where ``capabilities.part_copy``.
        ObjectNotFoundError for a missing source, InvalidRangeError for a range that does
        not lie inside it. Safe to call from several threads at once."""
        from offloader.exceptions import UnsupportedOperationError

        raise UnsupportedOperationError(f"{type(self).__name__} cannot copy parts")

    def list_temp_files(self) -> Iterator[TempFile]:
        """Files being written or left by a dead writer (none on S3: an unfinished write
        is a multipart upload there)."""
        return iter(())

    def remove_temp_file(self, temp: TempFile, older_than: datetime) -> bool:
        """Remove ``temp`` if it was last written before ``older_than`` (checked again at
        removal: a writer that wrote to it since keeps it). Whether it was removed."""
        return False

    def now(self) -> datetime:
        """The store's clock, the one ``TempFile.modified`` is on."""
        from datetime import UTC

        return datetime.now(UTC)

    def check_available(self) -> None:  # noqa: B027 - optional hook
        """Raise if the store is gone or unreachable (a recorded store is about to be used)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


def check_part_number(store: ObjectStore, part_number: int) -> None:
    """ValueError unless ``part_number`` can number a part of ``store``'s uploads."""
    max_parts = store.capabilities.max_parts
    if not 1 <= part_number <= max_parts:
        raise ValueError(f"part number {part_number}: must be 1..{max_parts}")


def check_part_copy(
    store: ObjectStore, part_number: int, source_key: str, offset: int, length: int
) -> None:
    """The arguments of ``upload_part_copy`` a binding can check before any request."""
    check_part_number(store, part_number)
    caps = store.capabilities
    if offset < 0 or not 1 <= length <= caps.max_part_size:
        raise ValueError(
            f"part copy of {source_key!r} at {offset}+{length}: the offset must be >= 0 and "
            f"the length 1..{caps.max_part_size}"
        )
