"""
### offload_ledgers

Moves sealed ledgers from the hot tier to the object store, then removes hot copies whose
deletion lag has passed. Runs every 10 minutes; trigger it from the UI to offload one
topic, everything up to a ledger id, or to see the plan without changing anything.

plan -> offload (mapped over bounded batches, pool `offload_uploads`) ->
delete_hot_copies -> summary
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, TriggerRule

from offloader_airflow.dag_defaults import default_args
from offloader_airflow.operators import (
    DeleteHotCopiesOperator,
    OffloadLedgersOperator,
    OffloadSummaryOperator,
    PlanOffloadOperator,
)

DEFAULT_ARGS = default_args(execution_timeout=timedelta(hours=2))

with DAG(
    dag_id="offload_ledgers",
    description="Offload sealed ledgers to object storage; delete hot copies after the lag",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    render_template_as_native_obj=True,
    tags=["offloader", "tiered-storage"],
    doc_md=__doc__,
    params={
        "topic": Param(
            "",
            type="string",
            maxLength=512,
            title="Topic",
            description="Offload this topic only; leave empty for every topic.",
        ),
        "up_to_ledger": Param(
            None,
            type=["null", "integer"],
            minimum=0,
            title="Offload up to ledger",
            description="Offload every sealed ledger with an id <= this, whatever the policy.",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Plan and log what would move and what would be deleted; change nothing.",
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
        task_id="offload", pool="offload_uploads", max_active_tis_per_dagrun=4
    ).expand(batch=plan.output)
    delete_hot = DeleteHotCopiesOperator(
        task_id="delete_hot_copies",
        topics="{{ ti.xcom_pull(task_ids='plan', key='topics') }}",
        dry_run="{{ params.dry_run }}",
        trigger_rule=TriggerRule.ALL_DONE,
    )
    summary = OffloadSummaryOperator(task_id="summary", trigger_rule=TriggerRule.ALL_DONE)

    plan >> offload >> delete_hot >> summary
