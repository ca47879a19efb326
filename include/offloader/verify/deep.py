"""`offloader verify --deep`: every block of every live offloaded object read and checked by
scrub's own checks (offloader/scrub/check.py: one block in memory at a time, its CRCs,
framing and ids, the index against the metadata), nothing repaired.

Objects the LIST pass already found missing or of the wrong size, and stores it could not
list, are not read again: those breaches are reported once.
"""

from __future__ import annotations

from offloader.runtime import Runtime
from offloader.scrub import FindingKind, plan_scrub, scrub_ledger
from offloader.verify.objects import ObjectsSeen
from offloader.verify.report import BreachKind, VerifyReport

_KINDS = {
    FindingKind.MISSING_INDEX: BreachKind.MISSING_OBJECT,
    FindingKind.MISSING_DATA: BreachKind.MISSING_OBJECT,
    FindingKind.TRUNCATED: BreachKind.SIZE_MISMATCH,
    FindingKind.OVERLONG: BreachKind.SIZE_MISMATCH,
    FindingKind.DAMAGED_INDEX: BreachKind.CORRUPT,
    FindingKind.DAMAGED_BLOCK: BreachKind.CORRUPT,
    FindingKind.METADATA_MISMATCH: BreachKind.CORRUPT,
    FindingKind.UNREADABLE: BreachKind.UNREADABLE,
}


def check_blocks(rt: Runtime, report: VerifyReport, topics: list[str], seen: ObjectsSeen) -> None:
    for target in plan_scrub(rt.metadata, topics):
        if target.store_id in seen.unavailable:
            continue
        if {target.data_key, target.index_key} & (seen.missing | seen.wrong_size):
            continue
        store = rt.stores.get(target.store_id, target.described)
        result = scrub_ledger(store, target)
        report.counts.blocks_read += result.blocks
        for finding in result.findings:
            report.add(
                _KINDS[finding.kind],
                f"{target.described}: {finding.where}: {finding.reason}",
                topic=finding.topic,
                key=finding.key,
                ledger_id=finding.ledger_id,
                segment_id=target.segment_id,
                store=None if target.location is None else str(target.location),
            )
