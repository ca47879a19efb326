"""Retention over streamed ledgers (PIP-76): a segment's objects are queued only when every
ledger in it is deleted; a segment that still holds a live ledger stays readable. Both
backends, with the GC as the CLI runs it."""

from __future__ import annotations

from fixtures.backends import make_topic, produce_ledgers, unaccounted_objects
from fixtures.streamed import ledgers_by_segment
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.run import collect_garbage
from offloader.metadata import Position, SegmentState
from offloader.read.topic_reader import Source, TopicReader
from offloader.retention.trim import trim_topic
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader


def gc(rt: Runtime) -> None:
    """Two GC passes: the keys of segments the first one's finish released go in the second."""
    for _ in range(2):
        collect_garbage(rt, process_deletions)


def test_segments_go_only_with_their_last_ledger(runtime: Runtime) -> None:
    rt = runtime
    part = max(rt.objects.capabilities.min_part_size, 4096)
    make_topic(rt, streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    # five ledgers of about 0.7 parts: segments of ~2 parts straddle ledger boundaries
    ledgers = produce_ledgers(rt, "orders", [(14, part // 10)] * 5, seed=4)
    StreamingOffloader(rt).run_pass("orders", close_now=True)
    held = ledgers_by_segment(rt, "orders")
    assert any(len(ids) > 1 for ids in held.values()), held

    cut = ledgers[2]
    trim_topic(rt, "orders", Position(ledger_id=cut, entry_id=0))
    gc(rt)

    states = {s.segment_id: s.state for s in rt.metadata.segments.of_topic("orders")}
    for segment_id, ids in held.items():
        wanted = SegmentState.DELETED if max(ids) < cut else SegmentState.OFFLOADED
        assert states[segment_id] is wanted, (segment_id, ids)
    present = {info.key for info in rt.objects.list()}
    for segment in rt.metadata.segments.of_topic("orders"):
        kept = segment.state is SegmentState.OFFLOADED
        assert (segment.data_key in present) is kept
        assert (segment.index_key in present) is kept
    assert unaccounted_objects(rt) == set()
    # what is left reads back from the segments alone, hot copies of live ledgers unused
    hot = TopicReader(rt).checksum("orders", Source.HOT)
    assert TopicReader(rt).checksum("orders", Source.TIERED) == hot
    assert hot.entries == 14 * (len(ledgers) - 2)
