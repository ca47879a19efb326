"""The scrub driver: plan, read every ledger, then settle what was found (compare with the
metadata store once more, repair, report).

:func:`run_scrub` does all three in this process (the CLI). A Spark job calls
:func:`plan_scrub` on the driver, maps :func:`scrub_ledger` over the targets on executors,
and hands the results back to :func:`finish_scrub` on the driver: reading scales out,
deciding and changing metadata stays in one place.

A damaged ledger whose hot copy is still present is offloaded again through the normal
path (``LedgerOffloader.replace_ledger``: intent, upload, CAS commit, the damaged objects
queued for deletion in the commit's transaction) and its new objects are scrubbed before
it counts as repaired. One without a hot copy is logged as an error and fails the run.

A damaged streaming segment is repaired ledger by ledger: each live ledger offloaded in
mode ``stream`` with entries in it whose hot copy is present is offloaded again from the
hot copy as v1 objects of its own by the same path (the swap makes it mode ``ledger``),
and its new objects are scrubbed; once no ledger needs the segment any more the swap that
freed it also released it (its keys queued). A ledger without a hot copy, or still being
streamed (not yet offloaded), is logged as a warning by name and fails the run; the
verdict lists what became of each ledger (``changed`` when the segment was released
meanwhile).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Sequence

from offloader.diagnostics import describe_error
from offloader.exceptions import HotLedgerMissingError, StoreUnavailableError
from offloader.metadata import Ledger
from offloader.metadata.records import OffloadMode, SegmentState
from offloader.objectstore import ObjectStore
from offloader.objectstore.registry import StoreRegistry
from offloader.offload.ledger_offloader import LedgerOffloader, Outcome, offloaded_as
from offloader.runtime import Runtime
from offloader.scrub.check import Finding, FindingKind, LedgerScrubResult, scrub_ledger
from offloader.scrub.report import (
    Action,
    Counts,
    LedgerRepair,
    LedgerVerdict,
    ScrubReport,
    check_report_path,
)
from offloader.scrub.targets import ScrubTarget, plan_scrub

log = logging.getLogger(__name__)


def run_scrub(
    runtime: Runtime,
    topics: Sequence[str] | None = None,
    *,
    repair: bool = True,
    report_path: str | os.PathLike[str] | None = None,
) -> ScrubReport:
    """Scrub every live offloaded ledger of ``topics`` (default all); repair unless told
    not to; write the report to ``report_path`` if given. The report's ``failed`` says
    whether damage is left (``raise_for_failure`` turns that into an error)."""
    if report_path is not None:
        check_report_path(report_path)  # before anything is read or repaired
    started_ms = runtime.metadata.db_now_ms()
    targets = plan_scrub(runtime.metadata, topics)
    results = scrub_targets(runtime.stores, targets)
    return finish_scrub(
        runtime,
        results,
        topics=topics,
        repair=repair,
        started_ms=started_ms,
        report_path=report_path,
    )


def scrub_targets(stores: StoreRegistry, targets: Iterable[ScrubTarget]) -> list[LedgerScrubResult]:
    """:func:`scrub_ledger` over ``targets`` in this process, each in its recorded store."""
    return [scrub_ledger_in(_registry_opener(stores), t) for t in targets]


def _registry_opener(stores: StoreRegistry) -> Callable[[ScrubTarget], ObjectStore]:
    def open_store(target: ScrubTarget) -> ObjectStore:
        return stores.get(target.store_id, target.described)

    return open_store


def scrub_ledger_in(
    open_store: Callable[[ScrubTarget], ObjectStore], target: ScrubTarget
) -> LedgerScrubResult:
    """One target in the store ``open_store`` gives for it (the one its row recorded); a
    store that cannot be opened (StoreUnavailableError) is an ``unreadable`` finding."""
    try:
        store = open_store(target)
    except StoreUnavailableError as err:
        finding = Finding(
            target.topic, target.ledger_id, target.data_key, None, FindingKind.UNREADABLE, str(err)
        )
        return LedgerScrubResult(target, 0, 0, 0, 0, (finding,))
    return scrub_ledger(store, target)


def finish_scrub(
    runtime: Runtime,
    results: list[LedgerScrubResult],
    *,
    topics: Sequence[str] | None,
    repair: bool,
    started_ms: int,
    report_path: str | os.PathLike[str] | None = None,
) -> ScrubReport:
    """The driver's step: settle every damaged result, build and write the report."""
    verdicts = [settle(runtime, r, repair=repair) for r in results if r.damaged]
    report = ScrubReport(
        topics=list(topics) if topics else None,
        repair=repair,
        started_ms=started_ms,
        finished_ms=runtime.metadata.db_now_ms(),
        counts=Counts.of(results),
        damaged=verdicts,
    )
    for v in verdicts:  # warnings: the CLI's one error line (exit 2) follows, as the task's
        if v.failed:
            log.warning(
                "scrub: ledger %s/%s is damaged and was not repaired (%s): %s; %s",
                v.topic,
                v.ledger_id,
                v.action,
                v.detail,
                "; ".join(map(str, v.findings)),
            )
    if report_path is not None:
        report.write(report_path)
    return report


