"""The driver's settle step (``finish_scrub``), word for word: what each damaged result
becomes as the metadata store stands when the executors' results reach the driver (the
Spark path: ``scrub_partition`` then ``finish_scrub``) or in one process (``run_scrub``),
the whole verdicts and the report's run fields, and the warning lines that are an
operator's only signal of which ledger was left damaged and why."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from fixtures.damage import flip, overwrite_object
from fixtures.inspect import table_rows
from fixtures.scrub import DAMAGES, offloaded_topic
from fixtures.streamed import (
    flip_a_payload_byte,
    ledgers_by_segment,
    shared_segment,
    streamed_topic,
)
from offloader.format import decode_segment_index
from offloader.metadata import Segment, SegmentState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.runtime import Runtime
from offloader.scrub import (
    Action,
    Finding,
    FindingKind,
    LedgerScrubResult,
    LedgerVerdict,
    ScrubReport,
    finish_scrub,
    plan_scrub,
    run_scrub,
    scrub_targets,
)
from offloader.scrub.report import LedgerRepair
from offloader.scrub.spread import scrub_partition

T = "events"
UNREADABLE = "the store could not be read; nothing was changed"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The scrub driver's warning lines, as logged."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "offloader.scrub.run" and r.levelno == logging.WARNING
    ]


def _segment_name(rt: Runtime, segment: Segment) -> str:
    """How the scrub names a segment to operators: its id and the entries it holds, as
    ``L:first..L:last`` ranges read from its index."""
    index = decode_segment_index(rt.objects.get(segment.index_key))
    held = ", ".join(
        f"{n}:{x.first_entry_id}..{n}:{x.last_entry_id}"
        for n, x in zip(index.ledger_ids, index.ledgers, strict=True)
    )
    return f"segment {segment.segment_id} (entries {held})"


def _findings_of(results: list[LedgerScrubResult], offload_uuid: str) -> tuple[Finding, ...]:
    """What the executors found in the target scrubbed as ``offload_uuid`` (not nothing)."""
    (result,) = [r for r in results if r.target.offload_uuid == offload_uuid]
    assert result.findings
    return result.findings


def _check_run_fields(
    rt: Runtime, report: ScrubReport, started: int, *, repair: bool, topics: list[str] | None
) -> None:
    """The report says what was asked and when the run began and was settled."""
    assert (report.topics, report.repair, report.started_ms) == (topics, repair, started)
    assert isinstance(report.finished_ms, int)
    assert started <= report.finished_ms <= rt.metadata.db_now_ms()
    json = report.to_json()
    assert (json["repair"], json["started_ms"]) == (repair, started)
    assert json["finished_ms"] == report.finished_ms


def test_the_driver_settles_each_ledger_result_with_its_exact_verdict(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Executors' results reach the driver: a ledger whose store could not be opened is
    ``unreadable`` and left alone, a damaged one with its hot copy is offloaded again (the
    verdict keeps the scrubbed attempt and names the new one), one without its hot copy
    fails the run naming the damaged objects as the only copy. Each failure is one
    warning line with the findings."""
    rt = runtime
    unread, damaged = offloaded_topic(rt, "orders", [(20, 500), (30, 800)])
    (lost,) = offloaded_topic(rt, "audit", [(25, 600)])
    delete_hot_copies(rt.metadata, rt.hot, "audit")
    lost = rt.metadata.get_ledger("audit", lost.ledger_id)
    assert not lost.has_hot_copy
    DAMAGES["missing-data-object"](rt, damaged)
    DAMAGES["missing-data-object"](rt, lost)
    started = rt.metadata.db_now_ms()
    targets = [
        replace(t, location=None) if t.offload_uuid == unread.offload_attempt_id else t
        for t in plan_scrub(rt.metadata)
    ]
    results = scrub_partition(targets, rt.settings.for_object_stores())

    with caplog.at_level(logging.WARNING, logger="offloader.scrub.run"):
        report = finish_scrub(
            rt, results, topics=["orders", "audit"], repair=True, started_ms=started
        )

    _check_run_fields(rt, report, started, repair=True, topics=["orders", "audit"])
    assert unread.offload_attempt_id and damaged.offload_attempt_id and lost.offload_attempt_id
    unread_findings = _findings_of(results, unread.offload_attempt_id)
    assert [f.kind for f in unread_findings] == [FindingKind.UNREADABLE]
    repaired = rt.metadata.get_ledger("orders", damaged.ledger_id)
    assert repaired.offload_attempt_id != damaged.offload_attempt_id
    lost_findings = _findings_of(results, lost.offload_attempt_id)
    assert [f.kind for f in lost_findings] == [FindingKind.MISSING_DATA]
    by_ledger = {(v.topic, v.ledger_id): v for v in report.damaged}
    assert len(report.damaged) == 3 and report.failed
    assert by_ledger == {
        ("orders", unread.ledger_id): LedgerVerdict(
            "orders",
            unread.ledger_id,
            unread.offload_attempt_id,
            Action.UNREADABLE,
            UNREADABLE,
            unread_findings,
        ),
        ("orders", damaged.ledger_id): LedgerVerdict(
            "orders",
            damaged.ledger_id,
            damaged.offload_attempt_id,
            Action.REPAIRED,
            f"offloaded again from the hot copy as attempt {repaired.offload_attempt_id} "
            f"({repaired.data_len} bytes); the damaged objects are queued for deletion",
            _findings_of(results, damaged.offload_attempt_id),
            repaired.offload_attempt_id,
        ),
        ("audit", lost.ledger_id): LedgerVerdict(
            "audit",
            lost.ledger_id,
            lost.offload_attempt_id,
            Action.NO_HOT_COPY,
            "hot copy deleted: the damaged objects are the only copy",
            lost_findings,
        ),
    }
    assert rt.metadata.get_ledger("orders", unread.ledger_id) == unread
    assert sorted(_warnings(caplog)) == [
        f"scrub: ledger audit/{lost.ledger_id} is damaged and was not repaired (no-hot-copy): "
        f"hot copy deleted: the damaged objects are the only copy; "
        f"audit/{lost.ledger_id} {lost.data_key}: missing data object",
        f"scrub: ledger orders/{unread.ledger_id} is damaged and was not repaired "
        f"(unreadable): {UNREADABLE}; orders/{unread.ledger_id} {unread.data_key}: "
        f"{unread_findings[0].reason}",
    ]


