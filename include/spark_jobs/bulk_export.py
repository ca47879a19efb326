"""bulk_export: offloaded entries as Parquet, submitted by the `bulk_export` DAG.

    spark-submit bulk_export.py '<ExportParams as JSON>' [offloader.zip [result.json]]

The driver plans from the metadata store and hands each executor its slices plus the
object-store settings in the task closure (offloader_app.py: settings, the library zip).
Executors read through the offloader library and stage Parquet files; the driver then
publishes them with one atomic step (offloader/bulk/output.py). The stores it read go, as
JSON, to ``result.json`` (the task's lineage).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from offloader_app import AppArgs, main, spark_context, spread

from offloader.bulk.export import export_slices, publish_export
from offloader.bulk.manifest import BulkExportResult
from offloader.bulk.output import ExportTarget
from offloader.bulk.params import ExportParams
from offloader.bulk.plan import plan_export
from offloader.runtime import Runtime
from offloader.settings import Settings

log = logging.getLogger("bulk_export")


def export(args: AppArgs, settings: Settings) -> int:
    params = ExportParams.model_validate_json(args.params_json)
    export_id = params.export_id
    if export_id is None:
        raise ValueError("the params name no export_id")
    params = params.with_defaults(export_id, settings.resolved_object_store_url)
    with Runtime.open(settings) as runtime:
        plan = plan_export(runtime.metadata, params)
    log.info("export %s to %s: %s", params.export_id, params.output, json.dumps(plan.to_json()))
    if params.dry_run:
        log.info("dry run: nothing written")
        return 0
    assert params.output is not None
    target = ExportTarget.new_attempt(params.output, export_id)
    closure = settings.for_object_stores()  # what executors need, and nothing more
    with spark_context(f"bulk_export {params.export_id}", args.library_zip) as sc:
        files = spread(sc, plan.slices, lambda parts: export_slices(parts, target, closure))
    manifest = publish_export(target, settings, params, files)
    log.info("published %s", json.dumps(BulkExportResult(manifest).to_json()))
    if args.result_file is not None:
        Path(args.result_file).write_text(json.dumps({"sources": plan.stores}))
    return 0


if __name__ == "__main__":
    main("bulk_export", export)
