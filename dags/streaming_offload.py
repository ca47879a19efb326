"""
### streaming_offload

Streaming offload (PIP-76): every minute, one pass per topic whose policy has
`streaming=true` moves the entries written since the last pass, the open ledger's up to
its last confirmed entry included, into the topic's current segment (a multipart upload
that stays open across passes); a segment is completed at its size or age limit. Ledgers
whose every entry is in completed segments are then offloaded, and hot copies past their
deletion lag deleted.

Trigger it from the UI to stream one topic, or with "Close now" to complete the current
segment at once, however small (a topic with streaming off may be named: its open segment
is completed).

A topic another pass holds (its lease not over) is reported `busy`, not failed. Each
topic's pass is its own mapped task, so a failing or slow topic holds no other back.

plan -> stream (mapped: one pass per topic, 4 at a time per run) -> check_service_levels

- plan: validates the Params and lists the topics; nothing changes.
- stream: the pass, then hot copies past their deletion lag; its XCom is the pass's
  result. Committed segments update the `offloader_offloaded_ledgers` asset, failed ones
  (their keys queued for deletion) `offloader_deletion_queue`.
- check_service_levels: the service levels (the policy's `max_*` fields) of the topic
  named, or of every streaming topic; a breach fails it with one line per breach, at once
  (no retries), so failure callbacks and e-mail fire. Runs even when a pass failed, and
  then fails too.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import TriggerRule

from offloader.stream.params import StreamRunParams
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.service_level_operators import CheckServiceLevelsOperator
from offloader_airflow.stream_operators import (
    STREAM_OUTLETS,
    PlanStreamOperator,
    StreamPassOperator,
)

with offloader_dag(
    "streaming_offload",
    description="Stream entries into segments (PIP-76) every minute; then delete due hot copies",
    schedule="* * * * *",
    doc_md=__doc__,
    # the form is generated from the model both tasks check with
    params=model_params(StreamRunParams),
    max_retry_delay=timedelta(seconds=30),
    execution_timeout=timedelta(minutes=10),
    tags=("streaming",),
) as dag:
    # a run stuck past this frees the schedule (one run at a time): the next run's pass
    # takes the stream once the stuck pass's lease is over, and fences it
    dag.dagrun_timeout = timedelta(minutes=15)

    plan = PlanStreamOperator(
        task_id="plan",
        retries=1,
        **{name: dag.param(name) for name in StreamRunParams.model_fields},
    )
    stream = StreamPassOperator.partial(
        task_id="stream",
        retries=1,
        max_active_tis_per_dagrun=4,
        outlets=[STREAM_OUTLETS],
    ).expand_kwargs(plan.output)

    check = CheckServiceLevelsOperator(
        task_id="check_service_levels",
        topic=dag.param("topic"),
        streaming_only=True,
        retries=1,
        fail_with_task_ids=("plan", "stream"),
        trigger_rule=TriggerRule.ALL_DONE,
    )

    plan >> stream >> check