def settle(runtime: Runtime, result: LedgerScrubResult, *, repair: bool) -> LedgerVerdict:
    """Decide what a damaged ledger's findings mean now, and repair it if allowed."""
    t = result.target
    if t.segment_id is not None:
        return _settle_segment(runtime, result, repair=repair)

    def verdict(action: Action, detail: str) -> LedgerVerdict:
        return LedgerVerdict(t.topic, t.ledger_id, t.offload_uuid, action, detail, result.findings)

    ledger = runtime.metadata.get_ledger(t.topic, t.ledger_id)
    if not (ledger.is_live and offloaded_as(ledger, t.offload_uuid)):
        return verdict(Action.CHANGED, _moved_on(ledger))
    if any(f.kind is FindingKind.UNREADABLE for f in result.findings):
        return verdict(Action.UNREADABLE, "the store could not be read; nothing was changed")
    if not repair:
        return verdict(Action.NOT_REPAIRED, "repair not requested; nothing was changed")
    done = _repair(runtime, ledger, t.offload_uuid, result, "the damaged objects are")
    return LedgerVerdict(
        t.topic,
        t.ledger_id,
        t.offload_uuid,
        done.action,
        done.detail,
        result.findings + done.findings,
        done.replaced_by,
    )


def _settle_segment(runtime: Runtime, result: LedgerScrubResult, *, repair: bool) -> LedgerVerdict:
    """A damaged streaming segment: every ledger with entries in it is repaired, or named
    as not repaired (the run fails); see the module's doc."""
    t = result.target
    assert t.segment_id is not None
    held = ", ".join(f"{ledger}:{first}..{ledger}:{last}" for ledger, first, last in t.pieces)
    name = f"segment {t.segment_id} (entries {held})"

    def verdict(
        action: Action, detail: str, ledgers: tuple[LedgerRepair, ...] = ()
    ) -> LedgerVerdict:
        return LedgerVerdict(
            t.topic,
            t.ledger_id,
            t.segment_id or "",
            action,
            detail,
            result.findings,
            ledgers=ledgers,
        )

    segment = runtime.metadata.segments.get(t.segment_id)
    if segment.state is not SegmentState.OFFLOADED:
        return verdict(
            Action.CHANGED,
            f"segment {t.segment_id} is {segment.state} now (trimmed, or its ledgers moved to "
            "objects of their own meanwhile); nothing to do",
        )
    if any(f.kind is FindingKind.UNREADABLE for f in result.findings):
        return verdict(
            Action.UNREADABLE,
            f"segment {t.segment_id}: the store could not be read; nothing was changed",
        )
    if not t.pieces:  # its segment_ledgers rows are gone: whose entries it holds is unknown
        return verdict(
            Action.REPAIR_FAILED,
            f"segment {t.segment_id} is damaged and the metadata store records no ledger "
            "ranges for it: nothing can be repaired or released; nothing was changed",
        )
    if not repair:
        return verdict(Action.NOT_REPAIRED, f"{name} is damaged; repair not requested")
    ledgers = tuple(
        _repair_streamed(runtime, t.topic, ledger_id, result, name)
        for ledger_id in dict.fromkeys(ledger_id for ledger_id, _, _ in t.pieces)
    )
    failed = [x for x in ledgers if x.failed]
    for x in failed:  # warnings, as for ledgers: the run's one error line names them all
        log.warning(
            "scrub: ledger %s/%s has entries in DAMAGED streaming %s and was NOT repaired "
            "(%s): %s; findings: %s",
            t.topic,
            x.ledger_id,
            name,
            x.action,
            x.detail,
            "; ".join(map(str, result.findings)),
        )
    if failed:
        action = failed[0].action
    else:
        repaired = any(x.action is Action.REPAIRED for x in ledgers)
        action = Action.REPAIRED if repaired else Action.CHANGED
    released = runtime.metadata.segments.get(t.segment_id).state is not SegmentState.OFFLOADED
    if released:
        outcome = "the segment was released (its keys queued for deletion)"
    elif failed:
        outcome = (
            f"the segment stays: ledgers {', '.join(str(x.ledger_id) for x in failed)} need it"
        )
    else:  # a trimmed ledger retention has not finished deleting
        outcome = "the segment stays while a ledger in it still needs it"
    summary = "; ".join(f"{x.ledger_id} {x.action}" for x in ledgers)
    return verdict(action, f"{name} is damaged: ledgers {summary}; {outcome}", ledgers)


