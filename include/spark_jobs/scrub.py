"""scrub: read every block of every offloaded object on Spark executors, repair on the
driver, submitted by the `scrub` DAG.

    spark-submit scrub.py '<ScrubParams as JSON>' [offloader.zip]

The driver plans with ``plan_scrub`` (the live offloaded ledgers and their stores'
locations, no credential), one Spark task per ledger; executors run ``scrub_ledger``
against the recorded stores (offloader/scrub/spread.py) with the object-store settings in
the task closure. The driver collects the results, settles them with ``finish_scrub``
(compare with the metadata again, repair from hot copies through the normal offload path)
and writes the JSON report where the params say. It logs the summary and exits 2 when
damage is left unrepaired, so the submitting task fails.
"""

from __future__ import annotations

import logging

from offloader_app import AppArgs, main, spark_context, spread

from offloader.exceptions import ScrubFailedError
from offloader.runtime import Runtime
from offloader.scrub import finish_scrub, plan_scrub
from offloader.scrub.output import write_report_at
from offloader.scrub.params import ScrubParams
from offloader.scrub.spread import scrub_partition
from offloader.settings import Settings

log = logging.getLogger("scrub")


def scrub(args: AppArgs, settings: Settings) -> int:
    params = ScrubParams.model_validate_json(args.params_json)
    if params.report is None:
        raise ValueError("the params name no report location")
    with Runtime.open(settings) as runtime:
        started_ms = runtime.metadata.db_now_ms()
        targets = plan_scrub(runtime.metadata, params.topics)
    data_bytes = sum(t.data_len or 0 for t in targets)
    log.info(
        "scrub plan: %d ledgers, %d data bytes, topics %s, repair %s, report %s",
        len(targets),
        data_bytes,
        params.topics or "all",
        params.repair,
        params.report,
    )
    if params.dry_run:
        log.info("dry run: nothing read, no report written")
        return 0
    closure = settings.for_object_stores()  # what executors need, and nothing more
    with spark_context("scrub", args.library_zip) as sc:
        results = spread(sc, targets, lambda part: scrub_partition(part, closure))
    with Runtime.open(settings) as runtime:  # anew: the reads may have taken hours
        report = finish_scrub(
            runtime, results, topics=params.topics, repair=params.repair, started_ms=started_ms
        )
    write_report_at(report, params.report, settings)
    log.info("scrub report at %s:\n%s", params.report, report)
    try:
        report.raise_for_failure()
    except ScrubFailedError as err:
        log.error("%s; report at %s", err, params.report)
        return 2
    return 0


if __name__ == "__main__":
    main("scrub", scrub)
