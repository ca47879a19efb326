"""
### offload_historical

Offloads a past period: each run moves the sealed ledgers **created inside its data
interval** (one UTC day, `[00:00, next 00:00)`) to the object store, whatever the topics'
offload policies say. Ledgers already offloaded, trimmed or still open are never planned.
Hot copies are left to `offload_ledgers`, which deletes them once the deletion lag passed.

The daily schedule has real data intervals and catchup is off. Unpause the DAG (no run of
a paused DAG starts, backfill runs included), then ask for days, e.g.

    airflow backfill create --dag-id offload_historical \\
        --from-date 2026-03-01 --to-date 2026-03-03

runs 2026-03-01, -02 and -03 (ledgers created from 2026-03-01 00:00 up to 2026-03-04 00:00
UTC). A date with no such ledgers succeeds having done nothing. While unpaused the DAG
also runs daily for the day before; pause it after the backfill if the policies alone
should decide. Step by step: docs/OPERATIONS.md, "Backfill historical ledgers".

**Reprocessing.** A backfill skips dates that already have a run; add
`--reprocess-behavior completed` to run them again. A re-run plans only ledgers of that
date still not offloaded, so after a finished run it plans nothing and changes nothing; a
ledger another run committed meanwhile reports `already-offloaded` and keeps its offload.

plan (ledgers created in the data interval) -> offload (mapped over bounded batches,
pool `offload_uploads`) -> summary
"""

from __future__ import annotations

from airflow.sdk import CronDataIntervalTimetable, TriggerRule

from offloader.offload.params import OffloadRunParams
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.operators import (
    OffloadSummaryOperator,
    PlanOffloadOperator,
    offload_each_batch,
)

with offloader_dag(
    "offload_historical",
    description="Backfill: offload the sealed ledgers created in each run's data interval",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    doc_md=__doc__,
    # the offload_ledgers form's model, less up_to_ledger: the data interval selects here
    params={k: v for k, v in model_params(OffloadRunParams).items() if k != "up_to_ledger"},
    tags=("backfill",),
) as dag:
    plan = PlanOffloadOperator(
        task_id="plan",
        **{name: dag.param(name) for name in dag.params},
        window="data_interval",
    )
    offload = offload_each_batch(plan)
    summary = OffloadSummaryOperator(
        task_id="summary", hot_task_id=None, trigger_rule=TriggerRule.ALL_DONE
    )

    plan >> offload >> summary