def _repair_streamed(
    runtime: Runtime, topic: str, ledger_id: int, result: LedgerScrubResult, name: str
) -> LedgerRepair:
    """One ledger with entries in a damaged segment: offloaded again from its hot copy if
    it is a live ledger offloaded in mode ``stream``; otherwise why not."""
    ledger = runtime.metadata.get_ledger(topic, ledger_id)
    if not ledger.is_live or (ledger.is_offloaded and ledger.offload_mode is OffloadMode.LEDGER):
        return LedgerRepair(ledger_id, Action.CHANGED, _moved_on(ledger))
    if not ledger.is_offloaded:
        return LedgerRepair(
            ledger_id,
            Action.NOT_OFFLOADED,
            f"still being streamed ({ledger.state}, offload {ledger.offload_state}): its "
            f"entries in {name} are read from nowhere else once its hot copy goes; run the "
            "scrub again once it is offloaded",
        )
    return _repair(runtime, ledger, None, result, f"{name} is")


def _repair(
    runtime: Runtime,
    ledger: Ledger,
    replaced_attempt_id: str | None,
    result: LedgerScrubResult,
    damaged: str,
) -> LedgerRepair:
    """Offload ``ledger`` (offloaded as ``replaced_attempt_id``, see ``replace_ledger``) again
    from its hot copy and scrub the new objects; ``damaged`` names what the findings were
    in (for the no-hot-copy detail)."""
    topic, ledger_id = ledger.topic, ledger.ledger_id
    if not ledger.has_hot_copy:
        return LedgerRepair(
            ledger_id, Action.NO_HOT_COPY, f"hot copy {ledger.hot_state}: {damaged} the only copy"
        )
    reason = f"scrub: {result.findings[0].reason}"
    try:
        outcome = LedgerOffloader(runtime).replace_ledger(
            topic, ledger_id, replaced_attempt_id, reason
        )
    except HotLedgerMissingError as err:
        return LedgerRepair(ledger_id, Action.NO_HOT_COPY, str(err))
    except Exception as err:
        detail = f"offloading again failed: {describe_error(err)}"
        return LedgerRepair(ledger_id, Action.REPAIR_FAILED, detail)
    if outcome.outcome is not Outcome.REPLACED:
        return _not_replaced(runtime, ledger, replaced_attempt_id, outcome.outcome)
    repaired = runtime.metadata.get_ledger(topic, ledger_id)
    location = (
        None if repaired.store_id is None else runtime.metadata.get_location(repaired.store_id)
    )
    again = scrub_ledger_in(_registry_opener(runtime.stores), ScrubTarget.of(repaired, location))
    if again.damaged:
        return LedgerRepair(
            ledger_id,
            Action.REPAIR_FAILED,
            f"offloaded again as {outcome.attempt_id}, but the new objects are damaged too",
            outcome.attempt_id,
            again.findings,
        )
    return LedgerRepair(
        ledger_id,
        Action.REPAIRED,
        f"offloaded again from the hot copy as attempt {outcome.attempt_id} "
        f"({outcome.bytes} bytes); the damaged objects are queued for deletion",
        outcome.attempt_id,
    )


def _not_replaced(
    runtime: Runtime, ledger: Ledger, replaced_attempt_id: str | None, outcome: Outcome
) -> LedgerRepair:
    """The repair did not swap the objects: say why, from the ledger as it is now."""
    now = runtime.metadata.get_ledger(ledger.topic, ledger.ledger_id)
    if not (now.is_live and offloaded_as(now, replaced_attempt_id)):
        return LedgerRepair(now.ledger_id, Action.CHANGED, _moved_on(now))
    if now.attempt_id is not None:  # another repair holds it (or took it over from ours)
        detail = f"attempt {now.attempt_id} is replacing it"
        return LedgerRepair(now.ledger_id, Action.IN_PROGRESS, detail)
    return LedgerRepair(
        now.ledger_id,
        Action.REPAIR_FAILED,
        f"the ledger moved while its repair began ({outcome}); nothing was changed: "
        "run the scrub again",
    )


def _moved_on(ledger: Ledger) -> str:
    if not ledger.is_live:
        return f"the ledger was trimmed ({ledger.deletion_state}) meanwhile; nothing to repair"
    return (
        f"the ledger names other objects now (attempt {ledger.offload_attempt_id}); these are no "
        "longer read"
    )
