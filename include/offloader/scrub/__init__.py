"""Scrub: read every block of every offloaded object, check it against the format and the
metadata store, repair what the hot tier still holds, report the rest (docs/OPERATIONS.md).

``targets`` plans what to read, ``check`` reads one ledger (a pure function an executor can
run), ``spread`` is what a Spark executor runs over its share, ``run`` settles the findings
on the driver (compare, repair, report), ``report`` is the JSON report and ``output`` where
a URL puts it, ``params`` a run's parameters (the `scrub` DAG's form).
"""

from offloader.scrub.check import Finding, FindingKind, LedgerScrubResult, scrub_ledger
from offloader.scrub.report import Action, Counts, LedgerVerdict, ScrubReport
from offloader.scrub.run import finish_scrub, run_scrub, scrub_targets
from offloader.scrub.targets import ScrubTarget, check_topics, plan_scrub

__all__ = [
    "Action",
    "Counts",
    "Finding",
    "FindingKind",
    "LedgerScrubResult",
    "LedgerVerdict",
    "ScrubReport",
    "ScrubTarget",
    "check_topics",
    "finish_scrub",
    "plan_scrub",
    "run_scrub",
    "scrub_ledger",
    "scrub_targets",
]
