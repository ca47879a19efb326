"""The orphan sweep and streaming segments, on both pairings: a segment's objects are
referenced while it is assigned, closing or offloaded and orphans once failed, replaced or
deleted; planted objects of the segment key shapes are swept; the multipart upload recorded
on an open segment is never aborted, while unrecorded ones under segment keys are."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from fixtures.backends import make_topic, produce_ledgers
from fixtures.inspect import queued, stored_keys
from offloader.gc.deletion_queue import process_deletions
from offloader.gc.sweep import ORPHAN_REASON, sweep
from offloader.keys import (
    is_ledger_object_key,
    is_offloaded_object_key,
    is_segment_object_key,
    ledger_object_keys,
    segment_object_keys,
)
from offloader.metadata import Position, schema
from offloader.metadata.records import SegmentState
from offloader.read.topic_reader import Source, TopicReader
from offloader.runtime import Runtime
from offloader.settings import Settings
from offloader.stream.offloader import StreamingOffloader

GRACE = 2.0
TOPIC = "events"


@pytest.fixture
def rt(backend_settings: Settings) -> Iterator[Runtime]:
    changes = dict(sweep_grace_seconds=GRACE, multipart_max_age_seconds=GRACE)
    with Runtime.open(backend_settings.model_copy(update=changes)) as runtime:
        yield runtime


def stream_topic(rt: Runtime, ledgers: int = 4) -> int:
    """A streaming topic of about ``0.75 * ledgers`` parts of sealed data, segments of two
    parts (S3's 5 MiB minimum part on S3, 4 KiB on files); the part size."""
    part = max(4096, rt.objects.capabilities.min_part_size)
    make_topic(rt, TOPIC, streaming=True, min_part_bytes=part, segment_max_bytes=2 * part)
    produce_ledgers(rt, TOPIC, [(12, part // 8)] * ledgers)
    return part


def set_state(rt: Runtime, segment_id: str, state: SegmentState) -> None:
    """Move a segment's row without the store's side effects (its keys are not queued)."""
    G = schema.segments
    with rt.metadata.engine.begin() as conn:
        conn.execute(G.update().where(G.c.segment_id == segment_id).values(state=state))


def test_key_shapes() -> None:
    segment_id = str(uuid.uuid4())
    data, index = segment_object_keys(segment_id)
    assert is_segment_object_key(data) and is_segment_object_key(index)
    assert not is_ledger_object_key(data) and not is_ledger_object_key(index)
    ledger_data, ledger_index = ledger_object_keys(segment_id, 5)
    assert not is_segment_object_key(ledger_data) and not is_segment_object_key(ledger_index)
    assert all(is_offloaded_object_key(k) for k in (data, index, ledger_data, ledger_index))
    for foreign in (
        segment_id.upper(),
        f"tiered/{data}",
        f"{data}-index-index",
        f"{data}-data",
        segment_id[:-1],
        "_metadata/snapshots/x.jsonl.gz",
    ):
        assert not is_offloaded_object_key(foreign), foreign


def test_committed_segments_are_kept_and_planted_segment_objects_swept(rt: Runtime) -> None:
    stream_topic(rt)
    result = StreamingOffloader(rt).run_pass(TOPIC, close_now=True)
    assert len(result.committed) >= 2
    before = TopicReader(rt).checksum(TOPIC, source=Source.TIERED)
    segment_keys = {
        k for s in rt.metadata.segments.of_topic(TOPIC) for k in (s.data_key, s.index_key)
    }
    assert segment_keys == stored_keys(rt.objects)
    planted = {}
    for n in range(2):
        data, index = segment_object_keys(str(uuid.uuid4()))
        rt.objects.put(data, b"d" * (5 + n))
        rt.objects.put(index, b"i" * (7 + n))
        planted |= {data: 5 + n, index: 7 + n}

    young = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = young.stores
    assert (store.orphans, store.young, store.foreign) == (0, 4, 0)
    time.sleep(GRACE + 1.5)

    scan = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = scan.stores
    assert {o.key: o.size for o in store.objects} == planted
    assert store.referenced == len(segment_keys)
    done = sweep(rt.metadata, rt.stores, rt.settings)
    assert done.stores[0].queued == 4
    assert queued(rt.metadata) == dict.fromkeys(planted, ORPHAN_REASON)
    process_deletions(rt.metadata, rt.stores, rt.settings)
    assert stored_keys(rt.objects) == segment_keys
    assert TopicReader(rt).checksum(TOPIC, source=Source.TIERED) == before


@pytest.mark.parametrize(
    "state", [SegmentState.FAILED, SegmentState.REPLACED, SegmentState.DELETED]
)
def test_a_finished_segments_objects_are_not_references(rt: Runtime, state: SegmentState) -> None:
    """The store queues a segment's keys when it fails or is released; objects of such a
    segment still present afterwards (a late write, a lost queue row) are orphans."""
    stream_topic(rt)
    StreamingOffloader(rt).run_pass(TOPIC, close_now=True)
    first, *rest = rt.metadata.segments.of_topic(TOPIC)
    set_state(rt, first.segment_id, state)
    time.sleep(GRACE + 1.5)
    scan = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = scan.stores
    assert {o.key for o in store.objects} == {first.data_key, first.index_key}
    assert store.referenced == 2 * len(rest)


def test_an_open_segments_recorded_upload_is_never_aborted(rt: Runtime) -> None:
    stream_topic(rt)
    offloader = StreamingOffloader(rt)
    result = offloader.run_pass(TOPIC)  # one segment committed, the rest left open
    assert len(result.committed) == 1 and result.open_segment is not None
    segment = rt.metadata.segments.get(result.open_segment)
    assert segment.state is SegmentState.ASSIGNED and segment.upload_id is not None
    # a pass that died between creating an upload and recording it, and a stray one
    unrecorded = rt.objects.create_multipart(segment.data_key)
    stray_key, _ = segment_object_keys(str(uuid.uuid4()))
    stray = rt.objects.create_multipart(stray_key)
    rt.objects.upload_part(stray, 1, b"a part nobody recorded")
    time.sleep(GRACE + 1.5)

    scan = sweep(rt.metadata, rt.stores, rt.settings, dry_run=True)
    (store,) = scan.stores
    stale = {(u.key, u.upload_id) for u in store.uploads}
    assert stale == {(segment.data_key, unrecorded.upload_id), (stray_key, stray.upload_id)}
    assert store.orphans == 0  # the committed segment's objects are referenced
    done = sweep(rt.metadata, rt.stores, rt.settings)
    assert done.stores[0].aborted_uploads == 2
    left = {(u.key, u.upload_id) for u in rt.objects.list_multipart_uploads()}
    assert left == {(segment.data_key, segment.upload_id)}

    # the next pass goes on with the recorded upload and completes it
    closed = offloader.run_pass(TOPIC, close_now=True)
    assert closed.committed == [segment.segment_id] and closed.failed == []
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    assert list(rt.objects.list_multipart_uploads()) == []
    assert {x.ledger_id for x in rt.metadata.list_ledgers(TOPIC) if x.is_offloaded}


def test_a_failed_segments_upload_is_aborted(rt: Runtime) -> None:
    stream_topic(rt)
    result = StreamingOffloader(rt).run_pass(TOPIC)
    segment = rt.metadata.segments.get(result.open_segment or "")
    assert segment.upload_id is not None
    claim = rt.metadata.segments.claim(TOPIC, "test", 60_000)
    rt.metadata.segments.fail(claim, segment, "test: given up")
    rt.metadata.segments.release(claim)
    # its keys were queued when it failed: not orphans, but its upload is no one's now
    assert {segment.data_key, segment.index_key} <= queued(rt.metadata).keys()
    time.sleep(GRACE + 1.5)
    done = sweep(rt.metadata, rt.stores, rt.settings)
    (store,) = done.stores
    assert (store.orphans, store.stale_uploads, store.aborted_uploads) == (0, 1, 1)
    assert list(rt.objects.list_multipart_uploads()) == []


def test_open_segment_uploads_answer_for_the_keys_asked_with_recorded_uploads(rt: Runtime) -> None:
    """Only the keys asked about (one page of the listing), and only uploads recorded on
    an open segment: one assigned whose pass died before creating its upload has none."""
    segments = {}
    for topic in ("recorded", "unrecorded"):
        make_topic(rt, topic, streaming=True)
        claim = rt.metadata.segments.claim(topic, "test", 60_000)
        data, index = segment_object_keys(segment_id := str(uuid.uuid4()))
        segment = rt.metadata.segments.assign(
            claim,
            segment_id=segment_id,
            data_key=data,
            index_key=index,
            store_id=rt.stores.default_id(),
            begin=Position(ledger_id=0, entry_id=0),
        )
        if topic == "recorded":
            upload = rt.objects.create_multipart(data)
            segment = rt.metadata.segments.record_upload(claim, segment, upload.upload_id)
        segments[topic] = segment
    recorded, unrecorded = segments["recorded"], segments["unrecorded"]
    assert recorded.state is unrecorded.state is SegmentState.ASSIGNED
    both = [recorded.data_key, unrecorded.data_key]
    assert rt.metadata.open_segment_uploads(both) == {(recorded.data_key, upload.upload_id)}
    assert rt.metadata.open_segment_uploads([unrecorded.data_key]) == set()
    rt.objects.abort_multipart(upload)
