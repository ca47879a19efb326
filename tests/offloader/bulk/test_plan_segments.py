"""Bulk export of ledgers offloaded by streaming, on both pairings: such a ledger has no
objects of their own, its entries are pieces of segments; the plan cuts it piece by piece
(a slice never spans two segments), the executors read each piece through the segment's
v2 index, and the export holds exactly the hot copy's entries, beside ledgers offloaded
ledger by ledger."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from fixtures.backends import make_topic, produce_ledgers, tiered_digests
from fixtures.exports import (
    export_files,
    export_table,
    output_url,
    parquet_digests,
    run_export,
    streamed_topic,
)
from offloader.bulk.export import export_slices
from offloader.bulk.output import ExportTarget
from offloader.bulk.params import ExportParams
from offloader.bulk.plan import plan_export
from offloader.exceptions import DamagedObjectError
from offloader.metadata import Position, SegmentState, schema
from offloader.offload.ledger_offloader import LedgerOffloader
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader

STREAMED = "events"


def topics(rt: Runtime) -> list[int]:
    """A streamed topic and a v1-offloaded one; the streamed ledgers' ids."""
    streamed = streamed_topic(rt, STREAMED)
    make_topic(rt, "orders")
    produce_ledgers(rt, "orders", [(30, 1000), (10, 100)])
    LedgerOffloader(rt).offload_topic("orders", up_to=2)
    return streamed


def test_a_streamed_ledger_is_cut_piece_by_piece(runtime: Runtime) -> None:
    rt = runtime
    streamed = topics(rt)
    plan = plan_export(rt.metadata, ExportParams.parse({"slice_bytes": 5000}))
    assert plan.ledgers == 5 and plan.streamed == [(STREAMED, i) for i in streamed]
    assert plan.to_json()["streamed"] == 3
    for ledger_id in streamed:
        pieces = rt.metadata.segments.pieces(STREAMED, ledger_id)
        slices = [s for s in plan.slices if (s.topic, s.ledger_id) == (STREAMED, ledger_id)]
        # together the slices are the ledger's entries, each once, in order
        ids = [e for s in slices for e in range(s.first_entry_id, s.last_entry_id + 1)]
        assert ids == list(range(rt.metadata.get_ledger(STREAMED, ledger_id).entry_count))
        for s in slices:  # each within one piece, naming that piece's segment
            (piece,) = [
                p for p in pieces if p.first_entry_id <= s.first_entry_id <= p.last_entry_id
            ]
            assert s.in_segment and s.last_entry_id <= piece.last_entry_id
            assert (s.data_key, s.index_key) == (piece.segment.data_key, piece.segment.index_key)
            assert s.piece_first_entry_id == piece.first_entry_id
            assert s.ledger_last_entry_id == piece.last_entry_id
            assert s.store == rt.metadata.get_location(piece.segment.store_id)
            assert s.created_ms == rt.metadata.get_ledger(STREAMED, ledger_id).created_ms
    assert not any(s.in_segment for s in plan.slices if s.topic == "orders")


def test_the_export_of_a_mixed_store_equals_the_hot_copy(runtime: Runtime, tmp_path: Path) -> None:
    rt = runtime
    streamed = topics(rt)
    url = output_url(rt, tmp_path)
    params = ExportParams.parse({"slice_bytes": 5000, "output": url, "export_id": "e1"})
    plan, _ = run_export(rt, params)
    assert sum(s.in_segment for s in plan.slices) > len(streamed)
    _, files = export_files(url, "e1", rt.settings)
    table = export_table(files)
    assert parquet_digests(table) == tiered_digests(rt, "hot") == tiered_digests(rt)
    assert {t for t, _ in parquet_digests(table)} == {STREAMED, "orders"}


