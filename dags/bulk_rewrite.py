"""
### bulk_rewrite

Rewrites offloaded objects on Spark (`spark_default`): **compact** merges runs of small
objects (small ledgers' v1 objects, small streamed segments) into segments near the
target size, server side where the store can copy parts; **to-v2** rewrites v1 ledger
objects into v2 segments; **to-v1** moves streamed ledgers back to objects of their own.
The Spark driver records each group's intent, keeps its lease and swaps the metadata by
compare-and-set; executors write the parts. Readers see the same bytes before, during and
after; the replaced objects are queued for deletion after `replaced_object_grace_seconds`
and the `garbage_collection` DAG deletes them (this task updates its asset). A killed run
leaves nothing visible: its rewrites' leases run out and the GC cleans up
(docs/OPERATIONS.md, "Compaction and format migration").

**Daily** (04:00 UTC), no catchup, compaction with the form's defaults (target 128 MiB,
at most 100 output objects a run): small objects accumulate slowly, a run does a bounded
amount of work, and the next run goes on where this one stopped. Migrations are
triggered by hand (the form's mode).
"""

from __future__ import annotations

from datetime import timedelta

from offloader.rewrite.params import RewriteParams
from offloader_airflow.assets import DELETION_QUEUE
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.spark import BulkRewriteOperator

with offloader_dag(
    "bulk_rewrite",
    description="Compact small offloaded objects or migrate formats with Spark",
    schedule="0 4 * * *",
    doc_md=__doc__,
    params=model_params(RewriteParams),
    execution_timeout=timedelta(hours=6),
    tags=("spark",),
) as dag:
    BulkRewriteOperator(
        task_id="rewrite",
        conn_id="spark_default",
        name="bulk_rewrite",
        rewrite_params={name: dag.param(name) for name in RewriteParams.model_fields},
        outlets=[DELETION_QUEUE],
    )
