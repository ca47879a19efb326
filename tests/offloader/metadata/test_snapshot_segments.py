"""Metadata snapshots with streaming offload, on both pairings: the streaming tables and the
ledgers' offload mode round-trip through export and import (an open segment goes on after
the restore)."""

from __future__ import annotations

from fixtures.backends import Fresh
from fixtures.inspect import table_rows
from fixtures.metadata_backup import STREAMED, ledger_digests, populate_streamed
from offloader.metadata.records import OffloadMode, SegmentState
from offloader.metadata.snapshot import import_snapshot
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime, export_metadata
from offloader.stream.offloader import StreamingOffloader

STREAM_TABLES = ("streams", "segments", "segment_parts", "segment_ledgers")


def test_streaming_tables_round_trip_through_export_and_import(
    runtime: Runtime, fresh: Fresh
) -> None:
    rt = runtime
    populate_streamed(rt, close_now=False)  # one segment left open, with parts and an upload
    open_segments = rt.metadata.segments.of_topic(STREAMED, [SegmentState.ASSIGNED])
    assert len(open_segments) == 1 and open_segments[0].upload_id is not None
    modes = {x.ledger_id: x.offload_mode for x in rt.metadata.list_ledgers(STREAMED)}
    assert OffloadMode.STREAM in modes.values()
    rows = table_rows(rt.metadata)
    assert all(rows[t] for t in STREAM_TABLES)
    digests = ledger_digests(rt, STREAMED)
    exported = export_metadata(rt)
    assert all(exported.snapshot.rows[t] == len(rows[t]) for t in STREAM_TABLES)

    restored = fresh()
    import_snapshot(restored.metadata.engine, restored.objects, None)
    assert table_rows(restored.metadata) == rows
    assert {x.ledger_id: x.offload_mode for x in restored.metadata.list_ledgers(STREAMED)} == modes
    assert ledger_digests(restored, STREAMED) == digests
    # the restored stream goes on: the open segment's recorded upload is completed
    result = StreamingOffloader(restored).run_pass(STREAMED, close_now=True)
    assert result.committed == [open_segments[0].segment_id] and result.epoch == 2
    checksum = TopicReader(restored).checksum(STREAMED, source=Source.TIERED)
    assert checksum == TopicReader(restored).checksum(STREAMED, source=Source.HOT)
