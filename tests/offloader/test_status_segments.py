"""Status with streaming offload, on both pairings: streamed ledgers count as offloaded and
their bytes are the segments' data objects (open segments' parts count nowhere), segments
are counted by state, and a segment released by retention leaves the totals and the
history alike."""

from __future__ import annotations

from fixtures.backends import make_topic, produce_ledgers
from offloader.gc.deletion_queue import drain_queue
from offloader.metadata.records import Position, SegmentState
from offloader.runtime import Runtime
from offloader.status import tier_history
from offloader.stream.offloader import StreamingOffloader

TOPIC = "events"


def test_streamed_ledgers_and_segments_count_as_offloaded(runtime: Runtime) -> None:
    rt = runtime
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, TOPIC, streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    produce_ledgers(rt, TOPIC, [(12, part // 4)] * 3)  # 1.5 parts each
    offloader = StreamingOffloader(rt)
    offloader.run_pass(TOPIC)  # full segments committed, the tail in an open one
    committed = rt.metadata.segments.of_topic(TOPIC, [SegmentState.OFFLOADED])
    (open_segment,) = rt.metadata.segments.of_topic(TOPIC, [SegmentState.ASSIGNED])
    assert rt.metadata.counts()["segments_by_state"] == {
        "assigned": 1,
        "offloaded": len(committed),
    }
    (tiers,) = rt.metadata.topic_tiers()
    assert tiers.offloaded_bytes == sum(s.data_len for s in committed)  # not in-flight parts

    offloader.run_pass(TOPIC, close_now=True)
    segments = rt.metadata.segments.of_topic(TOPIC, [SegmentState.OFFLOADED])
    assert open_segment.segment_id in {s.segment_id for s in segments}
    streamed = [x for x in rt.metadata.list_ledgers(TOPIC) if x.is_offloaded]
    assert len(streamed) == 3 and all(x.data_len is None for x in streamed)
    counts = rt.metadata.counts()
    assert counts["segments_by_state"] == {"offloaded": len(segments)}
    assert counts["ledgers_by_state"]["sealed/offloaded/present"] == 3
    (tiers,) = rt.metadata.topic_tiers()
    total = sum(s.data_len for s in segments)
    assert (tiers.offloaded_ledgers, tiers.offloaded_bytes) == (3, total)
    assert tier_history(rt.metadata)[-1].offloaded_bytes == total

    # retention: a segment goes once every ledger in it is deleted
    held: dict[str, set[int]] = {}
    for ledger in streamed:
        for piece in rt.metadata.segments.pieces(TOPIC, ledger.ledger_id):
            held.setdefault(piece.segment.segment_id, set()).add(ledger.ledger_id)
    first = segments[0]
    last_ledger = max(held[first.segment_id])
    gone = [s for s in segments if max(held[s.segment_id]) <= last_ledger]
    assert first in gone and len(gone) < len(segments)
    from offloader.retention.trim import trim_topic

    trim_topic(rt, TOPIC, Position(ledger_id=last_ledger + 1, entry_id=0))
    drain_queue(rt.metadata, rt.stores, rt.settings)
    rt.metadata.retention.finish_deleted_ledgers()
    after = {s.segment_id: s.state for s in rt.metadata.segments.of_topic(TOPIC)}
    assert {i for i, state in after.items() if state is SegmentState.DELETED} == {
        s.segment_id for s in gone
    }
    counts = rt.metadata.counts()
    assert counts["segments_by_state"] == {
        "deleted": len(gone),
        "offloaded": len(segments) - len(gone),
    }
    left = total - sum(s.data_len for s in gone)
    (tiers,) = rt.metadata.topic_tiers()
    assert tiers.offloaded_bytes == left
    assert tiers.offloaded_ledgers == 3 - last_ledger
    history = tier_history(rt.metadata)
    assert history[-1].offloaded_bytes == left
    assert max(s.offloaded_bytes for s in history) == total
