"""
### scrub

Reads every block of every offloaded object of the chosen topics on Spark (`spark_default`,
one task per ledger) and checks it against the format and the metadata store: magic,
lengths, CRCs, framing, the index, the entry counts. The driver then offloads a damaged
ledger again from its hot copy through the normal path (repair), and writes a JSON report
(counts; every damaged ledger with its findings and what was done) to
`scrub-reports/<run id>.json` under the offloader's object store, or where the form says.
Damage left unrepaired (no hot copy, repair off, a failed repair) fails the task; the log
names the ledgers and why (docs/OPERATIONS.md, "Scrub").

**Weekly** (Sundays 03:00 UTC), no catchup: a scrub reads every offloaded byte, so its cost
grows with the tier and it should not compete with daily offloads; bit rot and lost
objects are rare and slow, so a week finds them soon enough, while a skipped week has
nothing to catch up on (the next run reads everything again). A damaged ledger is only
repairable while its hot copy exists: keep the topics' `deletion_lag_seconds` above a week
where that matters, or trigger a scrub by hand (the form) before deleting hot copies.
"""

from __future__ import annotations

from datetime import timedelta

from offloader.scrub.params import ScrubParams
from offloader_airflow.dag_defaults import model_params, offloader_dag
from offloader_airflow.spark import ScrubOperator

with offloader_dag(
    "scrub",
    description="Read and check every offloaded block with Spark; repair from hot copies",
    schedule="0 3 * * 0",
    doc_md=__doc__,
    params=model_params(ScrubParams),
    execution_timeout=timedelta(hours=12),
    tags=("spark",),
) as dag:
    ScrubOperator(
        task_id="scrub",
        conn_id="spark_default",
        name="scrub",
        scrub_params={name: dag.param(name) for name in ScrubParams.model_fields},
    )
