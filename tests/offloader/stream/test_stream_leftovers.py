"""What a streaming pass makes of the leftovers of a pass that died while closing a
segment (in this process, both pairings), each leftover as it was recorded and not:

- a completed data object of the recorded size: not completed again, the index written,
  the segment committed; of another size (not the recorded parts): the segment is failed,
  its keys queued, and a replacement streams the same entries from its begin;
- a written index that is the one the pass computes: accepted as is and committed; other
  bytes under the index key: rewritten by the pass holding the stream, then committed;
- a completion that fails: judged by the data object (there at the recorded size: the
  store completed it and the answer was lost), else left Closing (transient) or failed
  and replaced (the upload is gone).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from fixtures.backends import unaccounted_objects
from fixtures.faults import ServerErrors, _Delegating
from fixtures.metadata import pending_deletions
from fixtures.streams import (
    check_sealed_ledgers_streamed,
    crash_at,
    produce,
    profile,
    run_pass,
    stream_topic,
)
from offloader.exceptions import ObjectNotFoundError, ObjectStoreError
from offloader.format import decode_segment_index
from offloader.metadata import Segment, SegmentState
from offloader.objectstore import MultipartUpload, ObjectStore
from offloader.runtime import Runtime

T = "s"


def closing_segment(rt: Runtime, monkeypatch: pytest.MonkeyPatch, point: str) -> Segment:
    """One segment of sealed history, its pass dead at ``point`` while closing it."""
    p = stream_topic(rt)
    produce(rt, T, int(0.6 * p.segment_max / p.ledger_bytes) + 1)
    with crash_at(monkeypatch, point):
        run_pass(rt, close_now=True)
    (segment,) = rt.metadata.segments.of_topic(T)
    assert segment.state is SegmentState.CLOSING
    return segment


def test_a_completed_data_object_of_the_recorded_size_is_committed_as_it_is(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = runtime
    segment = closing_segment(rt, monkeypatch, "stream-after-complete")
    data = rt.objects.get(segment.data_key)
    assert len(data) == segment.data_len and not rt.objects.exists(segment.index_key)
    result = run_pass(rt)
    assert result.committed == [segment.segment_id] and result.failed == []
    assert rt.objects.get(segment.data_key) == data  # not completed again
    decode_segment_index(rt.objects.get(segment.index_key))
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    check_sealed_ledgers_streamed(rt)


def test_a_completed_data_object_of_another_size_fails_the_segment_and_is_replaced(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not the recorded parts (a zombie's completion, a store that lost bytes): the data
    object cannot be trusted, so the segment fails and its entries are streamed again."""
    rt = runtime
    segment = closing_segment(rt, monkeypatch, "stream-after-complete")
    rt.objects.put(segment.data_key, rt.objects.get(segment.data_key) + b"\0")
    with caplog.at_level(logging.WARNING, logger="offloader.stream.offloader"):
        result = run_pass(rt, close_now=True)
    assert result.failed == [segment.segment_id]
    failed = rt.metadata.segments.get(segment.segment_id)
    assert failed.state is SegmentState.REPLACED
    (replacement,) = rt.metadata.segments.of_topic(T, [SegmentState.OFFLOADED])
    assert failed.detail == (
        f"data object {segment.data_key} holds {segment.data_len + 1} bytes, the recorded "
        f"parts {segment.data_len}; replaced by {replacement.segment_id}"
    )
    assert any(
        r.getMessage().startswith(f"segment {segment.segment_id} failed") for r in caplog.records
    )
    assert replacement.replaces == segment.segment_id and replacement.begin == segment.begin
    queued = {d.object_key for d in pending_deletions(rt.metadata)}
    assert {segment.data_key, segment.index_key} <= queued
    check_sealed_ledgers_streamed(rt)


@pytest.mark.parametrize("matching", [True, False], ids=["as-computed", "other-bytes"])
def test_a_written_index_is_accepted_or_rewritten_and_the_segment_committed(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, matching: bool
) -> None:
    rt = runtime
    segment = closing_segment(rt, monkeypatch, "stream-after-index")
    index = rt.objects.get(segment.index_key)
    if not matching:
        rt.objects.put(segment.index_key, b"not this segment's index")
    result = run_pass(rt)
    assert result.committed == [segment.segment_id] and result.failed == []
    assert rt.objects.get(segment.index_key) == index  # the computed one, either way
    assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
    assert pending_deletions(rt.metadata) == []
    check_sealed_ledgers_streamed(rt)


