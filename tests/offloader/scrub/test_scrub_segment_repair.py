"""Scrub's repair of a damaged streaming segment, on both pairings: every ledger with
entries in it whose hot copy is present is offloaded again from the hot copy as v1 objects
of its own and the segment is released once no ledger needs it; a ledger without a hot
copy, or still being streamed, is named, fails the run and keeps the segment. The SIGKILL
cases are test_scrub_segment_crash.py."""

from __future__ import annotations

import logging
import re

import pytest

from fixtures.backends import make_topic, produce_ledgers, tiered_digests, unaccounted_objects
from fixtures.inspect import table_rows
from fixtures.metadata import list_attempts, pending_deletions
from fixtures.streamed import (
    flip_a_payload_byte,
    ledgers_by_segment,
    shared_segment,
    streamed_open_ledger,
    streamed_topic,
)
from offloader.exceptions import ScrubFailedError
from offloader.gc.deletion_queue import process_deletions
from offloader.metadata import AttemptState, OffloadMode, Position, Segment, SegmentState
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.retention.deletion import finish_deleted_ledgers
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime
from offloader.scrub import Action, ScrubReport, run_scrub

T = "events"


def ledgers_of(rt: Runtime, segment: Segment) -> list[int]:
    return sorted(ledgers_by_segment(rt, T)[segment.segment_id])


def verdict_of(report: ScrubReport, segment: Segment) -> tuple[Action, dict[int, Action]]:
    (verdict,) = report.damaged
    assert verdict.offload_uuid == segment.segment_id and verdict.findings
    return verdict.action, {x.ledger_id: x.action for x in verdict.ledgers}


def test_a_damaged_segment_with_hot_copies_is_repaired_and_released(runtime: Runtime) -> None:
    rt = runtime
    streamed_topic(rt, T, 6)
    hot = tiered_digests(rt, "hot")
    victim = shared_segment(rt, T)
    ids = ledgers_of(rt, victim)
    flip_a_payload_byte(rt, victim)
    held = ledgers_by_segment(rt, T)
    # the victim, and any other segment holding only its ledgers, goes with them
    released = {s for s, ledger_ids in held.items() if ledger_ids <= set(ids)}
    assert victim.segment_id in released and len(released) < len(held)

    report = run_scrub(rt, [T])
    assert not report.failed, str(report)
    report.raise_for_failure()
    action, ledgers = verdict_of(report, victim)
    assert action is Action.REPAIRED and ledgers == dict.fromkeys(ids, Action.REPAIRED)
    (verdict,) = report.damaged
    assert verdict.detail.endswith(
        f"is damaged: ledgers {'; '.join(f'{i} repaired' for i in ids)}; the segment was "
        "released (its keys queued for deletion)"
    )
    for repair in verdict.ledgers:
        ledger = rt.metadata.get_ledger(T, repair.ledger_id)
        assert ledger.offload_mode is OffloadMode.LEDGER
        assert ledger.offload_attempt_id == repair.replaced_by is not None
        committed = [
            a.attempt_id
            for a in list_attempts(rt.metadata, T, AttemptState.COMMITTED)
            if a.ledger_id == repair.ledger_id
        ]
        assert committed == [repair.replaced_by]
    segments = rt.metadata.segments.of_topic(T)
    for segment in segments:  # the others still hold stream-mode ledgers
        gone = segment.segment_id in released
        assert segment.state is (SegmentState.DELETED if gone else SegmentState.OFFLOADED)
    queued = {d.object_key: d.reason for d in pending_deletions(rt.metadata)}
    keys = {k for s in segments if s.segment_id in released for k in (s.data_key, s.index_key)}
    assert set(queued) == keys
    assert all(r.startswith("segment released: scrub: ") for r in queued.values())
    assert tiered_digests(rt) == hot
    json = report.to_json()["damaged_ledgers"][0]
    assert [(x["ledger_id"], x["action"]) for x in json["ledgers"]] == [
        (n, "repaired") for n in ids
    ]

    again = run_scrub(rt, [T])
    assert again.damaged == [] and not again.failed
    gc = process_deletions(rt.metadata, rt.stores, rt.settings)
    assert (gc.failed, gc.remaining) == (0, 0)
    assert unaccounted_objects(rt) == set()
    assert tiered_digests(rt) == hot


