"""
### bulk_export

Exports the offloaded entries of chosen topics, ledger ranges or creation times as Parquet
(topic, ledger_id, entry_id, payload, publish_time), partitioned by topic and ledger, to a
local directory or the object store. Spark (`spark_default`) reads through the offloader
library, one task per slice of a ledger. A run whose export id names an earlier export
replaces it atomically; readers open the export's manifest (docs/OPERATIONS.md).

Triggered by hand (the form); no schedule.
"""

from __future__ import annotations

from offloader.bulk.params import ExportParams
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.spark import BulkExportOperator

with offloader_dag(
    "bulk_export",
    description="Export offloaded entries as Parquet with Spark",
    schedule=None,
    doc_md=__doc__,
    params=model_params(ExportParams),
    tags=("spark",),
) as dag:
    BulkExportOperator(
        task_id="export",
        conn_id="spark_default",
        name="bulk_export",
        export_params={name: dag.param(name) for name in ExportParams.model_fields},
    )
