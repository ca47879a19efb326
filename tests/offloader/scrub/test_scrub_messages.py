"""The exact words of findings an operator acts on: a segment whose index and metadata
store disagree on the ledger ranges it holds (both sides listed), a segment whose ranges
are gone from the metadata store (the run fails), and a target whose row names no store
(the command that fixes it)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.scrub import offloaded_topic
from fixtures.streamed import shared_segment, streamed_topic
from offloader.format import decode_segment_index
from offloader.metadata import SegmentState, schema
from offloader.runtime import Runtime
from offloader.scrub import Action, FindingKind, plan_scrub, run_scrub, scrub_targets
from offloader.scrub.spread import scrub_partition

pytestmark = pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
T = "events"


def _listed(ranges: list[tuple[int, int, int]]) -> str:
    """Ranges as the finding lists them: ``L:first..L:last``, comma separated."""
    return ", ".join(f"{n}:{first}..{n}:{last}" for n, first, last in ranges)


def test_a_segment_range_mismatch_lists_both_sides(runtime: Runtime) -> None:
    """The metadata store recorded the segment's first range one entry short, then nothing
    at all for it: the finding lists what the index holds and what was recorded."""
    rt = runtime
    streamed_topic(rt, T, 3)
    victim = shared_segment(rt, T)
    index = decode_segment_index(rt.objects.get(victim.index_key))
    held = [
        (n, x.first_entry_id, x.last_entry_id)
        for n, x in zip(index.ledger_ids, index.ledgers, strict=True)
    ]
    assert len(held) > 1
    SL = schema.pieces
    (first, start, _), *_ = held
    this = SL.c.segment_id == victim.segment_id

    def mismatch() -> str:
        (target,) = [t for t in plan_scrub(rt.metadata, [T]) if t.segment_id == victim.segment_id]
        (result,) = scrub_targets(rt.stores, [target])
        (reason,) = [
            f.reason
            for f in result.findings
            if f.kind is FindingKind.METADATA_MISMATCH and f.key == victim.index_key
        ]
        return reason

    with rt.metadata.engine.begin() as conn:
        conn.execute(
            SL.update().where(this, SL.c.ledger_id == first).values(first_entry_id=start + 1)
        )
    recorded = [(first, start + 1, held[0][2]), *held[1:]]
    assert mismatch() == (
        f"segment {victim.segment_id}: index holds {_listed(held)}, the metadata store "
        f"recorded {_listed(recorded)}"
    )
    with rt.metadata.engine.begin() as conn:
        conn.execute(SL.delete().where(this))
    assert mismatch() == (
        f"segment {victim.segment_id}: index holds {_listed(held)}, the metadata store "
        "recorded no entries"
    )


def test_a_segment_whose_ranges_are_gone_fails_the_scrub_and_changes_nothing(
    runtime: Runtime,
) -> None:
    """Without its ``segment_ledgers`` rows nobody knows which ledgers a segment serves:
    it can be neither repaired nor released, and the run must not pass."""
    rt = runtime
    streamed_topic(rt, T, 3)
    victim = shared_segment(rt, T)
    SL = schema.pieces
    with rt.metadata.engine.begin() as conn:
        conn.execute(SL.delete().where(SL.c.segment_id == victim.segment_id))
    before = rt.metadata.list_ledgers(T)
    report = run_scrub(rt, [T])
    assert report.failed
    (verdict,) = [v for v in report.damaged if v.offload_uuid == victim.segment_id]
    assert verdict.action is Action.REPAIR_FAILED and verdict.failed
    assert verdict.detail == (
        f"segment {victim.segment_id} is damaged and the metadata store records no ledger "
        "ranges for it: nothing can be repaired or released; nothing was changed"
    )
    assert rt.metadata.segments.get(victim.segment_id).state is SegmentState.OFFLOADED
    assert rt.metadata.list_ledgers(T) == before


def test_a_target_naming_no_store_says_how_to_fix_it(runtime: Runtime) -> None:
    """A row written before revision 0002 has no store: the executor's finding names the
    ledger and the command that records one."""
    rt = runtime
    offloaded_topic(rt, "orders", [(20, 500)])
    (target,) = plan_scrub(rt.metadata)
    (result,) = scrub_partition([replace(target, location=None)], rt.settings.for_object_stores())
    (finding,) = result.findings
    assert finding.kind is FindingKind.UNREADABLE
    assert finding.reason == (
        f"ledger orders/{target.ledger_id} names no object store (written before revision "
        "0002 and not upgraded): run `offloader db upgrade`"
    )