def test_results_gone_stale_before_the_driver_settles_them_are_changed_even_without_repair(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Between the executors' read and the driver's settle, another run repaired the
    damaged segment (released it) and replaced a damaged ledger: both are ``changed``,
    saying why, and pass; only the ledger still on its damaged objects is ``not-repaired``
    (the one warning) since repair was not requested."""
    rt = runtime
    streamed_topic(rt, T, 6)
    victim = shared_segment(rt, T)
    first = min(ledgers_by_segment(rt, T)[victim.segment_id])
    flip_a_payload_byte(rt, victim)
    replaced, kept = offloaded_topic(rt, "orders", [(20, 500), (30, 800)])
    assert replaced.offload_attempt_id and kept.offload_attempt_id
    DAMAGES["missing-data-object"](rt, replaced)
    DAMAGES["missing-data-object"](rt, kept)
    started = rt.metadata.db_now_ms()
    results = scrub_targets(rt.stores, plan_scrub(rt.metadata))
    # meanwhile: another scrub repairs the segment, another repair replaces one ledger
    assert not run_scrub(rt, [T]).failed
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.DELETED
    again = LedgerOffloader(rt).replace_ledger(
        "orders", replaced.ledger_id, replaced.offload_attempt_id, "scrub: another run"
    )
    assert again.attempt_id is not None

    with caplog.at_level(logging.WARNING, logger="offloader.scrub.run"):
        late = finish_scrub(rt, results, topics=None, repair=False, started_ms=started)

    _check_run_fields(rt, late, started, repair=False, topics=None)
    by_uuid = {v.offload_uuid: v for v in late.damaged}
    assert len(late.damaged) == 3
    assert by_uuid == {
        victim.segment_id: LedgerVerdict(
            T,
            first,
            victim.segment_id,
            Action.CHANGED,
            f"segment {victim.segment_id} is deleted now (trimmed, or its ledgers moved to "
            "objects of their own meanwhile); nothing to do",
            _findings_of(results, victim.segment_id),
        ),
        replaced.offload_attempt_id: LedgerVerdict(
            "orders",
            replaced.ledger_id,
            replaced.offload_attempt_id,
            Action.CHANGED,
            f"the ledger names other objects now (attempt {again.attempt_id}); these are no "
            "longer read",
            _findings_of(results, replaced.offload_attempt_id),
        ),
        kept.offload_attempt_id: LedgerVerdict(
            "orders",
            kept.ledger_id,
            kept.offload_attempt_id,
            Action.NOT_REPAIRED,
            "repair not requested; nothing was changed",
            _findings_of(results, kept.offload_attempt_id),
        ),
    }
    assert late.failed
    assert _warnings(caplog) == [
        f"scrub: ledger orders/{kept.ledger_id} is damaged and was not repaired "
        f"(not-repaired): repair not requested; nothing was changed; "
        f"orders/{kept.ledger_id} {kept.data_key}: missing data object"
    ]


def test_an_unreadable_segment_and_a_damaged_one_without_repair_change_nothing(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment whose store an executor could not open is ``unreadable`` (by its id and
    first ledger); a damaged one, with repair not requested, is named with the entries it
    holds. Nothing in the metadata store changes; each is one warning line."""
    rt = runtime
    streamed_topic(rt, T, 6)
    victim = shared_segment(rt, T)
    flip_a_payload_byte(rt, victim)
    other, *_ = rt.metadata.segments.of_topic(T)
    assert other.segment_id != victim.segment_id
    held = ledgers_by_segment(rt, T)
    started = rt.metadata.db_now_ms()
    targets = [
        replace(t, location=None) if t.segment_id == other.segment_id else t
        for t in plan_scrub(rt.metadata, [T])
    ]
    results = scrub_partition(targets, rt.settings.for_object_stores())
    before = table_rows(rt.metadata)

    with caplog.at_level(logging.WARNING, logger="offloader.scrub.run"):
        report = finish_scrub(rt, results, topics=[T], repair=False, started_ms=started)

    _check_run_fields(rt, report, started, repair=False, topics=[T])
    assert table_rows(rt.metadata) == before
    unread = _findings_of(results, other.segment_id)
    assert [f.kind for f in unread] == [FindingKind.UNREADABLE]
    (finding,) = damage = _findings_of(results, victim.segment_id)
    name = _segment_name(rt, victim)
    unreadable = f"segment {other.segment_id}: {UNREADABLE}"
    assert report.damaged == [
        LedgerVerdict(
            T,
            min(held[other.segment_id]),
            other.segment_id,
            Action.UNREADABLE,
            unreadable,
            unread,
        ),
        LedgerVerdict(
            T,
            min(held[victim.segment_id]),
            victim.segment_id,
            Action.NOT_REPAIRED,
            f"{name} is damaged; repair not requested",
            damage,
        ),
    ]
    assert _warnings(caplog) == [
        f"scrub: ledger {T}/{min(held[other.segment_id])} is damaged and was not repaired "
        f"(unreadable): {unreadable}; {unread[0]}",
        f"scrub: ledger {T}/{min(held[victim.segment_id])} is damaged and was not repaired "
        f"(not-repaired): {name} is damaged; repair not requested; {finding}",
    ]


def test_a_damaged_segment_without_hot_copies_names_every_ledger_in_warnings(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """No ledger of the damaged segment has its hot copy: the verdict lists each with the
    segment named as the only copy, says which ledgers keep the segment, and each ledger
    is a warning line of its own with every finding, then the verdict's line."""
    rt = runtime
    streamed_topic(rt, T, 6)
    delete_hot_copies(rt.metadata, rt.hot, T)
    victim = shared_segment(rt, T)
    ids = sorted(ledgers_by_segment(rt, T)[victim.segment_id])
    assert len(ids) >= 2
    index = decode_segment_index(rt.objects.get(victim.index_key))
    flip_a_payload_byte(rt, victim)
    overwrite_object(rt.objects, victim.data_key, flip(index.ledgers[0].blocks[0].offset + 200))
    name = _segment_name(rt, victim)

    with caplog.at_level(logging.WARNING, logger="offloader.scrub.run"):
        report = run_scrub(rt, [T])

    (verdict,) = report.damaged
    assert len(verdict.findings) >= 2
    findings = "; ".join(str(f) for f in verdict.findings)
    only_copy = f"hot copy deleted: {name} is the only copy"
    summary = "; ".join(f"{n} no-hot-copy" for n in ids)
    detail = (
        f"{name} is damaged: ledgers {summary}; the segment stays: ledgers "
        f"{', '.join(map(str, ids))} need it"
    )
    assert verdict == LedgerVerdict(
        T,
        ids[0],
        victim.segment_id,
        Action.NO_HOT_COPY,
        detail,
        verdict.findings,
        ledgers=tuple(LedgerRepair(n, Action.NO_HOT_COPY, only_copy) for n in ids),
    )
    assert _warnings(caplog) == [
        *(
            f"scrub: ledger {T}/{n} has entries in DAMAGED streaming {name} and was NOT "
            f"repaired (no-hot-copy): {only_copy}; findings: {findings}"
            for n in ids
        ),
        f"scrub: ledger {T}/{ids[0]} is damaged and was not repaired (no-hot-copy): "
        f"{detail}; {findings}",
    ]
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.OFFLOADED
