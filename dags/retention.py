"""
### retention

Applies each topic's retention policy (PDP-19): every 15 minutes it takes one stream cut
at the end of every topic ("retention cut generation"), then truncates each topic at the
cut its policy chooses (time: the newest cut older than `retention_time_seconds`; size:
the cut keeping the least that is still >= `retention_size_bytes`; both: the one keeping
more). A trim moves the topic's start first, then queues what fell below it for the
`garbage_collection` DAG, which the deletion queue asset wakes.

From the UI: one topic, optionally with a retention override for this run; or a manual
trim of one topic at a cut id or a position `L:E`; either as a dry run. Params are
checked before anything changes.

plan -> retention_cut_generation -> apply_retention (mapped per topic) -> summary
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import TriggerRule

from offloader.retention.params import RetentionParams
from offloader_airflow.assets import DELETION_QUEUE
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.retention_operators import (
    ApplyRetentionOperator,
    PlanRetentionOperator,
    RetentionCutsOperator,
    RetentionSummaryOperator,
)

with offloader_dag(
    "retention",
    description="Take a stream cut per topic, truncate each topic where its policy says",
    schedule=timedelta(minutes=15),
    doc_md=__doc__,
    max_retry_delay=timedelta(minutes=5),
    execution_timeout=timedelta(hours=1),
    tags=("retention",),
    # the form is generated from the model the plan task checks with
    params=model_params(RetentionParams),
) as dag:
    plan = PlanRetentionOperator(
        task_id="plan", **{name: dag.param(name) for name in RetentionParams.model_fields}
    )
    cuts = RetentionCutsOperator(task_id="retention_cut_generation", plan=plan.output)
    apply = ApplyRetentionOperator.partial(
        task_id="apply_retention", outlets=[DELETION_QUEUE], max_active_tis_per_dagrun=4
    ).expand(work=cuts.output)
    summary = RetentionSummaryOperator(task_id="summary", trigger_rule=TriggerRule.ALL_DONE)

    plan >> cuts >> apply >> summary