def test_without_hot_copies_the_ledgers_are_named_and_nothing_changes(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    rt = runtime
    streamed_topic(rt, T, 6)
    delete_hot_copies(rt.metadata, rt.hot, T)
    victim = shared_segment(rt, T)
    ids = ledgers_of(rt, victim)
    flip_a_payload_byte(rt, victim)
    rows = table_rows(rt.metadata)
    objects = {info.key: rt.objects.get(info.key) for info in rt.objects.list()}

    with caplog.at_level(logging.WARNING, logger="offloader.scrub.run"):
        report = run_scrub(rt, [T])
    action, ledgers = verdict_of(report, victim)
    assert action is Action.NO_HOT_COPY and report.failed
    assert ledgers == dict.fromkeys(ids, Action.NO_HOT_COPY)
    (verdict,) = report.damaged
    assert all("hot copy deleted" in x.detail for x in verdict.ledgers)
    assert "the segment stays" in verdict.detail
    names = ", ".join(f"{T}/{n} (no-hot-copy)" for n in ids)
    with pytest.raises(ScrubFailedError, match=f"found {len(ids)} damaged .*: {re.escape(names)}$"):
        report.raise_for_failure()
    for n in ids:
        assert f"ledger {T}/{n} has entries in DAMAGED streaming segment" in caplog.text
    assert table_rows(rt.metadata) == rows
    assert {info.key: rt.objects.get(info.key) for info in rt.objects.list()} == objects


def test_mixed_repairs_what_it_can_and_fails_for_the_rest(runtime: Runtime) -> None:
    """One ledger of the damaged segment lost its hot copy: the others are repaired, it is
    not, so the segment stays (it still needs it) and the report lists both."""
    rt = runtime
    streamed_topic(rt, T, 6)
    hot = tiered_digests(rt, "hot")
    victim = shared_segment(rt, T)
    lost, *kept = ledgers_of(rt, victim)
    ledger = rt.metadata.mark_hot_deleting(rt.metadata.get_ledger(T, lost))
    rt.hot.delete(T, lost)
    rt.metadata.mark_hot_deleted(ledger)
    flip_a_payload_byte(rt, victim)

    report = run_scrub(rt, [T])
    action, ledgers = verdict_of(report, victim)
    assert action is Action.NO_HOT_COPY and report.failed
    assert ledgers == {lost: Action.NO_HOT_COPY, **dict.fromkeys(kept, Action.REPAIRED)}
    with pytest.raises(ScrubFailedError, match=rf"found 1 damaged ledger\(s\) .*: {T}/{lost} "):
        report.raise_for_failure()
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.OFFLOADED
    assert rt.metadata.get_ledger(T, lost).offload_mode is OffloadMode.STREAM
    assert all(rt.metadata.get_ledger(T, n).offload_mode is OffloadMode.LEDGER for n in kept)
    summary = str(report)
    assert f"ledger {T}/{lost}: no-hot-copy" in summary
    assert all(f"ledger {T}/{n}: repaired" in summary for n in kept)
    hot.pop((T, lost))
    digests = tiered_digests(rt)
    assert all(digests[k] == v for k, v in hot.items())
    assert unaccounted_objects(rt) == set()


def test_a_ledger_still_being_streamed_fails_the_run_and_keeps_the_segment(
    runtime: Runtime,
) -> None:
    rt = runtime
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, T, streaming=True, min_part_bytes=part, segment_max_bytes=4 * part)
    sealed = produce_ledgers(rt, T, [(12, part // 8)])
    with streamed_open_ledger(rt, T) as open_id:
        held = ledgers_by_segment(rt, T)
        (victim,) = [s for s in rt.metadata.segments.of_topic(T) if open_id in held[s.segment_id]]
        assert set(sealed) & held[victim.segment_id]
        flip_a_payload_byte(rt, victim)

        report = run_scrub(rt, [T])
        action, ledgers = verdict_of(report, victim)
        assert action is Action.NOT_OFFLOADED and report.failed
        assert ledgers == {
            **{n: Action.REPAIRED for n in sealed if n in held[victim.segment_id]},
            open_id: Action.NOT_OFFLOADED,
        }
        (verdict,) = report.damaged
        (streaming,) = [x for x in verdict.ledgers if x.ledger_id == open_id]
        assert "still being streamed" in streaming.detail
        assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.OFFLOADED
        assert rt.metadata.segments.pieces(T, open_id)


def test_a_trimmed_ledger_in_a_damaged_segment_is_left_to_retention(runtime: Runtime) -> None:
    """The segment's first ledger is below the topic's start (being deleted): nothing to
    repair there, the others are repaired, and the segment stays until retention has
    deleted that ledger; then it is released."""
    rt = runtime
    streamed_topic(rt, T, 6)
    victim = shared_segment(rt, T)
    trimmed, *live = ledgers_of(rt, victim)
    trim_topic(rt, T, Position(ledger_id=live[0], entry_id=0))
    flip_a_payload_byte(rt, victim)

    report = run_scrub(rt, [T])
    action, ledgers = verdict_of(report, victim)
    assert action is Action.REPAIRED and not report.failed
    assert ledgers == {trimmed: Action.CHANGED, **dict.fromkeys(live, Action.REPAIRED)}
    (verdict,) = report.damaged
    assert verdict.detail.endswith("the segment stays while a ledger in it still needs it")
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.OFFLOADED
    finish_deleted_ledgers(rt)
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.DELETED
    assert run_scrub(rt, [T]).damaged == []
