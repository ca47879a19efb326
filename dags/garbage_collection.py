"""
### garbage_collection

Drains the deletion queue: objects of trimmed or deleted ledgers, of lost or stale offload
attempts, and hot copies' leftovers, each deleted in the store it was written to, in
batches of up to 1,000 keys per DeleteObjects request, with backoff and the last error kept
per key. A key the store no longer has counts as deleted.

Runs every hour, and as soon as a task that queues deletions (offload, retention's trim, a
topic delete) updates the `offloader_deletion_queue` asset. Trigger it from the UI to
drain up to a number of keys, or as a dry run that only reports the backlog.

drain -> summary (backlog, oldest item, items that keep failing: those fail the run)
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable, Param, TriggerRule

from offloader_airflow.assets import DELETION_QUEUE
from offloader_airflow.dag_defaults import default_args
from offloader_airflow.gc_operators import DeletionQueueSummaryOperator, DrainDeletionQueueOperator

DEFAULT_ARGS = default_args(execution_timeout=timedelta(hours=1))

with DAG(
    dag_id="garbage_collection",
    description="Drain the deletion queue; report its backlog and the deletions that keep failing",
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 * * * *", timezone="UTC"), assets=DELETION_QUEUE
    ),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    tags=["offloader", "tiered-storage", "gc"],
    doc_md=__doc__,
    params={
        "max_items": Param(
            100_000,
            type="integer",
            minimum=1,
            maximum=10_000_000,
            title="Most keys to take",
            description="Stop after this many queued keys were tried in this run.",
        ),
        "time_budget_seconds": Param(
            1800,
            type="integer",
            minimum=1,
            maximum=3300,
            title="Time budget (seconds)",
            description="Start no new pass after this long; the next run goes on.",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Only report the backlog, the oldest item and failing items.",
        ),
    },
) as dag:
    drain = DrainDeletionQueueOperator(
        task_id="drain",
        max_items="{{ params.max_items }}",
        time_budget_seconds="{{ params.time_budget_seconds }}",
        dry_run="{{ params.dry_run }}",
    )
    # Integrator: S's orphan sweep (SweepOrphansOperator) and metadata export
    # (ExportMetadataOperator) go here, between drain and summary: drain >> sweep >>
    # export >> summary, the summary with trigger_rule ALL_DONE as now.
    summary = DeletionQueueSummaryOperator(task_id="summary", trigger_rule=TriggerRule.ALL_DONE)

    drain >> summary
