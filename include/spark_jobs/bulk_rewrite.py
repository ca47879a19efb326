"""bulk_rewrite: compaction and format migration with the parts written on Spark
executors, submitted by the `bulk_rewrite` DAG.

    spark-submit bulk_rewrite.py '<RewriteParams as JSON>' [offloader.zip [result.json]]

The driver plans from the metadata store and keeps every state change to itself: per wave
of groups it records each intent and multipart upload, keeps their leases, and hands
executors one picklable work order per group (sources by recorded store location and keys,
the upload, the output's layout; offloader/rewrite/work.py) with the object-store settings
in the task closure. Executors read, re-encode or server-side copy, and upload the parts;
the driver completes, indexes and swaps each group by compare-and-set. A driver killed
anywhere leaves rewrite segments whose leases run out: `offloader gc` (the
`garbage_collection` DAG) fails them and queues their objects; readers never saw them.

Mode ``to-v1`` and dry runs run on the driver alone (a ledger at a time through the
offload path's replacement; a plan). The report goes to the log and, as JSON, to
``result.json``; a failed group ends the driver with status 2 after the others were done.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from offloader_app import AppArgs, main, spark_context, spread

from offloader.rewrite.params import TO_V1, RewriteParams
from offloader.rewrite.report import RewriteReport
from offloader.rewrite.run import run_rewrite
from offloader.rewrite.work import WorkOrder, WorkResult, write_partition
from offloader.runtime import Runtime
from offloader.settings import Settings

log = logging.getLogger("bulk_rewrite")


def bulk_rewrite(args: AppArgs, settings: Settings) -> int:
    params = RewriteParams.model_validate_json(args.params_json)
    owner = f"spark:{socket.gethostname()}:{os.getpid()}"
    with Runtime.open(settings) as runtime:
        if params.dry_run or params.mode == TO_V1:
            report = run_rewrite(runtime, params, owner=owner)
        else:
            closure = settings.for_object_stores()  # what executors need, and nothing more
            with spark_context(f"bulk_rewrite {params.mode}", args.library_zip) as sc:

                def on_executors(orders: list[WorkOrder]) -> list[WorkResult]:
                    return spread(sc, orders, lambda part: write_partition(part, closure))

                report = run_rewrite(runtime, params, owner=owner, spread=on_executors)
    return finish(report, args.result_file)


def finish(report: RewriteReport, result_file: str | None) -> int:
    """Log and hand over the report; a failed group is RewriteFailedError naming it (exit
    status 2, offloader_app.run)."""
    log.info("rewrite report:\n%s", report)
    if result_file is not None:
        Path(result_file).write_text(json.dumps(report.to_json()))
    report.raise_for_failure()
    return 0


if __name__ == "__main__":
    main("bulk_rewrite", bulk_rewrite)
