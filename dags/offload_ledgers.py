"""
### offload_ledgers

Moves sealed ledgers from the hot tier to the object store, then removes hot copies whose
deletion lag has passed. Runs every 10 minutes; trigger it from the UI to offload one
topic, everything up to a ledger id, or to see the plan without changing anything.

plan -> offload (mapped over bounded batches, pool `offload_uploads`) ->
delete_hot_copies -> summary
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import Param, TriggerRule

from offloader_airflow.assets import DELETION_QUEUE
from offloader_airflow.dag_defaults import (
    dry_run_param,
    offloader_dag,
    optional_number_param,
    topic_param,
)
from offloader_airflow.operators import (
    DeleteHotCopiesOperator,
    OffloadLedgersOperator,
    OffloadSummaryOperator,
    PlanOffloadOperator,
)

with offloader_dag(
    "offload_ledgers",
    description="Offload sealed ledgers to object storage; delete hot copies after the lag",
    schedule=timedelta(minutes=10),
    doc_md=__doc__,
    params={
        "topic": topic_param("Offload this topic only; leave empty for every topic."),
        "up_to_ledger": optional_number_param(
            "Offload up to ledger",
            "Offload every sealed ledger with an id <= this, whatever the policy.",
        ),
        "dry_run": dry_run_param(
            "Plan and log what would move and what would be deleted; change nothing."
        ),
        "batch_size": Param(
            500,
            type="integer",
            minimum=1,
            maximum=10000,
            title="Ledgers per task",
            description="Due ledgers are offloaded in mapped tasks of at most this many.",
        ),
        "batch_bytes": Param(
            1 << 30,
            type="integer",
            minimum=1 << 20,
            title="Bytes per task",
            description="A task takes ledgers up to this many bytes (a larger ledger alone).",
        ),
    },
) as dag:
    plan = PlanOffloadOperator(
        task_id="plan",
        topic="{{ params.topic }}",
        up_to_ledger="{{ params.up_to_ledger }}",
        batch_size="{{ params.batch_size }}",
        batch_bytes="{{ params.batch_bytes }}",
        dry_run="{{ params.dry_run }}",
    )
    offload = OffloadLedgersOperator.partial(
        task_id="offload",
        pool="offload_uploads",
        max_active_tis_per_dagrun=4,
        outlets=[DELETION_QUEUE],  # a losing or stale attempt queues its objects
    ).expand(batch=plan.output)
    delete_hot = DeleteHotCopiesOperator(
        task_id="delete_hot_copies",
        topics="{{ ti.xcom_pull(task_ids='plan', key='topics') }}",
        dry_run="{{ params.dry_run }}",
        trigger_rule=TriggerRule.ALL_DONE,
        outlets=[DELETION_QUEUE],
    )
    summary = OffloadSummaryOperator(task_id="summary", trigger_rule=TriggerRule.ALL_DONE)

    plan >> offload >> delete_hot >> summary
