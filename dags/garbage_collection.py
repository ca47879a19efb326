"""
### garbage_collection

Drains the deletion queue: objects of trimmed or deleted ledgers, of lost or stale offload
attempts, and hot copies' leftovers, each deleted in the store it was written to, in
batches of up to 1,000 keys per DeleteObjects request, with backoff and the last error kept
per key. A key the store no longer has counts as deleted.

Runs every hour, and as soon as a task that queues deletions (offload, retention's trim, a
topic delete) updates the `offloader_deletion_queue` asset. Trigger it from the UI to
drain up to a number of keys, or as a dry run that only reports the backlog.

sweep -> drain -> export_metadata -> summary -> check_service_levels

- sweep: the orphan sweep, the only task that lists the bucket. Objects nothing references
  and older than `sweep_grace_seconds` are queued; stale multipart uploads no live attempt
  owns are aborted.
- drain: rewrites (compaction, format migration) whose lease ran out are recovered first
  (failed, their keys queued, their uploads aborted); then bounded passes over the queue,
  then trimmed ledgers whose keys are all gone are recorded `deleted`.
- export_metadata: a metadata snapshot into the object store, keeping the newest
  `metadata_snapshots_keep`.
- summary: backlog, oldest item, items that keep failing and items left untried because
  their store does not answer (both fail the run), and any failed task above.
- check_service_levels: every topic's service levels (its policy's `max_*` fields) against
  the metrics; a breach fails it with one line per breach, at once (no retries), so
  failure callbacks and e-mail fire. Runs even when a task above failed (that is when lags
  grow), and then fails too.

A dry run changes nothing: the sweep only reports, the drain only counts, no snapshot.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable, TriggerRule

from offloader.gc.params import GcParams
from offloader_airflow.assets import DELETION_QUEUE
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.gc_operators import DeletionQueueSummaryOperator, DrainDeletionQueueOperator
from offloader_airflow.maintenance_operators import ExportMetadataOperator, SweepOrphansOperator
from offloader_airflow.service_level_operators import CheckServiceLevelsOperator

with offloader_dag(
    "garbage_collection",
    description="Sweep orphans, drain the deletion queue, snapshot the metadata; report failures",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 * * * *", timezone="UTC"), assets=DELETION_QUEUE
    ),
    doc_md=__doc__,
    execution_timeout=timedelta(hours=1),
    tags=("gc",),
    # the form is generated from the model the drain task checks with
    params=model_params(GcParams),
) as dag:
    sweep = SweepOrphansOperator(task_id="sweep", dry_run=dag.param("dry_run"))
    drain = DrainDeletionQueueOperator(
        task_id="drain",
        **{name: dag.param(name) for name in GcParams.model_fields},
        trigger_rule=TriggerRule.ALL_DONE,  # a store the sweep could not list blocks nothing
    )
    export = ExportMetadataOperator(
        task_id="export_metadata",
        dry_run=dag.param("dry_run"),
        # no DELETION_QUEUE outlet although older snapshots are queued: this DAG is
        # scheduled on that asset and would trigger itself; the next run deletes them
        trigger_rule=TriggerRule.ALL_DONE,
    )
    summary = DeletionQueueSummaryOperator(
        task_id="summary",
        fail_with_task_ids=("sweep", "drain", "export_metadata"),
        trigger_rule=TriggerRule.ALL_DONE,
    )

    check = CheckServiceLevelsOperator(
        task_id="check_service_levels",
        fail_with_task_ids=("sweep", "drain", "export_metadata", "summary"),
        trigger_rule=TriggerRule.ALL_DONE,
    )

    sweep >> drain >> export >> summary >> check
