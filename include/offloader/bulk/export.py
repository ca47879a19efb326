"""The export's two halves around Spark: what an executor does with its slices, and how the
driver publishes what the executors wrote. Plain functions of plain data, so Spark only
distributes them (include/spark_jobs/bulk_export.py) and tests can run them without it."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable

from offloader.bulk.manifest import ExportManifest, ManifestFile
from offloader.bulk.output import ExportTarget, open_output
from offloader.bulk.params import ExportParams
from offloader.bulk.parquet import parquet_bytes, slice_table
from offloader.bulk.plan import ExportSlice
from offloader.bulk.source import read_slice
from offloader.objectstore import ObjectStore
from offloader.objectstore.location import StoreLocation
from offloader.objectstore.registry import open_location
from offloader.settings import Settings


def export_slices(
    parts: Iterable[ExportSlice], target: ExportTarget, settings: Settings
) -> list[dict[str, object]]:
    """Read each slice from its recorded store and stage it as one Parquet file of
    ``target``'s attempt; one manifest entry (a dict) per file. ``settings`` is what the
    executor got in its closure (:meth:`Settings.for_object_stores`)."""
    stores: dict[StoreLocation, ObjectStore] = {}
    files = []
    try:
        with open_output(target, settings) as output:
            for part in parts:
                store = stores.get(part.store)
                if store is None:
                    store = stores[part.store] = open_location(part.store, settings)
                data = parquet_bytes(
                    slice_table(part, read_slice(store, part, settings.read_prefetch))
                )
                output.write(part.path, data)
                files.append(
                    ManifestFile(
                        path=part.path,
                        topic=part.topic,
                        ledger_id=part.ledger_id,
                        first_entry_id=part.first_entry_id,
                        last_entry_id=part.last_entry_id,
                        rows=part.entries,
                        bytes=len(data),
                        sha256=hashlib.sha256(data).hexdigest(),
                    ).model_dump()
                )
    finally:
        for store in stores.values():
            store.close()
    return files


def publish_export(
    target: ExportTarget,
    settings: Settings,
    params: ExportParams,
    files: Iterable[dict[str, object]],
) -> ExportManifest:
    """Publish the staged files as the export (one atomic step), then remove the export's
    other attempts: a rerun replaces its own output, and a reader never sees half of it."""
    entries = sorted((ManifestFile.model_validate(f) for f in files), key=lambda f: f.path)
    with open_output(target, settings) as output:
        manifest = ExportManifest(
            export_id=target.export_id,
            attempt=target.attempt,
            root=output.root,
            created_ms=int(time.time() * 1000),
            params=params.model_dump(mode="json"),
            files=entries,
        )
        output.publish(manifest)
        output.discard_others()
    return manifest


def published_manifest(url: str, export_id: str, settings: Settings) -> ExportManifest | None:
    """The manifest readers of export ``export_id`` at ``url`` see (None: not published)."""
    with open_output(ExportTarget(url, export_id, "-"), settings) as output:
        return output.published()
