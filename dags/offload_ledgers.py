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

from airflow.sdk import TriggerRule

from offloader.offload.params import OffloadRunParams
from offloader_airflow.assets import DELETION_QUEUE
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.operators import (
    DeleteHotCopiesOperator,
    OffloadSummaryOperator,
    PlanOffloadOperator,
    offload_each_batch,
)

with offloader_dag(
    "offload_ledgers",
    description="Offload sealed ledgers to object storage; delete hot copies after the lag",
    schedule=timedelta(minutes=10),
    doc_md=__doc__,
    # the form is generated from the model `offloader plan` and the plan task check with
    params=model_params(OffloadRunParams),
) as dag:
    plan = PlanOffloadOperator(
        task_id="plan",
        **{name: dag.param(name) for name in OffloadRunParams.model_fields},
    )
    offload = offload_each_batch(plan)
    delete_hot = DeleteHotCopiesOperator(
        task_id="delete_hot_copies",
        topics=plan.output["topics"],
        dry_run=plan.output["dry_run"],
        # after failed batches too, but not without a plan (its XComs are the input)
        trigger_rule=TriggerRule.ALL_DONE_MIN_ONE_SUCCESS,
        outlets=[DELETION_QUEUE],
    )
    summary = OffloadSummaryOperator(task_id="summary", trigger_rule=TriggerRule.ALL_DONE)

    plan >> offload >> delete_hot >> summary
