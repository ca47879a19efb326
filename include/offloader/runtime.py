"""The wiring of one process: settings -> metadata store, object store, hot tier."""

from __future__ import annotations

from dataclasses import dataclass

from offloader.hottier import HotLedgerStore
from offloader.metadata import MetadataStore
from offloader.objectstore import ObjectStore, open_object_store
from offloader.settings import Settings


@dataclass
class Runtime:
    settings: Settings
    metadata: MetadataStore
    objects: ObjectStore
    hot: HotLedgerStore

    @classmethod
    def open(cls, settings: Settings | None = None) -> Runtime:
        from offloader.hottier.filestore import FileLedgerStore

        settings = settings or Settings()
        metadata = MetadataStore.open(settings.resolved_metadata_url)
        objects = open_object_store(settings.resolved_object_store_url, settings)
        hot = FileLedgerStore(settings.resolved_ledger_dir)
        return cls(settings=settings, metadata=metadata, objects=objects, hot=hot)

    def close(self) -> None:
        self.objects.close()
        self.metadata.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
