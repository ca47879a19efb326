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

from airflow.sdk import Param, TriggerRule

from offloader_airflow.assets import DELETION_QUEUE
from offloader_airflow.dag_defaults import (
    dry_run_param,
    offloader_dag,
    optional_number_param,
    topic_param,
)
from offloader_airflow.retention_operators import (
    REQUEST_FIELDS,
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
    params={
        "topic": topic_param("Act on this topic only; leave empty for every topic (policy run)."),
        "cut_id": optional_number_param(
            "Trim at cut", "Trim the topic at this stream cut (`offloader cut list TOPIC`)."
        ),
        "position": Param(
            None,  # nullable: the UI's form counts an empty non-null string as missing
            type=["null", "string"],
            pattern=r"^(\s*|\s*\d+:\d+\s*)$",
            title="Trim at position",
            description="Trim the topic at LEDGER:ENTRY (e.g. 12:0) instead of a cut.",
        ),
        "retention_time_seconds": optional_number_param(
            "Keep at least (seconds)", "Override the topic's retention time for this run.", "number"
        ),
        "retention_size_bytes": optional_number_param(
            "Keep at least (bytes)", "Override the topic's retention size for this run."
        ),
        "dry_run": dry_run_param(
            "Log where each topic would be trimmed and what would go; change nothing."
        ),
    },
) as dag:
    plan = PlanRetentionOperator(
        task_id="plan", **{name: dag.param(name) for name in REQUEST_FIELDS}
    )
    cuts = RetentionCutsOperator(task_id="retention_cut_generation", plan=plan.output)
    apply = ApplyRetentionOperator.partial(
        task_id="apply_retention", outlets=[DELETION_QUEUE], max_active_tis_per_dagrun=4
    ).expand(work=cuts.output)
    summary = RetentionSummaryOperator(task_id="summary", trigger_rule=TriggerRule.ALL_DONE)

    plan >> cuts >> apply >> summary
