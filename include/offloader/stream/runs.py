"""Streaming offload as a scheduler runs it: the topics that stream, one pass each, then the
hot copies past their deletion lag.

A topic another pass holds (its lease not over) is reported ``busy``, not failed: the
pass that holds it is doing the work. A topic whose pass fails is reported ``failed`` and
the others still get their pass; the caller decides what a failure means (the Airflow
task fails, so the run shows it and retries).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from offloader.exceptions import StreamBusyError, TopicDeletedError
from offloader.metadata import MetadataStore
from offloader.objectstore.location import StoreLocation
from offloader.offload.hot_deletion import delete_hot_copies
from offloader.runtime import Runtime
from offloader.stream.offloader import StreamingOffloader, StreamPassResult
from offloader.stream.params import StreamRunParams

log = logging.getLogger(__name__)

DONE, BUSY, FAILED = "done", "busy", "failed"


@dataclass(frozen=True)
class StreamTopicResult:
    """One topic's step: its streaming pass, then its hot copies deleted (ledger ids)."""

    passed: StreamPassResult
    hot_deleted: list[int]

    def to_json(self) -> dict[str, Any]:
        return {**self.passed.to_json(), "hot_deleted": self.hot_deleted}

    def __str__(self) -> str:
        return f"{self.passed}; hot copies deleted: {self.hot_deleted or '-'}"


def streaming_topics(metadata: MetadataStore, topic: str | None = None) -> list[str]:
    """The live topics whose policy has streaming on or that still have an open segment
    (streaming was just turned off: the pass completes it), by name; or ``topic`` alone.

    A named topic may have streaming off (a pass then completes its open segment); an
    unknown one is a NotFoundError, a deleted one a TopicDeletedError.
    """
    if topic:
        if metadata.get_topic(topic).is_deleted:  # NotFoundError names an unknown topic
            raise TopicDeletedError(f"topic {topic!r} was deleted: nothing to stream")
        return [topic]
    open_segments = set(metadata.segments.topics_with_open_segments())
    return [
        t.name
        for t in metadata.list_topics()
        if (t.policy.streaming or t.name in open_segments) and not t.is_deleted
    ]


def run_streaming(runtime: Runtime, params: StreamRunParams, owner: str) -> list[dict[str, Any]]:
    """One pass per topic of ``params`` (as ``owner``), each followed by the topic's hot
    copies due for deletion; one JSON-safe dict per topic, no credentials in it.

    Each dict holds ``topic``, ``status`` (done, busy or failed), ``detail`` (why busy or
    failed, else None), ``hot_deleted`` (ledger ids) and, when done, the pass's result
    (:meth:`StreamTopicResult.to_json`). The topics are resolved before any pass, so a bad
    topic changes nothing.
    """
    topics = streaming_topics(runtime.metadata, params.topic)
    offloader = StreamingOffloader(runtime, owner=owner)
    return [_stream_topic(runtime, offloader, topic, params.close_now) for topic in topics]


def stream_topic(
    runtime: Runtime, offloader: StreamingOffloader, topic: str, *, close_now: bool = False
) -> StreamTopicResult:
    """One pass over ``topic`` (PIP-76), then its hot copies past their deletion lag.
    What `offloader stream` runs, and each topic's step of :func:`run_streaming`; raises
    what the pass raises (StreamBusyError: another pass holds the topic)."""
    passed = offloader.run_pass(topic, close_now=close_now)
    return StreamTopicResult(passed, _delete_hot_copies(runtime, topic))


def _stream_topic(
    runtime: Runtime, offloader: StreamingOffloader, topic: str, close_now: bool
) -> dict[str, Any]:
    try:
        try:
            passed = stream_topic(runtime, offloader, topic, close_now=close_now)
            outcome: dict[str, Any] = {"status": DONE, "detail": None, **passed.to_json()}
        except StreamBusyError as busy:
            outcome = {"topic": topic, "status": BUSY, "detail": str(busy)}
            outcome["hot_deleted"] = _delete_hot_copies(runtime, topic)
    except Exception as exc:  # one topic's failure does not hold the others back
        log.warning("streaming pass of %s failed", topic, exc_info=True)
        detail = f"{type(exc).__name__}: {exc}"
        outcome = {"topic": topic, "status": FAILED, "detail": detail, "hot_deleted": []}
    return outcome


def moved_data(result: dict[str, Any]) -> bool:
    """Whether a topic's step (a :func:`run_streaming` dict) moved entries into the object
    tier: parts uploaded, or a segment completed."""
    return result.get("status") == DONE and bool(
        result.get("bytes_uploaded") or result.get("committed")
    )


def stores_written(metadata: MetadataStore, result: dict[str, Any]) -> list[StoreLocation]:
    """The stores of the segments a topic's step wrote parts to or completed, by URL;
    none when it moved nothing (:func:`moved_data`)."""
    if not moved_data(result):
        return []
    segment_ids = [*result.get("committed", []), result.get("open_segment")]
    return metadata.get_locations(
        metadata.segments.get(s).store_id for s in segment_ids if s is not None
    )


def _delete_hot_copies(runtime: Runtime, topic: str) -> list[int]:
    return [h.ledger_id for h in delete_hot_copies(runtime.metadata, runtime.hot, topic)]
