"""Stream cuts (PDP-19): positions of a topic with their time and byte offset."""

from __future__ import annotations

import logging

from offloader.metadata import StreamCut
from offloader.runtime import Runtime

log = logging.getLogger(__name__)


def take_cut(rt: Runtime, topic: str) -> StreamCut:
    """A cut at the end of the topic's sealed data now (the retention DAG takes one per
    topic per run, so time and size retention have positions to truncate at)."""
    cut = rt.metadata.retention.create_cut(topic)
    log.info(
        "cut %d of %s at %d:%d (%d bytes)",
        cut.cut_id,
        topic,
        cut.ledger_id,
        cut.entry_id,
        cut.offset_bytes,
    )
    return cut
