"""The wiring of one process: settings -> metadata store, object stores, hot tier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from offloader.hottier import HotLedgerStore
from offloader.metadata import MetadataStore
from offloader.metadata.engine import DatabaseDeadlines, create_metadata_engine
from offloader.metadata.migrate import check_revision, upgrade
from offloader.metadata.snapshot import ExportResult, export_snapshot
from offloader.objectstore import ObjectStore
from offloader.objectstore.registry import StoreRegistry, default_location, open_object_store
from offloader.settings import Settings

if TYPE_CHECKING:
    from offloader.objectstore.s3 import S3ClientFactory


@dataclass
class Runtime:
    """``objects`` is the configured store new offloads go to; ``stores`` opens the store
    any recorded row names (invariant 7)."""

    settings: Settings
    metadata: MetadataStore
    objects: ObjectStore
    stores: StoreRegistry
    hot: HotLedgerStore

    @classmethod
    def open(
        cls, settings: Settings | None = None, client_factory: S3ClientFactory | None = None
    ) -> Runtime:
        """Open everything; SchemaOutOfDateError if the database needs `offloader db upgrade`.

        ``client_factory`` makes every S3 client (the default store's and recorded ones');
        without it they are built from the settings' keys.
        """
        from offloader.hottier.filestore import FileLedgerStore

        settings = settings or Settings()
        metadata = MetadataStore.open(settings.resolved_metadata_url, database_deadlines(settings))
        try:
            objects = open_object_store(
                settings.resolved_object_store_url, settings, client_factory
            )
            stores = StoreRegistry(metadata, settings, objects, client_factory)
            hot = FileLedgerStore(settings.resolved_ledger_dir)
        except BaseException:
            metadata.close()
            raise
        return cls(settings=settings, metadata=metadata, objects=objects, stores=stores, hot=hot)

    def close(self) -> None:
        self.stores.close()
        self.objects.close()
        self.metadata.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def database_deadlines(settings: Settings) -> DatabaseDeadlines:
    """The settings' deadlines for the metadata database (invariant 8)."""
    return DatabaseDeadlines(
        connect_seconds=settings.db_connect_timeout_seconds,
        statement_seconds=settings.db_statement_timeout_seconds,
        lock_seconds=settings.db_lock_timeout_seconds,
    )


def upgrade_database(settings: Settings) -> tuple[str | None, str | None]:
    """`offloader db upgrade`: migrate the metadata to head; rows written before revision
    0002 are recorded as written to the store ``settings`` configure. Returns the revisions
    before and after."""
    engine = create_metadata_engine(settings.resolved_metadata_url, database_deadlines(settings))
    try:
        return upgrade(engine, default_location(settings))
    finally:
        engine.dispose()


def check_database(settings: Settings) -> str:
    """`offloader db check`: the head revision, or SchemaOutOfDateError."""
    engine = create_metadata_engine(settings.resolved_metadata_url, database_deadlines(settings))
    try:
        return check_revision(engine)
    finally:
        engine.dispose()


def export_metadata(rt: Runtime) -> ExportResult:
    """``offloader metadata export`` and the GC DAG: a snapshot of ``rt``'s database in its
    configured store, keeping the newest ``metadata_snapshots_keep``."""
    return export_snapshot(
        rt.metadata.engine, rt.objects, rt.stores.default_id(), rt.settings.metadata_snapshots_keep
    )
