"""Streaming offload as a scheduler runs it (stream/runs.py), in process on both backends:
which topics get a pass, the per-topic result the DAG's task returns (its keys are what
the task log, XCom and docs/OPERATIONS.md show), a busy topic, a failed one, and the hot
copies deleted after each pass."""

from __future__ import annotations

import logging

import pytest

from fixtures.streams import produce, stream_topic
from offloader.exceptions import NotFoundError, TopicDeletedError
from offloader.metadata import HotState, SegmentState
from offloader.policy import OffloadPolicy
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader
from offloader.stream.params import StreamRunParams
from offloader.stream.runs import run_streaming, streaming_topics

PASS_KEYS = {
    "topic",
    "epoch",
    "committed",
    "failed",
    "parts_uploaded",
    "bytes_uploaded",
    "settled_ledgers",
    "open_segment",
    "offloaded_to",
    "waiting_bytes",
    "over_budget",
}


def test_a_closing_run_reports_the_pass_and_the_hot_copies_it_deleted(runtime: Runtime) -> None:
    rt = runtime
    stream_topic(rt, "a", deletion_lag_seconds=0)
    ids = produce(rt, "a", 2)
    [result] = run_streaming(rt, StreamRunParams(close_now=True), owner="test")
    assert set(result) == PASS_KEYS | {"status", "detail", "hot_deleted"}
    [segment] = rt.metadata.segments.of_topic("a")
    assert segment.state is SegmentState.OFFLOADED
    assert {k: result[k] for k in ("topic", "status", "detail", "epoch", "failed")} == {
        "topic": "a",
        "status": "done",
        "detail": None,
        "epoch": 1,
        "failed": [],
    }
    assert result["committed"] == [segment.segment_id]
    assert result["settled_ledgers"] == ids and result["hot_deleted"] == ids
    assert result["bytes_uploaded"] == segment.data_len > 0
    assert result["parts_uploaded"] == len(rt.metadata.segments.parts(segment)) >= 1
    assert result["open_segment"] is None and result["waiting_bytes"] == 0
    assert result["offloaded_to"] == str(segment.end)
    assert result["over_budget"] is False
    ledgers = rt.metadata.list_ledgers("a")
    assert [x.hot_state for x in ledgers] == [HotState.DELETED] * len(ids)


def test_an_open_segment_is_reported_and_hot_copies_within_their_lag_stay(
    runtime: Runtime,
) -> None:
    rt = runtime
    stream_topic(rt, "a")  # a 4 h deletion lag
    produce(rt, "a", 1)
    [result] = run_streaming(rt, StreamRunParams(), owner="test")
    [segment] = rt.metadata.segments.of_topic("a")
    assert segment.state is SegmentState.ASSIGNED
    assert result["status"] == "done" and result["committed"] == []
    assert result["open_segment"] == segment.segment_id
    assert result["hot_deleted"] == [] and result["settled_ledgers"] == []


def test_a_topic_another_pass_holds_is_busy_and_its_hot_copies_are_still_looked_at(
    runtime: Runtime,
) -> None:
    rt = runtime
    stream_topic(rt, "a")
    produce(rt, "a", 1)
    rt.metadata.segments.claim("a", "other", 600_000)
    [result] = run_streaming(rt, StreamRunParams(close_now=True), owner="test")
    assert set(result) == {"topic", "status", "detail", "hot_deleted"}
    assert result["topic"] == "a" and result["status"] == "busy"
    assert "other" in result["detail"] and result["hot_deleted"] == []
    assert rt.metadata.segments.of_topic("a") == []


def test_one_topic_failing_holds_no_other_back(
    runtime: Runtime, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pass that raises is reported with the error's type and message, and logged with
    its traceback; the hot copies of that topic are left alone, and the next topic still
    gets its pass (with the ``close_now`` of the run)."""
    rt = runtime
    stream_topic(rt, "a", deletion_lag_seconds=0)
    stream_topic(rt, "b", deletion_lag_seconds=0)
    produce(rt, "b", 1)
    real = StreamingOffloader.run_pass
    owners = []

    def run_pass(self: StreamingOffloader, topic: str, *, close_now: bool = False):  # type: ignore[no-untyped-def]
        owners.append(self.owner)
        if topic == "a":
            raise OSError("store unreachable")
        return real(self, topic, close_now=close_now)

    monkeypatch.setattr(StreamingOffloader, "run_pass", run_pass)
    with caplog.at_level(logging.WARNING, logger="offloader.stream.runs"):
        results = run_streaming(rt, StreamRunParams(close_now=True), owner="run-7")
    [record] = caplog.records
    assert record.getMessage() == "streaming pass of a failed"
    assert record.exc_info is not None and record.exc_info[0] is OSError
    assert [(r["topic"], r["status"], r["detail"]) for r in results] == [
        ("a", "failed", "OSError: store unreachable"),
        ("b", "done", None),
    ]
    assert results[0] == {
        "topic": "a",
        "status": "failed",
        "detail": "OSError: store unreachable",
        "hot_deleted": [],
    }
    assert owners == ["run-7", "run-7"]
    assert [s.state for s in rt.metadata.segments.of_topic("b")] == [SegmentState.OFFLOADED]
    assert results[1]["hot_deleted"] == [x.ledger_id for x in rt.metadata.list_ledgers("b")]


def test_a_named_topic_gets_the_only_pass(runtime: Runtime) -> None:
    rt = runtime
    stream_topic(rt, "a")
    stream_topic(rt, "b")
    results = run_streaming(rt, StreamRunParams(topic="b"), owner="test")
    assert [r["topic"] for r in results] == ["b"]


def test_the_topics_that_stream(runtime: Runtime) -> None:
    """Streaming on, or an open segment left after streaming was turned off; never a
    deleted topic. A named topic is taken as it is, unless unknown or deleted."""
    rt = runtime
    stream_topic(rt, "on")
    stream_topic(rt, "gone")
    stream_topic(rt, "turned-off")
    rt.metadata.create_topic("plain", OffloadPolicy())
    produce(rt, "turned-off", 1)
    run_streaming(rt, StreamRunParams(topic="turned-off"), owner="test")  # leaves it open
    topic = rt.metadata.get_topic("turned-off")
    rt.metadata.set_policy(topic, topic.policy.updated({"streaming": False}))
    rt.metadata.retention.delete_topic(rt.metadata.get_topic("gone"))
    assert streaming_topics(rt.metadata) == ["on", "turned-off"]
    assert streaming_topics(rt.metadata, "plain") == ["plain"]
    with pytest.raises(TopicDeletedError, match=r"^topic 'gone' was deleted: nothing to stream$"):
        streaming_topics(rt.metadata, "gone")
    with pytest.raises(NotFoundError, match="nope"):
        streaming_topics(rt.metadata, "nope")
    with pytest.raises(TopicDeletedError):
        run_streaming(rt, StreamRunParams(topic="gone"), owner="test")
