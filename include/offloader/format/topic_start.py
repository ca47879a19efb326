"""A topic's recorded start (docs/FORMAT.md, "Topic starts"): the one fact a trim inside a
ledger leaves that no offloaded object holds.

A trim to ``150:2`` keeps ledger 150, whose objects still hold entries 0 and 1; without
this record a rebuild from the objects alone (``offloader/recovery/``) would make them
readable again. The object is small UTF-8 JSON under ``_metadata/starts/`` (its key:
``offloader/keys.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

START_FORMAT = "offloader-topic-start"
START_FORMAT_VERSION = 1


@dataclass(frozen=True)
class RecordedStart:
    """Reads of ``topic`` below entry ``entry_id`` of ledger ``ledger_id`` are refused."""

    topic: str
    ledger_id: int
    entry_id: int
    recorded_ms: int  # when it was written (the database's clock)

    @property
    def position(self) -> tuple[int, int]:
        return (self.ledger_id, self.entry_id)


def encode_start(start: RecordedStart) -> bytes:
    """The object's bytes: one JSON object, keys sorted."""
    return json.dumps(
        {
            "format": START_FORMAT,
            "format_version": START_FORMAT_VERSION,
            "topic": start.topic,
            "ledger_id": start.ledger_id,
            "entry_id": start.entry_id,
            "recorded_ms": start.recorded_ms,
        },
        sort_keys=True,
    ).encode()


def decode_start(data: bytes) -> RecordedStart:
    """The record in ``data``; ValueError naming what is wrong."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"not a topic start record: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != START_FORMAT:
        raise ValueError(f"not a topic start record (format is not {START_FORMAT!r})")
    if doc.get("format_version") != START_FORMAT_VERSION:
        raise ValueError(f"topic start record of unknown version {doc.get('format_version')!r}")
    topic, ledger_id, entry_id, recorded_ms = (
        doc.get(k) for k in ("topic", "ledger_id", "entry_id", "recorded_ms")
    )
    if not isinstance(topic, str) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for v in (ledger_id, entry_id, recorded_ms)
    ):
        raise ValueError("topic start record: topic must be text, the numbers integers >= 0")
    assert isinstance(ledger_id, int) and isinstance(entry_id, int)
    assert isinstance(recorded_ms, int)
    return RecordedStart(topic, ledger_id, entry_id, recorded_ms)