class _CompletionFaults(_Delegating):
    """The store of a closing pass: ``complete_multipart`` raises ``error``, after doing
    the real completion when ``completes`` (the store did it, its answer was lost)."""

    def __init__(self, store: ObjectStore, error: Exception, *, completes: bool) -> None:
        super().__init__(store)
        self._error, self._completes = error, completes

    def complete_multipart(self, upload: MultipartUpload, parts: Any, **kw: Any) -> None:
        if self._completes:
            self._inner.complete_multipart(upload, parts, **kw)
        raise self._error


class _Stores(_Delegating):
    """The runtime's store registry, handing out ``store`` for every store id."""

    def __init__(self, registry: Any, store: Any) -> None:
        super().__init__(registry)
        self._store = store

    def get(self, store_id: int | None, what: str) -> Any:
        return self._store


@pytest.mark.parametrize(
    ("error", "completes", "outcome"),
    [
        (ObjectStoreError("connection reset by peer"), True, "committed"),
        (ObjectStoreError("connection reset by peer"), False, "raised"),
        (ObjectNotFoundError("NoSuchUpload: the upload is gone"), False, "replaced"),
    ],
    ids=["answer-lost", "transient", "upload-gone"],
)
def test_a_completion_that_fails_is_judged_by_the_data_object(
    runtime: Runtime,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    completes: bool,
    outcome: str,
) -> None:
    """A Closing segment (its pass died before completing) whose completion fails: if the
    store did complete it (the answer was lost) the data object is there at the recorded
    size and the segment is committed; a transient error leaves it Closing for the next
    pass; an upload that is gone fails the segment and a replacement streams its entries."""
    rt = runtime
    segment = closing_segment(rt, monkeypatch, "stream-after-begin-close")
    assert not rt.objects.exists(segment.data_key)
    faulty = _CompletionFaults(rt.objects, error, completes=completes)
    flaky = dataclasses.replace(rt, stores=_Stores(rt.stores, faulty))  # type: ignore[arg-type]
    if outcome == "raised":
        with pytest.raises(ObjectStoreError, match="connection reset"):
            run_pass(flaky)
        assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.CLOSING
        result = run_pass(rt)  # the store answers again
    else:
        result = run_pass(flaky)
    if outcome == "replaced":
        assert result.failed == [segment.segment_id]
        failed = rt.metadata.segments.get(segment.segment_id)
        assert failed.state is SegmentState.REPLACED
        assert (failed.detail or "").startswith(
            "its upload cannot be completed with the recorded parts: NoSuchUpload"
        )
        run_pass(rt, close_now=True)
    else:
        assert result.committed == [segment.segment_id] and result.failed == []
        assert rt.metadata.segments.get(segment.segment_id).state is SegmentState.OFFLOADED
        assert rt.objects.stat(segment.data_key).size == segment.data_len
    check_sealed_ledgers_streamed(rt)


def test_a_part_upload_failing_otherwise_than_upload_gone_is_raised_and_the_next_pass_goes_on(
    runtime: Runtime,
) -> None:
    """A part refused with a server error (boto3's retries used up), not a vanished
    upload: the pass raises it and fails nothing; the segment stays Assigned with the
    parts recorded before the error and nothing after, the stream is released, and the
    next pass uploads the refused part again and closes the segment."""
    rt = runtime
    p = stream_topic(rt, segment_max_bytes=profile(rt).segment_max * 4)
    produce(rt, T, int(1.5 * p.segment_max / p.ledger_bytes) + 1)
    faulty = ServerErrors(rt.objects, ["upload_part"], after=1)
    flaky = dataclasses.replace(rt, stores=_Stores(rt.stores, faulty))  # type: ignore[arg-type]
    with pytest.raises(ObjectStoreError, match="InternalError"):
        run_pass(flaky)
    assert faulty.calls == 1
    (segment,) = rt.metadata.segments.of_topic(T)
    assert segment.state is SegmentState.ASSIGNED and segment.upload_id is not None
    (part,) = rt.metadata.segments.parts(segment)
    assert part.part_number == 1 and segment.data_len == part.length
    assert pending_deletions(rt.metadata) == []
    result = run_pass(rt, close_now=True)  # claims the stream: the failed pass released it
    assert result.committed == [segment.segment_id] and result.failed == []
    assert result.parts_uploaded >= 1
    check_sealed_ledgers_streamed(rt)
    assert unaccounted_objects(rt) == set()