def test_a_streamed_ledger_exports_from_the_topics_start(runtime: Runtime) -> None:
    """The topic trimmed inside a streamed ledger's second piece: its first piece is not
    read, the second from the start on."""
    rt = runtime
    streamed = topics(rt)
    ledger_id = next(i for i in streamed if len(rt.metadata.segments.pieces(STREAMED, i)) > 1)
    second = rt.metadata.segments.pieces(STREAMED, ledger_id)[1]
    start = min(second.first_entry_id + 1, second.last_entry_id)
    trim_topic(rt, STREAMED, Position(ledger_id=ledger_id, entry_id=start))
    plan = plan_export(rt.metadata, ExportParams(topics=[STREAMED]))
    firsts: dict[int, int] = {}
    for s in plan.slices:
        firsts[s.ledger_id] = min(firsts.get(s.ledger_id, s.first_entry_id), s.first_entry_id)
    assert firsts == {ledger_id: start, **{i: 0 for i in streamed if i > ledger_id}}
    assert all(s.piece_first_entry_id != 0 for s in plan.slices if s.ledger_id == ledger_id)


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_streamed_ledger_with_a_gap_in_its_segments_fails_the_plan(runtime: Runtime) -> None:
    """Metadata that no longer covers a streamed ledger (a segment of it not offloaded) is
    damage: the plan names the ledger and what its segments hold instead of exporting less."""
    rt = runtime
    streamed = topics(rt)
    ledger_id = next(i for i in streamed if len(rt.metadata.segments.pieces(STREAMED, i)) > 1)
    *kept, tail = rt.metadata.segments.pieces(STREAMED, ledger_id)
    with rt.metadata.transaction() as conn:  # the segment with the ledger's last piece
        conn.execute(
            sa.update(schema.segments)
            .where(schema.segments.c.segment_id == tail.segment.segment_id)
            .values(state=SegmentState.FAILED)
        )
    held = [(p.first_entry_id, p.last_entry_id) for p in kept]
    damaged = (
        rf"ledger {STREAMED}/{ledger_id} is offloaded by streaming, but its offloaded segments "
        rf"hold entries {re.escape(str(held))}, not \[\(0, {tail.last_entry_id}\)\]"
    )
    with pytest.raises(ValueError, match=damaged) as raised:
        plan_export(rt.metadata, ExportParams(topics=[STREAMED]))
    assert str(raised.value).endswith("run `offloader scrub`")  # what to do about it


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_piece_the_segment_does_not_hold_from_its_first_entry_fails_the_slice(
    runtime: Runtime, tmp_path: Path
) -> None:
    """The metadata store moves the boundary between a ledger's two pieces one entry back
    (still covering the ledger): the second segment does not hold its piece's first entry,
    and reading that slice is damage naming what each side says, not a bad request."""
    rt = runtime
    streamed = topics(rt)
    ledger_id = next(i for i in streamed if len(rt.metadata.segments.pieces(STREAMED, i)) > 1)
    head, tail, *_ = rt.metadata.segments.pieces(STREAMED, ledger_id)
    moved = tail.first_entry_id - 1
    P = schema.pieces
    with rt.metadata.transaction() as conn:
        for piece, values in (
            (head, {"last_entry_id": moved - 1}),
            (tail, {"first_entry_id": moved}),
        ):
            conn.execute(
                sa.update(P)
                .where(P.c.segment_id == piece.segment.segment_id, P.c.ledger_id == ledger_id)
                .values(**values)
            )
    plan = plan_export(rt.metadata, ExportParams(topics=[STREAMED]))
    (part,) = [s for s in plan.slices if (s.ledger_id, s.first_entry_id) == (ledger_id, moved)]
    assert part.piece_first_entry_id == moved and part.data_key == tail.segment.data_key
    target = ExportTarget.new_attempt((tmp_path / "out").as_uri(), "e1")
    said = (
        rf"segment index holds entries {moved + 1}\.\.{tail.last_entry_id} of ledger "
        rf"{ledger_id}, the metadata store says {moved}\.\.{tail.last_entry_id}"
    )
    with pytest.raises(DamagedObjectError, match=said) as raised:
        export_slices([part], target, rt.settings.for_object_stores())
    assert (raised.value.topic, raised.value.ledger_id) == (STREAMED, ledger_id)


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_a_start_on_a_pieces_last_entry_exports_that_entry(runtime: Runtime) -> None:
    """The topic trimmed to the last entry of a streamed ledger's first piece: that entry
    is the first exported, read from the first piece's segment."""
    rt = runtime
    streamed = topics(rt)
    ledger_id = next(i for i in streamed if len(rt.metadata.segments.pieces(STREAMED, i)) > 1)
    first = rt.metadata.segments.pieces(STREAMED, ledger_id)[0]
    start = first.last_entry_id
    trim_topic(rt, STREAMED, Position(ledger_id=ledger_id, entry_id=start))
    plan = plan_export(rt.metadata, ExportParams(topics=[STREAMED], slice_bytes=5000))
    slices = [s for s in plan.slices if s.ledger_id == ledger_id]
    ids = [e for s in slices for e in range(s.first_entry_id, s.last_entry_id + 1)]
    entry_count = rt.metadata.get_ledger(STREAMED, ledger_id).entry_count
    assert ids == list(range(start, entry_count))
    assert (slices[0].data_key, slices[0].entries) == (first.segment.data_key, 1)


@pytest.mark.parametrize("backend_settings", ["fs-sqlite"], indirect=True)
def test_an_empty_streamed_ledger_is_not_counted(runtime: Runtime) -> None:
    """A writer that died before writing its ledger leaves it sealed empty, and the
    streaming offloader settles it as offloaded: the plan passes over it (it counts no
    ledger) and goes on with the ledgers after it."""
    rt = runtime
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, STREAMED, streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    dead = rt.metadata.allocate_ledger(STREAMED, rt.metadata.claim_writer(STREAMED).writer_epoch)
    ids = produce_ledgers(rt, STREAMED, [(12, part // 4)] * 2)  # recovery seals ``dead`` empty
    StreamingOffloader(rt).run_pass(STREAMED, close_now=True)
    empty = rt.metadata.get_ledger(STREAMED, dead.ledger_id)
    assert empty.is_offloaded and empty.entry_count == 0 and ids[0] > dead.ledger_id
    plan = plan_export(rt.metadata, ExportParams())
    assert plan.streamed == [(STREAMED, i) for i in ids]
    assert plan.ledgers == 2 and plan.entries == 24
    assert plan.bytes == sum(rt.metadata.get_ledger(STREAMED, i).size_bytes for i in ids)
