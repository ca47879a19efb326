"""Opening object stores: a binding by URL, and stores by recorded location (invariant 7),
opened once per runtime.

Every attempt, committed ledger and queued deletion names the store it went to; readers
and the GC ask this registry for that store rather than using the configured default.
Credentials are never recorded: they come from the current settings.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlparse

from offloader.exceptions import StoreUnavailableError
from offloader.objectstore import ObjectStore
from offloader.objectstore.location import FILE, StoreLocation

if TYPE_CHECKING:
    from offloader.objectstore.s3 import S3ClientFactory
    from offloader.settings import Settings


def open_object_store(
    url: str, settings: Settings | None = None, client_factory: S3ClientFactory | None = None
) -> ObjectStore:
    """Pick the binding by URL scheme: ``file:///abs/dir`` or ``s3://bucket/prefix``;
    ``client_factory`` (see :data:`~offloader.objectstore.s3.S3ClientFactory`) makes S3
    clients instead of the settings' keys."""
    scheme = urlparse(url).scheme
    if scheme == "file":
        from offloader.objectstore.filesystem import FilesystemObjectStore

        return FilesystemObjectStore.from_url(url)
    if scheme == "s3":
        from offloader.objectstore.s3 import S3ObjectStore

        return S3ObjectStore.from_url(url, settings, client_factory)
    raise ValueError(
        f"object store URL {url!r}: scheme must be 'file' (file:///abs/dir) or 's3' "
        "(s3://bucket/prefix)"
    )


def default_location(settings: Settings) -> StoreLocation:
    """The location of the configured store: the one new offloads go to."""
    return StoreLocation.from_url(settings.resolved_object_store_url, settings.s3_endpoint_url)


def open_location(
    location: StoreLocation, settings: Settings, client_factory: S3ClientFactory | None = None
) -> ObjectStore:
    """Open a recorded store; StoreUnavailableError naming it if it is gone or unreachable.

    A recorded store is never created: a missing directory or bucket means the data is not
    where the metadata says, which an operator must hear about.
    """
    if location.kind == FILE and not Path(location.location).is_dir():
        raise StoreUnavailableError(
            f"object store {location} cannot be opened: the directory does not exist"
        )
    at = settings.model_copy(update={"s3_endpoint_url": location.endpoint or None})
    try:
        store = open_object_store(location.store_url, at, client_factory)
    except Exception as exc:
        raise StoreUnavailableError(f"object store {location} cannot be opened: {exc}") from exc
    try:
        store.check_available()
    except Exception as exc:
        store.close()
        raise StoreUnavailableError(f"object store {location} is not reachable: {exc}") from exc
    return store


class RecordedStores(Protocol):
    """Where the registry finds recorded locations: the metadata store (``MetadataStore``),
    which sits above the object stores and so is not imported here."""

    def record_location(self, location: StoreLocation) -> int: ...

    def get_location(self, store_id: int) -> StoreLocation: ...


@dataclass
class StoreRegistry:
    """The runtime's stores: the configured default plus every recorded one it opened."""

    metadata: RecordedStores
    settings: Settings
    default: ObjectStore
    client_factory: S3ClientFactory | None = None  # the runtime's: recorded stores use it too
    _default_location: StoreLocation = field(init=False)
    _default_id: int | None = field(default=None, init=False)
    _opened: dict[int, ObjectStore] = field(default_factory=dict, init=False)
    # stores found unreachable in this runtime: asked once, not once per row (invariant 8)
    _unavailable: dict[int, StoreUnavailableError] = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._default_location = default_location(self.settings)

    @property
    def default_location(self) -> StoreLocation:
        return self._default_location

    def default_id(self) -> int:
        """The id under which the default store is recorded (recorded on first use, and
        only once it answered: a dead endpoint must not become a recorded store that
        attempts, deletions and sweeps then name forever)."""
        with self._lock:
            if self._default_id is None:
                try:
                    self.default.check_available()
                except Exception as exc:
                    raise StoreUnavailableError(
                        f"object store {self._default_location} is not reachable: {exc}"
                    ) from exc
                self._default_id = self.metadata.record_location(self._default_location)
                self._opened[self._default_id] = self.default
            return self._default_id

    def get(self, store_id: int | None, what: str) -> ObjectStore:
        """The store ``store_id``, recorded for ``what`` (named in errors)."""
        if store_id is None:
            raise StoreUnavailableError(
                f"{what} names no object store (written before revision 0002 and not "
                "upgraded): run `offloader db upgrade`"
            )
        with self._lock:
            if store_id in self._unavailable:
                raise self._unavailable[store_id]
            store = self._opened.get(store_id)
            if store is None:
                location = self.metadata.get_location(store_id)
                if location == self._default_location:
                    store = self.default  # the same store: never open it twice
                else:
                    try:
                        store = open_location(location, self.settings, self.client_factory)
                    except StoreUnavailableError as exc:
                        self._unavailable[store_id] = exc
                        raise
                self._opened[store_id] = store
            return store

    def location(self, store_id: int) -> StoreLocation:
        return self.metadata.get_location(store_id)

    def close(self) -> None:
        """Close every store this registry opened; the default belongs to the runtime."""
        with self._lock:
            for store in self._opened.values():
                if store is not self.default:
                    store.close()
            self._opened.clear()


class OpenedLocations:
    """Stores opened by recorded location where there is no database (a Spark executor):
    each location once, so two sources in one store are one store (server-side copies
    between them work), all closed together."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._opened: dict[StoreLocation, ObjectStore] = {}

    def open(self, location: StoreLocation) -> ObjectStore:
        if location not in self._opened:
            self._opened[location] = open_location(location, self._settings)
        return self._opened[location]

    def close(self) -> None:
        for store in self._opened.values():
            store.close()
        self._opened.clear()
