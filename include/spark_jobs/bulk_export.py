"""bulk_export: offloaded entries as Parquet, submitted by the `bulk_export` DAG.

    spark-submit bulk_export.py '<ExportParams as JSON>' [offloader.zip]

The driver reads its settings from the ``OFFLOADER_*`` environment that the submitting task
set (secrets never on a command line or in Spark's conf), plans from the metadata store,
and hands each executor its slices plus the object-store settings in the task closure.
Executors read through the offloader library and stage Parquet files; the driver then
publishes them with one atomic step (offloader/bulk/output.py).

``offloader.zip`` (the library, offloader/bulk/shipping.py) is added for executors only,
with ``addPyFile`` once the driver has imported the library from its install: the driver
needs the real package (its schema check reads the migration scripts from disk), and
``--py-files`` would put the zip first on the driver's path too.
"""

from __future__ import annotations

import json
import logging
import sys

from offloader.bulk.export import export_slices, publish_export
from offloader.bulk.output import ExportTarget
from offloader.bulk.params import ExportParams
from offloader.bulk.plan import plan_export
from offloader.runtime import Runtime
from offloader.settings import Settings

log = logging.getLogger("bulk_export")


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: bulk_export.py '<export params as JSON>' [offloader.zip]", file=sys.stderr)
        return 2
    params = ExportParams.model_validate_json(argv[0])
    if params.export_id is None:
        print("bulk_export: the params name no export_id", file=sys.stderr)
        return 2
    settings = Settings()
    params = params.with_defaults(params.export_id, settings.resolved_object_store_url)
    with Runtime.open(settings) as runtime:
        plan = plan_export(runtime.metadata, params)
    log.info("export %s to %s: %s", params.export_id, params.output, json.dumps(plan.summary()))
    if params.dry_run:
        log.info("dry run: nothing written")
        return 0
    assert params.output is not None
    target = ExportTarget.new_attempt(params.output, params.export_id)
    closure = settings.for_object_stores()  # what executors need, and nothing more

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"bulk_export {params.export_id}").getOrCreate()
    try:
        if len(argv) == 2:
            spark.sparkContext.addPyFile(argv[1])  # executors import this copy
        slices = plan.slices
        rdd = spark.sparkContext.parallelize(slices, max(1, len(slices)))
        files = rdd.mapPartitions(lambda parts: export_slices(parts, target, closure)).collect()
    finally:
        spark.stop()
    manifest = publish_export(target, settings, params, files)
    log.info("published %s", json.dumps(manifest.summary()))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(main(sys.argv[1:]))
